//! The partition map as tests see it: read from `meridian status --json`, its borders and
//! corners, and the layout ARCHITECTURE.md promises for N shards (to check the live map against,
//! and to aim a scenario at before any cluster runs).
//!
//! The promised layouts are a hand-written table (`LAYOUTS_400`), not a second copy of
//! the coordinator's arithmetic: a copy would share that arithmetic's bugs. The unit tests
//! check the table against properties read from ARCHITECTURE.md (an exact tiling, the
//! column grid, shards in id order, the borders and corners a reader expects) and against
//! `meridian_cluster::compute_partition`, so the two derivations must agree.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use meridian_protocol::pb::Direction;

use crate::cluster::Cluster;
use crate::wait::wait_until;

/// A half-open rectangle `[x0, x1) x [y0, y1)` owned by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub shard: u32,
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

impl Region {
    pub fn contains(&self, (x, y): (u32, u32)) -> bool {
        self.x0 <= x && x < self.x1 && self.y0 <= y && y < self.y1
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {} x[{},{}) y[{},{})", self.shard, self.x0, self.x1, self.y0, self.y1)
    }
}

/// A straight piece of border between two cells: `Vertical { x, .. }` runs between columns
/// `x - 1` and `x` for rows `y0..y1`; `Horizontal { y, .. }` between rows `y - 1` and `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Border {
    Vertical { x: u32, y0: u32, y1: u32 },
    Horizontal { y: u32, x0: u32, x1: u32 },
}

impl Border {
    /// The number of cell pairs along it.
    pub fn len(&self) -> u32 {
        match *self {
            Border::Vertical { y0, y1, .. } => y1 - y0,
            Border::Horizontal { x0, x1, .. } => x1 - x0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The grid point `along` cells from its start: `(x, y)` with the border between
    /// `x - 1` and `x` (vertical) or `y - 1` and `y` (horizontal).
    pub fn point(&self, along: u32) -> (u32, u32) {
        match *self {
            Border::Vertical { x, y0, .. } => (x, y0 + along),
            Border::Horizontal { y, x0, .. } => (x0 + along, y),
        }
    }

    /// The direction that crosses it from the low side (left or top) to the high side.
    pub fn across(&self) -> Direction {
        match self {
            Border::Vertical { .. } => Direction::Right,
            Border::Horizontal { .. } => Direction::Down,
        }
    }
}

/// The partition map: who owns which cells, as of one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub epoch: u64,
    pub width: u32,
    pub height: u32,
    pub regions: Vec<Region>,
}

impl Partition {
    /// The layout ARCHITECTURE.md promises `shards` (ids, any order, repeats ignored) on a
    /// `width x height` map, from the hand-written table `LAYOUTS_400`: the i-th smallest id
    /// gets the table's i-th rectangle. Epoch 0: compare with [`Partition::same_layout`].
    ///
    /// Panics for a map size or shard count the table has no row for: add the row, worked
    /// out by hand, rather than compute it (see the module header).
    pub fn expected(shards: &[u32], width: u32, height: u32) -> Partition {
        Partition::promised(shards, width, height).unwrap_or_else(|| {
            panic!(
                "no hand-written layout for {} shards on a {width}x{height} map in \
                 testkit's partition table; add one",
                distinct(shards).len()
            )
        })
    }

    /// [`Partition::expected`], or `None` where the table has no row.
    fn promised(shards: &[u32], width: u32, height: u32) -> Option<Partition> {
        let ids = distinct(shards);
        let rectangles: &[[u32; 4]] = if ids.is_empty() {
            &[]
        } else if (width, height) == (400, 400) {
            LAYOUTS_400.get(ids.len() - 1)?
        } else {
            return None;
        };
        let regions = ids
            .iter()
            .zip(rectangles)
            .map(|(&shard, &[x0, y0, x1, y1])| Region { shard, x0, y0, x1, y1 })
            .collect();
        Some(Partition { epoch: 0, width, height, regions })
    }

