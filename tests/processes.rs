//! Real processes: five `warden node`s and a `warden router` on loopback, bootstrapped with
//! `warden admin`; one node is killed with SIGKILL while a client writes through the router,
//! and every acknowledged write is read back afterwards.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

/// A child process killed (SIGKILL) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn spawn(args: &[&str], log: &std::path::Path) -> Process {
    let log = std::fs::File::create(log).expect("log file");
    Process(Command::new(BIN).args(args).stdout(Stdio::null()).stderr(log).spawn().expect("spawn warden"))
}

fn admin(args: &[&str]) {
    let output = Command::new(BIN).arg("admin").args(args).output().expect("run warden admin");
    assert!(output.status.success(), "warden admin {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_processes_behind_a_router_lose_no_acknowledged_write_when_one_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let peers = ports.iter().enumerate().map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1)).collect::<Vec<_>>().join(",");
    let seeds = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Option<Process>> = Vec::new();
    for (index, port) in ports.iter().enumerate() {
        let id = (index + 1).to_string();
        let listen = format!("127.0.0.1:{port}");
        let data = dir.path().join(format!("node-{id}"));
        let args = ["node", "--id", &id, "--listen", &listen, "--data-dir", data.to_str().expect("utf8"), "--peers", &peers];
        nodes.push(Some(spawn(&args, &dir.path().join(format!("node-{id}.log")))));
    }
    admin(&["bootstrap", "--nodes", &peers, "--placement", "1,2,3"]);
    admin(&["create-group", "/b", "--seeds", &seeds]);
    let router_port = free_port();
    let router_listen = format!("127.0.0.1:{router_port}");
    let _router = spawn(&["router", "--listen", &router_listen, "--seeds", &seeds], &dir.path().join("router.log"));
    let channel = Channel::from_shared(format!("http://{router_listen}")).expect("uri").timeout(Duration::from_secs(10)).connect_lazy();
    let client = WardenClient::new(channel);
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.clone().sync(SyncRequest::default()).await.is_err() {
        assert!(Instant::now() < deadline, "the router never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

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
    nodes[0] = None;
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
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
