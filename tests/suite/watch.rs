//! Watches over gRPC on a 5-replica group. Histories of watch events recorded under faults
//! (leader kills, partitions, watcher reconnects) are checked with the validators of
//! `warden_loadgen::watch_check` (ordered, unique, atomic, reliable, resumable, and a
//! follower's watch equal to the leader's); then one-shot semantics, read + watch under
//! concurrent writers, slow-watcher cancellation, compaction, lock and session nodes as
//! events, and progress notifications.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::api::{namespace_cluster, namespace_cluster_with, ApiClient, CallError};
use crate::support::watch::{events_of, persistent, WatchConn};
use warden_loadgen::watch_check::{self, AckedWrite, Delivery, EventKind};
use warden_namespace::watch::{WatchHubs, WatchLimits};
use warden_namespace::NamespaceFactory;
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_create::Kind;
use warden_proto::v1::watch_created::Read;
use warden_proto::v1::watch_event::Type;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;
use warden_shard_node::cluster::{Cluster, ClusterConfig};

const TIMEOUT: Duration = Duration::from_secs(20);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

async fn create(api: &ApiClient, path: &str, data: &[u8]) -> u64 {
    let request = CreateRequest { path: path.into(), data: data.to_vec(), create_parents: true, ..CreateRequest::default() };
    let response = api
        .call(TIMEOUT, false, |mut c| {
            let request = request.clone();
            async move { c.create(request).await }
        })
        .await
        .expect("create");
    response.header.expect("header").revision
}

async fn set(api: &ApiClient, path: &str, data: &[u8]) -> u64 {
    let request = SetRequest { path: path.into(), data: data.to_vec(), ..SetRequest::default() };
    let response = api
        .call(TIMEOUT, false, |mut c| {
            let request = request.clone();
            async move { c.set(request).await }
        })
        .await
        .expect("set");
    response.header.expect("header").revision
}

async fn sync_revision(api: &ApiClient) -> u64 {
    let response = api.call(TIMEOUT, true, |mut c| async move { c.sync(SyncRequest::default()).await }).await.expect("sync");
    response.header.expect("header").revision
}

/// What the writers did: acknowledged writes (with their revisions) and every attempt.
#[derive(Default)]
struct WriteLog {
    acked: Vec<AckedWrite>,
    attempted: HashSet<(String, Vec<u8>)>,
}

/// Creates, sets and deletes its own keys under `/w` and runs two-node transactions until
/// `stop`, logging what was acknowledged at which revision.
async fn writer(api: ApiClient, client: usize, stop: Arc<AtomicBool>, log: Arc<Mutex<WriteLog>>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("/w/c{client}-k{}", n % 5);
        let data = format!("c{client}-n{n}").into_bytes();
        let ops: Vec<(String, EventKind, Vec<u8>, Op)> = match n % 4 {
            0 => vec![(key.clone(), EventKind::Created, data.clone(), Op::Create(CreateRequest { path: key, data, ..CreateRequest::default() }))],
            1 => vec![(key.clone(), EventKind::Changed, data.clone(), Op::Set(SetRequest { path: key, data, ..SetRequest::default() }))],
            2 => vec![(key.clone(), EventKind::Deleted, Vec::new(), Op::Delete(DeleteRequest { path: key, ..DeleteRequest::default() }))],
            _ => {
                let parent = format!("/w/c{client}-t{n}");
                let child = format!("{parent}/x");
                let child_data = format!("c{client}-n{n}-x").into_bytes();
                vec![
                    (parent.clone(), EventKind::Created, data.clone(), Op::Create(CreateRequest { path: parent, data, ..CreateRequest::default() })),
                    (
                        child.clone(),
                        EventKind::Created,
                        child_data.clone(),
                        Op::Create(CreateRequest { path: child, data: child_data, ..CreateRequest::default() }),
                    ),
                ]
            }
        };
        {
            let mut log = log.lock().expect("log");
            for (path, _, data, _) in &ops {
                log.attempted.insert((path.clone(), data.clone()));
            }
        }
        let request = TxnRequest { then: ops.iter().map(|(_, _, _, op)| TxnOp { op: Some(op.clone()) }).collect(), ..TxnRequest::default() };
        let result = api
            .call(CALL_TIMEOUT, false, |mut c| {
                let request = request.clone();
                async move { c.txn(request).await }
            })
            .await;
        match result {
            Ok(response) => {
                assert!(response.succeeded, "no compares: the transaction runs");
                let revision = response.header.expect("header").revision;
                let mut log = log.lock().expect("log");
                for (path, kind, data, _) in ops {
                    log.acked.push(AckedWrite { revision, path, kind, data });
                }
            }
            // Refused (the key did not exist, or did already): nothing changed.
            Err(CallError::Refused(_)) => {}
            // Unknown outcome: only attempted.
            Err(CallError::Unknown(_)) => {}
        }
    }
}

