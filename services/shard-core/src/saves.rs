//! The core's saves part: what goes to the player store, and the logouts that wait for it.
//!
//! With a player store (`CoreConfig::save_interval`), a player is saved as it leaves, every
//! save interval if its cell, generation or private state changed since its last save, and
//! when the shard stops; a logout's connection is closed once its save is in the store (at
//! most [`CLOSE_AFTER_SAVE_WITHIN`] later). Without one, nothing is recorded.
//!
//! Only `ShardCore` calls it: it says which players to save and when, and takes the round's
//! saves out at each flush (`Transmit::Save`). It reads no clock: `now` is given.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use meridian_world::{PlayerId, Position, World};

use crate::outbox::Outbox;
use crate::types::{LinkId, SaveRecord, Seat};

/// How long a logout waits for its save before its connection is closed anyway.
const CLOSE_AFTER_SAVE_WITHIN: Duration = Duration::from_secs(5);

pub(crate) struct Saves {
    /// How often changed players are saved; `None`: there is no player store.
    interval: Option<Duration>,
    last_round: Instant,
    /// The cell, generation and state fingerprint each player was last saved at.
    saved: FxHashMap<PlayerId, (Position, u64, u64)>,
    /// This round's saves.
    round: Vec<SaveRecord>,
    /// Logged-out sessions whose connection closes once their player's save is in the
    /// store, with since when.
    closing_after_save: Vec<(PlayerId, LinkId, u64, Instant)>,
}

impl Saves {
    /// Saves every `interval` (none without a player store), the first round `interval`
    /// after `now`.
    pub fn new(interval: Option<Duration>, now: Instant) -> Saves {
        Saves {
            interval,
            last_round: now,
            saved: FxHashMap::default(),
            round: Vec::new(),
            closing_after_save: Vec::new(),
        }
    }

    /// Whether there is a player store to save to.
    pub fn enabled(&self) -> bool {
        self.interval.is_some()
    }

    /// Saves a local player (not an NPC) where it stands.
    pub fn save(&mut self, player: PlayerId, seat: &Seat, at: Position) {
        if !self.enabled() || seat.npc {
            return;
        }
        let generation = seat.generation;
        self.saved.insert(player, (at, generation, state_hash(&seat.private)));
        let state = seat.private.clone();
        self.round.push(SaveRecord { player: player.0, generation, at: (at.x, at.y), state });
    }

    /// Saves a record as it is (a parked player moved by an operator).
    pub fn save_record(&mut self, record: SaveRecord) {
        if self.enabled() {
            self.round.push(record);
        }
    }

    /// If a save round is due at `now`: the local players whose cell, generation or state
    /// changed since their last save (or who were never saved). Players no longer seated
    /// are forgotten.
    pub fn changed(
        &mut self,
        seats: &FxHashMap<PlayerId, Seat>,
        world: &World,
        now: Instant,
    ) -> Vec<PlayerId> {
        let Some(interval) = self.interval else { return Vec::new() };
        if now.saturating_duration_since(self.last_round) < interval {
            return Vec::new();
        }
        self.last_round = now;
        let changed = seats
            .iter()
            .filter(|(player, seat)| {
                let now = world
                    .position(**player)
                    .map(|at| (at, seat.generation, state_hash(&seat.private)));
                !seat.npc && now.is_some() && self.saved.get(*player).copied() != now
            })
            .map(|(player, _)| *player)
            .collect();
        self.saved.retain(|player, _| seats.contains_key(player));
        changed
    }

    /// Closes the logged-out session once its player's save is in the store.
    pub fn close_after_save(&mut self, player: PlayerId, link: LinkId, session: u64, now: Instant) {
        self.closing_after_save.push((player, link, session, now));
    }

    /// The store has these players' latest saves: their logouts' connections close.
    pub fn stored(&mut self, players: &[u64], outbox: &mut Outbox) {
        self.closing_after_save.retain(|(player, link, session, _)| {
            let saved = players.contains(&player.0);
            if saved {
                outbox.close(*link, *session);
            }
            !saved
        });
    }

    /// Logouts that waited longer than [`CLOSE_AFTER_SAVE_WITHIN`] are closed: the store
    /// is slow or down, and the client is not kept waiting; its save goes on being retried.
    pub fn expire(&mut self, now: Instant, outbox: &mut Outbox) {
        self.closing_after_save.retain(|(_, link, session, since)| {
            let waited = now.saturating_duration_since(*since) > CLOSE_AFTER_SAVE_WITHIN;
            if waited {
                outbox.close(*link, *session);
            }
            !waited
        });
    }

    /// This round's saves, if any.
    pub fn take_round(&mut self) -> Option<Vec<SaveRecord>> {
        (!self.round.is_empty()).then(|| std::mem::take(&mut self.round))
    }
}

/// A cheap fingerprint of a private state, to save players whose state changed.
fn state_hash(state: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    state.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PlayerId = PlayerId(3);
    const AT: Position = Position { x: 4, y: 5 };

    fn seat(generation: u64, private: &[u8]) -> Seat {
        let mut seat = Seat::new(LinkId(1), 9, 1, generation, 1);
        seat.private = private.to_vec();
        seat
    }

    #[test]
    fn without_a_store_nothing_is_saved() {
        let mut saves = Saves::new(None, Instant::now());
        saves.save(P, &seat(1, b""), AT);
        saves.save_record(SaveRecord { player: 1, generation: 1, at: (0, 0), state: vec![] });
        assert_eq!(saves.take_round(), None);
    }

    #[test]
    fn a_save_carries_the_seats_generation_and_private_state_and_npcs_are_not_saved() {
        let mut saves = Saves::new(Some(Duration::from_secs(1)), Instant::now());
        saves.save(P, &seat(2, b"hp"), AT);
        let mut npc = seat(1, b"");
        npc.npc = true;
        saves.save(PlayerId(4), &npc, AT);
        let saved = SaveRecord { player: 3, generation: 2, at: (4, 5), state: b"hp".to_vec() };
        assert_eq!(saves.take_round(), Some(vec![saved]));
        assert_eq!(saves.take_round(), None, "taken once");
    }

    #[test]
    fn logouts_close_once_saved_or_when_the_store_takes_too_long() {
        let start = Instant::now();
        let mut saves = Saves::new(Some(Duration::from_secs(1)), start);
        let mut outbox = Outbox::default();
        saves.close_after_save(P, LinkId(1), 9, start);
        saves.close_after_save(PlayerId(4), LinkId(1), 10, start);
        saves.stored(&[3], &mut outbox);
        assert_eq!(saves.closing_after_save.len(), 1, "player 3's closed");
        saves.expire(start + CLOSE_AFTER_SAVE_WITHIN, &mut outbox);
        assert_eq!(saves.closing_after_save.len(), 1, "not yet");
        saves.expire(start + CLOSE_AFTER_SAVE_WITHIN + Duration::from_millis(1), &mut outbox);
        assert!(saves.closing_after_save.is_empty());
    }
}