    /// The `partition` of `meridian status --json`; `None` while none is published.
    pub fn from_status(status: &serde_json::Value) -> anyhow::Result<Option<Partition>> {
        let partition = &status["partition"];
        if partition.is_null() {
            return Ok(None);
        }
        let number = |value: &serde_json::Value, name: &str| {
            value[name].as_u64().with_context(|| format!("no number {name:?} in {value}"))
        };
        let list = partition["regions"]
            .as_array()
            .with_context(|| format!("no partition.regions in {status}"))?;
        let regions = list
            .iter()
            .map(|r| {
                Ok(Region {
                    shard: number(r, "shard")? as u32,
                    x0: number(r, "x0")? as u32,
                    y0: number(r, "y0")? as u32,
                    x1: number(r, "x1")? as u32,
                    y1: number(r, "y1")? as u32,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some(Partition {
            epoch: number(partition, "epoch")?,
            width: number(partition, "width")? as u32,
            height: number(partition, "height")? as u32,
            regions,
        }))
    }

    /// Same map size and the same regions (in any order), whatever the epochs.
    pub fn same_layout(&self, other: &Partition) -> bool {
        let sorted = |p: &Partition| {
            let mut r: Vec<(u32, u32, u32, u32, u32)> =
                p.regions.iter().map(|r| (r.shard, r.x0, r.y0, r.x1, r.y1)).collect();
            r.sort_unstable();
            r
        };
        self.width == other.width && self.height == other.height && sorted(self) == sorted(other)
    }

    /// The shard that owns a cell.
    pub fn owner(&self, cell: (u32, u32)) -> Option<u32> {
        self.regions.iter().find(|r| r.contains(cell)).map(|r| r.shard)
    }

    /// The region that holds a cell.
    pub fn region_of(&self, cell: (u32, u32)) -> Option<&Region> {
        self.regions.iter().find(|r| r.contains(cell))
    }

    /// Shards that own at least one region.
    pub fn owners(&self) -> BTreeSet<u32> {
        self.regions.iter().map(|r| r.shard).collect()
    }

    /// Every straight piece of border: each region's right and bottom edge, cut where the
    /// shard on the other side changes. Map edges are not borders.
    pub fn borders(&self) -> Vec<Border> {
        let mut borders = BTreeSet::new();
        for r in &self.regions {
            if r.x1 < self.width {
                let mut start = r.y0;
                for y in r.y0..=r.y1 {
                    let cut = y == r.y1
                        || (y > r.y0 && self.owner((r.x1, y)) != self.owner((r.x1, y - 1)));
                    if cut {
                        if y > start && self.owner((r.x1, start)) != Some(r.shard) {
                            borders.insert(Border::Vertical { x: r.x1, y0: start, y1: y });
                        }
                        start = y;
                    }
                }
            }
            if r.y1 < self.height {
                let mut start = r.x0;
                for x in r.x0..=r.x1 {
                    let cut = x == r.x1
                        || (x > r.x0 && self.owner((x, r.y1)) != self.owner((x - 1, r.y1)));
                    if cut {
                        if x > start && self.owner((start, r.y1)) != Some(r.shard) {
                            borders.insert(Border::Horizontal { y: r.y1, x0: start, x1: x });
                        }
                        start = x;
                    }
                }
            }
        }
        borders.into_iter().collect()
    }

    /// Grid points where three or more shards meet, with how many: `(x, y)` is the point
    /// shared by cells `(x-1, y-1)`, `(x, y-1)`, `(x-1, y)` and `(x, y)`.
    pub fn corners(&self) -> Vec<((u32, u32), usize)> {
        let mut points = BTreeSet::new();
        for r in &self.regions {
            for p in [(r.x0, r.y0), (r.x1, r.y0), (r.x0, r.y1), (r.x1, r.y1)] {
                points.insert(p);
            }
        }
        points
            .into_iter()
            .filter(|&(x, y)| x > 0 && y > 0 && x < self.width && y < self.height)
            .filter_map(|(x, y)| {
                let owners: BTreeSet<u32> = [(x - 1, y - 1), (x, y - 1), (x - 1, y), (x, y)]
                    .into_iter()
                    .filter_map(|c| self.owner(c))
                    .collect();
                (owners.len() >= 3).then_some(((x, y), owners.len()))
            })
            .collect()
    }

    /// How many times the owner changes along a path of cells.
    pub fn owner_changes(&self, path: impl IntoIterator<Item = (u32, u32)>) -> u64 {
        let mut changes = 0;
        let mut last = None;
        for cell in path {
            let owner = self.owner(cell);
            if last.is_some() && owner != last {
                changes += 1;
            }
            last = owner;
        }
        changes
    }
}

/// The promised layouts of the 400x400 map, written out by hand: row `n - 1` lists the
/// rectangles `[x0, y0, x1, y1]` (half-open) of the 1st, 2nd, ... smallest shard id of `n`.
///
/// ARCHITECTURE.md ("One world over many shards"): `ceil(sqrt(n))` columns, each cut into
/// rows, shards in id order filling column 0 top to bottom, then column 1; `n = 4` is a
/// 2x2 grid with a four-way corner at the centre. The coordinator's documentation adds
/// near-equal widths and heights and the spare rows (`n % columns`) in the first columns.
/// Where a length does not divide, a cut sits at `floor(k * 400 / parts)`: thirds are
/// 0 / 133 / 266 / 400, so the last column and the last row are the 134-cell ones.
const LAYOUTS_400: [&[[u32; 4]]; 9] = [
    // 1 shard: the whole map, no border.
    &[[0, 0, 400, 400]],
    // 2 shards: two columns, one border at x = 200.
    &[[0, 0, 200, 400], [200, 0, 400, 400]],
    // 3 shards: two columns, the first cut in two; a three-way corner at (200, 200).
    &[[0, 0, 200, 200], [0, 200, 200, 400], [200, 0, 400, 400]],
    // 4 shards: 2x2, a four-way corner at (200, 200).
    &[[0, 0, 200, 200], [0, 200, 200, 400], [200, 0, 400, 200], [200, 200, 400, 400]],
    // 5 shards: three columns of 2, 2 and 1 rows.
    &[
        [0, 0, 133, 200],
        [0, 200, 133, 400],
        [133, 0, 266, 200],
        [133, 200, 266, 400],
        [266, 0, 400, 400],
    ],
    // 6 shards: three columns of 2 rows.
    &[
        [0, 0, 133, 200],
        [0, 200, 133, 400],
        [133, 0, 266, 200],
        [133, 200, 266, 400],
        [266, 0, 400, 200],
        [266, 200, 400, 400],
    ],
    // 7 shards: three columns of 3, 2 and 2 rows.
    &[
        [0, 0, 133, 133],
        [0, 133, 133, 266],
        [0, 266, 133, 400],
        [133, 0, 266, 200],
        [133, 200, 266, 400],
        [266, 0, 400, 200],
        [266, 200, 400, 400],
    ],
    // 8 shards: three columns of 3, 3 and 2 rows.
    &[
        [0, 0, 133, 133],
        [0, 133, 133, 266],
        [0, 266, 133, 400],
        [133, 0, 266, 133],
        [133, 133, 266, 266],
        [133, 266, 266, 400],
        [266, 0, 400, 200],
        [266, 200, 400, 400],
    ],
    // 9 shards: 3x3, four four-way corners.
    &[
        [0, 0, 133, 133],
        [0, 133, 133, 266],
        [0, 266, 133, 400],
        [133, 0, 266, 133],
        [133, 133, 266, 266],
        [133, 266, 266, 400],
        [266, 0, 400, 133],
        [266, 133, 400, 266],
        [266, 266, 400, 400],
    ],
];

/// The ids in increasing order, each once.
fn distinct(shards: &[u32]) -> Vec<u32> {
    shards.iter().copied().collect::<BTreeSet<u32>>().into_iter().collect()
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} ({}x{}):", self.epoch, self.width, self.height)?;
        for r in &self.regions {
            write!(f, " [{r}]")?;
        }
        Ok(())
    }
}

/// Waits until the published partition gives a region to every shard of the ready file, and
/// returns it. The ready file promises the nodes are up; the map may follow a moment later.
pub fn wait_for_partition(cluster: &Cluster, within: Duration) -> anyhow::Result<Partition> {
    let want: BTreeSet<u32> = cluster.shards().iter().map(|s| s.id).collect();
    let mut last: Option<Partition> = None;
    let mut error = None;
    let waited = wait_until(
        Instant::now() + within,
        &format!("the partition map to give a region to each of the shards {want:?}"),
        || match cluster.status_json().and_then(|s| Partition::from_status(&s)) {
            Ok(partition) => {
                let done = partition.as_ref().is_some_and(|p| p.owners() == want);
                last = partition;
                done
            }
            Err(e) => {
                error = Some(e);
                true
            }
        },
    );
    if let Some(e) = error {
        return Err(e.context("reading the partition from `meridian status --json`"));
    }
    if let Err(e) = waited {
        match &last {
            Some(p) => bail!("{e:#}; last partition: {p}"),
            None => bail!("{e:#}; no partition was ever published"),
        }
    }
    Ok(last.expect("invariant: set when the wait succeeded"))
}

/// [`wait_for_partition`], then checks that the live map is the layout ARCHITECTURE.md
/// promises for this many shards, so a scenario aimed at the promised borders really meets
/// them.
pub fn wait_for_expected_partition(
    cluster: &Cluster,
    within: Duration,
) -> anyhow::Result<Partition> {
    let live = wait_for_partition(cluster, within)?;
    let ids: Vec<u32> = cluster.shards().iter().map(|s| s.id).collect();
    let Some(expected) = Partition::promised(&ids, live.width, live.height) else {
        bail!(
            "testkit's partition table has no layout for {} shards on a {}x{} map; add one \
             (live: {live})",
            distinct(&ids).len(),
            live.width,
            live.height
        );
    };
    if !live.same_layout(&expected) {
        bail!(
            "the live partition is not the layout ARCHITECTURE.md gives {} shards:\n  live     {live}\n  expected {expected}",
            ids.len()
        );
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use meridian_cluster::{compute_partition, ShardId};

    /// Everything ARCHITECTURE.md's "One world over many shards" (and the coordinator's
    /// documented near-equal spans) says a layout for `ids` must be, checked from the
    /// rectangles alone, without building a layout: the list of what is wrong.
    fn problems(p: &Partition, ids: &[u32]) -> Vec<String> {
        let mut wrong = Vec::new();
        let want = distinct(ids);
        let n = want.len() as u32;
        let mut owners: Vec<u32> = p.regions.iter().map(|r| r.shard).collect();
        owners.sort_unstable();
        if owners != want {
            wrong.push(format!("one region per shard of {want:?}, got owners {owners:?}"));
        }
        // An exact tiling: every rectangle non-empty and on the map, no two overlapping,
        // and together as large as the map.
        let area = |r: &Region| u64::from(r.x1 - r.x0) * u64::from(r.y1 - r.y0);
        for r in &p.regions {
            if r.x0 >= r.x1 || r.y0 >= r.y1 || r.x1 > p.width || r.y1 > p.height {
                wrong.push(format!("[{r}] is empty or off the {}x{} map", p.width, p.height));
            }
        }
        for (i, a) in p.regions.iter().enumerate() {
            for b in &p.regions[i + 1..] {
                if a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 {
                    wrong.push(format!("[{a}] overlaps [{b}]"));
                }
            }
        }
        let covered: u64 = p.regions.iter().map(area).sum();
        if n > 0 && covered != u64::from(p.width) * u64::from(p.height) {
            wrong.push(format!("the regions cover {covered} cells, not the whole map"));
        }
        // Columns: side by side across the whole width, ceil(sqrt(n)) of them, widths
        // within one cell of each other.
        let mut columns: BTreeMap<(u32, u32), Vec<Region>> = BTreeMap::new();
        for r in &p.regions {
            columns.entry((r.x0, r.x1)).or_default().push(*r);
        }
        let c = columns.len() as u32;
        if n > 0 && !(c > 0 && c * c >= n && (c - 1) * (c - 1) < n) {
            wrong.push(format!("{c} columns for {n} shards, not ceil(sqrt({n}))"));
        }
        let mut x = 0;
        for &(x0, x1) in columns.keys() {
            if x0 != x {
                wrong.push(format!(
                    "the column x[{x0},{x1}) does not start where the last ended, {x}"
                ));
            }
            x = x1;
        }
        if n > 0 && x != p.width {
            wrong.push(format!("the columns end at x = {x}, not {}", p.width));
        }
        let spread = |spans: &mut dyn Iterator<Item = u32>| {
            let spans: Vec<u32> = spans.collect();
            spans.iter().max().unwrap_or(&0) - spans.iter().min().unwrap_or(&0)
        };
        if spread(&mut columns.keys().map(|(x0, x1)| x1 - x0)) > 1 {
            wrong.push(format!("column widths differ by more than a cell: {:?}", columns.keys()));
        }
        // Rows: each column stacked top to bottom over the whole height, heights within
        // one cell; the spare rows in the first columns.
        let mut row_counts = Vec::new();
        for ((x0, _), rows) in &mut columns {
            rows.sort_by_key(|r| r.y0);
            row_counts.push(rows.len());
            let mut y = 0;
            for r in rows.iter() {
                if r.y0 != y {
                    wrong.push(format!("[{r}] does not start where the row above ended, {y}"));
                }
                y = r.y1;
            }
            if y != p.height {
                wrong.push(format!("the column at x = {x0} ends at y = {y}, not {}", p.height));
            }
            if spread(&mut rows.iter().map(|r| r.y1 - r.y0)) > 1 {
                wrong.push(format!(
                    "row heights in the column at x = {x0} differ by more than a cell"
                ));
            }
        }
        if row_counts.windows(2).any(|w| w[0] < w[1] || w[0] > w[1] + 1) {
            wrong.push(format!("rows per column {row_counts:?}: not near-equal, spares first"));
        }
        // Shards in id order: column 0 top to bottom, then column 1, and so on.
        let order: Vec<u32> = columns.values().flatten().map(|r| r.shard).collect();
        if order != want {
            wrong.push(format!("shards by column then row are {order:?}, not in id order"));
        }
        wrong
    }

    /// The coordinator's own layout, in the test kit's terms.
    fn coordinator(ids: &[u32], width: u32, height: u32) -> Partition {
        let shards: Vec<ShardId> = ids.iter().map(|&id| ShardId(id)).collect();
        let regions = compute_partition(&shards, width, height)
            .into_iter()
            .map(|r| Region { shard: r.shard.0, x0: r.x0, y0: r.y0, x1: r.x1, y1: r.y1 })
            .collect();
        Partition { epoch: 0, width, height, regions }
    }

    /// Shard-id sets of every size the table has: 1..=n, shuffled with a repeat, and
    /// sparse (the ids a cluster has after joins and drains).
    fn id_sets() -> Vec<Vec<u32>> {
        let mut sets = Vec::new();
        for n in 1..=LAYOUTS_400.len() as u32 {
            sets.push((1..=n).collect());
            let mut shuffled: Vec<u32> = (1..=n).rev().collect();
            shuffled.rotate_left(n as usize / 2);
            shuffled.push(n);
            sets.push(shuffled);
            sets.push((1..=n).map(|i| 7 * i + 3).collect());
        }
        sets
    }

    #[test]
    fn every_table_layout_keeps_the_documented_rules() {
        for ids in id_sets() {
            let p = Partition::expected(&ids, 400, 400);
            let wrong = problems(&p, &ids);
            assert!(wrong.is_empty(), "{ids:?}: {p}\n  {}", wrong.join("\n  "));
        }
    }

    #[test]
    fn the_coordinator_computes_the_table_layouts() {
        // Two independent derivations of the same promise: if the coordinator's grid
        // changes (a rounding, the order of shards, where the spare rows go), this fails.
        for ids in id_sets() {
            let table = Partition::expected(&ids, 400, 400);
            let live = coordinator(&ids, 400, 400);
            assert!(
                table.same_layout(&live),
                "{ids:?}:\n  table       {table}\n  coordinator {live}"
            );
            assert_eq!(table.regions, live.regions, "{ids:?}: same regions, in the same order");
        }
    }

    #[test]
    fn the_property_check_rejects_broken_layouts() {
        // The checks above must be able to fail: each of these breaks one rule.
        let r = |s, x0, y0, x1, y1| Region { shard: s, x0, y0, x1, y1 };
        let map = |regions| Partition { epoch: 0, width: 400, height: 400, regions };
        let broken = [
            // A gap of one column of cells.
            (vec![r(1, 0, 0, 199, 400), r(2, 200, 0, 400, 400)], vec![1, 2]),
            // An overlap.
            (vec![r(1, 0, 0, 201, 400), r(2, 200, 0, 400, 400)], vec![1, 2]),
            // Split across, not along: one column of two rows for two shards.
            (vec![r(1, 0, 0, 400, 200), r(2, 0, 200, 400, 400)], vec![1, 2]),
            // Shards out of id order.
            (vec![r(2, 0, 0, 200, 400), r(1, 200, 0, 400, 400)], vec![1, 2]),
            // The spare row in the last column instead of the first.
            (
                vec![r(1, 0, 0, 200, 400), r(2, 200, 0, 400, 200), r(3, 200, 200, 400, 400)],
                vec![1, 2, 3],
            ),
            // Widths two cells apart.
            (vec![r(1, 0, 0, 199, 400), r(2, 199, 0, 400, 400)], vec![1, 2]),
            // A shard without a region.
            (vec![r(1, 0, 0, 200, 400), r(2, 200, 0, 400, 400)], vec![1, 2, 3]),
            // Two columns for five shards.
            (
                vec![
                    r(1, 0, 0, 200, 133),
                    r(2, 0, 133, 200, 266),
                    r(3, 0, 266, 200, 400),
                    r(4, 200, 0, 400, 200),
                    r(5, 200, 200, 400, 400),
                ],
                vec![1, 2, 3, 4, 5],
            ),
        ];
        for (regions, ids) in broken {
            let p = map(regions);
            assert!(!problems(&p, &ids).is_empty(), "{ids:?}: {p} passed the checks");
        }
    }

    #[test]
    fn nine_shards_make_a_three_by_three_grid_with_four_four_way_corners() {
        let p = Partition::expected(&(1..=9).collect::<Vec<_>>(), 400, 400);
        assert_eq!(
            p.corners(),
            vec![((133, 133), 4), ((133, 266), 4), ((266, 133), 4), ((266, 266), 4)]
        );
        assert_eq!(p.owner((0, 0)), Some(1));
        assert_eq!(p.owner((0, 399)), Some(3));
        assert_eq!(p.owner((399, 0)), Some(7));
        assert_eq!(p.owner((399, 399)), Some(9));
    }

    #[test]
    fn five_to_eight_shards_put_the_spare_rows_in_the_first_columns() {
        // Three columns; a shard alone in the last column for five, three rows in the
        // first column for seven and in the first two for eight.
        let five = Partition::expected(&[1, 2, 3, 4, 5], 400, 400);
        assert_eq!(five.region_of((300, 0)), five.region_of((300, 399)));
        assert_eq!(five.corners(), vec![((133, 200), 4), ((266, 200), 3)]);
        let seven = Partition::expected(&[1, 2, 3, 4, 5, 6, 7], 400, 400);
        assert_eq!(seven.owner((0, 133)), Some(2));
        assert_eq!(seven.owner((132, 399)), Some(3));
        assert_eq!(seven.owner((133, 0)), Some(4));
        let eight = Partition::expected(&[1, 2, 3, 4, 5, 6, 7, 8], 400, 400);
        assert_eq!(eight.owner((200, 200)), Some(5));
        assert_eq!(eight.owner((399, 199)), Some(7));
        assert_eq!(eight.owner((399, 200)), Some(8));
    }

    #[test]
    fn sparse_ids_take_the_places_in_id_order_and_unknown_sizes_have_no_layout() {
        let p = Partition::expected(&[30, 10, 20, 10], 400, 400);
        assert_eq!(p.owner((0, 0)), Some(10));
        assert_eq!(p.owner((0, 399)), Some(20));
        assert_eq!(p.owner((399, 0)), Some(30));
        assert!(Partition::expected(&[], 400, 400).regions.is_empty());
        assert!(Partition::promised(&[1, 2], 300, 400).is_none());
        assert!(Partition::promised(&(1..=10).collect::<Vec<_>>(), 400, 400).is_none());
    }

    #[test]
    fn four_shards_make_a_two_by_two_grid_with_a_four_way_corner() {
        let p = Partition::expected(&[1, 2, 3, 4], 400, 400);
        let r = |s, x0, y0, x1, y1| Region { shard: s, x0, y0, x1, y1 };
        assert_eq!(
            p.regions,
            vec![
                r(1, 0, 0, 200, 200),
                r(2, 0, 200, 200, 400),
                r(3, 200, 0, 400, 200),
                r(4, 200, 200, 400, 400)
            ]
        );
        assert_eq!(p.corners(), vec![((200, 200), 4)]);
        assert_eq!(
            p.borders(),
            vec![
                Border::Vertical { x: 200, y0: 0, y1: 200 },
                Border::Vertical { x: 200, y0: 200, y1: 400 },
                Border::Horizontal { y: 200, x0: 0, x1: 200 },
                Border::Horizontal { y: 200, x0: 200, x1: 400 },
            ]
        );
    }

    #[test]
    fn three_shards_make_a_three_way_corner() {
        let p = Partition::expected(&[3, 1, 2], 400, 400);
        assert_eq!(p.owner((199, 199)), Some(1));
        assert_eq!(p.owner((199, 200)), Some(2));
        assert_eq!(p.owner((200, 0)), Some(3));
        assert_eq!(p.owner((200, 399)), Some(3));
        assert_eq!(p.corners(), vec![((200, 200), 3)]);
        assert_eq!(
            p.borders(),
            vec![
                Border::Vertical { x: 200, y0: 0, y1: 200 },
                Border::Vertical { x: 200, y0: 200, y1: 400 },
                Border::Horizontal { y: 200, x0: 0, x1: 200 },
            ]
        );
    }

    #[test]
    fn two_shards_split_at_x_200_and_one_has_no_border() {
        let p = Partition::expected(&[1, 2], 400, 400);
        assert_eq!(p.borders(), vec![Border::Vertical { x: 200, y0: 0, y1: 400 }]);
        assert!(p.corners().is_empty());
        assert!(Partition::expected(&[1], 400, 400).borders().is_empty());
        assert_eq!(
            p.owner_changes([(198, 5), (199, 5), (200, 5), (201, 5), (200, 5), (199, 5)]),
            2
        );
    }

    #[test]
    fn reads_the_status_json() {
        let status = serde_json::json!({
            "partition": {"epoch": 3, "width": 400, "height": 400, "regions": [
                {"shard": 1, "x0": 0, "y0": 0, "x1": 200, "y1": 400},
                {"shard": 2, "x0": 200, "y0": 0, "x1": 400, "y1": 400}
            ]}
        });
        let p = Partition::from_status(&status).unwrap().unwrap();
        assert_eq!(p.epoch, 3);
        assert!(p.same_layout(&Partition::expected(&[1, 2], 400, 400)));
        assert!(Partition::from_status(&serde_json::json!({"partition": null})).unwrap().is_none());
    }
}
