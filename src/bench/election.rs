//! `warden bench election`: the client's recipes (`warden_client::recipes`) through a router
//! to an in-process 5-node cluster with a placement group (fsync on):
//!
//! - election failover: a leader crashes — its client process dies, so its session stops
//!   keepalives without closing — and the time until the next candidate's `campaign`
//!   returns and it acts as leader (a proclaim, a CAS write, applied). The crashed session
//!   lives on for a TTL after its last keepalive, which came up to a keepalive interval
//!   (TTL / 3) before the crash, so failover is TTL − [0, TTL / 3] plus the expiry, watch
//!   and campaign work; the runs crash at evenly spread points of the keepalive interval,
//!   and the JSON reports the TTL;
//! - lock hand-off: a holder unlocks and the next waiter's `lock()` returns.
//!
//! Both lines give the cluster's and router's CPU ([`super::SERVER_THREADS`], not the
//! clients') as `server_cpu_cores` over the run, and no CPU per operation: the runs are paced
//! by session TTLs and fixed waits, not by the servers, so nearly all of their CPU is the
//! cluster's idle work (ticks, heartbeats, keepalives), and divided by the few failovers or
//! hand-offs it would say nothing about their cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::oneshot;
use warden_client::recipes::{Election, Mutex};
use warden_client::{Client, ClientConfig, Session, SessionConfig};

/// The shard group the benchmark's elections and locks live in.
const PREFIX: &str = "/bench";

