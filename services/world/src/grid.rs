//! The sector grid: the map cut into squares of side `view_range`, each holding the entities
//! inside it, so that a sight query reads only the 3x3 sectors around a cell instead of every
//! entity in the world.
//!
//! A sector keeps copies of its members' positions and kinds next to their ids, so that a
//! scan (the hot loop of every move) reads one contiguous array and never chases a pointer
//! unless it has something to send.

use std::hash::{BuildHasherDefault, Hasher};

use crate::config::WorldConfig;
use crate::types::{PlayerId, Position};

/// An entity as its sector sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Member {
    pub(crate) id: PlayerId,
    pub(crate) position: Position,
    /// The entity's slot in the world's slab, so a removal can fix the moved member's index.
    pub(crate) slot: u32,
    pub(crate) local: bool,
}

/// An inclusive rectangle of sector coordinates.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct SectorRect {
    x0: u32,
    x1: u32,
    y0: u32,
    y1: u32,
}

impl SectorRect {
    fn contains(&self, column: u32, row: u32) -> bool {
        (self.x0..=self.x1).contains(&column) && (self.y0..=self.y1).contains(&row)
    }
}

pub(crate) struct SectorGrid {
    side: u32,
    columns: u32,
    rows: u32,
    /// Row-major; index `row * columns + column`.
    sectors: Vec<Vec<Member>>,
}

impl SectorGrid {
    /// Builds the grid for a validated config, whose sector count fits in a `u32`.
    pub(crate) fn new(config: &WorldConfig) -> SectorGrid {
        let side = config.sector_side();
        let columns = config.width.div_ceil(side);
        let rows = config.height.div_ceil(side);
        let count = usize::try_from(u64::from(columns) * u64::from(rows))
            .expect("invariant: a validated config has at most MAX_SECTORS sectors");
        SectorGrid { side, columns, rows, sectors: (0..count).map(|_| Vec::new()).collect() }
    }

    /// The sector coordinates of a cell. Cells past the map's edge are clamped to the edge
    /// sectors, which still hold everyone who could see them.
    fn coordinates(&self, position: Position) -> (u32, u32) {
        (
            (position.x / self.side).min(self.columns - 1),
            (position.y / self.side).min(self.rows - 1),
        )
    }

    /// The index of the sector holding `position`.
    pub(crate) fn sector_of(&self, position: Position) -> u32 {
        let (column, row) = self.coordinates(position);
        row * self.columns + column
    }

    /// The sectors that can hold anyone in sight of `position`.
    fn around(&self, position: Position) -> SectorRect {
        let (column, row) = self.coordinates(position);
        SectorRect {
            x0: column.saturating_sub(1),
            x1: (column + 1).min(self.columns - 1),
            y0: row.saturating_sub(1),
            y1: (row + 1).min(self.rows - 1),
        }
    }

    /// Adds a member to a sector and returns its index there.
    pub(crate) fn insert(&mut self, sector: u32, member: Member) -> u32 {
        let members = &mut self.sectors[sector as usize];
        members.push(member);
        u32::try_from(members.len() - 1).expect("invariant: fewer than 2^32 entities")
    }

    /// Removes the member at `index` in O(1). If another member took its place, returns that
    /// member's slot so the caller can record its new index (which is `index`).
    pub(crate) fn remove(&mut self, sector: u32, index: u32) -> Option<u32> {
        let members = &mut self.sectors[sector as usize];
        members.swap_remove(index as usize);
        members.get(index as usize).map(|moved| moved.slot)
    }

    pub(crate) fn member(&self, sector: u32, index: u32) -> &Member {
        &self.sectors[sector as usize][index as usize]
    }

    pub(crate) fn member_mut(&mut self, sector: u32, index: u32) -> &mut Member {
        &mut self.sectors[sector as usize][index as usize]
    }

    fn for_each_in(&self, rect: SectorRect, skip: Option<SectorRect>, f: &mut impl FnMut(&Member)) {
        for row in rect.y0..=rect.y1 {
            let row_start = (row * self.columns) as usize;
            for column in rect.x0..=rect.x1 {
                if skip.is_some_and(|skip| skip.contains(column, row)) {
                    continue;
                }
                self.sectors[row_start + column as usize].iter().for_each(&mut *f);
            }
        }
    }

    /// Calls `f` for every member of the sectors around `position`: a superset of everyone in
    /// sight of it (the caller checks the range).
    pub(crate) fn for_each_near(&self, position: Position, mut f: impl FnMut(&Member)) {
        self.for_each_in(self.around(position), None, &mut f);
    }

