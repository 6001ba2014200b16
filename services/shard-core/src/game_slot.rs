//! The core's game part: the game itself and what the core keeps for it.
//!
//! It owns the game (taken out while a hook runs, so a hook can be handed the core as its
//! `Host`), the mail a hook leaves for other hooks, the entities whose public state changed
//! since the last game tick, the blocks of entity ids for NPCs (and whether more are
//! wanted from the shell), the NPC limit, the game's own seeded randomness, and whether
//! orphaned NPCs wait for a shard to take them.
//!
//! Only `ShardCore` calls it (`game.rs` runs the hooks and is the game's `Host`); it runs
//! no hook and sends nothing itself.

use std::collections::VecDeque;
use std::ops::Range;

use meridian_game::Game;

use crate::kv::KvRequests;
use meridian_protocol::pb::ServerMessage;
use meridian_protocol::server;
use meridian_world::{Notification, PlayerId};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// Entity ids asked for when fewer than this many are left.
const IDS_LOW: u64 = 256;

/// Something for a hook that must wait until the current one returns.
pub(crate) enum GameMail {
    Message { to: PlayerId, from: PlayerId, kind: u32, payload: Vec<u8> },
    Arrived(PlayerId),
}

/// The game and what the core keeps for it.
pub(crate) struct GameSlot {
    /// Taken out while a hook runs.
    game: Option<Box<dyn Game>>,
    mail: VecDeque<GameMail>,
    /// Entities whose public state changed since the last game tick.
    changed: Vec<PlayerId>,
    /// Blocks of entity ids for NPCs, whether more were asked for, and whether the shell
    /// is still to be told so ([`GameSlot::take_ids_wanted`]).
    ids: VecDeque<Range<u64>>,
    ids_asked: bool,
    ids_wanted: bool,
    max_npcs: usize,
    rng: SmallRng,
    /// Orphaned NPCs (their owner died) that could not be restored yet: the shard owning
    /// their cell was not reachable. Tried again every tick while set.
    orphans_waiting: bool,
    /// The game's key-value requests for the store.
    pub kv: KvRequests,
}

impl GameSlot {
    /// `store`: the shard has a store (for the game's key-value space).
    pub fn new(game: Box<dyn Game>, max_npcs: usize, seed: u64, store: bool) -> GameSlot {
        GameSlot {
            game: Some(game),
            mail: VecDeque::new(),
            changed: Vec::new(),
            ids: VecDeque::new(),
            ids_asked: false,
            ids_wanted: false,
            max_npcs,
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            orphans_waiting: false,
            kv: KvRequests::new(store),
        }
    }

    /// The game, taken out for a hook (`None` while another hook runs).
    pub fn take_game(&mut self) -> Option<Box<dyn Game>> {
        self.game.take()
    }

    /// The game back after its hook.
    pub fn put_game(&mut self, game: Box<dyn Game>) {
        self.game = Some(game);
    }

    /// Mail for a hook, after the current one.
    pub fn mail(&mut self, mail: GameMail) {
        self.mail.push_back(mail);
    }

    pub fn next_mail(&mut self) -> Option<GameMail> {
        self.mail.pop_front()
    }

    /// Mail taken that could not be handed over yet: first again.
    pub fn mail_first(&mut self, mail: GameMail) {
        self.mail.push_front(mail);
    }

    pub fn mail_waiting(&self) -> usize {
        self.mail.len()
    }

    /// `entity`'s public state changed (told at the next game tick).
    pub fn state_changed(&mut self, entity: PlayerId) {
        self.changed.push(entity);
    }