/// What one resuming watcher saw: its responses, and where each of its streams began.
#[derive(Default)]
struct Recorded {
    responses: Vec<Vec<watch_check::Event>>,
    segments: Vec<usize>,
}

/// Watches `/w` recursively from `start`, first on `first_node`; whenever its stream fails,
/// is cancelled or a node refuses it (down, or compacted after a restart) it moves to the
/// next node and resumes from the last revision it saw + 1, as a client would; with
/// `drop_every` it also drops its stream on purpose after that many event responses.
/// Stops once it has seen `until` (when set).
async fn resuming_watcher(cluster: Arc<Cluster>, first_node: u64, start: u64, drop_every: Option<usize>, until: Arc<AtomicU64>) -> Recorded {
    let ids = cluster.node_ids();
    let mut node_index = ids.iter().position(|id| *id == first_node).expect("node");
    let mut next = start;
    let mut recorded = Recorded::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = |next: u64| {
        let target = until.load(Ordering::SeqCst);
        target != 0 && next > target
    };
    'streams: while !done(next) {
        assert!(Instant::now() < deadline, "the watcher never caught up (at revision {next})");
        let node = ids[node_index % ids.len()];
        node_index += 1;
        let Ok(mut conn) = WatchConn::open(cluster.addr(node).expect("addr")).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match conn.create(persistent("/w", true, next)).await {
            Ok(answer) if answer.created.is_some() => {}
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        recorded.segments.push(recorded.responses.len());
        let mut in_stream = 0;
        while !done(next) {
            match conn.next(Duration::from_millis(300)).await {
                Ok(None) => {}
                Ok(Some(response)) if response.canceled.is_some() => continue 'streams,
                Ok(Some(response)) => {
                    let events = events_of(&response);
                    let Some(last) = events.last() else { continue };
                    next = last.revision + 1;
                    recorded.responses.push(events);
                    in_stream += 1;
                    if drop_every.is_some_and(|every| in_stream >= every) {
                        continue 'streams;
                    }
                }
                Err(_) => continue 'streams,
            }
        }
    }
    recorded
}

