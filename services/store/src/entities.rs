//! Persistent entities: the world's objects that outlive a shard (doors, chests, dropped
//! items, NPCs), each a row of their own in `meridian_entities`, in the same store as the
//! players. A shard loads the entities of the region it takes and writes them back as they
//! change; the rows carry the game's public state (what others see) and its private state
//! (what only the owner reads), both opaque to the store.
//!
//! Every write is **fenced** by who owns the entity: a write carries the ownership
//! generation `g` and the id `s` of the shard that makes it, and the row keeps those of the
//! last write applied. A write is applied if and only if
//!
//! - the store has no row for the id, or
//! - the row's generation is older than `g`, or
//! - the row's generation is `g` and its shard is `s` (the owner writing again).
//!
//! Otherwise it is refused, and its id is listed in [`EntityReport::refused`]. So an old
//! owner (a shard paused past its lease that wakes up) cannot roll an entity back, and of two
//! shards at one generation only the first to write owns the row.
//!
//! That is how a shard **claims** an entity it loads: it upserts the row it loaded with the
//! row's generation + 1 and its own shard id. Of shards claiming one row at once, exactly one
//! is written (the first to commit) and the others are refused: they must not run the
//! entity. On PostgreSQL the fence is the `WHERE` of a single `INSERT ... ON CONFLICT DO
//! UPDATE`, which re-reads a row another session is writing once that session commits, so
//! it holds under concurrency; on SQLite a batch is one immediate transaction (one writer
//! at a time for the whole file).
//!
//! A **remove** does not delete the row: it leaves a tombstone, the row marked `removed`
//! with the remove's generation and shard (and nothing of the entity's data). The tombstone
//! fences like any row, so a late upsert from an older owner cannot bring the entity back.
//! An upsert on a tombstone asks more than the rule above: its generation must be newer
//! than the tombstone's (a newer owner re-creating the entity, which clears `removed`); the
//! same generation is refused, from any shard. A remove of an id the store has no row for
//! leaves a tombstone too. [`Store::entities`] leaves tombstones out. Tombstones are kept:
//! they are small, and an entity's fence must outlive it.
//!
//! A batch is written in one transaction. A batch naming an id twice keeps its last write
//! of it; the report names each id once, at its first place in the batch.
//!
//! Bounded: a name is at most [`ENTITY_NAME_MAX`] bytes (and holds no NUL, which
//! PostgreSQL's text cannot), public and private state at most [`ENTITY_STATE_MAX`] bytes
//! each; a write over a bound is refused (`StoreError::TooBig`) before the store is asked.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::{Cell, Store, StoreError};

/// The largest public or private state of an entity, in bytes (the game's
/// `MAX_STATE_BYTES`).
pub const ENTITY_STATE_MAX: usize = 1024;
/// The longest entity name, in bytes.
pub const ENTITY_NAME_MAX: usize = 64;

/// A persistent entity as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityRow {
    pub id: u64,
    /// The game's kind of entity (opaque to the store).
    pub kind: u32,
    pub name: String,
    pub at: Cell,
    /// The state others see (opaque to the store).
    pub state: Vec<u8>,
    /// The state only the owner reads (opaque to the store).
    pub private: Vec<u8>,
    /// The ownership generation of the last write applied.
    pub generation: u64,
    /// The shard that made the last write applied, and which life of it (its
    /// incarnation: not part of the fence, it tells a loader whether that owner is still
    /// the one running).
    pub shard: u32,
    pub incarnation: u64,
}

/// A rectangle of cells, `x0..x1` by `y0..y1` (half-open), for [`Store::entities_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

/// Areas one [`Store::entities_for`] takes at most (a shard owns a few rectangles).
pub const MAX_AREAS: usize = 256;

/// One write of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityWrite {
    /// Creates the entity or overwrites it, fenced by the row's generation and shard.
    Upsert(EntityRow),
    /// Leaves a tombstone, fenced the same way (see the module's doc).
    Remove { id: u64, generation: u64, shard: u32, incarnation: u64 },
}

/// What a batch of entity writes did: each id once, in the order the batch first named it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityReport {
    pub written: Vec<u64>,
    /// Entities whose write was fenced out: another owner has the row (or, for an upsert,
    /// a tombstone at the same generation or newer).
    pub refused: Vec<u64>,
}

impl EntityWrite {
    pub(crate) fn id(&self) -> u64 {
        match self {
            EntityWrite::Upsert(row) => row.id,
            EntityWrite::Remove { id, .. } => *id,
        }
    }

    /// The row this write leaves, and whether it is a tombstone (which keeps nothing of
    /// the entity but its id and its fence).
    pub(crate) fn row(&self) -> (Cow<'_, EntityRow>, bool) {
        match self {
            EntityWrite::Upsert(row) => (Cow::Borrowed(row), false),
            EntityWrite::Remove { id, generation, shard, incarnation } => {
                let tombstone = EntityRow {
                    id: *id,
                    kind: 0,
                    name: String::new(),
                    at: (0, 0),
                    state: Vec::new(),
                    private: Vec::new(),
                    generation: *generation,
                    shard: *shard,
                    incarnation: *incarnation,
                };
                (Cow::Owned(tombstone), true)
            }
        }
    }
}

