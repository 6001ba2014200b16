//! How a run is set up: the cluster's size, the workload, the delays and the faults, drawn
//! from a seed or chosen by hand.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How a run is set up. [`Settings::swarm`] draws one from a seed (swarm testing: each
/// seed also picks which faults and workloads it runs, so rare combinations get their
/// turn).
#[derive(Debug, Clone)]
pub struct Settings {
    pub shards: u32,
    pub gateways: u32,
    pub clients: u32,
    /// Side of the square map.
    pub map: u32,
    pub view_range: u32,
    pub workload: Workload,
    /// How long clients play and faults happen.
    pub duration: Duration,
    /// Stream delays are drawn from 0..=this.
    pub max_delay: Duration,
    /// etcd watch lag per node, drawn from 0..=this.
    pub view_lag: Duration,
    pub faults: Faults,
    /// Run the coordinator's balancer (`meridian_cluster::rebalance`) every 2 s on the load
    /// profiles the shard cores report, as a real cluster does.
    pub balance: bool,
    /// Every shard runs a game that plants persistent entities and walks them around
    /// (across borders), with a model of the store (issue 34): at quiescence every entity
    /// the store holds is owned by exactly one shard, which saved it last.
    pub entities: bool,
}

/// Faults injected during the workload.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Borders moved (one cut shifted by up to 24 cells, a new epoch each time).
    pub border_moves: u32,
    /// A shard killed: its gateways find its port refusing connects and revoke its lease
    /// (issue 33), or, with [`Faults::lease_only_deaths`], its lease is left to expire.
    pub kills: u32,
    /// A gateway's stream to a shard cut and reconnected.
    pub link_cuts: u32,
    /// A shard-to-shard stream stalled for up to a second (nothing lost).
    pub peer_stalls: u32,
    /// A shard joining.
    pub joins: u32,
    /// A shard paused past its lease (a stopped process, a frozen VM): it handles nothing
    /// for longer than the TTL, is taken for dead (its region reassigned, its players
    /// restored elsewhere), then wakes, finds its lease gone and registers again.
    pub pauses: u32,
    /// etcd stalled (frozen, not dead): no watch sees anything new and no lease expires
    /// for up to 8 s; then everything written meanwhile arrives.
    pub etcd_stalls: u32,
    /// A killed shard is noticed only when its lease expires (the TTL), as before gateways
    /// revoked the lease of a shard whose port refuses connects.
    pub lease_only_deaths: bool,
}

impl Faults {
    pub(crate) fn destructive(&self) -> bool {
        self.kills > 0 || self.link_cuts > 0 || self.pauses > 0
    }
}

impl Settings {
    /// A small cluster with varied settings drawn from `seed`.
    pub fn swarm(seed: u64) -> Settings {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_5eed);
        let shards = rng.random_range(2..=4);
        let workload = match rng.random_range(0..4) {
            0 => Workload::RandomWalk,
            1 => Workload::Corners,
            2 => Workload::ZigZag,
            _ => Workload::Churn,
        };
        let mut faults = Faults::default();
        if rng.random_bool(0.7) {
            faults.border_moves = rng.random_range(1..=6);
        }
        if rng.random_bool(0.25) {
            faults.kills = 1;
        }
        if rng.random_bool(0.25) {
            faults.link_cuts = rng.random_range(1..=2);
        }
        if rng.random_bool(0.3) {
            faults.peer_stalls = rng.random_range(1..=3);
        }
        if rng.random_bool(0.15) {
            faults.joins = 1;
        }
        // Drawn from a generator of their own, so adding them left every earlier seed's
        // settings (and the regressions named by seed) as they were.
        let mut later = SmallRng::seed_from_u64(seed ^ 0xfa17_5eed);
        let pause = later.random_bool(0.12);
        if later.random_bool(0.12) {
            faults.etcd_stalls = 1;
        }
        if pause {
            faults.pauses = 1;
        }
        // A quarter of the seeds keep the lease as the only way a death is noticed (no
        // draw: every other setting of every seed stays as it was).
        faults.lease_only_deaths = seed.is_multiple_of(4);
        Settings {
            shards,
            gateways: rng.random_range(1..=2),
            clients: rng.random_range(6..=24),
            map: 120,
            view_range: rng.random_range(4..=10),
            workload,
            duration: Duration::from_millis(rng.random_range(1_500..=4_000)),
            max_delay: Duration::from_millis(rng.random_range(0..=20)),
            view_lag: Duration::from_millis(rng.random_range(0..=200)),
            faults,
            balance: false,
            entities: false,
        }
    }

    /// The stale-neighbour workload, scaled: a crowd on the corners of four
    /// shards, borders moving under it.
    pub fn corners(clients: u32) -> Settings {
        Settings {
            shards: 4,
            gateways: 1,
            clients,
            map: 400,
            view_range: 20,
            workload: Workload::Corners,
            duration: Duration::from_secs(3),
            max_delay: Duration::from_millis(5),
            view_lag: Duration::from_millis(100),
            faults: Faults { border_moves: 4, ..Faults::default() },
            balance: false,
            entities: false,
        }
    }

    /// A battle (issue 29): a crowd in one box of the view range's side (all in sight of
    /// all) on the corner of four shards, wandering but staying in it, with the real
    /// balancer moving borders. Its first adjustment takes the borders out of the crowd;
    /// then a standing battle moves none.
    pub fn battle(clients: u32) -> Settings {
        Settings {
            workload: Workload::Battle,
            duration: Duration::from_secs(10),
            faults: Faults::default(),
            balance: true,
            entities: false,
            ..Settings::corners(clients)
        }
    }

    /// A crowd walking across a border (issue 30): it starts west of the middle and drifts
    /// east, with the real balancer moving borders after it, the streams lagging by
    /// different amounts.
    pub fn march(clients: u32, seed: u64) -> Settings {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x3a7c_5eed);
        Settings {
            workload: Workload::March,
            duration: Duration::from_secs(6),
            max_delay: Duration::from_millis(rng.random_range(0..=30)),
            view_lag: Duration::from_millis(rng.random_range(0..=300)),
            faults: Faults::default(),
            balance: true,
            entities: false,
            ..Settings::corners(clients)
        }
    }
}

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Walk in random directions from random cells.
    RandomWalk,
    /// A crowd around the middle of the map, where shards meet.
    Corners,
    /// Back and forth across a border.
    ZigZag,
    /// Random walks with logins, logouts, dropped connections and resumes.
    Churn,
    /// A crowd in a box of the view range's side on the map's middle, staying in it.
    Battle,
    /// A crowd of the view range's side west of the middle, drifting east across it.
    March,
}

impl Workload {
    /// The box a battle's crowd spawns in and keeps to (x0, y0, side), on a map of `map`
    /// cells with sight `view_range`.
    pub fn battle_box(map: u32, view_range: u32) -> (u32, u32, u32) {
        let corner = (map / 2).saturating_sub(view_range / 2);
        (corner, corner, view_range)
    }
}
