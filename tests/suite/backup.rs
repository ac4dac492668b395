//! `warden admin backup` and `warden admin restore`, run as the real binary
//! against in-process clusters: 100,000 nodes in four groups, a backup while writers go on,
//! a restore into a fresh cluster, and every node acknowledged at or before each group's
//! backup revision there with its data and stat — and none acknowledged after it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::moving::fill;
use crate::support::routed::{at_placement_leader, client, cluster_with_groups, placement_client, start_router, TIMEOUT};
use futures::stream::{self, StreamExt};
use prost::Message as _;
use serde_json::Value;
use tonic::transport::Channel;
use warden_proto::placement::*;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_warden");
/// The subtrees, one per group: `/r` is served by the root group.
const PREFIXES: [&str; 4] = ["/a", "/b", "/c", "/r"];
/// Parents per subtree, and children per parent: 4 × 100 × 250 = 100,000 leaves.
const PARENTS: usize = 100;
const CHILDREN: usize = 250;
/// Creates per transaction while loading (within the first release's 128 operations).
const CREATES_PER_TXN: usize = 125;
/// Ephemeral nodes a session owns under `/a/p0` (not in a backup).
const EPHEMERALS: usize = 3;
/// Longest a backup or restore of this size may take on a loaded machine.
const COMMAND_DEADLINE: Duration = Duration::from_secs(300);

fn seeds(cluster: &Cluster) -> String {
    [1, 2, 3].iter().map(|id| cluster.addr(*id).expect("a node address").to_string()).collect::<Vec<_>>().join(",")
}

/// Runs `warden --json ARGS` to its end (within [`COMMAND_DEADLINE`]): its exit code, stdout
/// and stderr.
async fn warden(args: Vec<String>) -> (i32, String, String) {
    let child = tokio::process::Command::new(BIN)
        .arg("--json")
        .args(&args)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("warden starts");
    let output = tokio::time::timeout(COMMAND_DEADLINE, child.wait_with_output()).await.expect("warden ends in time").expect("warden output");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// Revision per prefix, from a backup's or a restore's JSON summary.
fn revisions(summary: &Value) -> BTreeMap<String, u64> {
    let groups = summary["groups"].as_array().unwrap_or_else(|| panic!("no groups in {summary}"));
    groups.iter().map(|g| (g["prefix"].as_str().unwrap_or_default().to_string(), g["revision"].as_u64().unwrap_or_default())).collect()
}

fn create(path: &str, data: Vec<u8>) -> txn_op::Op {
    txn_op::Op::Create(CreateRequest { path: path.into(), data, ..CreateRequest::default() })
}

async fn txn(router: &mut WardenClient<Channel>, ops: Vec<txn_op::Op>) {
    let then = ops.into_iter().map(|op| TxnOp { op: Some(op) }).collect();
    let response = router.txn(TxnRequest { then, ..TxnRequest::default() }).await.expect("a txn").into_inner();
    assert!(response.succeeded, "a txn of creates failed");
}

fn leaf(prefix: &str, parent: usize, child: usize) -> String {
    format!("{prefix}/p{parent}/n{child}")
}

/// 100,000 leaves under 400 parents, some of them changed twice (a version to keep), and a
/// session with ephemeral nodes under `/a/p0`.
async fn load(router: &WardenClient<Channel>) {
    let mut setup = router.clone();
    for prefix in PREFIXES {
        // A group's prefix node exists from its creation on; `/r` is the root group's.
        let mut ops = if prefix == "/r" { vec![create(prefix, b"subtree".to_vec())] } else { Vec::new() };
        ops.push(create(&format!("{prefix}/load"), Vec::new()));
        ops.extend((0..PARENTS).map(|p| create(&format!("{prefix}/p{p}"), format!("parent {p}").into_bytes())));
        for chunk in ops.chunks(CREATES_PER_TXN) {
            txn(&mut setup, chunk.to_vec()).await;
        }
    }
    let chunks: Vec<(&str, usize, usize)> = PREFIXES
        .iter()
        .flat_map(|prefix| (0..PARENTS).flat_map(move |p| (0..CHILDREN).step_by(CREATES_PER_TXN).map(move |c| (*prefix, p, c))))
        .collect();
    stream::iter(chunks)
        .for_each_concurrent(8, |(prefix, parent, first)| {
            let mut router = router.clone();
            async move {
                let ops = (first..first + CREATES_PER_TXN).map(|c| create(&leaf(prefix, parent, c), leaf(prefix, parent, c).into_bytes())).collect();
                txn(&mut router, ops).await;
            }
        })
        .await;
    for prefix in PREFIXES {
        for round in 0..2 {
            let set = SetRequest { path: leaf(prefix, 7, 7), data: format!("set {round}").into_bytes(), ..SetRequest::default() };
            setup.set(set).await.expect("a set");
        }
    }
    let session = setup.create_session(CreateSessionRequest { ttl_ms: 60_000, ..CreateSessionRequest::default() }).await.expect("a session");
    let session_id = session.into_inner().session_id;
    for e in 0..EPHEMERALS {
        let request = CreateRequest { path: format!("/a/p0/eph{e}"), session_id, ..CreateRequest::default() };
        setup.create(request).await.expect("an ephemeral");
    }
}

/// Creates `PREFIX/load/wN` one at a time in every subtree until `stop`: each acknowledged
/// path with its group's revision.
async fn write_until(router: WardenClient<Channel>, stop: Arc<AtomicBool>) -> Vec<(String, String, u64)> {
    let mut acknowledged = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        for prefix in PREFIXES {
            let path = format!("{prefix}/load/w{n}");
            let request = CreateRequest { path: path.clone(), data: path.clone().into_bytes(), ..CreateRequest::default() };
            // A write whose outcome is unknown is neither required nor forbidden afterwards.
            if let Ok(response) = router.clone().create(request).await {
                let revision = response.into_inner().header.map_or(0, |h| h.revision);
                acknowledged.push((prefix.to_string(), path, revision));
            }
        }
        n += 1;
    }
    acknowledged
}

