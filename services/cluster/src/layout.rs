//! The first layout of the map: a grid of rectangles, one per shard (the coordinator's
//! starting point, which the balancer then moves; the simulator's model lays out the same).

use crate::model::{Region, ShardId};

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
