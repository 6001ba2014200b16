//! The shard's view of the partition: which cells it owns, who its neighbours are, and
//! which neighbours must hold a ghost of a player standing at a given cell.

use meridian_cluster::{ClusterView, Region, ShardId};
use meridian_world::{Position, WorldConfig};
use rand::Rng;

/// How far outside a shard's region it keeps ghosts: the sight range plus one step, so a
/// player that has just stepped out of a region (and is about to be handed off) still has
/// everything it can see in the old owner's world.
pub fn ghost_margin(config: &WorldConfig) -> u32 {
    config.view_range + 1
}

/// Chebyshev distance from a cell to the nearest cell of a region (0 inside it).
pub fn distance(region: &Region, at: Position) -> u32 {
    let axis = |v: u32, lo: u32, hi: u32| {
        if v < lo {
            lo - v
        } else if v >= hi {
            v - (hi - 1)
        } else {
            0
        }
    };
    axis(at.x, region.x0, region.x1).max(axis(at.y, region.y0, region.y1))
}

#[derive(Debug, Clone, Default)]
pub struct Geometry {
    pub epoch: u64,
    me: Option<ShardId>,
    regions: Vec<Region>,
    margin: u32,
}

impl Geometry {
    pub fn from_view(view: &ClusterView, me: ShardId, config: &WorldConfig) -> Geometry {
        match &view.partition {
            None => Geometry { me: Some(me), margin: ghost_margin(config), ..Geometry::default() },
            Some(map) => Geometry {
                epoch: map.epoch,
                me: Some(me),
                regions: map.regions.clone(),
                margin: ghost_margin(config),
            },
        }
    }

    pub fn owner_of(&self, at: Position) -> Option<ShardId> {
        self.regions.iter().find(|r| r.contains(at.x, at.y)).map(|r| r.shard)
    }

    pub fn owns(&self, at: Position) -> bool {
        self.me.is_some() && self.owner_of(at) == self.me
    }

    /// Other shards that must keep a ghost of a player at `at`, in id order, no repeats.
    pub fn ghost_holders(&self, at: Position, out: &mut Vec<ShardId>) {
        out.clear();
        for region in &self.regions {
            if Some(region.shard) != self.me && distance(region, at) <= self.margin {
                out.push(region.shard);
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// This shard's regions, as `[x0, y0, x1, y1]` (half-open).
    pub fn my_areas(&self) -> Vec<[u32; 4]> {
        self.regions
            .iter()
            .filter(|r| Some(r.shard) == self.me)
            .map(|r| [r.x0, r.y0, r.x1, r.y1])
            .collect()
    }

    /// How many regions `shard` owns.
    pub fn owner_count(&self, shard: ShardId) -> usize {
        self.regions.iter().filter(|r| r.shard == shard).count()
    }

    /// Every other shard that owns a region.
    pub fn peers(&self) -> Vec<ShardId> {
        let mut peers: Vec<ShardId> =
            self.regions.iter().map(|r| r.shard).filter(|s| Some(*s) != self.me).collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// A uniformly random cell of this shard's regions (by area).
    pub fn random_cell(&self, rng: &mut impl Rng) -> Option<Position> {
        let mine: Vec<&Region> = self.regions.iter().filter(|r| Some(r.shard) == self.me).collect();
        let total: u64 = mine.iter().map(|r| r.area()).sum();
        if total == 0 {
            return None;
        }
        let mut pick = rng.random_range(0..total);
        for region in mine {
            if pick < region.area() {
                let width = u64::from(region.x1 - region.x0);
                return Some(Position {
                    x: region.x0 + (pick % width) as u32,
                    y: region.y0 + (pick / width) as u32,
                });
            }
            pick -= region.area();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_cluster::PartitionMap;

    fn two_columns() -> ClusterView {
        let regions = vec![
            Region { shard: ShardId(1), x0: 0, y0: 0, x1: 200, y1: 400 },
            Region { shard: ShardId(2), x0: 200, y0: 0, x1: 400, y1: 400 },
        ];
        ClusterView {
            partition: Some(PartitionMap { epoch: 3, width: 400, height: 400, regions }),
            ..ClusterView::default()
        }
    }

    #[test]
    fn ghosts_go_to_neighbours_within_sight_plus_one() {
        let geometry = Geometry::from_view(&two_columns(), ShardId(1), &WorldConfig::default());
        let mut out = Vec::new();
        geometry.ghost_holders(Position { x: 179, y: 5 }, &mut out);
        assert_eq!(out, vec![ShardId(2)], "179 is 21 cells from x=200");
        geometry.ghost_holders(Position { x: 178, y: 5 }, &mut out);
        assert!(out.is_empty(), "178 is 22 cells away");
        assert_eq!(geometry.owner_of(Position { x: 200, y: 0 }), Some(ShardId(2)));
        assert!(geometry.owns(Position { x: 199, y: 399 }));
    }

    #[test]
    fn distance_is_chebyshev_to_the_rectangle() {
        let region = Region { shard: ShardId(1), x0: 10, y0: 10, x1: 20, y1: 20 };
        assert_eq!(distance(&region, Position { x: 15, y: 15 }), 0);
        assert_eq!(distance(&region, Position { x: 20, y: 15 }), 1);
        assert_eq!(distance(&region, Position { x: 5, y: 25 }), 6);
    }
}
