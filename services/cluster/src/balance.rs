//! Load-aware borders: the coordinator moves the partition's borders toward where the
//! players are, BigWorld-style, so a crowd in one region ends up spread over several, but
//! never cuts through a crowd that sees itself.
//!
//! The grid keeps its shape (columns, then rows within each column, each shard keeping
//! its place); only the cut positions move. Each interior cut is placed where the cost
//! this module models is lowest (approached by at most [`MAX_STEP`] cells a round):
//!
//! ```text
//! cost(c) = |players below c - their fair share| + BORDER_WEIGHT * players within sight of c
//! ```
//!
//! The first term is the imbalance the cut leaves (the fair share of the cut between the
//! k-th and (k+1)-th of n shards is k/n of the players it divides). The second is what a
//! border costs: every player within sight of it (closer than the view range, on either
//! side) is mirrored as a ghost to the shard across it, each of its moves is sent twice,
//! and its steps across the line are handoffs. A crowd whose members all see each other
//! (one narrower than the sight diameter) gains nothing from being cut, since every viewer
//! still needs every mover's notifications and each side must now mirror the other: for
//! such a crowd the second term outweighs the first at any cut inside it, so the cut goes
//! beside the crowd. A crowd wider than the sight diameter is cut where it is thinnest
//! and the shares are nearest fair.
//!
//! A cut moves only when that lowers its cost by more than [`HYSTERESIS`] of the players it
//! divides (at least [`MIN_GAIN`]): so a standing battle, whose players wander but whose
//! shape does not change, moves no border after the first adjustment, and a spread world
//! settles instead of oscillating.

use std::collections::BTreeMap;

use crate::model::{ClusterView, LoadProfile, Region, ShardId, LOAD_BAND};

/// Largest move of one border per round, in cells.
pub const MAX_STEP: u32 = 24;
/// Narrowest a column or row may become, in cells.
pub const MIN_SPAN: u32 = 20;
/// Below this many players in all, load is noise: borders stay where they are.
pub const MIN_PLAYERS: u64 = 20;
/// What one player within sight of a border costs, in players of imbalance.
pub const BORDER_WEIGHT: f64 = 1.0;
/// A cut moves only if that lowers its cost by more than this fraction of the players it
/// divides ...
pub const HYSTERESIS: f64 = 0.05;
/// ... and by more than this many players.
pub const MIN_GAIN: f64 = 5.0;

/// The world's dimensions as the balancer needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub width: u32,
    pub height: u32,
    /// The view range (a player sees another iff both coordinates are within it).
    pub sight: u32,
}

/// Players per band along one axis and how crowded they stand, with prefix sums to count
/// any range at once.
struct Axis {
    /// `players[b]` = players in bands `0..b`.
    players: Vec<u64>,
    /// `crowd[b]` = the crowd weights (hundredths of a player) of bands `0..b`.
    crowd: Vec<u64>,
}

fn prefix(profile: &[u64]) -> Vec<u64> {
    std::iter::once(0)
        .chain(profile.iter().scan(0, |total, &n| {
            *total += n;
            Some(*total)
        }))
        .collect()
}

impl Axis {
    fn new(players: &[u64], crowd: &[u64]) -> Axis {
        Axis { players: prefix(players), crowd: prefix(crowd) }
    }

    fn total(&self) -> u64 {
        *self.players.last().expect("invariant: never empty")
    }

    /// The sum of `prefix`'s profile over cells `from..to` of the axis (clamped to it).
    fn between(prefix: &[u64], from: i64, to: i64) -> u64 {
        let band = |cell: i64| {
            let band = cell.max(0) as u64 / u64::from(LOAD_BAND);
            (band as usize).min(prefix.len() - 1)
        };
        let (from, to) = (band(from), band(to));
        if to <= from {
            return 0;
        }
        prefix[to] - prefix[from]
    }

