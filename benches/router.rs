//! Router route lookup: the group serving a path, by longest prefix (by segments) over the
//! router's copy of the routing table (`warden_proto::routing::Table::route`), with 10,000 ready groups.
//! Every request the router forwards pays one lookup.
//!
//! Prefixes are `/tenants/tNN/svcNN` (100 × 100) under the root group; the paths looked up
//! are deeper paths below them (a lock, an instance, a config key) and paths only the root
//! group serves.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use warden_proto::placement::{GroupEntry, RoutingTable};
use warden_proto::routing::Table;
use warden_proto::v1::GroupDescriptor;

const TENANTS: u64 = 100;
const SERVICES: u64 = 100;
const LOOKUPS: usize = 1_000;

fn prefix(tenant: u64, service: u64) -> String {
    format!("/tenants/t{tenant:02}/svc{service:02}")
}

/// A table of the root group and one ready group per tenant service.
fn table() -> Table {
    let entry = |group_id: u64, prefix: String| GroupEntry {
        descriptor: Some(GroupDescriptor { group_id, prefix, replicas: vec![1, 2, 3, 4, 5], version: 1, ..GroupDescriptor::default() }),
        ready: true,
        learners: Vec::new(),
        merging_into: 0,
        retired: false,
    };
    let mut groups = vec![entry(1, "/".into())];
    for tenant in 0..TENANTS {
        for service in 0..SERVICES {
            groups.push(entry(2 + tenant * SERVICES + service, prefix(tenant, service)));
        }
    }
    Table::from_proto(RoutingTable { version: 1, nodes: Vec::new(), groups, scheduler_paused: false, acl: None })
}

/// Paths to route, with the group each must route to.
fn lookups() -> Vec<(String, u64)> {
    let mut rng = StdRng::seed_from_u64(13);
    (0..LOOKUPS)
        .map(|n| {
            let (tenant, service) = (rng.random_range(0..TENANTS), rng.random_range(0..SERVICES));
            let group = 2 + tenant * SERVICES + service;
            match n % 4 {
                0 => (format!("{}/locks/job-{n}", prefix(tenant, service)), group),
                1 => (format!("{}/instances/node-{n:04}", prefix(tenant, service)), group),
                2 => (format!("{}/config/flags/checkout/variant-{n}", prefix(tenant, service)), group),
                // Beside the prefixes (`svc` + three digits is no prefix): the root group's.
                _ => (format!("/tenants/t{tenant:02}/svc{service:03}/x"), 1),
            }
        })
        .collect()
}

fn route(c: &mut Criterion) {
    let table = table();
    let lookups = lookups();
    for (path, group) in &lookups {
        assert_eq!(table.route(path).map(|route| route.id()), Some(*group), "{path}");
    }
    let mut group = c.benchmark_group("router/route");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function(format!("longest_prefix/{}_routes", TENANTS * SERVICES + 1), |b| {
        b.iter(|| {
            next = (next + 1) % lookups.len();
            table.route(black_box(&lookups[next].0)).map(|route| route.id())
        });
    });
    group.finish();
}

criterion_group!(benches, route);
criterion_main!(benches);
