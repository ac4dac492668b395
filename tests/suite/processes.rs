//! Real processes: five `warden node`s and a `warden router` on loopback, bootstrapped with
//! `warden admin`; one node is killed with SIGKILL while a client writes through the router,
//! and every acknowledged write is read back afterwards.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::processes::ProcessCluster;
use warden_proto::v1::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_processes_behind_a_router_lose_no_acknowledged_write_when_one_is_killed() {
    let mut cluster = ProcessCluster::start(&["/b"]).await;
    let client = cluster.router();

    // Writers create keys in both groups; acknowledged ones are recorded.
    let acknowledged = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = ["/a", "/b"]
        .into_iter()
        .map(|prefix| {
            let (mut client, acknowledged, stop) = (client.clone(), acknowledged.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let path = format!("{prefix}/k{n}");
                    let create =
                        CreateRequest { path: path.clone(), data: path.clone().into_bytes(), create_parents: true, ..CreateRequest::default() };
                    if client.create(create).await.is_ok() {
                        acknowledged.lock().expect("lock").push((path, Instant::now()));
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // SIGKILL node 1: it holds a placement replica and replicas of both shard groups.
    cluster.kill(1);
    let killed_at = Instant::now();
    // Writes go on in both groups: waited for (a loaded machine may take a while to elect new
    // leaders), up to a deadline.
    let after_kill = |prefix: &str| acknowledged.lock().expect("lock").iter().filter(|(p, at)| p.starts_with(prefix) && *at > killed_at).count();
    let deadline = killed_at + Duration::from_secs(30);
    while (after_kill("/a") <= 5 || after_kill("/b") <= 5) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(acknowledged.len() > 20, "writes went through ({})", acknowledged.len());
    for prefix in ["/a", "/b"] {
        let after_kill = acknowledged.iter().filter(|(p, at)| p.starts_with(prefix) && *at > killed_at).count();
        assert!(after_kill > 5, "writes to {prefix} continued after the kill ({after_kill})");
    }
    for (path, _) in &acknowledged {
        let got = client.clone().get(GetRequest { path: path.clone(), ..GetRequest::default() }).await;
        let got = got.unwrap_or_else(|status| panic!("acknowledged {path} is lost: {status}")).into_inner();
        assert_eq!(got.data, path.as_bytes());
    }
}
