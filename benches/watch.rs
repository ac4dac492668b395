//! Watch event fan-out: one applied revision's event delivered by a replica's watch hub
//! (`WatchHub::publish`) to 10,000 live persistent watches of the changed path, spread over
//! 100 watch streams, each push going into its stream's bounded queue. This runs on the
//! applying thread after every write, so its cost holds up the group's next apply.
//!
//! The streams' queues are emptied (as their gRPC senders would) before each publish,
//! outside the measurement.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use prost::bytes::Bytes;
use warden_namespace::watch::event::NodeState;
use warden_namespace::watch::hub::CatchUp;
use warden_namespace::watch::stream::{Outgoing, Phase, StreamWatch};
use warden_namespace::watch::{Event, EventBatch, EventKind, WatchHub, WatchLimits, WatchSpec, WatchStream};
use warden_proto::v1::watch_create::Kind as WatchKind;
use warden_proto::v1::{NodeKind, Stat, WatchCreated};

const GROUP: u64 = 1;
const WATCHED: &str = "/bench/watched";
const WATCHERS: usize = 10_000;
const STREAMS: usize = 100;
const VALUE_BYTES: usize = 256;

/// Registers `WATCHERS` live persistent watches of `WATCHED` on `hub`, over `STREAMS` streams,
/// the way the service's watch driver does (added to the stream, then caught up into the
/// hub's index).
fn register(hub: &Arc<WatchHub>, limits: &WatchLimits) -> Vec<Arc<WatchStream>> {
    let streams: Vec<Arc<WatchStream>> = (0..STREAMS).map(|_| WatchStream::new(limits.stream_queue_bytes_max)).collect();
    let spec = WatchSpec::new(WatchKind::Persistent, false, false, false, false, false);
    for n in 0..WATCHERS {
        let stream = &streams[n % STREAMS];
        let watch_id = (n / STREAMS) as u64 + 1;
        let revision = hub.revision();
        let start_revision = revision + 1;
        let phase = Phase::CatchingUp { next_revision: start_revision };
        let watch = StreamWatch {
            group: GROUP,
            path: Arc::from(WATCHED),
            spec: spec.clone(),
            phase,
            progress_notify: false,
            active: false,
            charge: None,
            resume_revisions: Arc::default(),
        };
        let created = Box::new(WatchCreated { start_revision, ..WatchCreated::default() });
        stream.add(watch_id, watch, Outgoing::Created { watch_id, group: GROUP, revision, created });
        assert_eq!(hub.catch_up(stream, watch_id, usize::MAX), CatchUp::Live);
    }
    assert_eq!(hub.stats().2, WATCHERS, "every watch is live");
    streams
}

/// Empties every stream's queue; returns the responses taken.
fn drain(streams: &[Arc<WatchStream>]) -> usize {
    streams.iter().map(|stream| std::iter::from_fn(|| stream.try_next()).count()).sum()
}

/// The event of a data change of `WATCHED` at `revision`.
fn change(revision: u64) -> EventBatch {
    let state = |version: u64| NodeState {
        stat: Stat { create_revision: 1, mod_revision: revision, version, kind: NodeKind::Persistent as i32, ..Stat::default() },
        data: Bytes::from(vec![version as u8; VALUE_BYTES]),
    };
    let event = Event { kind: EventKind::Changed, path: WATCHED.into(), node: state(revision), prev: Some(state(revision - 1)) };
    EventBatch { revision, events: vec![event] }
}

fn fan_out(c: &mut Criterion) {
    let limits = WatchLimits::default();
    let hub = WatchHub::new(GROUP, limits.clone());
    let streams = register(&hub, &limits);
    drain(&streams);
    let mut revision = hub.revision() + 1;
    hub.publish(vec![change(revision)], revision);
    assert_eq!(drain(&streams), WATCHERS, "one response per watch");

    let mut next = || {
        drain(&streams);
        revision += 1;
        change(revision)
    };
    let mut group = c.benchmark_group("watch/fan_out");
    group.throughput(Throughput::Elements(WATCHERS as u64));
    group.bench_function(format!("publish_one_event/{WATCHERS}_watchers"), |b| {
        b.iter_batched(
            &mut next,
            |batch| {
                let revision = batch.revision;
                hub.publish(vec![batch], revision);
            },
            // The queues must be emptied between publishes, so one input per measurement.
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group!(benches, fan_out);
criterion_main!(benches);
