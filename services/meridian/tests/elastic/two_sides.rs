//! Walkers on both sides of the border x = 200 of a two-shard cluster (shard 1 west of it,
//! shard 2 east), each group in its own half, so the load is even and no border moves, and
//! in sight of each other across it: the setup of the tests about one shard failing.

use anyhow::ensure;
use meridian_testkit::{Area, Cluster, Partition, Rng, ShardInfo, WalkerSpec};

use crate::walkers_in;

pub struct TwoSides {
    pub west: Area,
    pub east: Area,
}

impl TwoSides {
    /// The columns `west` (ending at x = 199) and `east` (starting at x = 200), over `rows`.
    pub fn new(west: (u32, u32), east: (u32, u32), rows: (u32, u32)) -> TwoSides {
        TwoSides {
            west: Area::new(west.0..=west.1, rows.0..=rows.1),
            east: Area::new(east.0..=east.1, rows.0..=rows.1),
        }
    }

    /// `per_side` walkers named `west…` in the west half and as many `east…` in the east.
    pub fn walkers(&self, per_side: usize, rng: &mut Rng) -> Vec<WalkerSpec> {
        let mut specs = walkers_in("west", per_side, self.west, rng);
        specs.extend(walkers_in("east", per_side, self.east, rng));
        specs
    }

    /// The shard that owns the west side and the one that owns the east side, checked
    /// against `partition`.
    pub fn owners(
        &self,
        cluster: &Cluster,
        partition: &Partition,
    ) -> anyhow::Result<(ShardInfo, ShardInfo)> {
        let (west, east) = (cluster.shard(0).clone(), cluster.shard(1).clone());
        ensure!(
            partition.owner((self.west.x1, self.west.y0)) == Some(west.id)
                && partition.owner((self.east.x0, self.east.y0)) == Some(east.id),
            "the test assumes shard {} west of x = 200 and shard {} east of it: {partition}",
            west.id,
            east.id
        );
        Ok((west, east))
    }
}
