//! Crash realism: five `warden node` processes and a `warden router`, with clients writing
//! registers, creating keys and taking fenced locks through the router while real processes
//! fail under them:
//!
//! - `sigkill_and_restart_cycles_lose_nothing_and_stay_linearizable`: repeated cycles of
//!   SIGKILL of a node (sometimes two at once, sometimes the placement leader, sometimes a
//!   shard group's leader) and a restart on the same data directory with the same flags
//!   (sometimes killed again while it recovers);
//! - `a_paused_leader_lets_no_stale_holder_act`: SIGSTOP of a lock group's leader (every
//!   third round the placement leader) for longer than the election timeout and the
//!   sessions' TTL (a GC pause, a VM stall), then SIGCONT.
//!
//! Afterwards every acknowledged create is read back, every fenced lock hold was exclusive
//! (tokens strictly increasing in hold order, holds not overlapping, no write refused by
//! the resource's fence), and the register history is linearizable (WGL checker).
//!
//! Knobs (environment variables, since `cargo test` takes no flags of its own):
//! - `WARDEN_CRASH_CYCLES`: kill/restart cycles (default 20), e.g.
//!   `WARDEN_CRASH_CYCLES=500 cargo test --release --test suite crash_cycles::sigkill -- --nocapture`;
//! - `WARDEN_PAUSE_ROUNDS`: SIGSTOP/SIGCONT rounds (default 3);
//! - `WARDEN_CRASH_SEED`: the seed of the choice of victims and pacing (default: random,
//!   printed, and named in every failure).

use std::time::{Duration, Instant};

use crate::support::processes::{ProcessCluster, NODES, STEP_TIMEOUT};
use crate::support::workload::{FencedResource, Workload, LOCKS, PREFIXES, SESSION_TTL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use warden_proto::v1::GetRequest;
use warden_testkit::wait_until;

fn knob(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text.parse().unwrap_or_else(|e| panic!("{name}={text}: {e}")),
        Err(_) => default,
    }
}

/// Kills and restarts nodes for `WARDEN_CRASH_CYCLES` cycles (at least 20 by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_cycles_lose_nothing_and_stay_linearizable() {
    let cycles = knob("WARDEN_CRASH_CYCLES", 20);
    let seed = knob("WARDEN_CRASH_SEED", rand::random());
    eprintln!("crash cycles: {cycles}, seed {seed} (WARDEN_CRASH_SEED={seed} repeats the choices)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = ProcessCluster::start(&PREFIXES).await;
    let groups = cluster.shard_groups().await;
    let workload = Workload::start(cluster.router_addr()).await;

    for cycle in 0..cycles {
        // Let the clients work before the next fault (pacing only).
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
        let mut victims = match cycle % 4 {
            // The placement leader (placement runs on nodes 1-3).
            1 => cluster.placement_leader(None).await.into_iter().collect(),
            // Two nodes at once: the groups keep a quorum of three.
            2 => {
                let first = rng.random_range(1..=NODES);
                let second = (first + rng.random_range(1..NODES) - 1) % NODES + 1;
                vec![first, second]
            }
            // A shard group's leader.
            3 => cluster.group_leader(groups[rng.random_range(0..groups.len())], None).await.into_iter().collect(),
            _ => Vec::new(),
        };
        if victims.is_empty() {
            victims.push(rng.random_range(1..=NODES));
        }
        let at = workload.now();
        for &victim in &victims {
            cluster.kill(victim);
        }
        workload.log(format!("cycle {cycle} at {at} ns: SIGKILL {victims:?}"));
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
        for &victim in &victims {
            cluster.restart(victim);
        }
        // Sometimes a crash during recovery: killed again while replaying its log or
        // catching up, then started once more.
        if rng.random_ratio(1, 4) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
            for &victim in &victims {
                cluster.kill(victim);
            }
            workload.log(format!("cycle {cycle} at {} ns: SIGKILL {victims:?} again while recovering", workload.now()));
            for &victim in &victims {
                cluster.restart(victim);
            }
        }
        for &victim in &victims {
            cluster.wait_caught_up(victim, &groups).await;
        }
        workload.wait_writable().await;
        workload.log(format!("cycle {cycle}: {victims:?} restarted and caught up at {} ns", workload.now()));
    }
    workload.finish_and_check(&format!("seed {seed}, {cycles} cycles")).await;
}

