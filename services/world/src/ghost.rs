//! Ghosts: copies of players owned by a neighbouring shard, kept so that local players near
//! a border see them exactly as they would see local players. A ghost never receives
//! anything, is moved by its owner's updates (no rate limit, no acknowledgement), and can
//! become local (or a local player a ghost) during a handoff without anyone noticing.

use std::sync::Arc;

use crate::rate::MoveBudget;
use crate::types::{EntityKind, Envelope, Look, Notification, PlayerId, Position, WorldError};
use crate::world::World;

impl World {
    /// Creates the ghost `id` at `at`, or moves it there. A new ghost is announced with
    /// `Entered` to the local players that see it; a moved one gets the same view diff as a
    /// local move (`Moved`, `Entered` or `Left` per local observer), and may jump any distance.
    /// An existing ghost keeps its first name, because observers already hold it, and its
    /// kind and state.
    pub fn upsert_ghost(
        &mut self,
        id: PlayerId,
        name: Arc<str>,
        at: Position,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        if !self.config.contains(at) {
            return Err(WorldError::OutsideMap(at));
        }
        match self.by_id.get(&id).copied() {
            // An existing ghost keeps its look (name, kind, state): only its cell changes.
            Some(slot) if self.entity(slot).kind.is_local() => Err(WorldError::NotGhost(id)),
            Some(slot) => {
                self.relocate(slot, at, out);
                Ok(())
            }
            None => {
                let look = self.plain_look(name);
                self.upsert_ghost_as(id, look, at, out)
            }
        }
    }

    /// As [`World::upsert_ghost`], for an entity with a game kind and public state. An
    /// existing ghost whose state differs takes the new one, and its observers are told
    /// (`StateChanged`) after the move.
    pub fn upsert_ghost_as(
        &mut self,
        id: PlayerId,
        look: Look,
        at: Position,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        if !self.config.contains(at) {
            return Err(WorldError::OutsideMap(at));
        }
        match self.by_id.get(&id).copied() {
            Some(slot) if self.entity(slot).kind.is_local() => Err(WorldError::NotGhost(id)),
            Some(slot) => {
                self.relocate(slot, at, out);
                if self.entity(slot).state != look.state {
                    self.entity_mut(slot).state = Arc::clone(&look.state);
                    let note = Notification::StateChanged { subject: id, state: look.state };
                    self.tell_observers(slot, &note, out);
                }
                Ok(())
            }
            None => {
                // A ghost cannot move here, but a budget keeps every entity the same shape
                // and is replaced with a fresh one on promotion anyway.
                let budget = MoveBudget::full(self.config.move_rate);
                let slot = self.insert_entity(id, look, EntityKind::Ghost, at, budget);
                self.announce_arrival(slot, out);
                Ok(())
            }
        }
    }

    /// Removes the ghost `id`; the local players that saw it are told `Left`.
    pub fn remove_ghost(
        &mut self,
        id: PlayerId,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        let slot = self.ghost_slot(id)?;
        self.announce_departure(slot, out);
        self.remove_entity(slot);
        Ok(())
    }

    /// Delivers a ghost's chat line to the local players that see it (the speaker hears its
    /// own line from its owning shard).
    pub fn ghost_chat(
        &mut self,
        id: PlayerId,
        text: Arc<str>,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        let slot = self.ghost_slot(id)?;
        self.broadcast_chat(slot, text, out);
        Ok(())
    }

    /// Makes the ghost `id` a local player, for a handoff to this world. Nobody is told
    /// anything: observers keep seeing the same entity at the same place. The new local player
    /// starts with a full move budget, whose clock starts at its first move.
    pub fn promote_to_local(&mut self, id: PlayerId) -> Result<(), WorldError> {
        self.promote(id, EntityKind::Local)
    }

    /// Makes the ghost `id` an NPC owned here (a handoff, or a restore from this copy),
    /// as [`World::promote_to_local`] does for a player.
    pub fn promote_to_npc(&mut self, id: PlayerId) -> Result<(), WorldError> {
        self.promote(id, EntityKind::Npc)
    }

    fn promote(&mut self, id: PlayerId, kind: EntityKind) -> Result<(), WorldError> {
        let slot = self.ghost_slot(id)?;
        self.set_kind(slot, kind);
        self.entity_mut(slot).budget = MoveBudget::full(self.config.move_rate);
        Ok(())
    }

    /// Makes the local player `id` a ghost, for a handoff away from this world. Nobody is told
    /// anything, and from now on it receives nothing here.
    pub fn demote_to_ghost(&mut self, id: PlayerId) -> Result<(), WorldError> {
        let slot = self.slot_of(id)?;
        if !self.entity(slot).kind.is_local() {
            return Err(WorldError::NotLocal(id));
        }
        self.set_kind(slot, EntityKind::Ghost);
        Ok(())
    }

    fn ghost_slot(&self, id: PlayerId) -> Result<u32, WorldError> {
        let slot = self.slot_of(id)?;
        if self.entity(slot).kind.is_local() {
            Err(WorldError::NotGhost(id))
        } else {
            Ok(slot)
        }
    }
}
