//! Load-aware borders: the coordinator moves the partition's borders toward where the
//! players are, BigWorld-style, so a crowd in one region ends up spread over several.
//!
//! The grid keeps its shape (columns, then rows within each column, each shard keeping
//! its place); only the cut positions move. Each cut moves toward the quantile of the
//! players' positions that would give every shard an equal share, by at most
//! [`MAX_STEP`] cells per round, and only while the busiest shard carries more than
//! [`TRIGGER`] times the mean: damped, so borders settle instead of oscillating.

use std::collections::BTreeMap;

use crate::model::{ClusterView, LoadProfile, Region, ShardId, LOAD_BAND};

/// Act only when the busiest shard carries more than this multiple of the mean load.
pub const TRIGGER: f64 = 1.15;
/// Largest move of one border per round, in cells.
pub const MAX_STEP: u32 = 24;
/// Narrowest a column or row may become, in cells.
pub const MIN_SPAN: u32 = 20;
/// Below this many players in all, load is noise: borders stay where they are.
pub const MIN_PLAYERS: u64 = 20;

/// The position (in cells) below which a fraction `q` of the profile's mass lies.
fn quantile(profile: &[u64], q: f64) -> Option<f64> {
    let total: u64 = profile.iter().sum();
    if total == 0 {
        return None;
    }
    let target = q * total as f64;
    let mut before = 0.0;
    for (band, &count) in profile.iter().enumerate() {
        let count = count as f64;
        if count > 0.0 && before + count >= target {
            let inside = (target - before) / count;
            return Some((band as f64 + inside) * f64::from(LOAD_BAND));
        }
        before += count;
    }
    Some((profile.len() as u32 * LOAD_BAND) as f64)
}

fn sum_profiles<'a>(profiles: impl Iterator<Item = &'a [u32]>, len: usize) -> Vec<u64> {
    let mut sum = vec![0u64; len];
    for profile in profiles {
        for (total, &n) in sum.iter_mut().zip(profile) {
            *total += u64::from(n);
        }
    }
    sum
}

/// Moves each interior cut of `cuts` (first and last fixed) toward its target, keeping
/// them ordered and at least [`MIN_SPAN`] apart.
fn step_cuts(cuts: &mut [u32], targets: &[Option<f64>]) -> bool {
    let mut changed = false;
    for i in 1..cuts.len() - 1 {
        let Some(target) = targets[i] else { continue };
        let current = cuts[i];
        let wanted = target.round() as i64;
        let step = (wanted - i64::from(current)).clamp(-i64::from(MAX_STEP), i64::from(MAX_STEP));
        let low = cuts[i - 1] + MIN_SPAN;
        let high = cuts[i + 1].saturating_sub(MIN_SPAN);
        if low > high {
            continue;
        }
        let next = (i64::from(current) + step).clamp(i64::from(low), i64::from(high)) as u32;
        if next != current {
            cuts[i] = next;
            changed = true;
        }
    }
    changed
}

