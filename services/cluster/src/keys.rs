//! The etcd key layout (documented in ARCHITECTURE.md; keep the two in step).
//!
//! ```text
//! /meridian/<cluster>/shards/<id>     ShardRecord JSON, on the shard's lease
//! /meridian/<cluster>/gateways/<id>   GatewayRecord JSON, on the gateway's lease
//! /meridian/<cluster>/partition       PartitionMap JSON, written by the coordinator
//! /meridian/<cluster>/election/...    etcd election keys for the coordinator
//! /meridian/<cluster>/ids/next        next unallocated player id (decimal)
//! /meridian/<cluster>/drain/<id>      an operator's request that a shard drain and exit
//! ```

use crate::model::{GatewayId, ShardId};

#[derive(Debug, Clone)]
pub struct ClusterKeys {
    root: String,
}

impl ClusterKeys {
    pub fn new(cluster: &str) -> Self {
        ClusterKeys { root: format!("/meridian/{cluster}/") }
    }

    /// Everything of this cluster: the prefix watched by every node.
    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn shards_prefix(&self) -> String {
        format!("{}shards/", self.root)
    }

    pub fn shard(&self, id: ShardId) -> String {
        format!("{}shards/{}", self.root, id.0)
    }

    pub fn gateways_prefix(&self) -> String {
        format!("{}gateways/", self.root)
    }

    pub fn gateway(&self, id: GatewayId) -> String {
        format!("{}gateways/{}", self.root, id.0)
    }

    pub fn partition(&self) -> String {
        format!("{}partition", self.root)
    }

    pub fn election(&self) -> String {
        format!("{}election", self.root)
    }

    pub fn drains_prefix(&self) -> String {
        format!("{}drain/", self.root)
    }

    /// Operators' orders for players (`meridian player kick|move`), one key per player.
    pub fn orders_prefix(&self) -> String {
        format!("{}order/", self.root)
    }

    pub fn order(&self, player: u64) -> String {
        format!("{}order/{player}", self.root)
    }

    pub fn drain(&self, id: ShardId) -> String {
        format!("{}drain/{}", self.root, id.0)
    }

    pub fn next_player_id(&self) -> String {
        format!("{}ids/next", self.root)
    }
}