/// `responses` without events after `last` (a write with an unknown outcome may land after
/// the final revision was read).
fn up_to(responses: &[Vec<watch_check::Event>], last: u64) -> Delivery {
    let responses = responses
        .iter()
        .map(|events| events.iter().filter(|e| e.revision <= last).cloned().collect::<Vec<_>>())
        .filter(|events| !events.is_empty())
        .collect();
    Delivery { responses }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_histories_under_leader_kills_partitions_and_reconnects_are_ordered_unique_atomic_reliable_resumable() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let start = create(&api, "/w", b"").await + 1;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let follower = cluster.node_ids().into_iter().find(|id| *id != leader).expect("a follower");
    let other = cluster.node_ids().into_iter().find(|id| *id != leader && *id != follower).expect("another node");
    let until = Arc::new(AtomicU64::new(0));
    let on_follower = tokio::spawn(resuming_watcher(cluster.clone(), follower, start, None, until.clone()));
    let on_leader = tokio::spawn(resuming_watcher(cluster.clone(), leader, start, None, until.clone()));
    let reconnecting = tokio::spawn(resuming_watcher(cluster.clone(), other, start, Some(15), until.clone()));

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(WriteLog::default()));
    let writers: Vec<_> = (0..3).map(|client| tokio::spawn(writer(api.clone(), client, stop.clone(), log.clone()))).collect();
    // Faults: kill the leader and bring it back, then cut a follower off and heal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    cluster.kill(killed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.restart(killed).expect("restart");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let leader_now = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let cut = cluster.node_ids().into_iter().find(|id| *id != leader_now && *id != killed).expect("a follower to cut off");
    cluster.faults().isolate(cut, &cluster.node_ids());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.faults().heal();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    let last = sync_revision(&api).await;
    until.store(last, Ordering::SeqCst);
    let recorded = [on_follower.await.expect("watcher"), on_leader.await.expect("watcher"), reconnecting.await.expect("watcher")];

    let log = log.lock().expect("log");
    assert!(log.acked.len() > 50, "the writers made progress through the faults ({} acked)", log.acked.len());
    assert!(recorded[2].segments.len() > 3, "the reconnecting watcher reconnected");
    let deliveries: Vec<Delivery> = recorded.iter().map(|r| up_to(&r.responses, last)).collect();
    for (name, delivery) in ["follower", "leader", "reconnecting"].iter().zip(&deliveries) {
        let check = || -> Result<(), watch_check::Violation> {
            watch_check::check_all(delivery)?;
            watch_check::check_contiguous(delivery, start, last)?;
            watch_check::check_reliable(delivery, &log.acked, start, last, |path| path.starts_with("/w/"))?;
            watch_check::check_no_phantoms(delivery, &log.attempted)
        };
        if let Err(violation) = check() {
            panic!("{name} watcher: {violation}");
        }
    }
    watch_check::check_same_sequence(&deliveries[1], &deliveries[0], start, last).expect("a follower's watch sees what the leader's sees");
    watch_check::check_same_sequence(&deliveries[1], &deliveries[2], start, last).expect("reconnecting loses and repeats nothing");
    let split = recorded[2].segments[1];
    let first = Delivery { responses: deliveries[2].responses[..split].to_vec() };
    let resumed = Delivery { responses: deliveries[2].responses[split..].to_vec() };
    watch_check::check_resumed(&first, &resumed, &deliveries[1]).expect("resuming from the last seen revision yields exactly the rest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_watches_fire_once_and_a_read_with_watch_misses_no_change() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    create(&api, "/counter", b"0").await;
    create(&api, "/p", b"").await;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let follower = cluster.node_ids().into_iter().find(|id| *id != leader).expect("a follower");
    let mut conn = WatchConn::open(cluster.addr(follower).expect("addr")).await.expect("stream");

    // Exists on a missing node fires on its creation; a children watch on the first child only.
    let exists = WatchCreate { watch_id: 1, path: "/later".into(), kind: Kind::Exists as i32, read: true, ..WatchCreate::default() };
    let answer = conn.create(exists).await.expect("created");
    assert!(matches!(answer.created.and_then(|c| c.read), Some(Read::Exists(ExistsResponse { stat: None, .. }))));
    let children = WatchCreate { watch_id: 2, path: "/p".into(), kind: Kind::Children as i32, read: true, ..WatchCreate::default() };
    let answer = conn.create(children).await.expect("created");
    assert!(matches!(answer.created.and_then(|c| c.read), Some(Read::Children(GetChildrenResponse { ref names, .. })) if names.is_empty()));
    create(&api, "/later", b"x").await;
    create(&api, "/p/a", b"").await;
    create(&api, "/p/b", b"").await;
    set(&api, "/later", b"y").await;

    // Read + watch while a writer keeps changing the node: the watch fires on exactly the
    // change after the state read (its previous state is the one read), once.
    let stop = Arc::new(AtomicBool::new(false));
    let counter_writer = {
        let (api, stop) = (api.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                set(&api, "/counter", n.to_string().as_bytes()).await;
            }
        })
    };
    let mut fired = std::collections::BTreeMap::new();
    let mut reads = std::collections::BTreeMap::new();
    for watch_id in 10..40u64 {
        let watch = WatchCreate { watch_id, path: "/counter".into(), kind: Kind::Data as i32, read: true, prev_data: true, ..WatchCreate::default() };
        conn.send(WatchRequestKind::Create(watch)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + TIMEOUT;
    while fired.len() < 30 + 2 || reads.len() < 30 {
        assert!(Instant::now() < deadline, "watches did not fire: {fired:?}");
        let Some(response) = conn.next(Duration::from_secs(1)).await.expect("stream") else { continue };
        if let Some(created) = response.created {
            if let Some(Read::Get(get)) = created.read {
                reads.insert(response.watch_id, (response.header.expect("header").revision, get.stat.expect("stat").mod_revision, get.data));
            }
            continue;
        }
        assert!(response.canceled.is_none(), "watch {} cancelled: {:?}", response.watch_id, response.canceled);
        assert!(fired.insert(response.watch_id, response.events.clone()).is_none(), "one-shot watch {} fired twice", response.watch_id);
    }
    stop.store(true, Ordering::SeqCst);
    counter_writer.await.expect("writer");
    // Nothing more arrives for fired watches (more changes happened meanwhile).
    set(&api, "/later", b"z").await;
    create(&api, "/p/c", b"").await;
    if let Some(extra) = conn.next(Duration::from_millis(500)).await.expect("stream") {
        panic!("a one-shot watch fired again: {extra:?}");
    }
    assert_eq!(fired[&1].iter().map(|e| (e.r#type, e.path.as_str())).collect::<Vec<_>>(), vec![(Type::Created as i32, "/later")]);
    assert_eq!(fired[&2].iter().map(|e| (e.r#type, e.path.as_str())).collect::<Vec<_>>(), vec![(Type::Created as i32, "/p/a")]);
    for watch_id in 10..40u64 {
        let (read_revision, read_mod_revision, read_data) = &reads[&watch_id];
        let events = &fired[&watch_id];
        assert_eq!(events.len(), 1);
        let event = &events[0];
        assert!(event.revision > *read_revision, "watch {watch_id} fired on a change the read already saw");
        assert_eq!(event.prev_stat.map(|s| s.mod_revision), Some(*read_mod_revision), "watch {watch_id} missed a change after its read");
        assert_eq!(&event.prev_data[..], &read_data[..]);
    }
}

fn factory(limits: WatchLimits) -> NamespaceFactory {
    NamespaceFactory { hubs: WatchHubs::new(limits), ..NamespaceFactory::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_is_cancelled_with_a_resume_revision_that_yields_the_rest() {
    let limits = WatchLimits { stream_queue_bytes_max: 256 << 10, ..WatchLimits::default() };
    let cluster = namespace_cluster_with(ClusterConfig::default(), factory(limits)).await;
    let api = ApiClient::new(&cluster);
    let start = create(&api, "/big", b"").await + 1;
    let node = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let mut slow = WatchConn::open(cluster.addr(node).expect("addr")).await.expect("stream");
    slow.create(persistent("/big", false, 0)).await.expect("created");
    // The client reads nothing while 40 × 64 KiB of events are written: more than the
    // transport's windows and buffers plus the stream's 256 KiB queue.
    let mut last = 0;
    for n in 0..40u8 {
        last = set(&api, "/big", &vec![n; 64 << 10]).await;
    }
    let mut delivered = Vec::new();
    let resume = loop {
        let response = slow.next(TIMEOUT).await.expect("stream").expect("a response");
        if let Some(canceled) = response.canceled {
            let error = canceled.error.expect("a reason");
            assert_eq!(error.code, Code::SlowWatcher as i32, "{error:?}");
            break canceled.resume_revision;
        }
        delivered.extend(events_of(&response));
    };
    assert!(resume > start && resume <= last, "cancelled part way ({start}..{last}), resume at {resume}");
    assert_eq!(delivered.last().map(|e| e.revision + 1), Some(resume), "resume right after the last delivered event");
    let mut again = WatchConn::open(cluster.addr(node).expect("addr")).await.expect("stream");
    again.create(persistent("/big", false, resume)).await.expect("created");
    while delivered.last().map(|e| e.revision) != Some(last) {
        let response = again.next(TIMEOUT).await.expect("stream").expect("the rest");
        assert!(response.canceled.is_none(), "{response:?}");
        delivered.extend(events_of(&response));
    }
    let revisions: Vec<u64> = delivered.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, (start..=last).collect::<Vec<_>>(), "every write exactly once, in order");
    assert!(delivered.iter().enumerate().all(|(n, e)| e.data == vec![n as u8; 64 << 10]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_older_than_the_history_is_compacted_and_a_newer_one_is_served() {
    let limits = WatchLimits { history_revisions_max: 16, ..WatchLimits::default() };
    let cluster = namespace_cluster_with(ClusterConfig::default(), factory(limits)).await;
    let api = ApiClient::new(&cluster);
    let first = create(&api, "/h", b"").await + 1;
    let mut last = 0;
    for n in 0..40u32 {
        last = set(&api, "/h", n.to_string().as_bytes()).await;
    }
    let node = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let mut conn = WatchConn::open(cluster.addr(node).expect("addr")).await.expect("stream");
    // The refusal comes after the creation (the history is checked as the watch catches up).
    conn.create(persistent("/h", false, first)).await.expect("created");
    let canceled = conn.next(TIMEOUT).await.expect("stream").and_then(|r| r.canceled).expect("cancelled");
    let error = canceled.error.expect("reason");
    assert_eq!(error.code, Code::Compacted as i32);
    assert_eq!(error.compact_revision, last - 16, "sixteen revisions kept");
    conn.create(persistent("/h", false, error.compact_revision + 1)).await.expect("created");
    let mut revisions = Vec::new();
    while revisions.last() != Some(&last) {
        let response = conn.next(TIMEOUT).await.expect("stream").expect("events");
        revisions.extend(response.events.iter().map(|e| e.revision));
    }
    assert_eq!(revisions, (error.compact_revision + 1..=last).collect::<Vec<_>>());
}

/// Reads events from `conn` into `seen` (type, path, ephemeral owner) until it holds `count`.
async fn owned_events_until(conn: &mut WatchConn, seen: &mut Vec<(i32, String, u64)>, count: usize) {
    while seen.len() < count {
        let response = conn.next(TIMEOUT).await.expect("stream").expect("events");
        seen.extend(response.events.into_iter().map(|e| (e.r#type, e.path, e.stat.map_or(0, |s| s.ephemeral_owner))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waiters_and_session_ephemerals_are_node_events() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    create(&api, "/locks/l", b"").await;
    let node = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let mut conn = WatchConn::open(cluster.addr(node).expect("addr")).await.expect("stream");
    conn.create(persistent("/locks", true, 0)).await.expect("created");
    let session = |api: ApiClient| async move {
        api.call(TIMEOUT, false, |mut c| async move { c.create_session(CreateSessionRequest { ttl_ms: 3_000, ..Default::default() }).await })
            .await
            .expect("session")
            .session_id
    };
    let (first, second) = (session(api.clone()).await, session(api.clone()).await);
    let lock = |session_id: u64, wait: bool| LockRequest { path: "/locks/l".into(), session_id, wait, timeout_ms: 10_000, ..LockRequest::default() };
    let held = api.call(TIMEOUT, false, |mut c| async move { c.lock(lock(first, false)).await }).await.expect("lock");
    assert!(held.acquired);
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move { api.call(TIMEOUT, false, |mut c| async move { c.lock(lock(second, true)).await }).await })
    };
    // The second waiter is queued (its creation seen) before the first session closes.
    let mut seen = Vec::new();
    owned_events_until(&mut conn, &mut seen, 2).await;
    api.call(TIMEOUT, false, |mut c| async move { c.close_session(CloseSessionRequest { session_id: first, routing: None }).await })
        .await
        .expect("close");
    let granted = waiting.await.expect("task").expect("lock");
    assert!(granted.acquired);
    owned_events_until(&mut conn, &mut seen, 3).await;
    let first_waiter = held.sequencer.expect("sequencer").waiter;
    let second_waiter = granted.sequencer.expect("sequencer").waiter;
    assert_eq!(
        seen,
        vec![
            (Type::Created as i32, first_waiter.clone(), first),
            (Type::Created as i32, second_waiter, second),
            (Type::Deleted as i32, first_waiter, first),
        ],
        "waiters appear as ephemeral children and go with their session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watches_get_progress_and_watches_cancel_in_band() {
    let limits = WatchLimits { progress_interval_ms: 200, ..WatchLimits::default() };
    let cluster = namespace_cluster_with(ClusterConfig::default(), factory(limits)).await;
    let api = ApiClient::new(&cluster);
    create(&api, "/quiet", b"").await;
    let node = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let mut conn = WatchConn::open(cluster.addr(node).expect("addr")).await.expect("stream");
    let watch = WatchCreate { progress_notify: true, ..persistent("/quiet", false, 0) };
    conn.create(watch).await.expect("created");
    // Writes elsewhere move the group's revision; the idle watch learns it is up to date.
    let elsewhere = create(&api, "/loud", b"").await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        assert!(Instant::now() < deadline, "no progress notification");
        let Some(response) = conn.next(Duration::from_secs(1)).await.expect("stream") else { continue };
        assert!(response.events.is_empty(), "nothing changed under /quiet");
        if response.progress && response.header.expect("header").revision >= elsewhere {
            break;
        }
    }
    // On request too (a watch without progress_notify gets one as well).
    conn.create(persistent("/other", false, 0)).await.expect("created");
    conn.send(WatchRequestKind::Progress(WatchProgressRequest {})).await;
    let mut progressed = HashSet::new();
    let mut other = 0;
    while progressed.len() < 2 {
        let response = conn.next(TIMEOUT).await.expect("stream").expect("progress");
        if response.progress {
            progressed.insert(response.watch_id);
            other = other.max(response.watch_id);
        }
    }
    // Cancelled in-band: confirmed without an error, and no event follows.
    conn.send(WatchRequestKind::Cancel(WatchCancel { watch_id: other })).await;
    let canceled = loop {
        let response = conn.next(TIMEOUT).await.expect("stream").expect("the cancellation");
        if let Some(canceled) = response.canceled {
            break (response.watch_id, canceled);
        }
    };
    assert_eq!((canceled.0, canceled.1.error), (other, None));
    create(&api, "/other", b"").await;
    // A refused creation is answered on the stream, typed, and changes nothing else.
    let refused = conn.create(persistent("no/leading/slash", false, 0)).await.expect("an answer");
    let error = refused.canceled.and_then(|c| c.error).expect("refused");
    assert_eq!(error.code, Code::InvalidPath as i32);
    let bad_kind = WatchCreate { kind: Kind::Data as i32, recursive: true, ..persistent("/quiet", false, 0) };
    let refused = conn.create(bad_kind).await.expect("an answer");
    assert_eq!(refused.canceled.and_then(|c| c.error).map(|e| e.code), Some(Code::InvalidArgument as i32));
    // (The idle /quiet watch keeps getting progress responses meanwhile.)
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if let Some(response) = conn.next(Duration::from_millis(200)).await.expect("stream") {
            assert!(response.events.is_empty() && response.watch_id != other, "nothing for a cancelled watch: {response:?}");
        }
    }
}