/// One balancing round: the regions with their cuts moved, or `None` if the load is
/// balanced enough, too small to matter, unknown, or the layout is not a column grid.
pub fn rebalance(
    regions: &[Region],
    view: &ClusterView,
    width: u32,
    height: u32,
) -> Option<Vec<Region>> {
    if regions.len() < 2 {
        return None;
    }
    let load = |id: ShardId| view.shards.get(&id).map(|s| s.players).unwrap_or(0);
    let total: u64 = regions.iter().map(|r| load(r.shard)).sum();
    let max = regions.iter().map(|r| load(r.shard)).max().unwrap_or(0);
    let mean = total as f64 / regions.len() as f64;
    if total < MIN_PLAYERS || (max as f64) <= TRIGGER * mean {
        return None;
    }
    // The grid: columns by x range, each a stack of rows by y.
    let mut columns: BTreeMap<(u32, u32), Vec<Region>> = BTreeMap::new();
    for region in regions {
        columns.entry((region.x0, region.x1)).or_default().push(*region);
    }
    for rows in columns.values_mut() {
        rows.sort_by_key(|r| r.y0);
    }
    let empty = LoadProfile::default();
    let profile_of = |id: ShardId| view.shards.get(&id).map(|s| &s.load).unwrap_or(&empty);
    let bands_x = width.div_ceil(LOAD_BAND) as usize;
    let bands_y = height.div_ceil(LOAD_BAND) as usize;

    // Column cuts: every column should carry its number of shards' share of all players.
    let mut x_cuts: Vec<u32> = columns.keys().map(|(x0, _)| *x0).collect();
    x_cuts.push(width);
    let all_x = sum_profiles(regions.iter().map(|r| profile_of(r.shard).x.as_slice()), bands_x);
    let n = regions.len() as f64;
    let mut before = 0usize;
    let mut x_targets = vec![None];
    for rows in columns.values() {
        before += rows.len();
        x_targets.push(quantile(&all_x, before as f64 / n));
    }
    let mut changed = step_cuts(&mut x_cuts, &x_targets);

    // Row cuts within each column, from the players of that column's shards.
    let mut result = Vec::with_capacity(regions.len());
    for (index, rows) in columns.values().enumerate() {
        let mut y_cuts: Vec<u32> = rows.iter().map(|r| r.y0).collect();
        y_cuts.push(height);
        let ys = sum_profiles(rows.iter().map(|r| profile_of(r.shard).y.as_slice()), bands_y);
        let k = rows.len() as f64;
        let targets: Vec<Option<f64>> = (0..=rows.len())
            .map(|j| if j == 0 { None } else { quantile(&ys, j as f64 / k) })
            .collect();
        changed |= step_cuts(&mut y_cuts, &targets);
        for (j, row) in rows.iter().enumerate() {
            result.push(Region {
                shard: row.shard,
                x0: x_cuts[index],
                x1: x_cuts[index + 1],
                y0: y_cuts[j],
                y1: y_cuts[j + 1],
            });
        }
    }
    changed.then_some(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::compute_partition;
    use crate::model::{ShardRecord, ShardState};

    /// Players standing on `cells`, counted by the region (shard) that owns each.
    fn view_with(regions: &[Region], cells: &[(u32, u32)]) -> ClusterView {
        let mut view = ClusterView::default();
        for region in regions {
            let bands = 400usize.div_ceil(LOAD_BAND as usize);
            let mut load = LoadProfile { x: vec![0; bands], y: vec![0; bands] };
            let mut players = 0;
            for &(x, y) in cells.iter().filter(|(x, y)| region.contains(*x, *y)) {
                load.x[(x / LOAD_BAND) as usize] += 1;
                load.y[(y / LOAD_BAND) as usize] += 1;
                players += 1;
            }
            let record = ShardRecord {
                id: region.shard,
                grpc: String::new(),
                admin: String::new(),
                state: ShardState::Serving,
                players,
                load,
                incarnation: 1,
            };
            view.shards.insert(region.shard, record);
        }
        view
    }

    fn loads(regions: &[Region], cells: &[(u32, u32)]) -> Vec<usize> {
        regions.iter().map(|r| cells.iter().filter(|(x, y)| r.contains(*x, *y)).count()).collect()
    }

    #[test]
    fn a_hotspot_is_spread_until_balanced_and_then_borders_stay() {
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let mut regions = compute_partition(&shards, 400, 400);
        // 400 players packed into 100x100 cells inside shard 1's quadrant.
        let cells: Vec<(u32, u32)> =
            (0..400u32).map(|i| (50 + (i * 37) % 100, 50 + (i * 53) % 100)).collect();
        let mut rounds = 0;
        while let Some(next) = rebalance(&regions, &view_with(&regions, &cells), 400, 400) {
            regions = next;
            rounds += 1;
            assert!(rounds < 50, "borders keep moving: {regions:?}");
        }
        let per_shard = loads(&regions, &cells);
        let max = *per_shard.iter().max().unwrap() as f64;
        assert!(max <= 1.3 * 100.0, "after {rounds} rounds loads are {per_shard:?}");
        assert!(rounds > 0);
        // Every cell still has exactly one owner.
        for x in (0..400).step_by(7) {
            for y in (0..400).step_by(7) {
                assert_eq!(regions.iter().filter(|r| r.contains(x, y)).count(), 1, "({x},{y})");
            }
        }
    }

    #[test]
    fn a_crowd_standing_in_clumps_is_balanced_too() {
        // A crowd in rows and columns a few cells apart (players queueing, say): the cuts
        // must land between the clumps, not where an even spread would put them.
        for seed in 1..200 {
            crowd_in_clumps_is_balanced(seed);
        }
    }

    fn crowd_in_clumps_is_balanced(seed: u32) {
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let mut regions = compute_partition(&shards, 400, 400);
        let mut state = seed;
        let mut next = |n: u32| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 16) % n
        };
        let cells: Vec<(u32, u32)> =
            (0..120).map(|_| (40 + 7 * next(17), 40 + 7 * next(17))).collect();
        let mut rounds = 0;
        while let Some(moved) = rebalance(&regions, &view_with(&regions, &cells), 400, 400) {
            regions = moved;
            rounds += 1;
            assert!(rounds < 50, "borders keep moving: {regions:?}");
        }
        let per_shard = loads(&regions, &cells);
        let max = *per_shard.iter().max().unwrap() as f64;
        assert!(max <= 1.3 * 30.0, "seed {seed}: after {rounds} rounds loads are {per_shard:?}");
    }

    #[test]
    fn balanced_or_tiny_loads_move_nothing() {
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let regions = compute_partition(&shards, 400, 400);
        let spread: Vec<(u32, u32)> =
            (0..400u32).map(|i| ((i * 97) % 400, (i * 89) % 400)).collect();
        assert!(rebalance(&regions, &view_with(&regions, &spread), 400, 400).is_none());
        let few: Vec<(u32, u32)> = (0..10u32).map(|i| (i, i)).collect();
        assert!(rebalance(&regions, &view_with(&regions, &few), 400, 400).is_none());
    }
}
