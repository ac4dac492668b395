//! `warden bench namespace`: the public API over gRPC against an in-process 5-node cluster
//! (fsync on, 5 replicas per group): create / set / get / txn rates and latencies, and the
//! cluster's CPU per acknowledged operation ([`super::SERVER_THREADS`], not the clients').

use std::time::Duration;

use serde_json::json;
use tonic::transport::Channel;
use warden_proto::v1::compare::{Op as CmpOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

/// Flags of `warden bench namespace`.
#[derive(clap::Args)]
pub struct NamespaceArgs {
    /// Group counts to run.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    groups: Vec<u64>,
    #[command(flatten)]
    load: super::ClosedLoop,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    #[command(flatten)]
    data_dir: super::DataDir,
}

const OPS: [&str; 4] = ["create", "set", "get", "txn"];

/// Runs every group count and operation, one JSON line each.
pub async fn run(args: NamespaceArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    for &groups in &args.groups {
        let bench = super::ApiCluster::start(&root, &format!("namespace-g{groups}"), groups).await?;
        let leaders = bench.leaders.clone();
        // Each client owns a key (and a parent for its creates) in its group.
        let clients = args.load.clients.max(1);
        let value = vec![b'v'; args.value_bytes];
        for client in 0..clients {
            let group = 1 + (client as u64 % groups);
            let mut leader = leaders[&group].clone();
            let routing = Some(Routing { group_id: group, ..Routing::default() });
            let parent = CreateRequest { path: format!("/c{client}"), routing, ..CreateRequest::default() };
            leader.create(parent).await?;
            let key = CreateRequest { path: format!("/k{client}"), data: value.clone(), routing, ..CreateRequest::default() };
            leader.create(key).await?;
        }
        for op in OPS {
            let (warmup, measure) = (Duration::from_secs(1), Duration::from_secs(args.load.seconds));
            let cpu = super::ServerCpu::window(warmup, measure);
            let report = warden_loadgen::closed_loop(clients, warmup, measure, {
                let leaders = leaders.clone();
                let value = value.clone();
                move |client, seq| {
                    let group = 1 + (client as u64 % groups);
                    let mut leader = leaders[&group].clone();
                    let value = value.clone();
                    async move { one_op(&mut leader, op, client, seq, group, value).await }
                }
            })
            .await;
            let mut line = json!({
                "bench": "namespace",
                "op": op,
                "groups": groups,
                "clients": clients,
                "value_bytes": args.value_bytes,
                "ops_per_sec": report.ops_per_sec,
                "p50_ms": report.p50_ms,
                "p99_ms": report.p99_ms,
                "errors": report.errors,
            });
            cpu.finish(report.ops).await?.insert(&mut line);
            println!("{line}");
        }
        bench.finish()?;
    }
    Ok(())
}

async fn one_op(leader: &mut WardenClient<Channel>, op: &str, client: usize, seq: u64, group: u64, value: Vec<u8>) -> Result<(), tonic::Status> {
    let routing = Some(Routing { group_id: group, ..Routing::default() });
    let key = format!("/k{client}");
    match op {
        "create" => {
            let path = format!("/c{client}/n{seq}");
            leader.create(CreateRequest { path, data: value, routing, ..CreateRequest::default() }).await.map(drop)
        }
        "set" => leader.set(SetRequest { path: key, data: value, expected_version: None, routing }).await.map(drop),
        "get" => leader.get(GetRequest { path: key, consistency: Consistency::Linearizable as i32, routing }).await.map(drop),
        _ => {
            // A CAS-shaped transaction: if the value is what we wrote, write it again and read it.
            let compare =
                Compare { path: key.clone(), target: Target::Value as i32, op: CmpOp::Equal as i32, value: value.clone(), ..Compare::default() };
            let set = TxnOp { op: Some(Op::Set(SetRequest { path: key.clone(), data: value, ..SetRequest::default() })) };
            let get = TxnOp { op: Some(Op::Get(GetRequest { path: key, ..GetRequest::default() })) };
            leader.txn(TxnRequest { compares: vec![compare], then: vec![set, get], r#else: Vec::new(), raise_to: 0, routing }).await.map(drop)
        }
    }
}
