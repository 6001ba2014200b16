//! Writes the core's saves to the player store, off the world task: the world task only
//! puts them in a map (the newest save of each player, so what waits is bounded by the
//! players this shard has had, never by time); this task takes the whole map as one batch,
//! writes it (one statement per 1,000 rows), and on a failure puts back what no newer save
//! replaced meanwhile and tries again a second later. A store that is down or slow never
//! stalls the world: saves wait, counted in `meridian_shard_saves_pending`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::types::SaveRecord;
use crate::ShardMetrics;

/// How long after a failed write the next try comes.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The world task's side: where saves wait for the writer.
#[derive(Clone)]
pub struct Saves {
    waiting: Arc<Mutex<FxHashMap<u64, SaveRecord>>>,
    /// Saves taken by the writer and not yet written (or put back): set and cleared under
    /// the `waiting` lock, so waiting plus writing never shows 0 while a save is on its way.
    writing: Arc<Mutex<usize>>,
    wake: Arc<Notify>,
    metrics: Arc<ShardMetrics>,
    /// Told which players' saves are in the store (logouts close after theirs).
    saved: Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<crate::command::Command>>>,
}

impl Saves {
    pub fn new(metrics: Arc<ShardMetrics>) -> Saves {
        Saves {
            waiting: Default::default(),
            writing: Default::default(),
            wake: Arc::new(Notify::new()),
            metrics,
            saved: Default::default(),
        }
    }

    /// Where to say which players' saves are in the store: the world task's commands.
    pub fn report_to(&self, commands: tokio::sync::mpsc::Sender<crate::command::Command>) {
        let _ = self.saved.set(commands);
    }

    /// Queues a round's saves (one lock per round, not per player).
    pub fn push(&self, saves: Vec<SaveRecord>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        for save in saves {
            keep_newest(&mut waiting, save);
        }
        self.metrics.saves_pending.set(waiting.len() as i64);
        drop(waiting);
        self.wake.notify_one();
    }

    /// How many saves wait.
    pub fn pending(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How many saves are not in the store yet: waiting, or being written.
    pub fn unwritten(&self) -> usize {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.len() + *self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every save queued so far is in the store, at most `within`, saying how
    /// far it got every second. Returns how many were still unwritten (0: all of them).
    pub async fn settle(&self, within: Duration) -> usize {
        let started = Instant::now();
        let mut said = started;
        loop {
            let left = self.unwritten();
            if left == 0 || started.elapsed() >= within {
                return left;
            }
            if said.elapsed() >= Duration::from_secs(1) {
                said = Instant::now();
                info!(saves = left, "waiting for the player store to take the last saves");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The writer: runs until the process ends.
    pub async fn write(self, store: Arc<meridian_store::Store>) {
        loop {
            let batch: Vec<SaveRecord> = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                let batch: Vec<SaveRecord> = waiting.drain().map(|(_, save)| save).collect();
                *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = batch.len();
                batch
            };
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            let rows: Vec<meridian_store::Save> = batch
                .iter()
                .map(|s| meridian_store::Save {
                    player_id: s.player,
                    generation: s.generation,
                    at: s.at,
                    state: s.state.clone(),
                })
                .collect();
            let started = Instant::now();
            match store.save(&rows).await {
                Ok(report) => {
                    self.metrics.saves.add("written", report.written as u64);
                    self.metrics.saves.add("refused", report.refused.len() as u64);
                    self.metrics.save_seconds.observe(started.elapsed().as_secs_f64());
                    if !report.refused.is_empty() {
                        info!(
                            players = report.refused.len(),
                            "saves refused: a newer owner saved those players already"
                        );
                    }
                    *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = 0;
                    if let Some(commands) = self.saved.get() {
                        let players = batch.iter().map(|s| s.player).collect();
                        let _ = commands.send(crate::command::Command::Saved { players }).await;
                    }
                }
                Err(error) => {
                    self.metrics.saves.add("failed", batch.len() as u64);
                    warn!(%error, saves = batch.len(), "player store write failed; trying again");
                    {
                        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                        for save in batch {
                            // A newer save of the same player, queued meanwhile, wins.
                            waiting.entry(save.player).or_insert(save);
                        }
                        *self.writing.lock().unwrap_or_else(|p| p.into_inner()) = 0;
                    }
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
            let pending = self.pending();
            self.metrics.saves_pending.set(pending as i64);
        }
    }
}

/// Keeps the newer of two saves of a player: the higher generation, and within one
/// generation the later.
fn keep_newest(waiting: &mut FxHashMap<u64, SaveRecord>, save: SaveRecord) {
    match waiting.get(&save.player) {
        Some(kept) if kept.generation > save.generation => {}
        _ => {
            waiting.insert(save.player, save);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_save_of_a_player_is_kept() {
        let mut waiting = FxHashMap::default();
        let save =
            |generation, x| SaveRecord { player: 7, generation, at: (x, 0), state: Vec::new() };
        keep_newest(&mut waiting, save(2, 1));
        keep_newest(&mut waiting, save(2, 2));
        keep_newest(&mut waiting, save(1, 3));
        assert_eq!(waiting[&7], save(2, 2), "later in the same generation; never an older one");
        keep_newest(&mut waiting, save(3, 4));
        assert_eq!(waiting[&7], save(3, 4));
    }
}
