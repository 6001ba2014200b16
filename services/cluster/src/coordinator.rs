//! The coordinator: one elected member computes the partition map and publishes it.
//!
//! Any shard may hold the election (etcd's election API on the shard's own lease, so a
//! dead leader loses it within the TTL). The leader recomputes the map whenever the set of
//! serving shards changes and writes it with epoch + 1, guarded by a compare on the
//! partition key's revision so a deposed leader cannot overwrite a newer map.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::balance::Bounds;
use crate::layout::compute_partition;
use crate::model::{ClusterView, PartitionMap, Region, ShardId};
use crate::transport::Transport;
use crate::{ClusterError, ClusterKeys};

/// The shards that may own cells: serving, and with a transport that matches `ours` (all
/// serving shards if `ours` is not known).
fn eligible(view: &ClusterView, ours: Option<&Transport>) -> Vec<ShardId> {
    view.serving_shards()
        .filter(|s| ours.is_none_or(|ours| ours.admits(s.transport.as_ref())))
        .map(|s| s.id)
        .collect()
}

/// How often the leader may move borders for load (each move is a damped step).
const BALANCE_PERIOD: Duration = Duration::from_secs(2);

pub struct Coordinator {
    client: Client,
    keys: ClusterKeys,
    me: ShardId,
    bounds: Bounds,
    /// This shard's transport: only shards whose records match it are given cells.
    transport: Option<Transport>,
    /// Shards already said to be left out for their transport (said once each).
    left_out: BTreeSet<ShardId>,
}

impl Coordinator {
    pub fn new(client: Client, keys: ClusterKeys, me: ShardId, bounds: Bounds) -> Self {
        Coordinator { client, keys, me, bounds, transport: None, left_out: BTreeSet::new() }
    }

    /// Gives cells only to shards whose transport matches `transport` (see `transport.rs`):
    /// a shard that cannot reach the others, or be reached, must not own a region.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Campaigns on `lease` and, while leader, keeps the partition in step with the
    /// serving shards seen in `changes`. Runs until the process ends.
    pub async fn run(
        mut self,
        lease: impl Fn() -> i64 + Send,
        mut changes: watch::Receiver<ClusterView>,
    ) {
        let mut failures = 0u32;
        loop {
            let lease_id = lease();
            let campaign =
                self.client.campaign(self.keys.election(), self.me.0.to_string(), lease_id).await;
            let leader_key = match campaign {
                Ok(response) => {
                    failures = 0;
                    response.leader().map(|l| l.key().to_vec())
                }
                Err(error) => {
                    // Logged once per outage, not once per retry.
                    if failures == 0 {
                        warn!(%error, "election campaign failed; retrying until etcd answers");
                    }
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            info!(shard = %self.me, "elected coordinator");
            match self.lead(&mut changes, lease_id).await {
                Ok(()) => {}
                // Another write to the partition key won the compare (a deposed leader's
                // last try, or ours racing a new leader): expected, and the campaign below
                // settles who leads.
                Err(ClusterError::Conflict(key)) if key == self.keys.partition() => {
                    let error = ClusterError::Conflict(key);
                    debug!(%error, "lost a race for the partition map; campaigning again")
                }
                Err(error) => warn!(%error, "lost coordinator leadership"),
            }
            if let Some(key) = leader_key {
                let _ = self.client.delete(key, None).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn lead(
        &mut self,
        changes: &mut watch::Receiver<ClusterView>,
        lease_id: i64,
    ) -> Result<(), ClusterError> {
        let mut last_balance = std::time::Instant::now();
        loop {
            let view = changes.borrow_and_update().clone();
            let live = eligible(&view, self.transport.as_ref());
            self.say_left_out(&view, &live);
            let owners = view.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
            let wanted = if owners != live {
                // Membership changed: a fresh grid over the serving shards.
                Some(compute_partition(&live, self.bounds.width, self.bounds.height))
            } else if last_balance.elapsed() >= BALANCE_PERIOD {
                // Same members: move borders toward the load, one damped step a period.
                last_balance = std::time::Instant::now();
                let regions = view.partition.as_ref().map(|p| p.regions.as_slice()).unwrap_or(&[]);
                crate::balance::rebalance(regions, &view, self.bounds)
            } else {
                None
            };
            if let Some(wanted) = wanted.filter(|_| !live.is_empty()) {
                if view.partition.as_ref().map(|p| &p.regions) != Some(&wanted) {
                    self.publish(wanted).await?;
                }
            }
            // Stop leading if our lease is gone; the watch wakes us on every change.
            let alive = self
                .client
                .lease_time_to_live(lease_id, None)
                .await
                .map_err(ClusterError::from_etcd)?;
            if alive.ttl() <= 0 {
                return Err(ClusterError::Conflict("coordinator lease expired".into()));
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return Ok(()) },
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Warns once per shard that serves but is given no cells for its transport.
    fn say_left_out(&mut self, view: &ClusterView, live: &[ShardId]) {
        for shard in view.serving_shards().filter(|s| !live.contains(&s.id)) {
            if self.left_out.insert(shard.id) {
                warn!(
                    shard = %shard.id,
                    theirs = ?shard.transport,
                    ours = ?self.transport,
                    "a shard's transport does not match the cluster's: it is given no cells"
                );
            }
        }
        self.left_out.retain(|id| view.shards.contains_key(id));
    }

    async fn publish(&mut self, regions: Vec<Region>) -> Result<(), ClusterError> {
        let key = self.keys.partition();
        let current = self.client.get(key.as_str(), None).await.map_err(ClusterError::from_etcd)?;
        let (epoch, compare) = match current.kvs().first() {
            Some(kv) => {
                let old: PartitionMap = serde_json::from_slice(kv.value())
                    .map_err(|source| ClusterError::BadValue { key: key.clone(), source })?;
                (
                    old.epoch + 1,
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision()),
                )
            }
            None => (1, Compare::version(key.as_str(), CompareOp::Equal, 0)),
        };
        let map =
            PartitionMap { epoch, width: self.bounds.width, height: self.bounds.height, regions };
        let value = serde_json::to_string(&map).expect("invariant: a partition map serialises");
        let txn = Txn::new().when([compare]).and_then([TxnOp::put(key.as_str(), value, None)]);
        let response = self.client.txn(txn).await.map_err(ClusterError::from_etcd)?;
        if !response.succeeded() {
            return Err(ClusterError::Conflict(key));
        }
        info!(epoch, shards = map.owners().len(), "published partition map");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ShardRecord, ShardState};

    fn shard(id: u32, transport: Option<Transport>) -> ShardRecord {
        ShardRecord {
            id: ShardId(id),
            grpc: format!("127.0.0.1:{id}"),
            admin: String::new(),
            state: ShardState::Serving,
            players: 0,
            load: Default::default(),
            incarnation: 1,
            transport,
        }
    }

    /// Issue 32: a shard started with `--dev` (no TLS) on a cluster with mutual TLS was
    /// given a third of the map, and nobody could reach it.
    #[test]
    fn a_shard_of_another_transport_gets_no_cells() {
        let tls = Transport::of(Some(vec!["ca".into()]));
        let mut view = ClusterView::default();
        for record in
            [shard(1, Some(tls.clone())), shard(2, None), shard(7, Some(Transport::of(None)))]
        {
            view.shards.insert(record.id, record);
        }
        assert_eq!(eligible(&view, Some(&tls)), vec![ShardId(1), ShardId(2)]);
        assert_eq!(eligible(&view, None).len(), 3, "a coordinator that does not know admits all");
    }
}
