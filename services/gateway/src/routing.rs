//! The routing table every worker reads on every frame: which shards are reachable, and
//! which one owns a cell. Read lock-free through an [`EpochCell`], replaced whole when the
//! cluster view changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use meridian_cluster::{EpochCell, PartitionMap, ShardId};
use meridian_rpc::pb::PlayerInput;
use tokio::sync::mpsc;

/// Batches of inputs a worker may queue for one shard before its inputs are refused.
pub const RELAY_QUEUE: usize = 4096;

/// The gateway's end of its stream to one shard.
pub struct ShardLink {
    pub id: ShardId,
    /// Workers hand their per-iteration batches here; the relay task sends them on.
    pub inputs: mpsc::Sender<Vec<PlayerInput>>,
    up: AtomicBool,
}

impl ShardLink {
    pub fn new(id: ShardId, inputs: mpsc::Sender<Vec<PlayerInput>>) -> Self {
        ShardLink {
            id,
            inputs,
            up: AtomicBool::new(false),
        }
    }

    /// Whether the stream is established (inputs sent now reach the shard).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
    }
}

#[derive(Default)]
pub struct RoutingTable {
    /// Links to the shards that own a region, in shard id order.
    pub links: Vec<Arc<ShardLink>>,
    pub partition: Option<PartitionMap>,
}

impl RoutingTable {
    pub fn link(&self, id: ShardId) -> Option<&Arc<ShardLink>> {
        self.links.iter().find(|l| l.id == id)
    }

    /// The link to the owner of a cell.
    pub fn owner_link(&self, x: u32, y: u32) -> Option<&Arc<ShardLink>> {
        let owner = self.partition.as_ref()?.owner_of(x, y)?;
        self.link(owner)
    }

    /// Map size, once a partition is known.
    pub fn map_size(&self) -> Option<(u32, u32)> {
        self.partition.as_ref().map(|p| (p.width, p.height))
    }
}

pub struct Routing {
    pub table: Arc<EpochCell<RoutingTable>>,
}

impl Routing {
    pub fn new() -> Self {
        Routing {
            table: Arc::new(EpochCell::new(RoutingTable::default())),
        }
    }
}
