//! What the cluster keeps in etcd, as typed values (stored as JSON).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::transport::Transport;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GatewayId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard-{}", self.0)
    }
}

impl fmt::Display for GatewayId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gateway-{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    /// Takes players and owns a region.
    Serving,
    /// Handing its players off before it exits; gets no region and no new players.
    Draining,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub id: ShardId,
    /// The shard's gRPC address, as gateways and other shards dial it.
    pub grpc: String,
    pub admin: String,
    pub state: ShardState,
    /// Players owned, refreshed every few seconds (placement and `meridian status`).
    #[serde(default)]
    pub players: u64,
    /// Where those players stand: counts per band of [`LOAD_BAND`] cells along x and
    /// along y. The coordinator moves borders toward where the players are.
    #[serde(default, skip_serializing_if = "LoadProfile::is_empty")]
    pub load: LoadProfile,
    /// Which life of the shard this is: the time the process started (Unix nanoseconds, so
    /// a later life has a larger one), plus one each time it drops everything it held (its lease expired and its region was given away:
    /// it was taken for dead and its players restored elsewhere). Never changed otherwise:
    /// a shard whose lease lapsed only because etcd stalled keeps its players and its
    /// incarnation. A watch may show the shard gone and back, or only back (both changes
    /// in one view, or a lapse within the watch's grace); peers and gateways compare the
    /// incarnation to know that it no longer holds what they gave it. 0: not known.
    #[serde(default)]
    pub incarnation: u64,
    /// What the shard's gRPC links use (see `transport.rs`); `None` in records of older
    /// shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

/// Width of one band of a [`LoadProfile`], in cells. One cell: a crowd stands in clumps
/// (a queue, a doorway), and a coarser profile, read as an even spread within each band,
/// puts borders through the middle of a clump and stops there, badly balanced. A
/// 400-cell map makes it 800 numbers per shard record.
pub const LOAD_BAND: u32 = 1;

/// Entities around a player (in the sectors of its neighbourhood, about twice its sight
/// square) at which it counts as fully in a crowd in [`LoadProfile::crowd_x`].
pub const CROWD: u32 = 200;

/// A shard's players counted per band of columns (`x`) and per band of rows (`y`), and how
/// crowded they stand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadProfile {
    pub x: Vec<u32>,
    pub y: Vec<u32>,
    /// Per band, the sum over its players of how crowded each stands, in hundredths: a
    /// player with [`CROWD`] or more entities around it counts 100, one alone about 0. The
    /// balancer's price of a border near them (see `balance`). Empty from shards that do not
    /// report it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crowd_x: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crowd_y: Vec<u32>,
}

impl LoadProfile {
    pub fn is_empty(&self) -> bool {
        self.x.is_empty() && self.y.is_empty()
    }

    /// How much a player with `around` entities around it adds to the crowd profiles.
    pub fn crowd_weight(around: usize) -> u32 {
        (around.min(CROWD as usize) as u32 * 100).div_ceil(CROWD)
    }
}

/// Side of one square of a [`DensityReport`], in cells.
pub const DENSITY_CELL: u32 = 10;

/// Where a shard's players stand on a coarse 2-D grid, as its admin port serves it at
/// `/density` (for the live map; not kept in etcd, see ARCHITECTURE.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DensityReport {
    pub shard: u32,
    /// The partition epoch the shard is using.
    pub epoch: u64,
    /// Whether the shard answers `/readyz` with 200 right now.
    pub ready: bool,
    /// Side of a square, in cells ([`DENSITY_CELL`]).
    pub cell: u32,
    /// `[column, row, players]` for every square with players (column = x / cell).
    pub counts: Vec<[u32; 3]>,
    /// `[column, row, npcs]` for every square with NPCs the shard owns (a game's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub npcs: Vec<[u32; 3]>,
}

impl DensityReport {
    pub fn players(&self) -> u64 {
        self.counts.iter().map(|c| u64::from(c[2])).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRecord {
    pub id: GatewayId,
    /// The client-facing TCP address.
    pub game: String,
    pub admin: String,
    /// The QUIC front's UDP address, if the gateway runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<String>,
    /// The WebSocket front's TCP address, if the gateway runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ws: Option<String>,
    /// What the gateway's gRPC links use (see `transport.rs`); `None` in records of older
    /// gateways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

/// A half-open rectangle of cells `[x0, x1) x [y0, y1)` owned by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub shard: ShardId,
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

impl Region {
    pub fn contains(&self, x: u32, y: u32) -> bool {
        self.x0 <= x && x < self.x1 && self.y0 <= y && y < self.y1
    }

    pub fn area(&self) -> u64 {
        u64::from(self.x1 - self.x0) * u64::from(self.y1 - self.y0)
    }
}

/// Who owns which cells, as of one epoch. The epoch only ever grows and fences every
/// cross-node message: a node acts on the newest map it has seen and refuses older ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    pub epoch: u64,
    pub width: u32,
    pub height: u32,
    pub regions: Vec<Region>,
}

impl PartitionMap {
    /// The shard that owns a cell, if the map covers it.
    pub fn owner_of(&self, x: u32, y: u32) -> Option<ShardId> {
        self.regions.iter().find(|r| r.contains(x, y)).map(|r| r.shard)
    }

    /// The regions of one shard.
    pub fn regions_of(&self, shard: ShardId) -> impl Iterator<Item = &Region> {
        self.regions.iter().filter(move |r| r.shard == shard)
    }

    /// Shards that own at least one region, in id order, without repeats.
    pub fn owners(&self) -> Vec<ShardId> {
        let mut owners: Vec<ShardId> = self.regions.iter().map(|r| r.shard).collect();
        owners.sort_unstable();
        owners.dedup();
        owners
    }
}

/// Everything a node knows about the cluster, rebuilt from etcd on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub shards: BTreeMap<ShardId, ShardRecord>,
    pub gateways: BTreeMap<GatewayId, GatewayRecord>,
    pub partition: Option<PartitionMap>,
    /// Shards an operator asked to drain (`meridian drain`).
    pub drains: std::collections::BTreeSet<ShardId>,
    /// Operators' orders for players, by player id (`meridian player kick|move`).
    pub orders: BTreeMap<u64, PlayerOrder>,
    /// The etcd revision this view reflects.
    pub revision: i64,
}

/// An operator's order for one player (`meridian player kick|move`), carried out once by
/// the shard holding the player when the order appears.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlayerOrder {
    /// Unique per order: a shard carries out each order once.
    pub id: u64,
    #[serde(flatten)]
    pub kind: OrderKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OrderKind {
    /// Out of the world: the connection gets `UNAVAILABLE` with `reason` and is closed.
    Kick { reason: String },
    /// To another cell at once: the client gets `ViewReset` there.
    Move { x: u32, y: u32 },
}

impl ClusterView {
    /// Live shards that take new players.
    pub fn serving_shards(&self) -> impl Iterator<Item = &ShardRecord> {
        self.shards.values().filter(|s| s.state == ShardState::Serving)
    }
}

impl ShardRecord {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("invariant: a shard record serialises")
    }
}

impl GatewayRecord {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("invariant: a gateway record serialises")
    }
}
