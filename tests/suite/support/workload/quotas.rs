//! The quota check: a nodes quota on [`QUOTA_PREFIX`] (set at the placement leader when
//! the workload starts; under `/a`, so the split-merge fault moves it with its group), two
//! clients creating under it until refused and then deleting one of their own nodes, so
//! the subtree keeps hitting its limit. The quota counts the prefix node itself (as
//! `quota.rs` shows), so a listing may show at most [`QUOTA_NODES`]` - 1` children; and a
//! create answered QUOTA_EXCEEDED changed nothing, so its node never exists.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Channel;
use warden_client::{ChildrenOptions, Client, CreateOptions, DeleteOptions, Error};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::SetQuotaRequest;
use warden_proto::v1::QuotaLimits;
use warden_testkit::wait_until;

use super::{Anomaly, Outcomes};
use crate::support::processes::{placement_leader_among, STEP_TIMEOUT};

/// The subtree under quota.
pub const QUOTA_PREFIX: &str = "/a/q";
/// Its limit of nodes (the prefix node counted).
pub const QUOTA_NODES: u64 = 12;
/// Clients creating under it.
const QUOTA_CLIENTS: usize = 2;
/// A client lists the prefix's children once every this many creates.
const LIST_EVERY: usize = 4;
/// Pause after a refusal: each one makes the serving node ask placement for a bigger
/// share, and the clients are not there to load placement.
const PAUSE_AFTER_REFUSAL: Duration = Duration::from_millis(20);

/// What the quota clients saw.
#[derive(Debug, Default)]
pub struct QuotaLog {
    /// Every listing: when it was answered (ns) and the nodes it counts (the prefix and its
    /// children).
    pub listings: Vec<(u64, u64)>,
    /// Creates answered QUOTA_EXCEEDED: when (ns) and their path.
    pub refused: Vec<(u64, String)>,
}

/// What the quota check found and counted.
#[derive(Debug, Default)]
pub struct QuotasChecked {
    pub anomalies: Vec<Anomaly>,
    /// Creates refused by the quota.
    pub refusals: usize,
    /// Listings of the prefix's children, the final one included.
    pub listings: usize,
}

/// The quota clients.
pub struct Quotas {
    log: Arc<Mutex<QuotaLog>>,
}

