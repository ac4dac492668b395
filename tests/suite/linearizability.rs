//! Linearizability of the public API under faults: concurrent clients run Set / Get / CAS
//! (a compare-on-value transaction) against a 5-replica group while the nemesis kills,
//! restarts and partitions leaders; the recorded history is checked with the WGL checker
//! (`warden_loadgen::linearizability`). Stale reads are not part of the history: they are
//! allowed to lag (see `namespace_api::stale_reads_can_lag_linearizable_reads_cannot`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::api::{namespace_cluster, ApiClient, CallError};
use crate::support::history::{check_records, Record};
use warden_loadgen::linearizability::{KvInput, KvOutput};
use warden_proto::v1::compare::{Op as CmpOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::*;
use warden_shard_node::cluster::ClusterConfig;

const KEYS: usize = 3;
const CLIENTS: usize = 5;
const RUN: Duration = Duration::from_secs(10);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

fn key(k: usize) -> String {
    format!("/lin{k}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_under_leader_kills_and_partitions_are_linearizable() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let start = Instant::now();
    let now = move || start.elapsed().as_nanos() as u64;
    let records: Arc<Mutex<Vec<Record>>> = Arc::new(Mutex::new(Vec::new()));
    for k in 0..KEYS {
        let invoked = now();
        api.call(Duration::from_secs(20), false, |mut c| async move {
            c.create(CreateRequest { path: key(k), data: b"init".to_vec(), ..CreateRequest::default() }).await
        })
        .await
        .expect("create key");
        let input = KvInput::Put { key: key(k).into_bytes(), value: b"init".to_vec() };
        records.lock().expect("lock").push((usize::MAX, invoked, Some(now()), input, Some(KvOutput::Written)));
    }

    let stop_at = Instant::now() + RUN;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let (api, records) = (api.clone(), records.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut last_seen: Vec<Vec<u8>> = vec![b"init".to_vec(); KEYS];
            while Instant::now() < stop_at {
                n += 1;
                let k = (client + n as usize) % KEYS;
                let path = key(k);
                let invoked = now();
                let (input, outcome) = match n % 3 {
                    0 => {
                        let value = format!("c{client}-{n}").into_bytes();
                        let set = SetRequest { path: path.clone(), data: value.clone(), ..SetRequest::default() };
                        let result = api
                            .call(CALL_TIMEOUT, false, |mut c| {
                                let set = set.clone();
                                async move { c.set(set).await }
                            })
                            .await;
                        (KvInput::Put { key: path.into_bytes(), value }, result.map(|_| KvOutput::Written))
                    }
                    1 => {
                        let get = GetRequest { path: path.clone(), ..GetRequest::default() };
                        let result = api
                            .call(CALL_TIMEOUT, true, |mut c| {
                                let get = get.clone();
                                async move { c.get(get).await }
                            })
                            .await;
                        if let Ok(response) = &result {
                            last_seen[k] = response.data.clone();
                        }
                        (KvInput::Get { key: path.into_bytes() }, result.map(|r| KvOutput::Value(Some(r.data))))
                    }
                    _ => {
                        let expected = last_seen[k].clone();
                        let new = format!("cas{client}-{n}").into_bytes();
                        let compare = Compare {
                            path: path.clone(),
                            target: Target::Value as i32,
                            op: CmpOp::Equal as i32,
                            value: expected.clone(),
                            ..Compare::default()
                        };
                        let set = TxnOp { op: Some(Op::Set(SetRequest { path: path.clone(), data: new.clone(), ..SetRequest::default() })) };
                        let txn = TxnRequest { compares: vec![compare], then: vec![set], r#else: Vec::new(), raise_to: 0, routing: None };
                        let result = api
                            .call(CALL_TIMEOUT, false, |mut c| {
                                let txn = txn.clone();
                                async move { c.txn(txn).await }
                            })
                            .await;
                        if result.as_ref().is_ok_and(|r| r.succeeded) {
                            last_seen[k] = new.clone();
                        }
                        (KvInput::Cas { key: path.into_bytes(), expected: Some(expected), new }, result.map(|r| KvOutput::Swapped(r.succeeded)))
                    }
                };
                let record = match outcome {
                    Ok(output) => (client, invoked, Some(now()), input, Some(output)),
                    // Unknown: the write may take effect at any later time, or never.
                    Err(CallError::Unknown(_)) if !matches!(input, KvInput::Get { .. }) => (client, invoked, None, input, None),
                    // A read that failed, or a refused write, had no effect: not part of the history.
                    Err(_) => continue,
                };
                records.lock().expect("lock").push(record);
            }
        }));
    }

    // The nemesis: alternately kill the leader (then restart it) and isolate it (then heal).
    let mut round = 0;
    while Instant::now() + Duration::from_millis(1500) < stop_at {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let Some(leader) = cluster.leader(1).await else { continue };
        if round % 2 == 0 {
            cluster.kill(leader);
            tokio::time::sleep(Duration::from_millis(800)).await;
            cluster.restart(leader).expect("restart");
        } else {
            cluster.faults().isolate(leader, &cluster.node_ids());
            tokio::time::sleep(Duration::from_millis(800)).await;
            cluster.faults().heal();
        }
        round += 1;
    }
    for client in clients {
        client.await.expect("client");
    }
    assert!(round >= 4, "the nemesis must have acted ({round} rounds)");

    let records = records.lock().expect("lock").clone();
    let completed = records.iter().filter(|r| r.2.is_some()).count();
    assert!(completed > 100, "too few operations completed ({completed}) for the check to mean anything");
    if let Err(failure) = check_records(records) {
        panic!("{failure}");
    }
}