    /// Calls `f` once for every member of the sectors around `a` or around `b`, so that a move
    /// from `a` to `b` (one step, or a ghost's jump) sees every old and new observer once.
    pub(crate) fn for_each_near_either(
        &self,
        a: Position,
        b: Position,
        mut f: impl FnMut(&Member),
    ) {
        let around_a = self.around(a);
        let around_b = self.around(b);
        self.for_each_in(around_a, None, &mut f);
        if around_b != around_a {
            self.for_each_in(around_b, Some(around_a), &mut f);
        }
    }

    /// How many members the sectors around `position` hold (a superset of those in sight of
    /// it, read in O(1)).
    pub(crate) fn population_near(&self, position: Position) -> usize {
        let rect = self.around(position);
        let mut n = 0;
        for row in rect.y0..=rect.y1 {
            let row_start = (row * self.columns) as usize;
            for column in rect.x0..=rect.x1 {
                n += self.sectors[row_start + column as usize].len();
            }
        }
        n
    }

    /// How many members all sectors hold, for consistency checks.
    pub(crate) fn n_members(&self) -> usize {
        self.sectors.iter().map(Vec::len).sum()
    }
}

/// A fast hasher for `PlayerId` keys. Ids are assigned by the cluster, not chosen by clients,
/// so the flooding resistance of the standard SipHash buys nothing on this hot path; a
/// folded 128-bit multiply spreads sequential ids over all bits.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl IdHasher {
    fn mix(&mut self, value: u64) {
        let product = u128::from(self.0 ^ value) * u128::from(MULTIPLIER);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.mix(value);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type IdHashBuilder = BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn grid(width: u32, height: u32, view_range: u32) -> SectorGrid {
        SectorGrid::new(&WorldConfig { width, height, view_range, move_rate: 1 })
    }

    fn member(id: u64, x: u32, y: u32) -> Member {
        Member { id: PlayerId(id), position: Position::new(x, y), slot: id as u32, local: true }
    }

    #[test]
    fn a_map_that_does_not_divide_evenly_gets_a_partial_last_sector() {
        let grid = grid(45, 20, 10);
        assert_eq!((grid.columns, grid.rows), (5, 2));
        assert_eq!(grid.sector_of(Position::new(44, 19)), 9);
        assert_eq!(grid.sector_of(Position::new(1000, 1000)), 9, "past the edge clamps");
        let blind = self::grid(3, 3, 0);
        assert_eq!((blind.side, blind.columns, blind.rows), (1, 3, 3));
    }

    #[test]
    fn remove_swaps_the_last_member_in() {
        let mut grid = grid(10, 10, 10);
        for id in 0..3 {
            assert_eq!(grid.insert(0, member(id, 1, 1)), id as u32);
        }
        assert_eq!(grid.remove(0, 0), Some(2));
        assert_eq!(grid.member(0, 0).id, PlayerId(2));
        assert_eq!(grid.remove(0, 1), None, "removing the last member moves nobody");
        assert_eq!(grid.n_members(), 1);
    }

    #[test]
    fn near_either_visits_each_member_once() {
        let mut grid = grid(100, 100, 10);
        let mut id = 0;
        for x in (0..100).step_by(7) {
            for y in (0..100).step_by(7) {
                let sector = grid.sector_of(Position::new(x, y));
                grid.insert(sector, member(id, x, y));
                id += 1;
            }
        }
        let (a, b) = (Position::new(15, 15), Position::new(75, 42));
        let mut seen = Vec::new();
        grid.for_each_near_either(a, b, |m| seen.push(m.id));
        let unique: BTreeSet<_> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "no member is visited twice");
        let mut near_a = BTreeSet::new();
        grid.for_each_near(a, |m| {
            near_a.insert(m.id);
        });
        let mut near_b = BTreeSet::new();
        grid.for_each_near(b, |m| {
            near_b.insert(m.id);
        });
        assert_eq!(unique, near_a.union(&near_b).copied().collect());
    }

    #[test]
    fn the_hasher_separates_sequential_ids() {
        let hashes: BTreeSet<u64> = (0..10_000u64)
            .map(|id| {
                let mut hasher = IdHasher::default();
                hasher.write_u64(id);
                hasher.finish() >> 57
            })
            .collect();
        assert_eq!(hashes.len(), 128, "the top 7 bits, which hashbrown uses as tags, all occur");
    }
}
