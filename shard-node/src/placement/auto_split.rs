//! Auto-split (`warden node --auto-split WRITES_PER_S`): while this node
//! leads placement, once a window it reads every routed group's write counts per top-level
//! child of its prefix (`GroupWrites`, from one replica on an up node) and, when a child took
//! at least the threshold of writes per second for enough windows in a row, proposes its
//! split: logged, and carried out when `perform` is set (the same sequence as `warden admin
//! split`, under the lifecycle lock). A child its group reports as one a split may not take
//! (a lock or an ephemeral node, `ChildWrites.unmovable`) is never proposed.

use std::collections::HashMap;
use std::time::Instant;

use warden_placement::{AutoSplit, Placement};
use warden_proto::namespace::ChildWrites;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::GroupWritesRequest;

use super::service::PlacementService;

/// One reading of a group's counts: which replica answered, when, and what it said.
struct Reading {
    node: u64,
    at: Instant,
    writes: ChildWrites,
}

impl PlacementService {
    /// Runs auto-split until the runtime stops (see the module documentation).
    pub async fn auto_split_periodically(self, config: AutoSplit) {
        let mut ticker = tokio::time::interval(std::time::Duration::from_millis(config.window_ms.max(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut readings: HashMap<u64, Reading> = HashMap::new();
        // Windows in a row each hot subtree has been hot, by path.
        let mut hot: HashMap<String, u32> = HashMap::new();
        loop {
            ticker.tick().await;
            if self.ensure_leader().is_err() {
                readings.clear();
                hot.clear();
                continue;
            }
            let Ok(state) = self.state().await else { continue };
            hot = self.hot_subtrees(&state, &config, &mut readings, &hot).await;
            for (path, windows) in hot.clone() {
                if windows < config.windows {
                    continue;
                }
                tracing::info!(%path, writes_per_s = config.writes_per_s, windows, perform = config.perform, "auto-split: a subtree stays hot: split proposed");
                if config.perform {
                    hot.remove(&path);
                    let _lifecycle = self.lifecycle.lock().await;
                    if self.ensure_leader().is_err() {
                        break;
                    }
                    let split = match self.settle_creations().await {
                        Ok(()) => self.split(path.clone()).await,
                        Err(error) => Err(error),
                    };
                    match split {
                        Ok(group) => tracing::info!(%path, group = group.id, "auto-split: split done"),
                        Err(error) => tracing::warn!(%path, %error, "auto-split: split failed"),
                    }
                }
            }
        }
    }

    /// Reads every routed group's counts and answers the subtrees hot in this window, with
    /// how many windows in a row they have been (`hot`: the last window's).
    async fn hot_subtrees(
        &self,
        state: &Placement,
        config: &AutoSplit,
        readings: &mut HashMap<u64, Reading>,
        hot: &HashMap<String, u32>,
    ) -> HashMap<String, u32> {
        let mut now_hot = HashMap::new();
        for group in state.groups().values().filter(|g| g.ready) {
            let Some(node) = group.replicas.iter().filter_map(|id| state.node(*id)).find(|n| n.up) else { continue };
            let Ok(channel) = self.channel(&node.addr) else { continue };
            let Ok(answer) = PlacementClient::new(channel).group_writes(GroupWritesRequest { group_id: group.id }).await else { continue };
            let reading = Reading { node: node.id, at: Instant::now(), writes: answer.into_inner().writes.unwrap_or_default() };
            // Counts are per replica: a rate compares two readings of the same one.
            if let Some(last) = readings.insert(group.id, reading).filter(|last| last.node == node.id) {
                let Some(current) = readings.get(&group.id) else { continue };
                let seconds = current.at.duration_since(last.at).as_secs_f64().max(0.001);
                // A child a split may not take (a lock, an ephemeral) is skipped: its nearest
                // ancestor that may move is the group's own root, which a split cannot take.
                let movable = |child: &String| !current.writes.unmovable.contains(child);
                for (child, count) in current.writes.writes.iter().filter(|(child, _)| movable(child)) {
                    let delta = count.saturating_sub(last.writes.writes.get(child).copied().unwrap_or(0));
                    if delta as f64 / seconds >= config.writes_per_s as f64 {
                        let path = if group.prefix == "/" { format!("/{child}") } else { format!("{}/{child}", group.prefix) };
                        let windows = hot.get(&path).copied().unwrap_or(0) + 1;
                        now_hot.insert(path, windows);
                    }
                }
            }
        }
        now_hot
    }
}
