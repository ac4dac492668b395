//! Helpers of the subtree-moving tests (`split.rs`, `split_merge.rs`): filling a subtree
//! through the router, keeping sessions alive, and writers of a counter whose every
//! acknowledged value (with its revision) a watcher must see.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use warden_loadgen::watch_check::{AckedWrite, EventKind};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

/// Nodes created per transaction while filling a subtree.
const NODES_PER_TXN: usize = 125;

/// Renews `sessions` every second until the returned task is aborted.
pub fn keep_alive(mut router: WardenClient<Channel>, sessions: Vec<u64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = router.keep_alive(KeepAliveRequest { session_ids: sessions.clone(), ..KeepAliveRequest::default() }).await;
            tokio::time::sleep(Duration::from_millis(1_000)).await;
        }
    })
}

/// `path` read through the router.
pub async fn get(router: &mut WardenClient<Channel>, path: &str) -> Result<GetResponse, tonic::Status> {
    router.get(GetRequest { path: path.into(), ..GetRequest::default() }).await.map(tonic::Response::into_inner)
}

/// The counter a writer stored in a node's data.
pub fn counter(data: &[u8]) -> u64 {
    data.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

/// Creates `{subtree}/n00000` … (`nodes` of them) holding `data {n}` padded to
/// `value_bytes`, in transactions of at most 125 nodes and 1 MiB.
pub async fn fill(router: &mut WardenClient<Channel>, subtree: &str, nodes: usize, value_bytes: usize) {
    let per_txn = NODES_PER_TXN.min((1 << 20) / value_bytes.max(1)).max(1);
    for batch in 0..nodes.div_ceil(per_txn) {
        let then = (batch * per_txn..((batch + 1) * per_txn).min(nodes))
            .map(|n| {
                let mut data = format!("data {n}").into_bytes();
                data.resize(data.len().max(value_bytes), b'.');
                let create = CreateRequest { path: format!("{subtree}/n{n:05}"), data, ..CreateRequest::default() };
                TxnOp { op: Some(txn_op::Op::Create(create)) }
            })
            .collect();
        router.txn(TxnRequest { then, ..TxnRequest::default() }).await.expect("fill");
    }
}

/// The nodes [`fill`] made, read back in path order.
pub async fn filled(router: &mut WardenClient<Channel>, subtree: &str, nodes: usize) -> Vec<GetResponse> {
    let mut out = Vec::with_capacity(nodes);
    for n in 0..nodes {
        out.push(get(router, &format!("{subtree}/n{n:05}")).await.expect("node"));
    }
    out
}

/// Sets `path` to 1, 2, 3 … until `stop`, recording each acknowledged write with its
/// revision in `acked`; answers how many writes failed and the longest one took (how long
/// writes paused).
pub fn counter_writer(
    mut router: WardenClient<Channel>,
    path: &'static str,
    acked: Arc<Mutex<Vec<AckedWrite>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Duration)> {
    tokio::spawn(async move {
        let (mut failed, mut value, mut longest) = (0, 0u64, Duration::ZERO);
        while !stop.load(Ordering::Relaxed) {
            value += 1;
            let data = value.to_be_bytes().to_vec();
            let started = Instant::now();
            match router.set(SetRequest { path: path.into(), data: data.clone(), ..SetRequest::default() }).await {
                Ok(answer) => {
                    let revision = answer.into_inner().stat.map_or(0, |stat| stat.mod_revision);
                    acked.lock().expect("acked").push(AckedWrite { revision, path: path.into(), kind: EventKind::Changed, data });
                }
                Err(status) => {
                    failed += 1;
                    eprintln!("write to {path} failed: {status}");
                }
            }
            longest = longest.max(started.elapsed());
        }
        (failed, longest)
    })
}

/// Sessions of `ttl_ms` homed in the groups serving each of `homes` (three different
/// groups), kept alive, each owning the ephemeral `{subtree}/eph{i}`. Answers the sessions
/// and the task renewing them.
pub async fn ephemerals_of_three_homes(
    router: &mut WardenClient<Channel>,
    subtree: &str,
    homes: [&str; 3],
    ttl_ms: u64,
) -> ([u64; 3], tokio::task::JoinHandle<()>) {
    let mut sessions = [0; 3];
    for (session, home) in sessions.iter_mut().zip(homes) {
        *session = super::routed::session_homed_at(router, home, ttl_ms).await;
    }
    let groups: std::collections::BTreeSet<u64> = sessions.iter().map(|s| warden_placement::home_group(*s)).collect();
    assert_eq!(groups.len(), 3, "sessions homed in three groups");
    let renewals = keep_alive(router.clone(), sessions.to_vec());
    for (i, session) in sessions.iter().enumerate() {
        let ephemeral = CreateRequest { path: format!("{subtree}/eph{i}"), session_id: *session, ..CreateRequest::default() };
        router.create(ephemeral).await.expect("ephemeral");
    }
    (sessions, renewals)
}

/// After a move: the ephemerals of [`ephemerals_of_three_homes`] stay while their sessions
/// live, and the second one is gone when the close of its session at its home group answers:
/// the group the move took it to noted itself at home at its first check after the move (the
/// home's leader counts it, `holders_noted_by_checks`), so the close ended it there too.
pub async fn check_moved_ephemerals_follow_their_sessions(
    cluster: &warden_shard_node::cluster::Cluster,
    router: &mut WardenClient<Channel>,
    subtree: &str,
    sessions: [u64; 3],
) {
    let home = warden_placement::home_group(sessions[1]);
    let leader = cluster.wait_leader(home, super::routed::TIMEOUT).await.expect("the home group's leader");
    let metrics = cluster.remote_session_metrics(leader).expect("the leader runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics.holders_noted_by_checks.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "no group the move took the session to noted itself at its home");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    router.close_session(CloseSessionRequest { session_id: sessions[1], ..Default::default() }).await.expect("close at home");
    assert_eq!(
        get(router, &format!("{subtree}/eph1")).await.map_err(|status| status.code()).err(),
        Some(tonic::Code::NotFound),
        "the closed session's moved ephemeral is gone when the close answers"
    );
    for i in [0, 2] {
        get(router, &format!("{subtree}/eph{i}")).await.expect("a live session's moved ephemeral stays");
    }
}
