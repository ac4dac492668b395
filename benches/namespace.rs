//! The namespace state machine: applying committed commands, and the lock grant rule.
//!
//! - `namespace/apply_batch`: one batch of committed commands (64 creates, sets or
//!   compare-and-set transactions of 256-byte values) applied as the engine applies a ready's
//!   entries: each into the batch's writes, one RocksDB write (not synced, as in the engine),
//!   then the watch hub is published to (`Harness::apply_batch` over a temporary RocksDB).
//!   `create_under_quota` is `create` under a subtree quota with room: what counting a
//!   quota's usage (and checking its share) adds to apply.
//! - `locks/grant`: the FIFO grant rule (`locks::holders`) over 10,000 queued waiters, and the
//!   whole computation apply runs for every touched lock (`locks::waiters` read through a
//!   `TxnView`, then `locks::holders`) over a lock with stored waiters.
//! - `split/state_machines`: the groups' own work of moving a subtree of 1,000 nodes of
//!   10 KiB (10 MiB) between two state machines, without raft: the source's freeze, every
//!   1 MiB export page read and ingested by the target, the source's hand-over (deleting
//!   the subtree) and the target's descriptor. What a split's write pause costs beyond
//!   replicating the pages (docs/operations.md "Moving a subtree" compares it with the end-to-end pause).

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput};
use prost::Message as _;
use warden_engine::state_machine::ApplyOutput;
use warden_namespace::locks::{self, Waiter};
use warden_namespace::store::TxnView;
use warden_namespace::Limits;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::{
    AcquireLock, Command, CommandResult, ExportSubtree, FreezeSubtree, HandSubtree, IngestSubtree, LockWaiterRecord, SetQuotaShare,
};
use warden_proto::v1::compare::{Op as CompareOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::{Compare, CreateRequest, GetRequest, GroupDescriptor, LockMode, SetRequest, TxnOp, TxnRequest};
use warden_testkit::harness::Harness;

/// Commands per applied batch.
const BATCH: usize = 64;
/// Bytes of each written value.
const VALUE_BYTES: usize = 256;
/// Waiters queued on the stored lock.
const STORED_WAITERS: u64 = 1_000;
/// Waiters in the in-memory grant rule run.
const QUEUED_WAITERS: u64 = 10_000;

fn harness() -> Harness {
    Harness::new(Limits::default()).expect("a namespace over a temporary RocksDB")
}

/// A transaction command of `then` operations behind `compares`, as the service proposes it.
fn txn_command(compares: Vec<Compare>, then: Vec<Op>) -> Vec<u8> {
    let request = TxnRequest { compares, then: then.into_iter().map(|op| TxnOp { op: Some(op) }).collect(), ..TxnRequest::default() };
    Command { now_ms: 1_000_000, principal: String::new(), op: Some(CommandOp::Txn(request)) }.encode_to_vec()
}

fn create(path: String, fill: u8) -> Op {
    Op::Create(CreateRequest { path, data: vec![fill; VALUE_BYTES], ..CreateRequest::default() })
}

fn set(path: String, fill: u8) -> Op {
    Op::Set(SetRequest { path, data: vec![fill; VALUE_BYTES], expected_version: None, routing: None })
}

/// Panics unless every output is a successful transaction: a benchmark that measured
/// refusals would measure the wrong path.
fn assert_succeeded(outputs: Vec<ApplyOutput>) {
    for output in outputs {
        let bytes = output.expect("apply");
        match CommandResult::decode(bytes.as_slice()).expect("a command result").result {
            Some(CommandOutcome::Txn(response)) => assert!(response.succeeded, "a compare failed"),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

/// A namespace with `/bench/<prefix><i>` for every `i` of a batch.
fn harness_with_batch_keys(prefix: &str) -> Harness {
    let mut ns = harness();
    ns.create_simple("/bench", b"").expect("create /bench");
    for i in 0..BATCH {
        ns.create_simple(&format!("/bench/{prefix}{i}"), &[0; VALUE_BYTES]).expect("create key");
    }
    ns
}

/// Benchmarks applying the batches `batch` makes to `ns` (checked to succeed first). Each
/// kind gets its own namespace, dropped before the next one starts, so one kind's RocksDB
/// background work does not run during another's measurement.
fn bench_batches(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut ns: Harness, mut batch: impl FnMut() -> Vec<Vec<u8>>) {
    assert_succeeded(ns.apply_batch(&batch()).expect("write"));
    group.bench_function(name, |b| b.iter_batched(&mut batch, |commands| ns.apply_batch(&commands), BatchSize::SmallInput));
}

/// Batches of creates of new nodes under `/bench`.
fn new_nodes() -> impl FnMut() -> Vec<Vec<u8>> {
    let mut created = 0u64;
    move || {
        (0..BATCH)
            .map(|_| {
                created += 1;
                txn_command(Vec::new(), vec![create(format!("/bench/n{created:012}"), created as u8)])
            })
            .collect()
    }
}

fn apply_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("namespace/apply_batch");
    group.throughput(Throughput::Elements(BATCH as u64));

    // Creates of new nodes under one parent (the parent's children index grows).
    let mut ns = harness();
    ns.create_simple("/bench", b"").expect("create /bench");
    bench_batches(&mut group, "create", ns, new_nodes());

    // The same creates under a subtree quota (with room): what counting costs apply.
    let mut ns = harness();
    ns.create_simple("/bench", b"").expect("create /bench");
    let limits = warden_proto::v1::QuotaLimits { nodes: Some(u64::MAX / 2), bytes: Some(u64::MAX / 2), ..Default::default() };
    let allotment = warden_proto::v1::QuotaCounts { nodes: u64::MAX / 2, bytes: u64::MAX / 2, ..Default::default() };
    let share = SetQuotaShare {
        prefix: "/bench".into(),
        version: 1,
        limits: Some(limits),
        allotment: Some(allotment),
        shrink: false,
        remove: false,
        cap: false,
        records_max: warden_namespace::quota::COUNT_RECORDS_PER_PAGE,
    };
    ns.set_quota_share(share).expect("a quota share");
    bench_batches(&mut group, "create_under_quota", ns, new_nodes());

    // Sets of existing nodes.
    let mut round = 0u8;
    let sets = move || {
        round = round.wrapping_add(1);
        (0..BATCH).map(|i| txn_command(Vec::new(), vec![set(format!("/bench/s{i}"), round)])).collect()
    };
    bench_batches(&mut group, "set", harness_with_batch_keys("s"), sets);

    // Compare-and-set transactions: the key exists (mod_revision > 0), then set it and read
    // its neighbour.
    let mut round = 0u8;
    let txns = move || {
        round = round.wrapping_add(1);
        (0..BATCH)
            .map(|i| {
                let compare = Compare {
                    path: format!("/bench/t{i}"),
                    target: Target::ModRevision as i32,
                    op: CompareOp::Greater as i32,
                    number: 0,
                    ..Compare::default()
                };
                let get = Op::Get(GetRequest { path: format!("/bench/t{}", (i + 1) % BATCH), ..GetRequest::default() });
                txn_command(vec![compare], vec![set(format!("/bench/t{i}"), round), get])
            })
            .collect()
    };
    bench_batches(&mut group, "txn", harness_with_batch_keys("t"), txns);
    group.finish();
}

/// How many waiters hold the lock at `path`, computed as apply does after a change.
fn holding(view: &TxnView<'_>, path: &str) -> usize {
    let meta = view.lock_meta(path).expect("read lock metadata");
    let Ok(waiters) = locks::waiters(view, path, Limits::FIRST_RELEASE.lock_waiters_max) else { panic!("{path} is not a lock") };
    locks::holders(&waiters, meta.as_ref())
}

fn lock_grant(c: &mut Criterion) {
    let mut group = c.benchmark_group("locks/grant");

    // A run of shared waiters behind which an exclusive one queues: the rule walks the run.
    let waiters: Vec<Waiter> = (1..=QUEUED_WAITERS)
        .map(|token| Waiter {
            path: format!("/locks/queue/lock-{token:010}"),
            mode: if token < QUEUED_WAITERS { LockMode::Shared } else { LockMode::Exclusive },
            session_id: 1,
            token,
            request_id: token,
            record: LockWaiterRecord::default(),
        })
        .collect();
    assert_eq!(locks::holders(&waiters, None), QUEUED_WAITERS as usize - 1);
    group.throughput(Throughput::Elements(QUEUED_WAITERS));
    group.bench_function(format!("holders/{QUEUED_WAITERS}_waiters"), |b| b.iter(|| locks::holders(black_box(&waiters), None)));

    // A stored lock with exclusive waiters queued by one session.
    let path = "/locks/queue";
    let mut ns = harness();
    let session_id = ns.create_session(60_000).expect("session").session_id;
    for request_id in 1..=STORED_WAITERS {
        let mode = LockMode::Exclusive as i32;
        ns.lock(AcquireLock { path: path.into(), session_id, mode, request_id, ..AcquireLock::default() }).expect("queue a waiter");
    }
    let reader = ns.reader();
    assert_eq!(holding(&TxnView::new(&reader, None), path), 1);
    group.throughput(Throughput::Elements(STORED_WAITERS));
    group.bench_function(format!("waiters_and_holders/{STORED_WAITERS}_stored_waiters"), |b| {
        b.iter(|| holding(&TxnView::new(&reader, None), black_box(path)));
    });
    group.finish();
}

/// Nodes in the moved subtree, and bytes of each one's data.
const SPLIT_NODES: usize = 1_000;
const SPLIT_VALUE_BYTES: usize = 10 * 1024;

/// A source group serving `/` with `/team/a` holding [`SPLIT_NODES`] nodes.
fn split_source() -> Harness {
    let mut source = Harness::for_group(Limits::default(), 1).expect("source");
    let descriptor =
        |version| GroupDescriptor { group_id: 1, prefix: "/".into(), replicas: vec![1], conf_ver: 1, version, ..GroupDescriptor::default() };
    source.set_descriptor(descriptor(1), 0).expect("descriptor");
    source.create_simple("/team", b"").expect("parent");
    source.create_simple("/team/a", b"").expect("root");
    for chunk in (0..SPLIT_NODES).collect::<Vec<_>>().chunks(64) {
        let then = chunk
            .iter()
            .map(|n| Op::Create(CreateRequest { path: format!("/team/a/n{n:05}"), data: vec![b'.'; SPLIT_VALUE_BYTES], ..CreateRequest::default() }));
        assert_succeeded(source.apply_batch(&[txn_command(Vec::new(), then.collect())]).expect("fill"));
    }
    source
}

/// Freeze, export and ingest every page, hand-over, target descriptor.
fn move_subtree(mut source: Harness) -> Harness {
    let target_id = 7;
    let freeze = FreezeSubtree { prefix: "/team/a".into(), target_group: target_id, into_group: 0 };
    source.placement_step(CommandOp::FreezeSubtree(freeze)).expect("freeze");
    let mut target = Harness::for_group(Limits::default(), target_id).expect("target");
    let mut after_key = Vec::new();
    loop {
        let export = ExportSubtree { prefix: "/team/a".into(), target_group: target_id, after_key: after_key.clone(), bytes_max: 1 << 20 };
        let page = source.export_page(export).expect("page");
        let ingest =
            IngestSubtree { prefix: "/team/a".into(), source_group: 1, records: page.records, operation: target_id, sessions: page.sessions };
        target.placement_step(CommandOp::IngestSubtree(ingest)).expect("ingest");
        if page.next_after_key.is_empty() {
            break;
        }
        after_key = page.next_after_key;
    }
    let served = GroupDescriptor { group_id: 1, prefix: "/".into(), excluded: vec!["/team/a".into()], replicas: vec![1], conf_ver: 1, version: 2 };
    let handed_at =
        source.placement_step(CommandOp::HandSubtree(HandSubtree { target_group: target_id, descriptor: Some(served) })).expect("hand over");
    let own =
        GroupDescriptor { group_id: target_id, prefix: "/team/a".into(), replicas: vec![1], conf_ver: 1, version: 1, ..GroupDescriptor::default() };
    target.set_descriptor(own, handed_at).expect("target descriptor");
    target
}

fn split(c: &mut Criterion) {
    let mut group = c.benchmark_group("split");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((SPLIT_NODES * SPLIT_VALUE_BYTES) as u64));
    group.bench_function("state_machines", |b| {
        b.iter_batched(split_source, |source| assert!(move_subtree(source).get("/team/a/n00000").is_ok()), BatchSize::PerIteration)
    });
    group.finish();
}

criterion_group!(benches, apply_batch, lock_grant, split);
criterion_main!(benches);