impl Quotas {
    /// Creates [`QUOTA_PREFIX`], sets its quota through the placement leader among
    /// `placement` and starts the clients (their tasks are pushed on `tasks`, stopped with
    /// the workload's).
    pub async fn start(
        client: &Client,
        placement: &[(u64, PlacementClient<Channel>)],
        outcomes: impl Fn() -> Outcomes,
        tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> Quotas {
        client.create(QUOTA_PREFIX, Vec::new(), &CreateOptions::persistent().create_parents()).await.expect("create the quota's prefix");
        let limits = QuotaLimits { nodes: Some(QUOTA_NODES), ..QuotaLimits::default() };
        let request = SetQuotaRequest { prefix: QUOTA_PREFIX.into(), limits: Some(limits), remove: false };
        wait_until(&format!("the quota on {QUOTA_PREFIX} is set at the placement leader"), STEP_TIMEOUT, || async {
            let leader = placement_leader_among(placement, None).await?;
            let (_, at_leader) = placement.iter().find(|(id, _)| *id == leader)?;
            at_leader.clone().set_quota(request.clone()).await.ok()
        })
        .await;
        let log = Arc::new(Mutex::new(QuotaLog::default()));
        for id in 0..QUOTA_CLIENTS {
            tasks.push(tokio::spawn(quota_client(id, client.clone(), outcomes(), log.clone())));
        }
        Quotas { log }
    }

    /// Lists the prefix's children once more (the clients have stopped) and checks every
    /// listing and refusal.
    pub async fn finish(self, client: &Client) -> QuotasChecked {
        let names = wait_until(&format!("a listing of {QUOTA_PREFIX}"), STEP_TIMEOUT, || async { list(client).await.ok() }).await;
        let log = self.log.lock().expect("quota log");
        QuotasChecked { anomalies: quota_anomalies(&log, &names), refusals: log.refused.len(), listings: log.listings.len() + 1 }
    }
}

/// The names of [`QUOTA_PREFIX`]'s children, in one read (a page holds up to 10,000).
async fn list(client: &Client) -> Result<Vec<String>, Error> {
    let page = client.children(QUOTA_PREFIX, ChildrenOptions::default()).next_page().await?;
    Ok(page.map_or_else(Vec::new, |page| page.children.into_iter().map(|child| child.name).collect()))
}

/// Creates `QUOTA_PREFIX/q<id>-<n>` (data: the path) again and again; when the quota refuses
/// one, deletes the oldest of its nodes that may exist (acknowledged, or of unknown outcome).
/// Lists the children every [`LIST_EVERY`] creates. A refusal is only a typed QUOTA_EXCEEDED
/// answer: any other failure may have created the node.
async fn quota_client(id: usize, client: Client, outcomes: Outcomes, log: Arc<Mutex<QuotaLog>>) {
    let mut own: VecDeque<String> = VecDeque::new();
    let mut n = 0usize;
    while !outcomes.stopped() {
        n += 1;
        let path = format!("{QUOTA_PREFIX}/q{id}-{n}");
        let invoked = outcomes.clock.now();
        let created = client.create(&path, path.clone().into_bytes(), &CreateOptions::persistent()).await;
        // A refusal is an answer, as for availability a lock wait that ran out is.
        outcomes.note("quota-create", &path, invoked, matches!(created, Ok(_) | Err(Error::QuotaExceeded { .. })));
        match created {
            Err(Error::QuotaExceeded { .. }) => {
                log.lock().expect("quota log").refused.push((outcomes.clock.now(), path));
                if let Some(victim) = own.pop_front() {
                    let invoked = outcomes.clock.now();
                    let deleted = client.delete(&victim, &DeleteOptions::default()).await;
                    outcomes.note("quota-delete", &victim, invoked, matches!(deleted, Ok(_) | Err(Error::NoNode { .. })));
                    if !matches!(deleted, Ok(_) | Err(Error::NoNode { .. })) {
                        // It may still be there: delete it another time.
                        own.push_back(victim);
                    }
                }
                tokio::time::sleep(PAUSE_AFTER_REFUSAL).await;
            }
            _ => own.push_back(path),
        }
        if n % LIST_EVERY == 0 {
            let invoked = outcomes.clock.now();
            let listed = list(&client).await;
            outcomes.note("quota-list", QUOTA_PREFIX, invoked, listed.is_ok());
            if let Ok(names) = listed {
                log.lock().expect("quota log").listings.push((outcomes.clock.now(), names.len() as u64 + 1));
            }
        }
    }
}

/// What is wrong with the quota's history, the final listing being `final_names`: a
/// listing (the final one too) counting more than [`QUOTA_NODES`] (`quota-exceeded`), a node
/// whose create was refused among the final children (`quota-refused-write-kept`).
pub fn quota_anomalies(log: &QuotaLog, final_names: &[String]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for (at_ns, nodes) in &log.listings {
        if *nodes > QUOTA_NODES {
            let detail = format!("a listing of {QUOTA_PREFIX} counts {nodes} nodes (itself included), over the quota of {QUOTA_NODES}");
            anomalies.push(Anomaly { kind: "quota-exceeded", detail, at_ms: Some(at_ns / 1_000_000) });
        }
    }
    let nodes = final_names.len() as u64 + 1;
    if nodes > QUOTA_NODES {
        let detail = format!("{QUOTA_PREFIX} counts {nodes} nodes (itself included) at the end, over the quota of {QUOTA_NODES}: {final_names:?}");
        anomalies.push(Anomaly { kind: "quota-exceeded", detail, at_ms: None });
    }
    for (at_ns, path) in &log.refused {
        if final_names.iter().any(|name| path.strip_prefix(QUOTA_PREFIX).and_then(|rest| rest.strip_prefix('/')) == Some(name.as_str())) {
            let detail = format!("{path} exists at the end, though its create was refused for the quota");
            anomalies.push(Anomaly { kind: "quota-refused-write-kept", detail, at_ms: Some(at_ns / 1_000_000) });
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|n| format!("q0-{n}")).collect()
    }

    fn kinds(log: &QuotaLog, final_names: &[String]) -> Vec<&'static str> {
        quota_anomalies(log, final_names).into_iter().map(|a| a.kind).collect()
    }

    #[test]
    fn listings_within_the_quota_and_refused_creates_gone_show_no_anomaly() {
        let log = QuotaLog { listings: vec![(1, QUOTA_NODES), (2, 3)], refused: vec![(3, format!("{QUOTA_PREFIX}/q1-99"))] };
        assert_eq!(kinds(&log, &names(QUOTA_NODES as usize - 1)), Vec::<&str>::new());
    }

    #[test]
    fn a_count_over_the_quota_and_a_refused_create_kept_are_reported() {
        let over = QuotaLog { listings: vec![(1, QUOTA_NODES + 1)], refused: Vec::new() };
        assert_eq!(kinds(&over, &names(1)), ["quota-exceeded"]);
        assert_eq!(kinds(&QuotaLog::default(), &names(QUOTA_NODES as usize)), ["quota-exceeded"], "the final listing counts too");
        let kept = QuotaLog { listings: Vec::new(), refused: vec![(1, format!("{QUOTA_PREFIX}/q0-1"))] };
        assert_eq!(kinds(&kept, &names(3)), ["quota-refused-write-kept"]);
    }
}
