//! Persistent entities in the store, off the world task (issue 34): the core's writes
//! (`Transmit::SaveEntities`) wait in a map (the newest write of each entity, so what waits
//! is bounded by the entities this shard has owned, never by time) for one writer task that
//! writes the whole map as one batch and tells the core through which round the store has
//! everything, and which writes it refused (a newer owner has those entities:
//! `Command::EntitiesSaved`); a failed batch is put back,
//! under any newer write queued meanwhile, and tried again a second later. Loads
//! (`Transmit::LoadEntities`) and claims (`Transmit::ClaimEntities`) each run on a task of
//! their own, tried again every second until the store answers. A store that is down or
//! slow never stalls the world.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use meridian_store::{Area, EntityRow, EntityWrite, Store};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, Notify};
use tracing::{info, warn};

use crate::command::Command;
use crate::types::{EntityRecord, EntitySave};
use crate::ShardMetrics;

/// How long after a failed store call the next try comes.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Writes waiting for the writer: the newest per entity, and the last round they include.
#[derive(Default)]
struct Waiting {
    saves: FxHashMap<u64, EntitySave>,
    through: u64,
}

/// The world task's side of the writer, and where loads and claims start.
#[derive(Clone)]
pub struct Entities {
    store: Arc<Store>,
    waiting: Arc<Mutex<Waiting>>,
    /// Writes taken by the writer and not yet written (or put back): set and cleared
    /// under the `waiting` lock.
    writing: Arc<Mutex<usize>>,
    wake: Arc<Notify>,
    metrics: Arc<ShardMetrics>,
    commands: Arc<OnceLock<mpsc::Sender<Command>>>,
    /// This shard's id: it loads what it saved last, wherever it stands.
    shard: u32,
}

impl Entities {
    /// Starts the writer.
    pub fn start(store: Arc<Store>, metrics: Arc<ShardMetrics>, shard: u32) -> Entities {
        let entities = Entities {
            store,
            waiting: Default::default(),
            writing: Default::default(),
            wake: Arc::new(Notify::new()),
            metrics,
            commands: Default::default(),
            shard,
        };
        tokio::spawn(entities.clone().write());
        entities
    }

    /// Where answers go: the world task's commands.
    pub fn report_to(&self, commands: mpsc::Sender<Command>) {
        let _ = self.commands.set(commands);
    }

    /// Queues a round's writes (one lock per round).
    pub fn push(&self, round: u64, saves: Vec<EntitySave>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        for save in saves {
            keep_newest(&mut waiting.saves, save);
        }
        waiting.through = waiting.through.max(round);
        self.metrics.entity_saves_pending.set(waiting.saves.len() as i64);
        drop(waiting);
        self.wake.notify_one();
    }

