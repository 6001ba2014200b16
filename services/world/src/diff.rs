//! What local observers are told when an entity arrives, moves, speaks or leaves. Sight is
//! computed from positions alone (A sees B iff both coordinates are within the view range),
//! so no per-player view set is stored: a move from `p` to `q` compares, for everyone in the
//! sectors around `p` or `q`, whether it saw `p` and whether it sees `q`.

use std::sync::Arc;

use crate::types::{Envelope, Notification, PlayerId, Position};
use crate::world::{Entity, World};

impl World {
    /// Tells local observers of a newly placed entity that it entered, and, if it is local,
    /// tells it about everyone it sees.
    pub(crate) fn announce_arrival(&self, slot: u32, out: &mut Vec<Envelope>) {
        let subject = self.entity(slot);
        let at = self.position_of_slot(slot);
        let subject_local = subject.kind.is_observer();
        self.grid.for_each_near(at, |member| {
            if member.slot == slot || !self.config.in_sight(member.position, at) {
                return;
            }
            if member.local {
                out.push(entered(member.id, subject, at));
            }
            if subject_local {
                out.push(entered(subject.id, self.entity(member.slot), member.position));
            }
        });
    }

    /// Tells local observers of an entity that is about to be removed that it left.
    pub(crate) fn announce_departure(&self, slot: u32, out: &mut Vec<Envelope>) {
        let subject = self.entity(slot).id;
        let at = self.position_of_slot(slot);
        self.grid.for_each_near(at, |member| {
            if member.local && member.slot != slot && self.config.in_sight(member.position, at) {
                out.push(Envelope { to: member.id, note: Notification::Left { subject } });
            }
        });
    }

    /// Tells every local observer of an entity (and the entity itself, if it is a local
    /// player) `note`.
    pub(crate) fn tell_observers(&self, slot: u32, note: &Notification, out: &mut Vec<Envelope>) {
        let at = self.position_of_slot(slot);
        self.grid.for_each_near(at, |member| {
            if member.local && self.config.in_sight(member.position, at) {
                out.push(Envelope { to: member.id, note: note.clone() });
            }
        });
    }

    /// Delivers a chat line to every local observer of the speaker (not to the speaker).
    pub(crate) fn broadcast_chat(&self, slot: u32, text: Arc<str>, out: &mut Vec<Envelope>) {
        let speaker = self.entity(slot).id;
        let at = self.position_of_slot(slot);
        self.grid.for_each_near(at, |member| {
            if member.local && member.slot != slot && self.config.in_sight(member.position, at) {
                let note = Notification::Chat { speaker, text: Arc::clone(&text) };
                out.push(Envelope { to: member.id, note });
            }
        });
    }

    /// Moves an entity to `to` (on the map) and emits the view diff: `Moved` to local
    /// observers that saw it before and after, `Entered`/`Left` both ways for pairs that come
    /// into or go out of sight (the mover's side only if the mover is local).
    pub(crate) fn relocate(&mut self, slot: u32, to: Position, out: &mut Vec<Envelope>) {
        let from = self.position_of_slot(slot);
        if from == to {
            return;
        }
        let entity = self.entity(slot);
        let (old_sector, old_index) = (entity.sector, entity.index);
        let new_sector = self.grid.sector_of(to);
        if new_sector == old_sector {
            self.grid.member_mut(old_sector, old_index).position = to;
        } else {
            let mut member = *self.grid.member(old_sector, old_index);
            member.position = to;
            if let Some(moved) = self.grid.remove(old_sector, old_index) {
                self.entity_mut(moved).index = old_index;
            }
            let new_index = self.grid.insert(new_sector, member);
            let entity = self.entity_mut(slot);
            entity.sector = new_sector;
            entity.index = new_index;
        }
        self.emit_view_diff(slot, from, to, out);
    }

    fn emit_view_diff(&self, slot: u32, from: Position, to: Position, out: &mut Vec<Envelope>) {
        let subject = self.entity(slot);
        let subject_local = subject.kind.is_observer();
        // A Moved is one step. An entity put elsewhere (a teleport, a restore after its
        // shard failed, a copy that missed updates) leaves and enters again, so no client
        // ever sees an entity jump.
        let jump = from.x.abs_diff(to.x) + from.y.abs_diff(to.y) > 1;
        self.grid.for_each_near_either(from, to, |member| {
            if member.slot == slot {
                return;
            }
            let saw = self.config.in_sight(member.position, from);
            let sees = self.config.in_sight(member.position, to);
            match (saw, sees) {
                (true, true) if jump => {
                    if member.local {
                        let note = Notification::Left { subject: subject.id };
                        out.push(Envelope { to: member.id, note });
                        out.push(entered(member.id, subject, to));
                    }
                }
                (true, true) => {
                    if member.local {
                        let note = Notification::Moved {
                            subject: subject.id,
                            position: to,
                            client_time: 0,
                        };
                        out.push(Envelope { to: member.id, note });
                    }
                }
                (false, true) => {
                    if member.local {
                        out.push(entered(member.id, subject, to));
                    }
                    if subject_local {
                        out.push(entered(subject.id, self.entity(member.slot), member.position));
                    }
                }
                (true, false) => {
                    if member.local {
                        let note = Notification::Left { subject: subject.id };
                        out.push(Envelope { to: member.id, note });
                    }
                    if subject_local {
                        let note = Notification::Left { subject: member.id };
                        out.push(Envelope { to: subject.id, note });
                    }
                }
                (false, false) => {}
            }
        });
    }
}

fn entered(to: PlayerId, subject: &Entity, position: Position) -> Envelope {
    let note = Notification::Entered {
        subject: subject.id,
        position,
        name: Arc::clone(&subject.name),
        kind: subject.game_kind,
        state: Arc::clone(&subject.state),
    };
    Envelope { to, note }
}
