//! `warden bench locks`: the lock service over gRPC against an in-process 5-node cluster
//! (fsync on): uncontended acquire+release cycles, contended hand-off latency, and session
//! keepalives per second on one group and across many. Each line carries the cluster's CPU
//! ([`super::SERVER_THREADS`], not the clients') per acknowledged operation of its run: per
//! acquire + release cycle, per contended acquisition (each followed by its release), per
//! keepalive request (renewing `--sessions-per-keepalive` sessions).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

/// Flags of `warden bench locks`.
#[derive(clap::Args)]
pub struct LocksArgs {
    /// Clients of the uncontended run (each with its own lock).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Waiters contending for one lock in the hand-off run.
    #[arg(long, default_value_t = 8)]
    waiters: usize,
    /// Sessions renewed per keepalive request.
    #[arg(long, default_value_t = 100)]
    sessions_per_keepalive: usize,
    /// Group counts of the keepalive run.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    keepalive_groups: Vec<u64>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[command(flatten)]
    data_dir: super::DataDir,
}

async fn session(client: &mut WardenClient<Channel>, group: u64) -> anyhow::Result<u64> {
    let request = CreateSessionRequest { ttl_ms: 60_000, path_hint: String::new(), routing: Some(Routing { group_id: group, ..Routing::default() }) };
    Ok(client.create_session(request).await?.into_inner().session_id)
}

fn lock_request(path: String, session_id: u64, wait: bool) -> LockRequest {
    LockRequest { path, session_id, mode: LockMode::Exclusive as i32, wait, timeout_ms: 30_000, ..LockRequest::default() }
}

/// Runs the three measurements, one JSON line each (keepalives: one per group count).
pub async fn run(args: LocksArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let measure = Duration::from_secs(args.seconds);
    let warmup = Duration::from_secs(1);
    {
        let setup = super::ApiCluster::start(&root, "locks-g1", 1).await?;
        let leader = setup.leaders[&1].clone();
        // Uncontended: each client owns a lock; a cycle is acquire + release.
        let mut sessions = Vec::new();
        for _ in 0..args.clients {
            sessions.push(session(&mut leader.clone(), 1).await?);
        }
        let sessions = Arc::new(sessions);
        let cpu = super::ServerCpu::window(warmup, measure);
        let report = warden_loadgen::closed_loop(args.clients, warmup, measure, {
            let (leader, sessions) = (leader.clone(), sessions.clone());
            move |client, _| {
                let (mut leader, session_id) = (leader.clone(), sessions[client]);
                async move {
                    let locked = leader.lock(lock_request(format!("/bench/u{client}"), session_id, false)).await?.into_inner();
                    let sequencer = locked.sequencer.filter(|_| locked.acquired).ok_or_else(|| tonic::Status::aborted("not acquired"))?;
                    leader.unlock(UnlockRequest { sequencer: Some(sequencer), routing: None }).await.map(drop)
                }
            }
        })
        .await;
        let mut line = json!({"bench": "locks", "run": "uncontended", "clients": args.clients, "cycles_per_sec": report.ops_per_sec,
                              "p50_ms": report.p50_ms, "p99_ms": report.p99_ms, "errors": report.errors});
        cpu.finish(report.ops).await?.insert(&mut line);
        println!("{line}");

        // Contended: waiters take turns on one lock; hand-off = last unlock sent → next grant.
        let mut sessions = Vec::new();
        for _ in 0..args.waiters {
            sessions.push(session(&mut leader.clone(), 1).await?);
        }
        let sessions = Arc::new(sessions);
        let unlock_sent_us = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let handoffs = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
        let cpu = super::ServerCpu::window(warmup, measure);
        let report = warden_loadgen::closed_loop(args.waiters, warmup, measure, {
            let (leader, sessions, unlock_sent_us, handoffs) = (leader.clone(), sessions.clone(), unlock_sent_us.clone(), handoffs.clone());
            move |client, _| {
                let (mut leader, session_id) = (leader.clone(), sessions[client]);
                let (unlock_sent_us, handoffs) = (unlock_sent_us.clone(), handoffs.clone());
                async move {
                    let locked = leader.lock(lock_request("/bench/contended".into(), session_id, true)).await?.into_inner();
                    let granted_us = start.elapsed().as_micros() as u64;
                    let sequencer = locked.sequencer.filter(|_| locked.acquired).ok_or_else(|| tonic::Status::aborted("not acquired"))?;
                    let sent = unlock_sent_us.load(Ordering::SeqCst);
                    if sent != 0 {
                        handoffs.lock().map_err(|_| tonic::Status::internal("poisoned"))?.push(granted_us.saturating_sub(sent));
                    }
                    unlock_sent_us.store(start.elapsed().as_micros() as u64, Ordering::SeqCst);
                    leader.unlock(UnlockRequest { sequencer: Some(sequencer), routing: None }).await.map(drop)
                }
            }
        })
        .await;
        let mut handoffs = handoffs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
        handoffs.sort_unstable();
        let pct = |q: f64| handoffs.get(((handoffs.len() as f64 - 1.0) * q) as usize).map_or(0.0, |us| *us as f64 / 1000.0);
        let mut line = json!({"bench": "locks", "run": "contended_handoff", "waiters": args.waiters, "acquisitions_per_sec": report.ops_per_sec,
                              "handoff_p50_ms": pct(0.5), "handoff_p99_ms": pct(0.99), "errors": report.errors});
        cpu.finish(report.ops).await?.insert(&mut line);
        println!("{line}");
        setup.finish()?;
    }
    // Keepalives: sessions spread over the groups, each request renews a batch of one group.
    for &groups in &args.keepalive_groups {
        let setup = super::ApiCluster::start(&root, &format!("locks-g{groups}"), groups).await?;
        let clients = groups as usize;
        let mut batches = Vec::new();
        for client in 0..clients {
            let group = 1 + client as u64;
            let mut leader = setup.leaders[&group].clone();
            let mut ids = Vec::new();
            for _ in 0..args.sessions_per_keepalive {
                ids.push(session(&mut leader, group).await?);
            }
            batches.push((group, ids));
        }
        let batches = Arc::new(batches);
        let per_request = args.sessions_per_keepalive;
        let cpu = super::ServerCpu::window(warmup, measure);
        let report = warden_loadgen::closed_loop(clients, warmup, measure, {
            let (leaders, batches) = (setup.leaders.clone(), batches.clone());
            move |client, _| {
                let (group, ids) = batches[client].clone();
                let mut leader = leaders[&group].clone();
                async move {
                    let request = KeepAliveRequest { session_ids: ids, routing: Some(Routing { group_id: group, ..Routing::default() }) };
                    leader.keep_alive(request).await.map(drop)
                }
            }
        })
        .await;
        let mut line = json!({"bench": "locks", "run": "keepalive", "groups": groups, "sessions": clients * per_request,
                              "sessions_renewed_per_sec": report.ops_per_sec * per_request as f64, "p50_ms": report.p50_ms, "p99_ms": report.p99_ms,
                              "errors": report.errors});
        cpu.finish(report.ops).await?.insert(&mut line);
        println!("{line}");
        setup.finish()?;
    }
    Ok(())
}
