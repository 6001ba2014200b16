//! The core's persistent entities (issue 34): NPCs a game marked persistent
//! (`Context::persist`) are saved in the store by whichever shard owns them, and brought
//! back from it when their owner is gone.
//!
//! **Saving.** A persistent NPC is saved at once when it becomes persistent or is handed
//! in (under the new owner's generation), then every save interval if its cell, public or
//! private state or generation changed, and when the shard stops (`Event::SaveAll`); a
//! despawn writes its removal. Every write carries the owner's generation, shard id and
//! incarnation, and the store keeps a write only over one of an older generation or the
//! same owner's (`meridian_store::entities`). A save the store refuses means a newer
//! owner has the entity: the copy here is dropped without a word to the store.
//!
//! **Restoring.** On every new partition the shard asks the store for its persistent
//! entities (`Transmit::LoadEntities`), and claims those standing in its region that it
//! does not own and whose last owner (shard and incarnation) is not a live shard of the
//! cluster: that owner died, drained away without handing them on, or the whole cluster
//! restarted. A claim is a write of the record under a newer generation (one past the
//! record's and past any copy's here) and this shard's id; the store takes exactly one of
//! racing claims, and only a claim it took brings the entity back here
//! (`Event::EntitiesClaimed`), private state included. Copies of a dead owner's persistent
//! NPCs are never promoted the way other orphaned NPCs are (`restore_orphaned_npcs`): the
//! store has their private state, a copy does not.
//!
//! What this does not cover: an entity handed to a shard that dies before its first save
//! there reaches the store (a few milliseconds) is restored from its record only if that
//! record's owner is gone too; otherwise it waits for that owner to lose it.

use meridian_game::{EntityId, GameError};
use meridian_rpc::pb::{peer_message::Kind as Peer, PeerMessage};
use meridian_world::{Look, PlayerId, Position};
use tracing::{debug, info, warn};

use crate::core::ShardCore;
use crate::types::{EntityRecord, EntitySave, Transmit};

/// A fingerprint of what a save of the entity would write.
fn fingerprint(at: Position, generation: u64, look: &Look, private: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    (at.x, at.y, generation).hash(&mut hasher);
    look.state.hash(&mut hasher);
    private.hash(&mut hasher);
    hasher.finish()
}

impl ShardCore {
    /// `Context::persist`: the NPC is saved from now on, starting this round.
    pub(crate) fn persist(&mut self, entity: EntityId) -> Result<(), GameError> {
        let npc = PlayerId(entity.0);
        if !self.persistent.enabled() {
            return Err(GameError::NoStore);
        }
        match self.roster.seat_mut(npc) {
            Some(seat) if seat.npc => seat.persistent = true,
            Some(_) => return Err(GameError::IsPlayer(entity)),
            None => return Err(GameError::NotOwned(entity)),
        }
        self.save_entity(npc);
        // Its copies learn it is persistent (they must not promote it if this shard dies).
        self.remirror(npc);
        Ok(())
    }

    /// Queues a save of a persistent NPC owned here, as it is now.
    pub(crate) fn save_entity(&mut self, npc: PlayerId) {
        let Some(seat) = self.roster.seat(npc).filter(|seat| seat.persistent) else { return };
        let (Some(at), Some(look)) = (self.world.position(npc), self.world.look(npc)) else {
            return;
        };
        let print = fingerprint(at, seat.generation, &look, &seat.private);
        let record = EntityRecord {
            id: npc.0,
            kind: look.kind,
            name: look.name.to_string(),
            at: (at.x, at.y),
            state: look.state.to_vec(),
            private: seat.private.clone(),
            generation: seat.generation,
            shard: self.id.0,
            incarnation: self.incarnation(),
        };
        self.persistent.saved.insert(npc, print);
        self.persistent.round.push(EntitySave::Upsert(record));
    }

    /// A persistent NPC owned here is being despawned: gone from the store too.
    pub(crate) fn entity_removed(&mut self, npc: PlayerId) {
        let Some(seat) = self.roster.seat(npc).filter(|seat| seat.persistent) else { return };
        let generation = seat.generation;
        self.persistent.saved.remove(&npc);
        self.persistent.round.push(EntitySave::Remove {
            id: npc.0,
            generation,
            shard: self.id.0,
            incarnation: self.incarnation(),
        });
    }

    /// Every save interval: the persistent NPCs owned here that changed since their last
    /// save. Those no longer owned here are forgotten.
    pub(crate) fn save_changed_entities(&mut self) {
        if !self.persistent.round_due(self.now) {
            return;
        }
        let owned = self.roster.seated_where(|seat| seat.npc && seat.persistent);
        self.persistent.saved.retain(|npc, _| owned.contains(npc));
        for npc in owned {
            let (Some(seat), Some(at), Some(look)) =
                (self.roster.seat(npc), self.world.position(npc), self.world.look(npc))
            else {
                continue;
            };
            let print = fingerprint(at, seat.generation, &look, &seat.private);
            if self.persistent.saved.get(&npc) != Some(&print) {
                self.save_entity(npc);
            }
        }
    }