fn check(writes: &[EntityWrite]) -> Result<(), StoreError> {
    for write in writes {
        let EntityWrite::Upsert(row) = write else { continue };
        if row.name.len() > ENTITY_NAME_MAX || row.name.contains('\0') {
            return Err(StoreError::TooBig(format!(
                "entity {}: a name is at most {ENTITY_NAME_MAX} bytes with no NUL, this one {} \
                 bytes",
                row.id,
                row.name.len()
            )));
        }
        for (what, bytes) in [("public", &row.state), ("private", &row.private)] {
            if bytes.len() > ENTITY_STATE_MAX {
                return Err(StoreError::TooBig(format!(
                    "entity {}: a {what} state is at most {ENTITY_STATE_MAX} bytes, this one {}",
                    row.id,
                    bytes.len()
                )));
            }
        }
    }
    Ok(())
}

/// The batch with one write per entity, its last, in first-appearance order (one statement
/// cannot write a row twice).
fn dedup_last(writes: &[EntityWrite]) -> Vec<EntityWrite> {
    let mut last = HashMap::with_capacity(writes.len());
    for (index, write) in writes.iter().enumerate() {
        last.insert(write.id(), index);
    }
    let mut seen = HashSet::with_capacity(writes.len());
    let mut out = Vec::with_capacity(last.len());
    for write in writes {
        if seen.insert(write.id()) {
            out.push(writes[last[&write.id()]].clone());
        }
    }
    out
}

impl Store {
    /// Writes a batch, fenced (see the module's doc), in one transaction (PostgreSQL: one
    /// statement over arrays, one round trip). A batch naming an entity twice keeps its
    /// last write of it.
    pub async fn save_entities(&self, writes: &[EntityWrite]) -> Result<EntityReport, StoreError> {
        check(writes)?;
        let writes = dedup_last(writes);
        if writes.is_empty() {
            return Ok(EntityReport::default());
        }
        match self {
            Store::Sqlite(s) => s.save_entities(writes).await,
            Store::Postgres(s) => s.save_entities(&writes).await,
        }
    }

    /// Every entity not removed, in id order.
    pub async fn entities(&self) -> Result<Vec<EntityRow>, StoreError> {
        match self {
            Store::Sqlite(s) => s.entities(None).await,
            Store::Postgres(s) => s.entities(None).await,
        }
    }

    /// The entities not removed that stand in one of `areas` or were saved last by
    /// `shard`, in id order: what a shard loads to find those it may have to bring back,
    /// without reading the whole world. At most [`MAX_AREAS`] areas (`TooBig` past it).
    pub async fn entities_for(
        &self,
        areas: &[Area],
        shard: u32,
    ) -> Result<Vec<EntityRow>, StoreError> {
        if areas.len() > MAX_AREAS {
            return Err(StoreError::TooBig(format!(
                "{} areas; at most {MAX_AREAS} at once",
                areas.len()
            )));
        }
        match self {
            Store::Sqlite(s) => s.entities(Some((areas, shard))).await,
            Store::Postgres(s) => s.entities(Some((areas, shard))).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upsert(id: u64, generation: u64, name: &str) -> EntityWrite {
        EntityWrite::Upsert(EntityRow {
            id,
            kind: 1,
            name: name.into(),
            at: (1, 1),
            state: vec![],
            private: vec![],
            generation,
            shard: 1,
            incarnation: 1,
        })
    }

    #[test]
    fn a_batch_keeps_each_entitys_last_write() {
        let remove = EntityWrite::Remove { id: 1, generation: 4, shard: 2, incarnation: 1 };
        let deduped =
            dedup_last(&[upsert(1, 1, "a"), upsert(2, 1, "b"), upsert(1, 3, "c"), remove]);
        let remove = EntityWrite::Remove { id: 1, generation: 4, shard: 2, incarnation: 1 };
        assert_eq!(deduped, vec![remove, upsert(2, 1, "b")]);
    }

    #[test]
    fn names_and_states_over_their_bounds_are_refused() {
        assert!(check(&[upsert(1, 1, &"n".repeat(ENTITY_NAME_MAX))]).is_ok());
        let long = check(&[upsert(1, 1, &"n".repeat(ENTITY_NAME_MAX + 1))]);
        assert!(matches!(long, Err(StoreError::TooBig(_))), "{long:?}");
        let nul = check(&[upsert(1, 1, "a\0b")]);
        assert!(matches!(nul, Err(StoreError::TooBig(_))), "{nul:?}");
        let EntityWrite::Upsert(mut row) = upsert(1, 1, "n") else { unreachable!() };
        row.private = vec![0; ENTITY_STATE_MAX + 1];
        let private = check(&[EntityWrite::Upsert(row)]);
        assert!(matches!(private, Err(StoreError::TooBig(_))), "{private:?}");
    }
}