/// Pauses a lock group's leader, or (every third round) the placement leader, with SIGSTOP
/// until another node leads that group and past the sessions' TTL, then lets it run again
/// (SIGCONT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_lets_no_stale_holder_act() {
    let rounds = knob("WARDEN_PAUSE_ROUNDS", 3);
    let mut cluster = ProcessCluster::start(&PREFIXES).await;
    let groups = cluster.shard_groups().await;
    let workload = Workload::start(cluster.router_addr()).await;
    let lock_groups = lock_groups(&cluster).await;

    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // (the group's name for the log, its leader other than `except`)
        let placement = round % 3 == 2;
        let group = lock_groups[round as usize % lock_groups.len()];
        let leader_of = |except: Option<u64>| {
            let cluster = &cluster;
            async move {
                match placement {
                    true => cluster.placement_leader(except).await,
                    false => cluster.group_leader(group, except).await,
                }
            }
        };
        let name = if placement { "the placement group".to_string() } else { format!("group {group}") };
        let leader = wait_until(&format!("a leader of {name}"), STEP_TIMEOUT, || leader_of(None)).await;
        let paused_at = Instant::now();
        cluster.pause(leader);
        workload.log(format!("round {round} at {} ns: SIGSTOP node {leader} (leader of {name})", workload.now()));
        let successor = wait_until("a new leader while the old one is paused", STEP_TIMEOUT, || leader_of(Some(leader))).await;
        workload.log(format!("round {round} at {} ns: node {successor} leads {name}", workload.now()));
        // Stay paused past the sessions' TTL too, so leases the old leader granted have
        // lapsed by the time it runs again (pacing, not synchronisation).
        tokio::time::sleep((SESSION_TTL + Duration::from_millis(500)).saturating_sub(paused_at.elapsed())).await;
        cluster.resume(leader);
        workload.log(format!("round {round} at {} ns: SIGCONT node {leader}", workload.now()));
        cluster.wait_caught_up(leader, &groups).await;
        workload.wait_writable().await;
    }
    workload.finish_and_check(&format!("{rounds} pause rounds")).await;
}

/// The groups serving the lock paths (those of `/b` and `/c`), as the router reports them
/// for their probe keys.
async fn lock_groups(cluster: &ProcessCluster) -> Vec<u64> {
    let mut groups = Vec::new();
    for path in ["/b/probe", "/c/probe"] {
        assert!(LOCKS.iter().any(|lock| lock.starts_with(path.trim_end_matches("probe"))), "a lock lives beside {path}");
        let got = cluster.router().get(GetRequest { path: path.into(), ..GetRequest::default() }).await.expect("read through the router");
        groups.push(got.into_inner().header.map_or(0, |h| h.group_id));
    }
    groups
}

/// The hold checker is not vacuous: a write the fence refuses, holds that overlap and a
/// token that does not grow are each reported; holds one after another are not.
#[test]
fn the_fenced_resource_reports_stale_writes_overlaps_and_repeated_tokens() {
    let resource = FencedResource::default();
    let (first, second) = (resource.next_hold("/l"), resource.next_hold("/l"));
    assert!(resource.write("/l", first, 5, || true));
    assert!(resource.write("/l", first, 5, || true));
    assert!(resource.write("/l", second, 7, || true));
    assert_eq!(resource.violations(), Vec::<String>::new(), "one hold after the other");
    assert!(!resource.write("/l", first, 5, || false), "an invalid holder does not write");
    assert_eq!(resource.violations(), Vec::<String>::new());
    // The first holder writes again after the second began: stale, and the holds overlap.
    assert!(resource.write("/l", first, 5, || true));
    let violations = resource.violations();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations[0].contains("stale write") && violations[1].contains("overlap"), "{violations:?}");

    let resource = FencedResource::default();
    let (first, second) = (resource.next_hold("/l"), resource.next_hold("/l"));
    assert!(resource.write("/l", first, 9, || true));
    assert!(resource.write("/l", second, 9, || true));
    let violations = resource.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("token 9 held after token 9"), "{violations:?}");
    assert_eq!(resource.holds(), 2);
}

/// The lock-delay check is not vacuous: a grant of a lock before its abandoned holder's
/// lease plus the lock-delay could have ended is reported; one after it, or of another
/// lock, is not.
#[test]
fn the_lock_delay_check_reports_a_grant_inside_the_delay() {
    use crate::support::workload::LOCK_DELAY;
    let now = std::time::Instant::now();
    let resource = FencedResource::default();
    let crashed = resource.next_hold("/l");
    resource.abandoned("/l", crashed, now - LOCK_DELAY - std::time::Duration::from_secs(1));
    resource.next_hold("/l");
    assert_eq!(resource.lock_delay_violations(), Vec::<String>::new(), "granted after the lease and the delay");
    let crashed = resource.next_hold("/l");
    resource.abandoned("/l", crashed, now + std::time::Duration::from_secs(2));
    resource.next_hold("/other");
    assert_eq!(resource.lock_delay_violations(), Vec::<String>::new(), "another lock's grant");
    let early = resource.next_hold("/l");
    let violations = resource.lock_delay_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains(&format!("hold {early} was granted")), "{violations:?}");
    assert_eq!(resource.abandonments(), 2);
}