/// Every node's `(data, stat)` under the preloaded parents, read through `router`.
async fn read_all(router: &WardenClient<Channel>, paths: &[String]) -> BTreeMap<String, Option<(Vec<u8>, Stat)>> {
    stream::iter(paths.iter().cloned())
        .map(|path| {
            let mut router = router.clone();
            async move {
                let request = GetRequest { path: path.clone(), ..GetRequest::default() };
                let node = match router.get(request).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        Some((response.data, response.stat.unwrap_or_default()))
                    }
                    Err(status) => {
                        let error = warden_proto::error_of(&status).map(|e| e.code);
                        assert_eq!(error, Some(warden_error::Code::NoNode as i32), "reading {path}: {status}");
                        None
                    }
                };
                (path, node)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

fn preloaded_paths() -> Vec<String> {
    let mut paths = Vec::new();
    for prefix in PREFIXES {
        paths.push(prefix.to_string());
        for p in 0..PARENTS {
            paths.push(format!("{prefix}/p{p}"));
            paths.extend((0..CHILDREN).map(|c| leaf(prefix, p, c)));
        }
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_load_restores_every_acknowledged_node_into_a_fresh_cluster() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("cluster.backup");
    let source = cluster_with_groups(&["/a", "/b", "/c"]).await;
    let source_router = start_router(&source, 0);
    let source_api = client(source_router.addr);
    load(&source_api).await;

    // The backup, while writers create nodes in every group.
    let stop = Arc::new(AtomicBool::new(false));
    let writers = tokio::spawn(write_until(source_api.clone(), stop.clone()));
    let started = Instant::now();
    let (code, stdout, stderr) =
        warden(vec!["admin".into(), "backup".into(), "--out".into(), file.display().to_string(), "--seeds".into(), seeds(&source)]).await;
    stop.store(true, Ordering::Relaxed);
    let acknowledged = writers.await.expect("the writers");
    assert_eq!(code, 0, "backup failed: {stderr}");
    let backup: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("no JSON summary ({e}): {stdout}"));
    let backup_revisions = revisions(&backup);
    let in_backup = acknowledged.iter().filter(|(prefix, _, revision)| *revision <= backup_revisions[prefix_group(prefix)]).count();
    eprintln!(
        "backup took {:?}: {} bytes, {} writes acknowledged meanwhile ({in_backup} before its revisions)",
        started.elapsed(),
        backup["bytes"],
        acknowledged.len()
    );
    assert!(acknowledged.len() > in_backup && in_backup > 0, "the writers ran both before and after the backup's revisions");
    assert!(!Path::new(&format!("{}.partial", file.display())).exists(), "no partial file is left");

    // A fresh cluster gets it all back.
    let target = cluster_with_groups(&[]).await;
    let restore_args =
        |file: &Path| vec!["admin".into(), "restore".into(), "--from".into(), file.display().to_string(), "--seeds".into(), seeds(&target)];
    // A corrupt copy is refused before anything changes.
    let corrupt = dir.path().join("corrupt.backup");
    let mut bytes = std::fs::read(&file).expect("the backup");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&corrupt, bytes).expect("a corrupt copy");
    let (code, _, stderr) = warden(restore_args(&corrupt)).await;
    assert!(code != 0 && (stderr.contains("corrupt") || stderr.contains("SHA-256")), "a corrupt backup is refused: {stderr}");
    let (code, stdout, stderr) = warden(restore_args(&file)).await;
    assert_eq!(code, 0, "restore failed: {stderr}");
    assert_eq!(revisions(&serde_json::from_str(stdout.trim()).expect("a JSON summary")), backup_revisions);
    let target_router = start_router(&target, 0);
    let mut target_api = client(target_router.addr);

    // Every preloaded node, with its data and stat (the ephemerals' parent less its
    // ephemerals).
    let paths = preloaded_paths();
    let before = read_all(&source_api, &paths).await;
    let after = read_all(&target_api, &paths).await;
    assert_eq!(after.len(), 100_000 + 4 * (PARENTS + 1));
    for (path, node) in &before {
        let (data, mut stat) = node.clone().unwrap_or_else(|| panic!("{path} is in the source"));
        if path == "/a/p0" {
            assert_eq!(stat.num_children, (CHILDREN + EPHEMERALS) as u64);
            stat.num_children -= EPHEMERALS as u64;
        }
        assert_eq!(after[path], Some((data, stat)), "{path} is restored as it was");
    }
    assert_eq!(after[&leaf("/b", 7, 7)].as_ref().map(|(data, stat)| (data.clone(), stat.version)), Some((b"set 1".to_vec(), 2)));
    let children = target_api.get_children(GetChildrenRequest { path: "/a/p0".into(), ..GetChildrenRequest::default() }).await.expect("children");
    let children = children.into_inner().names;
    assert_eq!(children.len(), CHILDREN, "the ephemerals are not restored");
    assert!(children.iter().all(|name| !name.starts_with("eph")), "{children:?}");

    // Each writer's node is there exactly when it was acknowledged at or before its group's
    // backup revision, with its own data and revision.
    let written: Vec<String> = acknowledged.iter().map(|(_, path, _)| path.clone()).collect();
    let restored = read_all(&target_api, &written).await;
    for (prefix, path, revision) in &acknowledged {
        let floor = backup_revisions[prefix_group(prefix)];
        match &restored[path] {
            Some((data, stat)) => {
                assert!(*revision <= floor, "{path} (revision {revision}) came after the backup's revision {floor}, yet was restored");
                assert_eq!((data.as_slice(), stat.create_revision), (path.as_bytes(), *revision));
            }
            None => assert!(*revision > floor, "{path} was acknowledged at revision {revision}, at or before {floor}, and is missing"),
        }
    }

    // The restored groups go on from the backup's revisions (fencing tokens never go back),
    // and take writes; a second restore into them is refused and changes nothing.
    let created = target_api.create(CreateRequest { path: "/c/after".into(), ..CreateRequest::default() }).await.expect("a write after");
    assert!(created.into_inner().header.map_or(0, |h| h.revision) > backup_revisions["/c"]);
    // The same file again restores nothing more: every group took it already (how an
    // interrupted restore is finished), and the write after it stays.
    let (code, _, stderr) = warden(restore_args(&file)).await;
    assert_eq!(code, 0, "the same backup again changes nothing: {stderr}");
    assert!(read_all(&target_api, &["/c/after".to_string()]).await["/c/after"].is_some(), "the write after the restore stays");
    assert_eq!(read_all(&target_api, &[leaf("/c", 1, 1)]).await, read_all(&source_api, &[leaf("/c", 1, 1)]).await);
}

/// The prefix of the group serving a writer's subtree (each subtree is its own group's
/// prefix, but `/r`, served by the root group).
fn prefix_group(prefix: &str) -> &str {
    if prefix == "/r" {
        "/"
    } else {
        prefix
    }
}

fn backup_args(cluster: &Cluster, file: &Path) -> Vec<String> {
    vec!["admin".into(), "backup".into(), "--out".into(), file.display().to_string(), "--seeds".into(), seeds(cluster)]
}

fn restore_args(cluster: &Cluster, file: &Path) -> Vec<String> {
    vec!["admin".into(), "restore".into(), "--from".into(), file.display().to_string(), "--seeds".into(), seeds(cluster)]
}

/// How many times each node's path is in the backup `file` (summed over its groups' pages).
fn paths_in(file: &Path) -> BTreeMap<String, usize> {
    let bytes = std::fs::read(file).expect("the backup");
    let mut paths = BTreeMap::new();
    let mut rest = bytes.as_slice();
    while let Some((length, tail)) = rest.split_first_chunk::<4>() {
        let (frame, tail) = tail.split_at(u32::from_be_bytes(*length) as usize);
        rest = tail;
        if let Some(backup_frame::Frame::Page(page)) = BackupFrame::decode(frame).expect("a frame").frame {
            for key in page.records.iter().map(|record| &record.key).filter(|key| key.first() == Some(&b'n')) {
                *paths.entry(String::from_utf8_lossy(&key[1..]).into_owned()).or_default() += 1;
            }
        }
    }
    paths
}

/// The nodes [`fill`] makes under `subtree`, with the subtree's root.
fn filled_paths(subtree: &str, nodes: usize) -> Vec<String> {
    std::iter::once(subtree.to_string()).chain((0..nodes).map(|n| format!("{subtree}/n{n:05}"))).collect()
}

/// Nodes per subtree in the tests of moves and interrupted restores.
const SMALL: usize = 200;
/// How long a move is held while a backup runs before it goes on (the backup is either done
/// by then or waiting for the move).
const MOVE_HELD: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
enum Move {
    /// `/t`, a subtree of the root group, split into a group of its own.
    Split,
    /// `/t`, a group of its own, merged into the root group.
    Merge,
}

/// A backup while `/t` moves, held after its hand-over (at `step`) and then let go on: the
/// backup is refused naming the move, or holds every path exactly once; and once the move is
/// done, a backup holds every path exactly once.
async fn backup_across(operation: Move, step: u8) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cluster = cluster_with_groups(if let Move::Merge = operation { &["/t"] } else { &[] }).await;
    let router = start_router(&cluster, 0);
    let mut api = client(router.addr);
    for path in ["/t", "/k"] {
        if matches!(operation, Move::Split) || path == "/k" {
            api.create(CreateRequest { path: path.into(), ..CreateRequest::default() }).await.expect("a subtree's root");
        }
    }
    fill(&mut api, "/t", SMALL, 16).await;
    fill(&mut api, "/k", 20, 16).await;
    let expected: Vec<String> = filled_paths("/t", SMALL).into_iter().chain(filled_paths("/k", 20)).collect();

    cluster.faults().hold_split_at(step);
    let placement_leader = cluster.wait_leader(warden_placement::PLACEMENT_GROUP_ID, TIMEOUT).await.expect("placement leader");
    let mut placement = placement_client(&cluster, placement_leader);
    let moving = tokio::spawn(async move {
        let prefix = "/t".to_string();
        match operation {
            Move::Split => placement.split_group(CreateGroupRequest { prefix }).await.map(drop),
            Move::Merge => placement.merge_group(RemoveGroupRequest { prefix }).await.map(drop),
        }
    });
    let deadline = Instant::now() + TIMEOUT;
    while cluster.faults().split_reached() != Some(step) {
        assert!(Instant::now() < deadline, "the {operation:?} never reached step {step}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let file = dir.path().join("across.backup");
    let mut backup = tokio::spawn(warden(backup_args(&cluster, &file)));
    let early = tokio::time::timeout(MOVE_HELD, &mut backup).await;
    cluster.faults().release_split();
    let (code, _, stderr) = match early {
        Ok(done) => done,
        Err(_) => backup.await,
    }
    .expect("the backup");
    moving.await.expect("the move's call").expect("the move");
    if code == 0 {
        let paths = paths_in(&file);
        for path in &expected {
            assert_eq!(paths.get(path), Some(&1), "{operation:?}: {path} must be in the backup exactly once");
        }
    } else {
        assert!(
            stderr.contains("/t") && (stderr.contains("merging") || stderr.contains("split off")),
            "{operation:?}: refused, naming the move: {stderr}"
        );
    }

    let settled = dir.path().join("settled.backup");
    let (code, _, stderr) = warden(backup_args(&cluster, &settled)).await;
    assert_eq!(code, 0, "a backup once the move is done: {stderr}");
    let paths = paths_in(&settled);
    assert!(expected.iter().all(|path| paths.get(path) == Some(&1)), "{operation:?}: every path once once the move is done");
    cluster.faults().heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_while_a_split_hands_over_is_refused_or_holds_every_path_once() {
    // Held after the source handed the subtree over, before the new group serves it.
    backup_across(Move::Split, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_while_a_merge_hands_over_is_refused_or_holds_every_path_once() {
    // Held after the merged group handed the subtree over, before its parent serves it.
    backup_across(Move::Merge, 5).await;
}

/// Whether a client write to `path` is refused by group `group` because a restore writes it
/// (asked of its leader directly: a router would retry).
async fn restoring(cluster: &Cluster, group: u64, path: &str) -> bool {
    let Ok(leader) = cluster.wait_leader(group, TIMEOUT).await else { return false };
    let Some(addr) = cluster.addr(leader) else { return false };
    let mut node = client(addr);
    let routing = Some(Routing { group_id: group, ..Routing::default() });
    // Deleting an absent node: refused NO_NODE by a group that takes writes, changing nothing.
    match node.delete(DeleteRequest { path: path.into(), routing, ..DeleteRequest::default() }).await {
        Err(status) => {
            warden_proto::error_of(&status).is_some_and(|e| e.code == warden_error::Code::Unavailable as i32 && e.message.contains("restor"))
        }
        Ok(_) => false,
    }
}

/// The id of the group serving exactly `prefix` in `cluster`'s routing table.
async fn group_at(cluster: &Cluster, prefix: &str) -> Option<u64> {
    let table = at_placement_leader(cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.ok()?;
    table.groups.iter().filter(|g| g.ready).filter_map(|g| g.descriptor.as_ref()).find(|d| d.prefix == prefix).map(|d| d.group_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_killed_half_way_is_finished_by_running_it_again() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let source = cluster_with_groups(&["/a", "/b"]).await;
    let source_router = start_router(&source, 0);
    let mut source_api = client(source_router.addr);
    source_api.create(CreateRequest { path: "/r".into(), ..CreateRequest::default() }).await.expect("/r");
    fill(&mut source_api, "/r", 20, 16).await;
    fill(&mut source_api, "/a", SMALL, 16).await;
    // Pages of 1 MiB: `/b`'s group takes several, so a restore is seen writing it.
    fill(&mut source_api, "/b", SMALL, 40 << 10).await;
    let quota = QuotaLimits { nodes: Some(10_000), ..QuotaLimits::default() };
    at_placement_leader(
        &source,
        |mut c| async move { c.set_quota(SetQuotaRequest { prefix: "/a".into(), limits: Some(quota), remove: false }).await },
    )
    .await
    .expect("a quota");
    let limits = ApplyLimits { value_bytes_max: Some(100_000), ..ApplyLimits::default() };
    at_placement_leader(&source, |mut c| async move { c.set_limits(SetLimitsRequest { changes: Some(limits) }).await }).await.expect("limits");
    let grant = ChangeAclRequest { prefix: "/a".into(), principal: "alice".into(), permissions: Permission::Read as u32, revoke: false };
    at_placement_leader(&source, |mut c| {
        let grant = grant.clone();
        async move { c.change_acl(grant).await }
    })
    .await
    .expect("a grant");
    let file = dir.path().join("cluster.backup");
    let (code, _, stderr) = warden(backup_args(&source, &file)).await;
    assert_eq!(code, 0, "backup failed: {stderr}");

    // Killed once the root's and `/a`'s groups are restored and `/b`'s is being written.
    let target = cluster_with_groups(&[]).await;
    let mut restore = tokio::process::Command::new(BIN)
        .args(restore_args(&target, &file))
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("warden starts");
    let deadline = Instant::now() + COMMAND_DEADLINE;
    loop {
        assert!(Instant::now() < deadline, "the restore never wrote /b's group");
        assert!(restore.try_wait().expect("the restore's state").is_none(), "the restore ended before it was seen writing /b's group");
        if let Some(group) = group_at(&target, "/b").await {
            if restoring(&target, group, "/b/absent").await {
                break;
            }
        }
    }
    restore.start_kill().expect("SIGKILL");
    restore.wait().await.expect("the restore ends");
    let b = group_at(&target, "/b").await.expect("/b's group");
    assert!(restoring(&target, b, "/b/absent").await, "the killed restore left /b's group refusing writes");

    let (code, _, stderr) = warden(restore_args(&target, &file)).await;
    assert_eq!(code, 0, "running the restore again finishes it: {stderr}");
    let target_router = start_router(&target, 0);
    let mut target_api = client(target_router.addr);
    let paths: Vec<String> = ["/r", "/a", "/b"].iter().flat_map(|subtree| filled_paths(subtree, if *subtree == "/r" { 20 } else { SMALL })).collect();
    assert_eq!(read_all(&target_api, &paths).await, read_all(&source_api, &paths).await, "every node as it was");
    for subtree in ["/r", "/a", "/b"] {
        let request = CreateRequest { path: format!("{subtree}/after"), ..CreateRequest::default() };
        target_api.create(request).await.unwrap_or_else(|e| panic!("{subtree}'s group takes writes: {e}"));
    }
    let quotas = at_placement_leader(&target, |mut c| async move { c.list_quotas(ListQuotasRequest {}).await }).await.expect("quotas");
    assert!(quotas.quotas.iter().any(|q| q.prefix == "/a" && q.limits == Some(quota)), "the quota arrived: {quotas:?}");
    let restored_limits = at_placement_leader(&target, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await.expect("limits");
    assert_eq!(restored_limits.value_bytes_max, Some(100_000), "the limits arrived");
    let table = at_placement_leader(&target, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
    let grants = table.acl.map(|acl| acl.grants).unwrap_or_default();
    assert!(grants.iter().any(|g| g.prefix == "/a" && g.principal == "alice"), "the grant arrived: {grants:?}");

    // Another backup (of other contents) is refused: the groups hold what this one restored.
    source_api.create(CreateRequest { path: "/a/later".into(), ..CreateRequest::default() }).await.expect("a later write");
    let later = dir.path().join("later.backup");
    let (code, _, stderr) = warden(backup_args(&source, &later)).await;
    assert_eq!(code, 0, "backup failed: {stderr}");
    let (code, _, stderr) = warden(restore_args(&target, &later)).await;
    assert!(code != 0 && stderr.contains("holds nodes"), "another backup into a restored cluster is refused: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_records_another_group_would_serve_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let source = cluster_with_groups(&["/a"]).await;
    let source_router = start_router(&source, 0);
    let mut source_api = client(source_router.addr);
    source_api.create(CreateRequest { path: "/x".into(), ..CreateRequest::default() }).await.expect("/x");
    fill(&mut source_api, "/x", 20, 16).await;
    fill(&mut source_api, "/a", 20, 16).await;
    let file = dir.path().join("cluster.backup");
    let (code, _, stderr) = warden(backup_args(&source, &file)).await;
    assert_eq!(code, 0, "backup failed: {stderr}");

    // `/x` is a plain subtree of the root group in the backup, an (empty) group here.
    let target = cluster_with_groups(&["/x"]).await;
    let table = |cluster: Arc<Cluster>| async move {
        let table = at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
        table.groups.iter().filter_map(|g| g.descriptor.clone()).map(|d| (d.group_id, d.prefix, d.version)).collect::<Vec<_>>()
    };
    let before = table(target.clone()).await;
    let (code, _, stderr) = warden(restore_args(&target, &file)).await;
    assert!(code != 0 && stderr.contains("holds /x") && stderr.contains("(/x) serves"), "refused, naming the record and the group: {stderr}");
    assert_eq!(table(target.clone()).await, before, "no group was created or changed");
    let target_router = start_router(&target, 0);
    let mut target_api = client(target_router.addr);
    target_api.create(CreateRequest { path: "/fresh".into(), ..CreateRequest::default() }).await.expect("the root group takes writes");
    assert_eq!(read_all(&target_api, &filled_paths("/a", 20)).await.values().flatten().count(), 0, "nothing was restored");
}
