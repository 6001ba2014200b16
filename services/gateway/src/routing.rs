//! The routing table every worker reads on every frame: which shards are reachable, and
//! which one owns a cell. Read lock-free through an [`EpochCell`], replaced whole when the
//! cluster view changes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use meridian_cluster::{EpochCell, PartitionMap, ShardId};
use meridian_rpc::pb::PlayerInput;
use tokio::sync::mpsc;

/// Batches of inputs a worker may queue for one shard before its inputs are refused.
pub const RELAY_QUEUE: usize = 4096;

/// The gateway's end of its stream to one shard.
pub struct ShardLink {
    pub id: ShardId,
    /// The shard's incarnation this link was opened for (`ShardRecord::incarnation`, 0 if
    /// unknown). A new incarnation gets a new link.
    pub incarnation: u64,
    /// Workers hand their per-iteration batches here; the relay task sends them on.
    pub inputs: mpsc::Sender<Vec<PlayerInput>>,
    up: AtomicBool,
    /// The last stream failed and no new one is open yet.
    failed: AtomicBool,
    /// The last gRPC health check passed (checked every second on the relay's channel).
    healthy: AtomicBool,
    /// Registered as serving (not draining) in etcd.
    serving: AtomicBool,
    /// Players on the shard: its etcd record's count plus logins placed here since.
    load: AtomicU64,
}

impl ShardLink {
    /// A link to incarnation `incarnation` of shard `id`.
    pub fn registered(
        id: ShardId,
        incarnation: u64,
        inputs: mpsc::Sender<Vec<PlayerInput>>,
    ) -> Self {
        ShardLink {
            id,
            incarnation,
            inputs,
            up: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            healthy: AtomicBool::new(false),
            serving: AtomicBool::new(true),
            load: AtomicU64::new(0),
        }
    }

    /// Whether new players may be placed here.
    pub fn takes_players(&self) -> bool {
        self.is_up() && self.healthy.load(Ordering::Acquire) && self.serving.load(Ordering::Acquire)
    }

    /// Records a health check; returns the previous state.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::AcqRel)
    }

    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    pub fn load(&self) -> u64 {
        self.load.load(Ordering::Relaxed)
    }

    pub fn set_load(&self, players: u64) {
        self.load.store(players, Ordering::Relaxed);
    }

    pub fn add_load(&self) {
        self.load.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether this link is to a later incarnation of its shard than `incarnation` (0:
    /// unknown): one that replaced the incarnation a player was handed to, which dropped
    /// the handoff with everything else. (A link to an earlier one is this gateway's view
    /// lagging: the player went to the later life, which this link is replaced by soon.)
    pub fn replaced(&self, incarnation: u64) -> bool {
        incarnation != 0 && self.incarnation > incarnation
    }

    /// Whether this link is to an earlier life of its shard than `incarnation` (0:
    /// unknown): this gateway's view lags behind the one that named it.
    pub fn earlier_than(&self, incarnation: u64) -> bool {
        self.incarnation != 0 && self.incarnation < incarnation
    }

    /// Whether the stream is established (inputs sent now reach the shard).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
        self.failed.store(!up, Ordering::Release);
    }

    /// Whether inputs may be queued for this shard: the stream is open, or it is being
    /// opened for the first time (a shard that just joined and already took players over);
    /// queued inputs go out as soon as it opens. After a failure, no: they are refused.
    pub fn accepts_inputs(&self) -> bool {
        self.is_up() || !self.failed.load(Ordering::Acquire)
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

    /// The partition's epoch (0 before one is known).
    pub fn epoch(&self) -> u64 {
        self.partition.as_ref().map_or(0, |p| p.epoch)
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
        Routing { table: Arc::new(EpochCell::new(RoutingTable::default())) }
    }
}