/// Flags of `warden bench election`.
#[derive(clap::Args)]
pub struct ElectionArgs {
    /// Leader crashes measured.
    #[arg(long, default_value_t = 50)]
    failovers: usize,
    /// Session TTL in milliseconds (the server raises it to its minimum, 3 s by default).
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    /// Lock hand-offs measured.
    #[arg(long, default_value_t = 200)]
    handoffs: usize,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// Runs both measurements, one JSON line each.
pub async fn run(args: ElectionArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let routed = super::RoutedCluster::start(super::fresh_dir(&root, "election")?, &[PREFIX.to_string()], false).await?;
    let router_addr = routed.router_addr.to_string();
    let session_config = SessionConfig { path_hint: Some(PREFIX.into()), ..SessionConfig::new(Duration::from_millis(args.ttl_ms)) };
    let client = Client::connect(ClientConfig::new([router_addr.clone()])).await?;

    let cpu = super::ServerCpu::start()?;
    let (failovers, ttl) = failovers(&client, &router_addr, &session_config, args.failovers).await?;
    let cores = cpu.finish(0).await?.cores;
    println!(
        "{}",
        json!({"bench": "election", "run": "failover", "failovers": failovers.len(), "session_ttl_ms": ttl.as_millis() as u64,
               "p50_ms": percentile_ms(&failovers, 0.5), "p99_ms": percentile_ms(&failovers, 0.99),
               "min_ms": percentile_ms(&failovers, 0.0), "max_ms": percentile_ms(&failovers, 1.0), "server_cpu_cores": cores})
    );
    let cpu = super::ServerCpu::start()?;
    let handoffs = handoffs(&client, &session_config, args.handoffs).await?;
    let cores = cpu.finish(0).await?.cores;
    println!(
        "{}",
        json!({"bench": "election", "run": "lock_handoff", "handoffs": handoffs.len(),
               "p50_ms": percentile_ms(&handoffs, 0.5), "p99_ms": percentile_ms(&handoffs, 0.99), "server_cpu_cores": cores})
    );
    drop(client);
    routed.finish()
}

/// The `q` quantile of `samples` in milliseconds (0 without samples).
fn percentile_ms(samples: &[Duration], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let index = ((sorted.len().saturating_sub(1)) as f64 * q).round() as usize;
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// A leader in a client process of its own (a runtime): it campaigns, reports its
/// leadership, and leads until [`CrashableLeader::crash`] shuts the runtime down — no
/// keepalive, close or resign is sent after that, as when a process is killed.
struct CrashableLeader {
    runtime: tokio::runtime::Runtime,
}

impl CrashableLeader {
    async fn start(router: &str, config: &SessionConfig, path: &str) -> anyhow::Result<(CrashableLeader, Duration)> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let (leading, led) = oneshot::channel();
        let (router, config, path) = (router.to_string(), config.clone(), path.to_string());
        runtime.spawn(async move {
            let campaign = async {
                let client = Client::connect(ClientConfig::new([router])).await?;
                let session = client.session(config).await?;
                let leadership = Election::new(&session, path).campaign(b"crashing".to_vec()).await?;
                anyhow::Ok((session, leadership))
            };
            match campaign.await {
                Ok((session, leadership)) => {
                    let _ = leading.send(Ok(session.ttl()));
                    // Leads (keeping both alive) until the runtime is shut down.
                    let _held = (session, leadership);
                    std::future::pending::<()>().await;
                }
                Err(error) => {
                    let _ = leading.send(Err(error));
                }
            }
        });
        let ttl = led.await??;
        Ok((CrashableLeader { runtime }, ttl))
    }

    fn crash(self) {
        self.runtime.shutdown_background();
    }
}

/// Measures `runs` failovers of the election at `PREFIX/election`: a crashable leader, a
/// waiting candidate on `client`, the crash, the candidate's campaign and first proclaim.
/// Returns the failover times and the TTL the server granted.
async fn failovers(client: &Client, router: &str, config: &SessionConfig, runs: usize) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let path = format!("{PREFIX}/election");
    let session = client.session(config.clone()).await?;
    let election = Arc::new(Election::new(&session, path.clone()));
    let mut times = Vec::with_capacity(runs);
    let mut ttl = session.ttl();
    for run in 0..runs {
        let (leader, granted) = CrashableLeader::start(router, config, &path).await?;
        ttl = granted;
        let campaign = tokio::spawn({
            let election = election.clone();
            async move {
                let leadership = election.campaign(b"next".to_vec()).await?;
                leadership.proclaim(b"acting".to_vec()).await?;
                anyhow::Ok((leadership, Instant::now()))
            }
        });
        // Let the candidate queue up and watch its predecessor; then crash at a point of the
        // leader's keepalive interval (a third of the TTL) that moves on with every run, so
        // the runs cover every phase of it instead of always the same one.
        let phase = (granted / 3).mul_f64(run as f64 / runs as f64);
        tokio::time::sleep(Duration::from_millis(300) + phase).await;
        let crashed_at = Instant::now();
        leader.crash();
        let (leadership, acted_at) = campaign.await??;
        times.push(acted_at - crashed_at);
        leadership.resign().await?;
    }
    close(session).await;
    Ok((times, ttl))
}

/// Measures `runs` hand-offs of the lock at `PREFIX/lock` between two sessions: the holder
/// unlocks while the other waits in `lock()`.
async fn handoffs(client: &Client, config: &SessionConfig, runs: usize) -> anyhow::Result<Vec<Duration>> {
    let path = format!("{PREFIX}/lock");
    let sessions = [Arc::new(client.session(config.clone()).await?), Arc::new(client.session(config.clone()).await?)];
    let mut held = Mutex::new(&sessions[0], path.clone()).lock().await?;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let next = sessions[(run + 1) % 2].clone();
        let waiting = tokio::spawn({
            let path = path.clone();
            async move {
                let guard = Mutex::new(&next, path).lock().await?;
                anyhow::Ok((guard, Instant::now()))
            }
        });
        // Let the waiter's Lock call reach the server and wait there.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let unlocked_at = Instant::now();
        held.unlock().await?;
        let (guard, granted_at) = waiting.await??;
        times.push(granted_at - unlocked_at);
        held = guard;
    }
    held.unlock().await?;
    for session in sessions {
        if let Ok(session) = Arc::try_unwrap(session) {
            close(session).await;
        }
    }
    Ok(times)
}

/// Closes a session, logging a failure (the cluster is torn down next anyway).
async fn close(session: Session) {
    if let Err(error) = session.close().await {
        tracing::debug!(%error, "closing a benchmark session");
    }
}
