//! The ACL check every public call pays twice with security on: once on the
//! router, once on the node serving the path (`warden_access::authorize`). Measured with a
//! fleet-sized list at its limit of 10,000 grants (a principal per tenant service, 100 × 99,
//! with read, write and lock at the service's prefix, and a group grant of read per tenant),
//! and the paths a call touches below the prefixes (a Set, a 3-path transaction); and a
//! refusal.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use warden_access::{authorize, Access};
use warden_placement::acl::{self, Acl};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::{Compare, SetRequest, TxnOp, TxnRequest};

const TENANTS: u32 = 100;
const SERVICES: u32 = 99;

fn prefix(tenant: u32, service: u32) -> String {
    format!("/tenants/t{tenant:02}/svc{service:02}")
}

fn principal(tenant: u32, service: u32) -> String {
    format!("svc-t{tenant:02}-s{service:02}")
}

/// The fleet's list: a grant per service, a group per tenant with read at its tenant prefix.
fn list() -> Acl {
    let mut list = Acl::default();
    for tenant in 0..TENANTS {
        list.change(&format!("/tenants/t{tenant:02}"), &format!("group:tenant-{tenant:02}"), acl::READ, false, &acl::AclMaxima::DEFAULT)
            .expect("group grant");
        for service in 0..SERVICES {
            list.change(&prefix(tenant, service), &principal(tenant, service), acl::READ | acl::WRITE | acl::LOCK, false, &acl::AclMaxima::DEFAULT)
                .expect("grant");
            list.change_group(&format!("tenant-{tenant:02}"), &principal(tenant, service), false, &acl::AclMaxima::DEFAULT).expect("member");
        }
    }
    list
}

fn bench(c: &mut Criterion) {
    let list = list();
    let (tenant, service) = (42, 17);
    let who = principal(tenant, service);
    let base = prefix(tenant, service);
    let set = SetRequest { path: format!("{base}/config/flags/checkout"), ..SetRequest::default() };
    let txn = TxnRequest {
        compares: vec![Compare { path: format!("{base}/leader"), ..Compare::default() }],
        then: vec![
            TxnOp { op: Some(Op::Set(SetRequest { path: format!("{base}/state/a"), ..SetRequest::default() })) },
            TxnOp { op: Some(Op::Set(SetRequest { path: format!("{base}/state/b"), ..SetRequest::default() })) },
        ],
        ..TxnRequest::default()
    };
    // Another service's path: refused (read is granted through the tenant group, write is not).
    let foreign = SetRequest { path: format!("{}/config/x", prefix(tenant, service + 1)), ..SetRequest::default() };
    assert!(authorize(&list, &who, &set.needs()).is_ok());
    assert!(authorize(&list, &who, &txn.needs()).is_ok());
    assert!(authorize(&list, &who, &foreign.needs()).is_err());

    let mut group = c.benchmark_group("acl_authorize_10k_grants");
    group.throughput(Throughput::Elements(1));
    group.bench_function("set_allowed", |b| b.iter(|| authorize(black_box(&list), black_box(&who), &black_box(&set).needs()).is_ok()));
    group.bench_function("txn_3_paths_allowed", |b| b.iter(|| authorize(black_box(&list), black_box(&who), &black_box(&txn).needs()).is_ok()));
    group.bench_function("set_refused", |b| b.iter(|| authorize(black_box(&list), black_box(&who), &black_box(&foreign).needs()).is_err()));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