    /// The shard stops: every persistent NPC owned here is saved as it is.
    pub(crate) fn save_all_entities(&mut self) {
        for npc in self.roster.seated_where(|seat| seat.npc && seat.persistent) {
            self.save_entity(npc);
        }
    }

    /// A copy's news from its owner: whether the NPC is persistent.
    pub(crate) fn note_persistent_ghost(&mut self, message: &PeerMessage) {
        if let Some(Peer::Upsert(upsert)) = &message.kind {
            let npc = PlayerId(message.player_id);
            if upsert.persistent {
                self.persistent.ghosts.insert(npc);
            } else {
                self.persistent.ghosts.remove(&npc);
            }
        }
    }

    /// A new partition: read the store for entities this shard may have to bring back.
    pub(crate) fn entities_after_partition(&mut self) {
        let world = &self.world;
        self.persistent.ghosts.retain(|npc| world.is_local(*npc) == Some(false));
        self.persistent.want_load();
    }

    /// The store's persistent entities: those in this shard's region, not owned here,
    /// whose last owner is not running any more, are claimed.
    pub(crate) fn entities_found(&mut self, records: Vec<EntityRecord>) {
        self.persistent.loading = false;
        let mut claims = Vec::new();
        for mut record in records {
            let npc = PlayerId(record.id);
            let at = Position { x: record.at.0, y: record.at.1 };
            if !self.geometry.owns(at)
                || self.world.is_local(npc) == Some(true)
                || self.persistent.claiming.contains(&npc)
            {
                continue;
            }
            let owner = meridian_cluster::ShardId(record.shard);
            let owner_runs = if owner == self.id {
                record.incarnation == self.incarnation()
            } else {
                self.peers.live_or_me(owner)
                    && self.peers.incarnation_of(owner) == record.incarnation
            };
            if owner_runs {
                continue;
            }
            let copy = self.ghosts.generation(npc).unwrap_or(0);
            record.generation = record.generation.max(copy) + 1;
            record.shard = self.id.0;
            record.incarnation = self.incarnation();
            self.persistent.claiming.insert(npc);
            claims.push(record);
        }
        if !claims.is_empty() {
            info!(shard = %self.id, entities = claims.len(), "claiming persistent entities whose owner is gone");
        }
        self.persistent.claims.extend(claims);
    }

    /// Claims the store took: the entities come back here (or are handed on, if the
    /// partition moved their cell meanwhile).
    pub(crate) fn entities_claimed(&mut self, records: Vec<EntityRecord>) {
        for record in records {
            let npc = PlayerId(record.id);
            self.persistent.claiming.remove(&npc);
            if self.world.is_local(npc) == Some(true) {
                continue;
            }
            let at = Position { x: record.at.0, y: record.at.1 };
            let look = Look {
                name: record.name.into(),
                kind: record.kind,
                state: std::sync::Arc::from(record.state),
            };
            let (generation, private) = (record.generation, record.private);
            if let Err(error) = self.npc_in(npc, look, at, (generation, 0), private, true) {
                warn!(%npc, %error, "cannot restore a persistent entity");
                continue;
            }
            self.metrics.entities_restored.inc();
            debug!(%npc, ?at, generation = record.generation, "persistent entity restored from the store");
            if !self.geometry.owns(at) {
                self.hand_off(npc);
            }
        }
        self.run_game_mail();
    }

    /// Saves the store refused: a newer owner has these entities, so the copies owned
    /// here go (their removal is not saved).
    pub(crate) fn entities_refused(&mut self, ids: Vec<u64>) {
        for id in ids {
            let npc = PlayerId(id);
            self.persistent.claiming.remove(&npc);
            let owned = self.roster.seat(npc).is_some_and(|seat| seat.npc && seat.persistent);
            if owned {
                warn!(%npc, "a newer owner saved this persistent entity; dropping the copy here");
                self.persistent.saved.remove(&npc);
                self.remove(npc, false);
                self.metrics.entities_fenced_out.inc();
            }
        }
    }

    /// What the store is to do this round.
    pub(crate) fn flush_entities(&mut self, out: &mut Vec<Transmit>) {
        let persistent = &mut self.persistent;
        if !persistent.round.is_empty() {
            out.push(Transmit::SaveEntities(std::mem::take(&mut persistent.round)));
        }
        if !persistent.claims.is_empty() {
            out.push(Transmit::ClaimEntities(std::mem::take(&mut persistent.claims)));
        }
        if persistent.load_wanted && !persistent.loading {
            persistent.load_wanted = false;
            persistent.loading = true;
            out.push(Transmit::LoadEntities);
        }
    }

    /// Sends every holder of the NPC's copy its full state again (with whether it is
    /// persistent).
    fn remirror(&mut self, npc: PlayerId) {
        if let Some(seat) = self.roster.seat_mut(npc) {
            seat.ghosted_at.clear();
        }
        self.mirror(npc);
    }
}
