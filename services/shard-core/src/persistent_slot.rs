//! The core's record of its persistent entities (issue 34): what it saved last of each
//! (a fingerprint), the round's writes, whether a load from the store is wanted or out, the
//! claims out, and which copies here are of persistent NPCs. `persistent.rs` decides what
//! goes in it; this part only keeps it.

use rustc_hash::{FxHashMap, FxHashSet};
use std::time::{Duration, Instant};

use meridian_world::PlayerId;

use crate::types::{EntityRecord, EntitySave};

/// An action's `ActionDone` held until the store has the writes of `round`: to a player
/// owned here, or to the shard of the player whose action ran here.
pub(crate) struct Durable {
    pub round: u64,
    pub to: AnswerTo,
    pub client_time: u64,
    pub payload: Vec<u8>,
    pub since: Instant,
}

pub(crate) enum AnswerTo {
    Here { player: PlayerId },
    Origin { shard: meridian_cluster::ShardId, actor: PlayerId },
}

/// The core's record of what it saved and what it asked the store.
pub(crate) struct Persistent {
    /// How often changed entities are saved; `None`: there is no store.
    pub interval: Option<Duration>,
    pub last_round: Instant,
    /// What each persistent entity owned here was last saved as (a fingerprint).
    pub saved: FxHashMap<PlayerId, u64>,
    pub round: Vec<EntitySave>,
    /// The partition epoch of the last load asked for.
    pub epoch_loaded: u64,
    /// A load from the store is to be asked for, and one is out.
    pub load_wanted: bool,
    pub loading: bool,
    /// Claims out, not yet answered.
    pub claiming: FxHashSet<PlayerId>,
    pub claims: Vec<EntityRecord>,
    /// Copies here of other shards' persistent NPCs.
    pub ghosts: FxHashSet<PlayerId>,
    /// The number of the next round of writes (`Transmit::SaveEntities`), from 1.
    pub next_round: u64,
    /// Action answers that wait for the store to have what their action saved.
    pub durable: Vec<Durable>,
    /// Persistent NPCs despawned here in this life: never claimed back (a load may read a
    /// record before the removal reaches the store). One id per despawn, for the life.
    pub removed: FxHashSet<PlayerId>,
}

impl Persistent {
    pub fn new(interval: Option<Duration>, now: Instant) -> Persistent {
        Persistent {
            interval,
            last_round: now,
            saved: FxHashMap::default(),
            round: Vec::new(),
            epoch_loaded: 0,
            load_wanted: false,
            loading: false,
            claiming: FxHashSet::default(),
            claims: Vec::new(),
            ghosts: FxHashSet::default(),
            removed: FxHashSet::default(),
            next_round: 1,
            durable: Vec::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.interval.is_some()
    }

    /// Whether `npc`, a copy here, is of a persistent NPC.
    pub fn is_persistent_ghost(&self, npc: PlayerId) -> bool {
        self.ghosts.contains(&npc)
    }

    /// A new partition: the store is to be read (once at a time).
    pub fn want_load(&mut self) {
        if self.enabled() {
            self.load_wanted = true;
        }
    }

    /// Whether a save round is due at `now` (then the next one is `interval` later).
    pub fn round_due(&mut self, now: Instant) -> bool {
        let Some(interval) = self.interval else { return false };
        if now.saturating_duration_since(self.last_round) < interval {
            return false;
        }
        self.last_round = now;
        true
    }
}
