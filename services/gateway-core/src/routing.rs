//! The routing table each worker reads on every frame: which shards its links reach, and
//! which shard owns a cell. Read lock-free through an [`EpochCell`], replaced whole when
//! the cluster view changes. Every worker has its own table, with its own link to each
//! shard ([`ShardLink`]); what is known of a shard itself ([`ShardStatus`]) is shared.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use meridian_cluster::{EpochCell, PartitionMap, ShardId};

/// What every worker's link to one shard shares: what the cluster and the health checks
/// say of the shard.
#[derive(Debug)]
pub struct ShardStatus {
    /// The last gRPC health check passed (checked every second).
    healthy: AtomicBool,
    /// Registered as serving (not draining) in etcd.
    serving: AtomicBool,
    /// Players on the shard: its etcd record's count plus logins placed here since.
    load: AtomicU64,
}

impl Default for ShardStatus {
    fn default() -> Self {
        ShardStatus {
            healthy: AtomicBool::new(false),
            serving: AtomicBool::new(true),
            load: AtomicU64::new(0),
        }
    }
}

impl ShardStatus {
    /// Records a health check; returns the previous state.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::AcqRel)
    }

    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
    }

    pub fn set_load(&self, players: u64) {
        self.load.store(players, Ordering::Relaxed);
    }
}

/// One worker's end of its relay link to one shard (the link itself, its socket and its
/// buffers, is the worker's: see `uplink.rs`).
pub struct ShardLink {
    pub id: ShardId,
    /// The shard's incarnation this link was opened for (`ShardRecord::incarnation`, 0 if
    /// unknown). A new incarnation gets a new link.
    pub incarnation: u64,
    pub status: Arc<ShardStatus>,
    up: AtomicBool,
    /// The last connection failed and no new one is open yet.
    failed: AtomicBool,
}

impl ShardLink {
    /// A link to incarnation `incarnation` of shard `id`.
    pub fn registered(id: ShardId, incarnation: u64, status: Arc<ShardStatus>) -> Self {
        ShardLink {
            id,
            incarnation,
            status,
            up: AtomicBool::new(false),
            failed: AtomicBool::new(false),
        }
    }

    /// Whether new players may be placed here.
    pub fn takes_players(&self) -> bool {
        self.is_up()
            && self.status.healthy.load(Ordering::Acquire)
            && self.status.serving.load(Ordering::Acquire)
    }

    /// Records a health check; returns the previous state.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.status.set_healthy(healthy)
    }

    pub fn load(&self) -> u64 {
        self.status.load.load(Ordering::Relaxed)
    }

    pub fn add_load(&self) {
        self.status.load.fetch_add(1, Ordering::Relaxed);
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

    /// Whether the link is connected (inputs sent now reach the shard).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
        self.failed.store(!up, Ordering::Release);
    }

    /// Whether inputs may be queued for this shard: the link is open, or it is being
    /// opened for the first time (a shard that just joined and already took players over);
    /// queued inputs go out as soon as it opens. After a failure, no: they are refused.
    pub fn accepts_inputs(&self) -> bool {
        self.is_up() || !self.failed.load(Ordering::Acquire)
    }
}

#[derive(Default)]
pub struct RoutingTable {
    /// This worker's links to the registered shards, in shard id order.
    pub links: Vec<Arc<ShardLink>>,
    /// Counts the tables stored: a worker whose links are not this table's reconciles.
    pub version: u64,
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

/// Every worker's routing table, by worker index.
pub type Routing = Arc<Vec<EpochCell<RoutingTable>>>;

/// An empty table for each of `workers` workers.
pub fn routing(workers: usize) -> Routing {
    Arc::new((0..workers).map(|_| EpochCell::new(RoutingTable::default())).collect())
}
