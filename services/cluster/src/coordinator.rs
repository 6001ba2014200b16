//! The coordinator: one elected member computes the partition map and publishes it.
//!
//! Any shard may hold the election (etcd's election API on the shard's own lease, so a
//! dead leader loses it within the TTL). The leader recomputes the map whenever the set of
//! serving shards changes and writes it with epoch + 1, guarded by a compare on the
//! partition key's revision so a deposed leader cannot overwrite a newer map.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::model::{ClusterView, PartitionMap, Region, ShardId};
use crate::{ClusterError, ClusterKeys};

/// How often the leader may move borders for load (each move is a damped step).
const BALANCE_PERIOD: Duration = Duration::from_secs(2);

pub struct Coordinator {
    client: Client,
    keys: ClusterKeys,
    me: ShardId,
    width: u32,
    height: u32,
}

impl Coordinator {
    pub fn new(client: Client, keys: ClusterKeys, me: ShardId, width: u32, height: u32) -> Self {
        Coordinator { client, keys, me, width, height }
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
            let live: Vec<ShardId> = view.serving_shards().map(|s| s.id).collect();
            let owners = view.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
            let wanted = if owners != live {
                // Membership changed: a fresh grid over the serving shards.
                Some(compute_partition(&live, self.width, self.height))
            } else if last_balance.elapsed() >= BALANCE_PERIOD {
                // Same members: move borders toward the load, one damped step a period.
                last_balance = std::time::Instant::now();
                let regions = view.partition.as_ref().map(|p| p.regions.as_slice()).unwrap_or(&[]);
                crate::balance::rebalance(regions, &view, self.width, self.height)
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
        let map = PartitionMap { epoch, width: self.width, height: self.height, regions };
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

/// Splits the map into a grid of rectangles, one per shard: `ceil(sqrt(n))` columns of
/// near-equal width, each cut into near-equal rows, shards assigned in id order. Four
/// shards give a 2x2 grid, so a four-way corner exists from the start.
pub fn compute_partition(shards: &[ShardId], width: u32, height: u32) -> Vec<Region> {
    let mut shards = shards.to_vec();
    shards.sort_unstable();
    shards.dedup();
    let n = shards.len() as u32;
    if n == 0 {
        return Vec::new();
    }
    let columns = (1..=n).find(|c| c * c >= n).expect("invariant: n >= 1 has a square root bound");
    let mut regions = Vec::with_capacity(shards.len());
    let mut next = shards.into_iter();
    for column in 0..columns {
        let x0 = width * column / columns;
        let x1 = width * (column + 1) / columns;
        // Spread the remainder over the first columns.
        let rows = n / columns + u32::from(column < n % columns);
        for row in 0..rows {
            let y0 = height * row / rows;
            let y1 = height * (row + 1) / rows;
            let shard = next.next().expect("invariant: rows sum to n");
            regions.push(Region { shard, x0, y0, x1, y1 });
        }
    }
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers_exactly_once(regions: &[Region], width: u32, height: u32) -> bool {
        (0..width)
            .all(|x| (0..height).all(|y| regions.iter().filter(|r| r.contains(x, y)).count() == 1))
    }

    #[test]
    fn every_cell_has_exactly_one_owner() {
        for n in 1..=9u32 {
            let shards: Vec<ShardId> = (1..=n).map(ShardId).collect();
            let regions = compute_partition(&shards, 400, 400);
            assert_eq!(regions.len(), n as usize);
            assert!(covers_exactly_once(&regions, 400, 400), "n = {n}");
        }
    }

    #[test]
    fn four_shards_meet_at_one_corner() {
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let regions = compute_partition(&shards, 400, 400);
        let owners: Vec<u32> = [(199, 199), (199, 200), (200, 199), (200, 200)]
            .iter()
            .map(|&(x, y)| regions.iter().find(|r| r.contains(x, y)).unwrap().shard.0)
            .collect();
        let mut distinct = owners.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "owners around the centre: {owners:?}");
    }
}