    /// The modelled cost of a cut at cell `at` that should leave `share` players below it:
    /// the imbalance, and the crowd within sight of the line on either side (a player in
    /// view of cells across the line sees them from `at - sight` to `at + sight - 1`).
    fn cost(&self, at: u32, share: f64, sight: u32) -> f64 {
        let below = Axis::between(&self.players, 0, i64::from(at)) as f64;
        let (at, sight) = (i64::from(at), i64::from(sight));
        let near = Axis::between(&self.crowd, at - sight, at + sight) as f64 / 100.0;
        (below - share).abs() + BORDER_WEIGHT * near
    }
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

/// Moves each interior cut of `cuts` (first and last fixed) toward the cheapest place
/// between its neighbours, by at most [`MAX_STEP`] cells, if that place is cheaper than
/// where it stands by the hysteresis; keeping the cuts ordered and at least [`MIN_SPAN`]
/// apart. `shares[i]` is the fair share below cut `i` (`shares[0]` unused). `eager`: any
/// gain over [`MIN_GAIN`] moves a cut (the hysteresis is spent: the map changes anyway).
fn step_cuts(cuts: &mut [u32], shares: &[f64], axis: &Axis, sight: u32, eager: bool) -> bool {
    let hysteresis = if eager { 0.0 } else { HYSTERESIS };
    let threshold = (hysteresis * axis.total() as f64).max(MIN_GAIN);
    let mut changed = false;
    for i in 1..cuts.len() - 1 {
        let low = cuts[i - 1] + MIN_SPAN;
        let high = cuts[i + 1].saturating_sub(MIN_SPAN);
        if low > high {
            continue;
        }
        let current = cuts[i].clamp(low, high);
        let share = shares[i];
        let here = axis.cost(current, share, sight);
        let mut best = (here, current);
        for at in low..=high {
            let cost = axis.cost(at, share, sight);
            let nearer = at.abs_diff(current) < best.1.abs_diff(current);
            if cost < best.0 || (cost == best.0 && nearer) {
                best = (cost, at);
            }
        }
        let next = if here - best.0 > threshold {
            let step = (i64::from(best.1) - i64::from(current))
                .clamp(-i64::from(MAX_STEP), i64::from(MAX_STEP));
            (i64::from(current) + step) as u32
        } else {
            current
        };
        if next != cuts[i] {
            cuts[i] = next;
            changed = true;
        }
    }
    changed
}

/// One balancing round: the regions with their cuts moved, or `None` if the load is
/// balanced enough, too small to matter, unknown, no cut would be cheaper, or the layout
/// is not a column grid.
pub fn rebalance(regions: &[Region], view: &ClusterView, bounds: Bounds) -> Option<Vec<Region>> {
    // Only a cut that gains more than the hysteresis starts a change; once the map changes,
    // every cut goes where it is cheapest, so that a settled map has no cut waiting just
    // under the threshold for noise to push it over.
    let cautious = round(regions, view, bounds, false)?;
    Some(round(regions, view, bounds, true).unwrap_or(cautious))
}

fn round(
    regions: &[Region],
    view: &ClusterView,
    bounds: Bounds,
    eager: bool,
) -> Option<Vec<Region>> {
    if regions.len() < 2 {
        return None;
    }
    let total: u64 =
        regions.iter().map(|r| view.shards.get(&r.shard).map(|s| s.players).unwrap_or(0)).sum();
    if total < MIN_PLAYERS {
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
    let bands_x = bounds.width.div_ceil(LOAD_BAND) as usize;
    let bands_y = bounds.height.div_ceil(LOAD_BAND) as usize;

    // Column cuts: the players left of a cut should be its columns' shards' share of all.
    let mut x_cuts: Vec<u32> = columns.keys().map(|(x0, _)| *x0).collect();
    x_cuts.push(bounds.width);
    let profiles = || regions.iter().map(|r| profile_of(r.shard));
    let all_x = Axis::new(
        &sum_profiles(profiles().map(|p| p.x.as_slice()), bands_x),
        &sum_profiles(profiles().map(|p| p.crowd_x.as_slice()), bands_x),
    );
    let n = regions.len() as f64;
    let mut before = 0usize;
    let mut x_shares = vec![0.0];
    for rows in columns.values() {
        before += rows.len();
        x_shares.push(all_x.total() as f64 * before as f64 / n);
    }
    let mut changed = step_cuts(&mut x_cuts, &x_shares, &all_x, bounds.sight, eager);

    // Row cuts within each column, from the players of that column's shards.
    let mut result = Vec::with_capacity(regions.len());
    for (index, rows) in columns.values().enumerate() {
        let mut y_cuts: Vec<u32> = rows.iter().map(|r| r.y0).collect();
        y_cuts.push(bounds.height);
        let profiles = || rows.iter().map(|r| profile_of(r.shard));
        let ys = Axis::new(
            &sum_profiles(profiles().map(|p| p.y.as_slice()), bands_y),
            &sum_profiles(profiles().map(|p| p.crowd_y.as_slice()), bands_y),
        );
        let k = rows.len() as f64;
        let shares: Vec<f64> = (0..=rows.len()).map(|j| ys.total() as f64 * j as f64 / k).collect();
        changed |= step_cuts(&mut y_cuts, &shares, &ys, bounds.sight, eager);
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

    const BOUNDS: Bounds = Bounds { width: 400, height: 400, sight: 20 };

    /// Players standing on `cells`, counted by the region (shard) that owns each.
    pub(super) fn view_with(regions: &[Region], cells: &[(u32, u32)]) -> ClusterView {
        let mut view = ClusterView::default();
        for region in regions {
            let bands = 400usize.div_ceil(LOAD_BAND as usize);
            let mut load =
                LoadProfile { x: vec![0; bands], y: vec![0; bands], ..Default::default() };
            let mut players = 0;
            for &(x, y) in cells.iter().filter(|(x, y)| region.contains(*x, *y)) {
                load.x[(x / LOAD_BAND) as usize] += 1;
                load.y[(y / LOAD_BAND) as usize] += 1;
                players += 1;
            }
            add_crowding(&mut load, region, cells);
            let record = ShardRecord {
                id: region.shard,
                grpc: String::new(),
                admin: String::new(),
                state: ShardState::Serving,
                players,
                load,
                incarnation: 1,
                transport: None,
            };
            view.shards.insert(region.shard, record);
        }
        view
    }

    /// The crowd profiles as a shard computes them: per player, the players in the 3x3
    /// sectors of side 20 around it.
    pub(super) fn add_crowding(load: &mut LoadProfile, region: &Region, cells: &[(u32, u32)]) {
        let mut sectors = std::collections::HashMap::<(u32, u32), usize>::new();
        for &(x, y) in cells {
            *sectors.entry((x / 20, y / 20)).or_default() += 1;
        }
        load.crowd_x = vec![0; 400];
        load.crowd_y = vec![0; 400];
        for &(x, y) in cells.iter().filter(|(x, y)| region.contains(*x, *y)) {
            let (column, row) = (x / 20, y / 20);
            let mut around = 0;
            for c in column.saturating_sub(1)..=column + 1 {
                for r in row.saturating_sub(1)..=row + 1 {
                    around += sectors.get(&(c, r)).copied().unwrap_or(0);
                }
            }
            let weight = LoadProfile::crowd_weight(around);
            load.crowd_x[x as usize] += weight;
            load.crowd_y[y as usize] += weight;
        }
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
        while let Some(next) = rebalance(&regions, &view_with(&regions, &cells), BOUNDS) {
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
        while let Some(moved) = rebalance(&regions, &view_with(&regions, &cells), BOUNDS) {
            regions = moved;
            rounds += 1;
            assert!(rounds < 50, "borders keep moving: {regions:?}");
        }
        let per_shard = loads(&regions, &cells);
        let max = *per_shard.iter().max().unwrap() as f64;
        assert!(
            max <= 1.3 * 30.0,
            "seed {seed}: after {rounds} rounds loads are {per_shard:?}: {regions:?}"
        );
    }

    #[test]
    fn balanced_or_tiny_loads_move_nothing() {
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let regions = compute_partition(&shards, 400, 400);
        let spread: Vec<(u32, u32)> =
            (0..400u32).map(|i| ((i * 97) % 400, (i * 89) % 400)).collect();
        assert!(rebalance(&regions, &view_with(&regions, &spread), BOUNDS).is_none());
        let few: Vec<(u32, u32)> = (0..10u32).map(|i| (i, i)).collect();
        assert!(rebalance(&regions, &view_with(&regions, &few), BOUNDS).is_none());
    }
}

#[cfg(test)]
mod battles {
    use super::tests::view_with;
    use super::*;
    use crate::layout::compute_partition;

    const BOUNDS: Bounds = Bounds { width: 400, height: 400, sight: 20 };

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u32) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) % u64::from(n)) as u32
        }
    }

    /// `n` players at random cells of the box `x0..x0+side`, `y0..y0+side`.
    fn crowd(rng: &mut Rng, n: u32, (x0, y0): (u32, u32), side: u32) -> Vec<(u32, u32)> {
        (0..n).map(|_| (x0 + rng.below(side), y0 + rng.below(side))).collect()
    }

    fn owners_of(regions: &[Region], cells: &[(u32, u32)]) -> std::collections::BTreeSet<ShardId> {
        cells
            .iter()
            .map(|&(x, y)| regions.iter().find(|r| r.contains(x, y)).expect("owned").shard)
            .collect()
    }

    /// Rounds until the balancer stops moving borders (at most 20).
    fn settle(regions: &mut Vec<Region>, cells: &[(u32, u32)]) -> usize {
        for round in 0..20 {
            match rebalance(regions, &view_with(regions, cells), BOUNDS) {
                Some(next) => *regions = next,
                None => return round,
            }
        }
        panic!("borders keep moving: {regions:?}");
    }

    #[test]
    fn a_battle_on_the_corner_of_four_shards_ends_on_one_and_stays() {
        for seed in 1..30 {
            let mut rng = Rng(seed);
            let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
            let mut regions = compute_partition(&shards, 400, 400);
            // 2,000 players in a 20x20 box on the corner where all four shards meet,
            // and 3,000 more spread over the map.
            let mut battle = crowd(&mut rng, 2000, (190, 190), 20);
            let mut spread = crowd(&mut rng, 3000, (0, 0), 400);
            let cells: Vec<_> = battle.iter().chain(&spread).copied().collect();
            let rounds = settle(&mut regions, &cells);
            assert!(rounds <= 4, "seed {seed}: {rounds} rounds to settle");
            assert_eq!(
                owners_of(&regions, &battle).len(),
                1,
                "seed {seed}: the crowd is cut: {regions:?}"
            );
            // The battle goes on: everyone wanders inside the box, and the map's players
            // walk a few cells a round (a balancing period is 2 s, a move a second). No
            // border moves again in 30 s.
            for _ in 0..15 {
                battle = crowd(&mut rng, 2000, (190, 190), 20);
                for (x, y) in &mut spread {
                    *x = (*x + rng.below(5)).saturating_sub(2).min(399);
                    *y = (*y + rng.below(5)).saturating_sub(2).min(399);
                }
                let cells: Vec<_> = battle.iter().chain(&spread).copied().collect();
                let moved = rebalance(&regions, &view_with(&regions, &cells), BOUNDS);
                assert!(
                    moved.is_none(),
                    "seed {seed}: a standing battle moved a border: {moved:?}"
                );
            }
        }
    }

    #[test]
    fn a_battle_alone_on_a_border_is_moved_beside_it_not_through_it() {
        for seed in 1..30 {
            let mut rng = Rng(seed);
            let shards: Vec<ShardId> = (1..=2).map(ShardId).collect();
            let mut regions = compute_partition(&shards, 400, 400);
            let battle = crowd(&mut rng, 1000, (190, 100), 20);
            settle(&mut regions, &battle);
            assert_eq!(owners_of(&regions, &battle).len(), 1, "seed {seed}: {regions:?}");
        }
    }

    #[test]
    fn a_crowd_wider_than_sight_is_still_shared() {
        // 2,000 players over 160x160 cells: wider than the sight diameter, so each part of
        // it sees only its neighbourhood and cutting it pays.
        let mut rng = Rng(7);
        let shards: Vec<ShardId> = (1..=4).map(ShardId).collect();
        let mut regions = compute_partition(&shards, 400, 400);
        let cells = crowd(&mut rng, 2000, (20, 20), 160);
        settle(&mut regions, &cells);
        let loads: Vec<usize> = regions
            .iter()
            .map(|r| cells.iter().filter(|(x, y)| r.contains(*x, *y)).count())
            .collect();
        assert!(loads.iter().all(|&n| n >= 300), "loads {loads:?}: {regions:?}");
    }
}
