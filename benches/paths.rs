//! Path validation and key encoding: what every request pays before and inside apply.
//!
//! - `validate`: the namespace's path rule (`namespace::path::validate`, placement's shape
//!   rules plus the reserved subtree) over a mix of typical paths, and over refused ones.
//! - `node_key` / `sm_key`: a node's record key in the group's `sm` range, as every read and
//!   write of a node builds it (`namespace::store::node_key`, then `storage::keys::sm_key`).
//! - `log_key`: a raft log entry's key (`storage::keys::log_key`) and its decoding.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use warden_engine::storage::keys;
use warden_namespace::{path, store};

/// Typical paths: short locks, service registries, deep config trees, one long path.
fn typical_paths() -> Vec<String> {
    let mut paths = vec!["/".to_string()];
    for i in 0..32 {
        paths.push(format!("/locks/job-{i}"));
        paths.push(format!("/services/payments/instances/node-{i:04}"));
        paths.push(format!("/tenants/t{i:03}/config/feature-flags/checkout/variant-{i}/enabled"));
        paths.push(format!("/elections/shard-{i}/candidates/lock-{:010}", i * 7919));
    }
    paths.push(format!("/{}", ["segment"; 100].join("/")));
    paths
}

/// Paths the rule refuses, one per reason (the error path must stay cheap too: a client
/// can send any string).
fn refused_paths() -> Vec<String> {
    vec![
        String::new(),
        "relative/path".into(),
        "/trailing/".into(),
        "/a//b".into(),
        "/a/../b".into(),
        "/control\u{7}char".into(),
        "/warden/sessions".into(),
        format!("/{}", "x".repeat(2000)),
        format!("/{}", ["d"; 80].join("/")),
    ]
}

fn validate(c: &mut Criterion) {
    let mut group = c.benchmark_group("paths/validate");
    let typical = typical_paths();
    group.throughput(Throughput::Elements(typical.len() as u64));
    group.bench_function("typical", |b| {
        b.iter(|| typical.iter().filter(|p| path::validate(black_box(p), false).is_ok()).count());
    });
    let refused = refused_paths();
    group.throughput(Throughput::Elements(refused.len() as u64));
    group.bench_function("refused", |b| {
        b.iter(|| refused.iter().filter(|p| path::validate(black_box(p), false).is_err()).count());
    });
    group.finish();
}

fn key_encoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("paths/keys");
    let typical = typical_paths();
    group.throughput(Throughput::Elements(typical.len() as u64));
    group.bench_function("node_key+sm_key", |b| {
        b.iter(|| typical.iter().map(|p| keys::sm_key(black_box(7), &store::node_key(black_box(p))).len()).sum::<usize>());
    });
    let indexes: Vec<u64> = (0..1024).map(|i| 5 + i * 3).collect();
    group.throughput(Throughput::Elements(indexes.len() as u64));
    group.bench_function("log_key_round_trip", |b| {
        b.iter(|| indexes.iter().filter_map(|index| keys::decode_log_key(&keys::log_key(black_box(7), *index))).count());
    });
    group.finish();
}

criterion_group!(benches, validate, key_encoding);
criterion_main!(benches);
