//! The partition map as tests see it: read from `meridian status --json`, its borders and
//! corners, and the layout DESIGN.md promises for N shards (to check the live map against,
//! and to aim a scenario at before any cluster runs).

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
    /// The layout DESIGN.md gives `shards` (ids, any order) on a `width x height` map:
    /// `ceil(sqrt(n))` columns of near-equal width, each cut into near-equal rows, the first
    /// `n % columns` columns taking one extra row, shards in id order filling column 0 top to
    /// bottom, then column 1, and so on. Epoch 0: compare with [`Partition::same_layout`].
    pub fn expected(shards: &[u32], width: u32, height: u32) -> Partition {
        let mut ids = shards.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let n = ids.len() as u32;
        let mut regions = Vec::new();
        if n > 0 {
            let columns = (1..=n).find(|c| c * c >= n).unwrap_or(n);
            let mut next = ids.into_iter();
            for column in 0..columns {
                let x0 = width * column / columns;
                let x1 = width * (column + 1) / columns;
                let rows = n / columns + u32::from(column < n % columns);
                for row in 0..rows {
                    let y0 = height * row / rows;
                    let y1 = height * (row + 1) / rows;
                    if let Some(shard) = next.next() {
                        regions.push(Region { shard, x0, y0, x1, y1 });
                    }
                }
            }
        }
        Partition { epoch: 0, width, height, regions }
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

/// [`wait_for_partition`], then checks that the live map is the layout DESIGN.md promises
/// for this many shards, so a scenario aimed at the promised borders really meets them.
pub fn wait_for_expected_partition(
    cluster: &Cluster,
    within: Duration,
) -> anyhow::Result<Partition> {
    let live = wait_for_partition(cluster, within)?;
    let ids: Vec<u32> = cluster.shards().iter().map(|s| s.id).collect();
    let expected = Partition::expected(&ids, live.width, live.height);
    if !live.same_layout(&expected) {
        bail!(
            "the live partition is not the layout DESIGN.md gives {} shards:\n  live     {live}\n  expected {expected}",
            ids.len()
        );
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

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
