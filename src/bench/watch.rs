//! `warden bench watch`: watches over gRPC against an in-process 5-node cluster (fsync on):
//! event delivery latency from write ack to watcher receipt with 1, 100 and 10,000 watchers
//! of one path; memory per idle watch; events per second reaching a recursive watch while
//! 64 clients write as fast as they can. Each line has the cluster's CPU ([`super::SERVER_THREADS`],
//! not the clients') over its run: `server_cpu_us_per_op` is per event delivered to a watcher
//! (what the delivery and recursive runs' figures are about; with many watchers one write
//! makes many events) — for the idle-memory run, per watch created after the baseline — and
//! `server_cpu_cores` the cores it kept busy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

/// Flags of `warden bench watch`.
#[derive(clap::Args)]
pub struct WatchArgs {
    /// Watcher counts of the delivery-latency runs (all on one path).
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000")]
    watchers: Vec<usize>,
    /// Writes per delivery-latency run (one at a time, each after the previous one's events
    /// reached every watcher).
    #[arg(long, default_value_t = 200)]
    writes: usize,
    /// Idle watches created to measure memory per watch.
    #[arg(long, default_value_t = 100_000)]
    idle_watches: usize,
    #[command(flatten)]
    load: super::ClosedLoop,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// Watch streams at most per run (watchers are spread over them and over every node).
const STREAMS_MAX: usize = 100;
/// Watches created per request burst before waiting for their answers.
const CREATE_BURST: usize = 1_000;

/// Runs the three measurements, one JSON line each (delivery: one per watcher count).
pub async fn run(args: WatchArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let bench = super::ApiCluster::start(&root, "watch", 1).await?;
    let mut leader = bench.leaders[&1].clone();
    let mut nodes = Vec::new();
    for id in bench.cluster.node_ids() {
        let addr = bench.cluster.addr(id).ok_or_else(|| anyhow::anyhow!("no address for node {id}"))?;
        nodes.push(warden_proto::channel::connect(&addr.to_string(), None, &super::TO_NODE).await?);
    }
    leader.create(CreateRequest { path: "/bench".into(), ..CreateRequest::default() }).await?;
    leader.create(CreateRequest { path: "/bench/hot".into(), ..CreateRequest::default() }).await?;
    for &watchers in &args.watchers {
        delivery(&mut leader, &nodes, watchers, args.writes).await?;
    }
    idle_memory(&nodes[0], args.idle_watches).await?;
    recursive(&bench, &nodes, args.load.clients, Duration::from_secs(args.load.seconds)).await?;
    bench.finish()
}

/// One watch stream: its request sender and a task that records every event's revision
/// and arrival time.
struct Watcher {
    requests: mpsc::Sender<WatchRequest>,
    created: Arc<AtomicU64>,
    arrivals: Arc<Mutex<Vec<(u64, Instant)>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn open(channel: &Channel) -> anyhow::Result<Watcher> {
    let (requests, outgoing) = mpsc::channel(CREATE_BURST * 2);
    let mut responses = WardenClient::new(channel.clone())
        .max_decoding_message_size(64 << 20)
        .watch(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await?
        .into_inner();
    let created = Arc::new(AtomicU64::new(0));
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let task = tokio::spawn({
        let (created, arrivals) = (created.clone(), arrivals.clone());
        async move {
            while let Ok(Some(response)) = responses.message().await {
                let now = Instant::now();
                if response.created.is_some() {
                    created.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(canceled) = response.canceled {
                    tracing::error!(?canceled, "bench watch cancelled");
                }
                if let Ok(mut arrivals) = arrivals.lock() {
                    arrivals.extend(response.events.iter().map(|event| (event.revision, now)));
                }
            }
        }
    });
    Ok(Watcher { requests, created, arrivals, task })
}

impl Watcher {
    async fn watch(&self, path: String) -> anyhow::Result<()> {
        let create = WatchCreate { path, consistency: Consistency::Stale as i32, ..WatchCreate::default() };
        self.requests.send(WatchRequest { request: Some(WatchRequestKind::Create(create)) }).await?;
        Ok(())
    }

    async fn wait_created(&self, count: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.created.load(Ordering::SeqCst) < count {
            anyhow::ensure!(Instant::now() < deadline, "watches were not created in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    fn arrived(&self) -> usize {
        self.arrivals.lock().map_or(0, |arrivals| arrivals.len())
    }
}

/// Spreads `watchers` watches of `path` over streams to every node; returns the streams.
async fn spread(nodes: &[Channel], watchers: usize, path: &str) -> anyhow::Result<Vec<Watcher>> {
    let streams = watchers.clamp(1, STREAMS_MAX);
    let mut opened = Vec::new();
    for stream in 0..streams {
        opened.push(open(&nodes[stream % nodes.len()]).await?);
    }
    for (stream, watcher) in opened.iter().enumerate() {
        let count = watchers / streams + usize::from(stream < watchers % streams);
        for _ in 0..count {
            watcher.watch(path.to_string()).await?;
        }
        watcher.wait_created(count as u64).await?;
    }
    Ok(opened)
}

fn percentile_ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// Delivery latency: writes to one path, one at a time; each event's arrival at each
/// watcher is compared with the write's acknowledgement (and with its start).
async fn delivery(leader: &mut WardenClient<Channel>, nodes: &[Channel], watchers: usize, writes: usize) -> anyhow::Result<()> {
    let streams = spread(nodes, watchers, "/bench/hot").await?;
    let cpu = super::ServerCpu::start()?;
    let mut sent_and_acked: HashMap<u64, (Instant, Instant)> = HashMap::new();
    for n in 0..writes {
        let sent = Instant::now();
        let response = leader.set(SetRequest { path: "/bench/hot".into(), data: n.to_le_bytes().to_vec(), ..SetRequest::default() }).await?;
        let acked = Instant::now();
        let revision = response.into_inner().header.map_or(0, |h| h.revision);
        sent_and_acked.insert(revision, (sent, acked));
        // The next write only once this one reached everyone: latency, not queueing.
        let deadline = Instant::now() + Duration::from_secs(30);
        while streams.iter().map(Watcher::arrived).sum::<usize>() < watchers * (n + 1) {
            anyhow::ensure!(Instant::now() < deadline, "events did not reach every watcher");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    let cpu = cpu.finish((watchers * writes) as u64).await?;
    let (mut after_ack, mut after_send) = (histogram()?, histogram()?);
    let mut before_ack = 0u64;
    for watcher in &streams {
        let arrivals = watcher.arrivals.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        for (revision, arrived) in arrivals.iter() {
            let Some((sent, acked)) = sent_and_acked.get(revision) else { continue };
            // Events are published right after apply, so a watcher can hear of a write
            // before its writer does: those count as 0 after the ack.
            if arrived < acked {
                before_ack += 1;
            }
            after_ack.record(arrived.saturating_duration_since(*acked).as_micros().max(1) as u64)?;
            after_send.record(arrived.saturating_duration_since(*sent).as_micros().max(1) as u64)?;
        }
    }
    for watcher in streams {
        watcher.task.abort();
    }
    let mut line = json!({"bench": "watch", "run": "delivery", "watchers": watchers, "streams": watchers.clamp(1, STREAMS_MAX), "writes": writes,
                          "events": after_ack.len(), "p50_ms": percentile_ms(&after_ack, 0.5), "p99_ms": percentile_ms(&after_ack, 0.99),
                          "from_send_p50_ms": percentile_ms(&after_send, 0.5), "from_send_p99_ms": percentile_ms(&after_send, 0.99),
                          "before_ack_fraction": before_ack as f64 / after_ack.len().max(1) as f64});
    cpu.insert(&mut line);
    println!("{line}");
    Ok(())
}

/// Resident memory of this process (server and client sides both live here).
fn resident_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).ok_or_else(|| anyhow::anyhow!("statm"))?.parse()?;
    Ok(pages * 4096)
}

/// Heap bytes in use by the process, as the allocator counts them (`warden bench watch`
/// switches the count on first thing, see allocator.rs).
fn heap_in_use_bytes() -> anyhow::Result<i64> {
    crate::allocator::in_use_bytes().ok_or_else(|| anyhow::anyhow!("the allocator does not count the heap in this process"))
}

/// Memory per idle watch: watches of distinct paths on one node, `count` in all over a few
/// streams. The baseline is taken after the first tenth, so the streams' own buffers (h2
/// windows, codec buffers) have grown already: what is divided is the memory the other
/// nine tenths added, the cost of one more watch. Heap in use and resident memory are both
/// reported, for the whole process (the server's state and the client's side).
async fn idle_memory(node: &Channel, count: usize) -> anyhow::Result<()> {
    let streams = (count / 10_000).clamp(1, STREAMS_MAX);
    let mut opened = Vec::new();
    for _ in 0..streams {
        opened.push(open(node).await?);
    }
    let per_stream = count / streams;
    let warm = per_stream / 10;
    let create = |from: usize, to: usize| {
        let opened = &opened;
        async move {
            for (stream, watcher) in opened.iter().enumerate() {
                for n in from..to {
                    watcher.watch(format!("/idle/s{stream}/w{n}")).await?;
                }
            }
            for watcher in opened {
                watcher.wait_created(to as u64).await?;
            }
            // Let answers drain and buffers settle.
            tokio::time::sleep(Duration::from_millis(500)).await;
            anyhow::Ok((heap_in_use_bytes()?, resident_bytes()? as i64))
        }
    };
    let (heap_before, resident_before) = create(0, warm).await?;
    let cpu = super::ServerCpu::start()?;
    let (heap_after, resident_after) = create(warm, per_stream).await?;
    let added = (per_stream - warm) * streams;
    let cpu = cpu.finish(added as u64).await?;
    // A figure that reads nothing measured nothing (a reading that cannot see these
    // allocations): the run fails rather than report it as a memory cost met.
    let per_watch = |what: &str, before: i64, after: i64| {
        let bytes = (after - before) as f64 / added as f64;
        anyhow::ensure!(bytes > 0.0, "{what} per idle watch read {bytes} ({before} → {after} bytes over {added} watches): not a measurement");
        Ok(bytes)
    };
    let mut line = json!({"bench": "watch", "run": "idle_memory", "watches": per_stream * streams, "streams": streams,
                          "bytes_per_idle_watch": per_watch("heap in use", heap_before, heap_after)?,
                          "resident_bytes_per_idle_watch": per_watch("resident memory", resident_before, resident_after)?});
    cpu.insert(&mut line);
    println!("{line}");
    for watcher in opened {
        watcher.task.abort();
    }
    Ok(())
}

/// Events per second reaching one recursive watch (served by a follower) while `clients`
/// writers set their own keys below it as fast as they can.
async fn recursive(bench: &super::ApiCluster, nodes: &[Channel], clients: usize, measure: Duration) -> anyhow::Result<()> {
    let leader_id = bench.cluster.wait_leader(1, Duration::from_secs(10)).await?;
    let follower = bench.cluster.node_ids().into_iter().position(|id| id != leader_id).ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let mut leader = bench.leaders[&1].clone();
    leader.create(CreateRequest { path: "/load".into(), ..CreateRequest::default() }).await?;
    let watcher = open(&nodes[follower]).await?;
    let create = WatchCreate { path: "/load".into(), recursive: true, consistency: Consistency::Stale as i32, ..WatchCreate::default() };
    watcher.requests.send(WatchRequest { request: Some(WatchRequestKind::Create(create)) }).await?;
    watcher.wait_created(1).await?;
    for client in 0..clients {
        leader.create(CreateRequest { path: format!("/load/k{client}"), ..CreateRequest::default() }).await?;
    }
    let received_before = watcher.arrived();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for client in 0..clients {
        let (mut leader, stop, written) = (leader.clone(), stop.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let path = format!("/load/k{client}");
            while !stop.load(Ordering::Relaxed) {
                if leader.set(SetRequest { path: path.clone(), data: vec![b'v'; 256], ..SetRequest::default() }).await.is_ok() {
                    written.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let cpu = super::ServerCpu::start()?;
    let start = Instant::now();
    tokio::time::sleep(measure).await;
    let (writes, received) = (written.load(Ordering::SeqCst), watcher.arrived() - received_before);
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu.finish(received as u64).await?;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await?;
    }
    watcher.task.abort();
    let mut line = json!({"bench": "watch", "run": "recursive", "clients": clients, "seconds": seconds,
                          "writes_per_sec": writes as f64 / seconds, "events_per_sec": received as f64 / seconds,
                          "events_to_writes_ratio": received as f64 / writes.max(1) as f64});
    cpu.insert(&mut line);
    println!("{line}");
    Ok(())
}