    /// The entities whose state changed since the last call, each once, in id order. Hand
    /// the vector back with [`GameSlot::reuse_changed`] to keep its room.
    pub fn take_changed(&mut self) -> Vec<PlayerId> {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    pub fn reuse_changed(&mut self, mut emptied: Vec<PlayerId>) {
        if self.changed.is_empty() {
            emptied.clear();
            self.changed = emptied;
        }
    }

    /// Asks for entity ids when few are left (once until they come).
    pub fn want_ids(&mut self) {
        if !self.ids_asked && self.ids_left() < IDS_LOW {
            self.ids_asked = true;
            self.ids_wanted = true;
        }
    }

    /// Whether the shell is to be asked for ids (`Transmit::WantIds`), once per asking.
    pub fn take_ids_wanted(&mut self) -> bool {
        std::mem::take(&mut self.ids_wanted)
    }

    /// A block of ids from the shell (empty: none to be had now).
    pub fn ids_arrived(&mut self, ids: Range<u64>) {
        self.ids_asked = false;
        if !ids.is_empty() {
            self.ids.push_back(ids);
        }
        self.want_ids();
    }

    fn ids_left(&self) -> u64 {
        self.ids.iter().map(|r| r.end - r.start).sum()
    }

    /// An unused entity id, if any is left.
    pub fn take_id(&mut self) -> Option<u64> {
        loop {
            let block = self.ids.front_mut()?;
            if let Some(id) = block.next() {
                return Some(id);
            }
            self.ids.pop_front();
        }
    }

    pub fn max_npcs(&self) -> usize {
        self.max_npcs
    }

    /// The game's randomness (seeded from the shard's configuration).
    pub fn rng(&mut self) -> &mut SmallRng {
        &mut self.rng
    }

    pub fn orphans_waiting(&self) -> bool {
        self.orphans_waiting
    }

    pub fn set_orphans_waiting(&mut self, waiting: bool) {
        self.orphans_waiting = waiting;
    }
}

/// What a notification about the game becomes on the wire (`None`: not a game one).
pub(crate) fn game_notification(note: &Notification) -> Option<ServerMessage> {
    match note {
        Notification::StateChanged { subject, state } => {
            Some(server::state_changed(subject.0, state))
        }
        Notification::Event { source, kind, payload } => {
            Some(server::game_event(source.0, *kind, payload))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> GameSlot {
        GameSlot::new(Box::new(meridian_game::NoGame), 10, 1, false)
    }

    #[test]
    fn ids_are_asked_for_once_until_a_block_comes_and_again_when_it_runs_low() {
        let mut slot = slot();
        slot.want_ids();
        slot.want_ids();
        assert!(slot.take_ids_wanted());
        assert!(!slot.take_ids_wanted(), "once until they come");
        slot.ids_arrived(100..100 + IDS_LOW);
        assert!(!slot.take_ids_wanted(), "enough now");
        assert_eq!((slot.take_id(), slot.take_id()), (Some(100), Some(101)));
        slot.want_ids();
        assert!(slot.take_ids_wanted(), "fewer than IDS_LOW left");
        slot.ids_arrived(0..0);
        assert!(slot.take_ids_wanted(), "none came: asked again");
    }

    #[test]
    fn ids_run_across_blocks_and_then_out() {
        let mut slot = slot();
        slot.ids_arrived(5..6);
        slot.ids_arrived(9..10);
        assert_eq!((slot.take_id(), slot.take_id(), slot.take_id()), (Some(5), Some(9), None));
    }

    #[test]
    fn changed_states_are_taken_once_each_in_id_order() {
        let mut slot = slot();
        for entity in [4, 2, 4, 3] {
            slot.state_changed(PlayerId(entity));
        }
        let changed = slot.take_changed();
        assert_eq!(changed, [PlayerId(2), PlayerId(3), PlayerId(4)]);
        slot.reuse_changed(changed);
        assert!(slot.take_changed().is_empty());
    }

    #[test]
    fn mail_taken_back_goes_first() {
        let mut slot = slot();
        slot.mail(GameMail::Arrived(PlayerId(1)));
        slot.mail(GameMail::Arrived(PlayerId(2)));
        let first = slot.next_mail().expect("mail");
        slot.mail_first(first);
        assert_eq!(slot.mail_waiting(), 2);
        assert!(matches!(slot.next_mail(), Some(GameMail::Arrived(PlayerId(1)))));
    }
}