    /// Writes not in the store yet: waiting, or being written.
    pub fn unwritten(&self) -> usize {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.saves.len() + *self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the persistent entities in `areas` or saved by this shard, for the core
    /// (tried until the store answers).
    pub fn load(&self, areas: Vec<[u32; 4]>) {
        let (store, commands) = (Arc::clone(&self.store), self.commands.get().cloned());
        let shard = self.shard;
        let areas: Vec<Area> =
            areas.into_iter().map(|[x0, y0, x1, y1]| Area { x0, y0, x1, y1 }).collect();
        tokio::spawn(async move {
            let records = loop {
                match store.entities_for(&areas, shard).await {
                    Ok(rows) => break rows.into_iter().map(record).collect(),
                    Err(error) => {
                        warn!(%error, "cannot read the persistent entities; trying again");
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                }
            };
            if let Some(commands) = commands {
                let _ = commands.send(Command::EntitiesFound { records }).await;
            }
        });
    }

    /// Writes the claims and tells the core which the store took (tried until it answers).
    pub fn claim(&self, claims: Vec<EntityRecord>) {
        let (store, commands) = (Arc::clone(&self.store), self.commands.get().cloned());
        let metrics = Arc::clone(&self.metrics);
        tokio::spawn(async move {
            let writes: Vec<EntityWrite> =
                claims.iter().cloned().map(|r| EntityWrite::Upsert(row(r))).collect();
            let report = loop {
                match store.save_entities(&writes).await {
                    Ok(report) => break report,
                    Err(error) => {
                        metrics.entity_saves.add("failed", writes.len() as u64);
                        warn!(%error, claims = writes.len(), "cannot claim persistent entities; trying again");
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                }
            };
            metrics.entity_saves.add("written", report.written.len() as u64);
            metrics.entity_saves.add("refused", report.refused.len() as u64);
            let taken: Vec<EntityRecord> =
                claims.into_iter().filter(|c| report.written.contains(&c.id)).collect();
            if let Some(commands) = commands {
                let _ = commands.send(Command::EntitiesClaimed { records: taken }).await;
            }
        });
    }

    /// Waits until every write queued so far is in the store, at most `within`. Returns
    /// how many were still unwritten (0: all of them).
    pub async fn settle(&self, within: Duration) -> usize {
        let started = Instant::now();
        loop {
            let left = self.unwritten();
            if left == 0 || started.elapsed() >= within {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The writer: runs until the process ends.
    async fn write(self) {
        loop {
            // The batch holds every write of the rounds up to `through` (or a newer write of
            // the same entity): once it is in the store, so are those rounds.
            let (batch, through) = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                let batch: Vec<EntitySave> = waiting.saves.drain().map(|(_, save)| save).collect();
                *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = batch.len();
                (batch, waiting.through)
            };
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            let writes: Vec<EntityWrite> = batch.iter().cloned().map(to_write).collect();
            match self.store.save_entities(&writes).await {
                Ok(report) => {
                    self.metrics.entity_saves.add("written", report.written.len() as u64);
                    self.metrics.entity_saves.add("refused", report.refused.len() as u64);
                    *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = 0;
                    if !report.refused.is_empty() {
                        info!(
                            entities = report.refused.len(),
                            "persistent entity saves refused: a newer owner saved them"
                        );
                    }
                    if let Some(commands) = self.commands.get() {
                        let refused = report.refused;
                        let _ = commands.send(Command::EntitiesSaved { through, refused }).await;
                    }
                }
                Err(error) => {
                    self.metrics.entity_saves.add("failed", batch.len() as u64);
                    warn!(%error, writes = batch.len(), "persistent entity write failed; trying again");
                    {
                        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                        for save in batch {
                            // A newer write of the same entity, queued meanwhile, wins.
                            waiting.saves.entry(save.id()).or_insert(save);
                        }
                        *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = 0;
                    }
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            let pending = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).saves.len();
            self.metrics.entity_saves_pending.set(pending as i64);
        }
    }
}

/// Keeps the newer of two writes of an entity: the higher generation, and within one
/// generation the later (a removal after the last save of it, say).
fn keep_newest(waiting: &mut FxHashMap<u64, EntitySave>, save: EntitySave) {
    match waiting.get(&save.id()) {
        Some(kept) if kept.generation() > save.generation() => {}
        _ => {
            waiting.insert(save.id(), save);
        }
    }
}

fn row(record: EntityRecord) -> EntityRow {
    EntityRow {
        id: record.id,
        kind: record.kind,
        name: record.name,
        at: record.at,
        state: record.state,
        private: record.private,
        generation: record.generation,
        shard: record.shard,
        incarnation: record.incarnation,
    }
}

fn record(row: EntityRow) -> EntityRecord {
    EntityRecord {
        id: row.id,
        kind: row.kind,
        name: row.name,
        at: row.at,
        state: row.state,
        private: row.private,
        generation: row.generation,
        shard: row.shard,
        incarnation: row.incarnation,
    }
}

fn to_write(save: EntitySave) -> EntityWrite {
    match save {
        EntitySave::Upsert(record) => EntityWrite::Upsert(row(record)),
        EntitySave::Remove { id, generation, shard, incarnation } => {
            EntityWrite::Remove { id, generation, shard, incarnation }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(generation: u64, x: u32) -> EntitySave {
        EntitySave::Upsert(EntityRecord {
            id: 7,
            kind: 2,
            name: "flag".into(),
            at: (x, 0),
            state: Vec::new(),
            private: Vec::new(),
            generation,
            shard: 1,
            incarnation: 1,
        })
    }

    #[test]
    fn the_newest_write_of_an_entity_is_kept() {
        let mut waiting = FxHashMap::default();
        keep_newest(&mut waiting, save(2, 1));
        keep_newest(&mut waiting, save(2, 2));
        keep_newest(&mut waiting, save(1, 3));
        assert_eq!(waiting[&7], save(2, 2), "later in the same generation; never an older one");
        let remove = EntitySave::Remove { id: 7, generation: 2, shard: 1, incarnation: 1 };
        keep_newest(&mut waiting, remove.clone());
        assert_eq!(waiting[&7], remove, "a removal after the last save");
    }
}
