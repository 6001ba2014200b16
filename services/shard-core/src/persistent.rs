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
//! **Restoring.** On every new partition, and whenever a shard leaves the view (or comes
//! back in a new life), the shard asks the store for its persistent entities
//! (`Transmit::LoadEntities`) and claims each that it does not own and did not despawn:
//! one standing in its region whose last owner (shard and incarnation) is not a running
//! shard of the cluster (it died, drained away without handing it on, or the whole
//! cluster restarted), and one it saved last itself and handed to a shard that no longer
//! runs (that shard died before its own first save landed). A claim is a write of the
//! record under this shard at the generation the entity's next owner had or would have,
//! so a claim and the save of an owner that did take it over tie and the store keeps the
//! first; only a claim it took brings the entity back here (`Event::EntitiesClaimed`),
//! private state included. Copies of persistent NPCs are never promoted the way other
//! orphaned NPCs are (`restore_orphaned_npcs`): the store has their private state, a copy
//! does not. `meridian-sim --entities` checks all of it against a model of the store.

use meridian_cluster::ShardId;
use meridian_game::{EntityId, GameError};
use meridian_rpc::pb::{peer_message::Kind as Peer, ActionAnswer, PeerMessage};
use meridian_world::{Look, PlayerId, Position};
use tracing::{debug, info, warn};

use crate::core::ShardCore;
use crate::messages::peer_at;
use crate::persistent_slot::{AnswerTo, Durable};
use crate::types::{Awaiting, EntityRecord, EntitySave, Transmit};

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
        self.persistent.removed.insert(npc);
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
        self.expire_durable();
        if !self.persistent.round_due(self.now) {
            return;
        }
        let owned = self.roster.seated_where(|seat| seat.npc && seat.persistent);
        // A set, not the list: one lookup per saved entity (a list made the round
        // quadratic: 133 ms at 20,000 NPCs, BENCHMARKS "Saving persistent entities").
        let owned_set: rustc_hash::FxHashSet<PlayerId> = owned.iter().copied().collect();
        self.persistent.saved.retain(|npc, _| owned_set.contains(npc));
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

    /// After a view: on a new partition, or when a shard left the cluster (died, drained
    /// away, or registered again in a new life, none of which need change the partition),
    /// read the store for entities this shard may have to bring back.
    pub(crate) fn entities_after_view(&mut self) {
        let departed = self.peers.take_departed();
        if self.persistent.epoch_loaded == self.geometry.epoch && !departed {
            return;
        }
        self.persistent.epoch_loaded = self.geometry.epoch;
        let world = &self.world;
        self.persistent.ghosts.retain(|npc| world.is_local(*npc) == Some(false));
        self.persistent.want_load();
    }

    /// The store's persistent entities: those to bring back are claimed. One is to come
    /// back here if it stands in this shard's region, is not owned here, and the shard
    /// that saved it last no longer runs; or if this shard saved it last and handed it to a
    /// shard that no longer runs (which died before its own save reached the store: its
    /// cell's new owner would take the record for this shard's, still running).
    pub(crate) fn entities_found(&mut self, records: Vec<EntityRecord>) {
        self.persistent.loading = false;
        let mut claims = Vec::new();
        for mut record in records {
            let npc = PlayerId(record.id);
            if self.world.is_local(npc) == Some(true)
                || self.persistent.claiming.contains(&npc)
                || self.persistent.removed.contains(&npc)
            {
                continue;
            }
            let at = Position { x: record.at.0, y: record.at.1 };
            let owner = ShardId(record.shard);
            // A claim is at the generation the entity's next owner had or would have: the
            // one after the record's, or, for one handed off from here, the one it was handed
            // over at. So a claim and the save of an owner that did take it over tie, and
            // the store keeps whichever came first (the other is refused and its copy goes).
            let generation = if owner == self.id && record.incarnation == self.incarnation() {
                // Saved here last and not here now: handed off. Its new owner's first
                // save may not have reached the store yet; it is lost only if that owner
                // (or whoever it was passed on to since) no longer runs.
                match self.handoffs.handed(npc) {
                    Some(handed) if self.runs(handed.to, handed.incarnation) => continue,
                    Some(handed) => handed.generation + 1,
                    None => record.generation + 1,
                }
            } else if self.geometry.owns(at) && !self.runs(owner, record.incarnation) {
                record.generation + 1
            } else {
                continue;
            };
            record.generation = generation;
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

    /// Whether `shard` in its life `incarnation` is running (this one, or registered);
    /// an incarnation of 0 is not known, and taken for the current one.
    fn runs(&self, shard: ShardId, incarnation: u64) -> bool {
        let life =
            if shard == self.id { self.incarnation() } else { self.peers.incarnation_of(shard) };
        self.peers.live_or_me(shard) && (incarnation == 0 || life == incarnation)
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
            // Past any copy here, so the copies elsewhere take its news as newer.
            let copy = self.ghosts.generation(npc).map_or(0, |g| g + 1);
            let (generation, private) = (record.generation.max(copy), record.private);
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

    /// The store has the writes of every round up to `through`, but for `refused`: the
    /// answers that waited for them go, and the refused entities' copies here.
    pub(crate) fn entities_saved(&mut self, through: u64, refused: Vec<u64>) {
        self.entities_refused(refused);
        let (due, waiting): (Vec<Durable>, Vec<Durable>) =
            std::mem::take(&mut self.persistent.durable)
                .into_iter()
                .partition(|d| d.round <= through);
        self.persistent.durable = waiting;
        for answer in due {
            self.answer_durable(answer);
        }
    }

    /// An action that saved persistent entities is answered `ActionDone` once the store
    /// has them (nothing acknowledged is lost with a shard killed meanwhile); until then
    /// the player's later inputs wait, as behind an action on another shard's entity, and
    /// an answer that waits longer than `ACTION_ANSWER_WITHIN` is given up on (the player
    /// gets `UNAVAILABLE`; the save may still land). `mark` is how many writes this round
    /// had before the action ran; whether it saved anything is the difference.
    pub(crate) fn done_when_saved(
        &mut self,
        mark: usize,
        to: AnswerTo,
        client_time: u64,
        payload: Vec<u8>,
    ) -> Result<(), Vec<u8>> {
        if self.persistent.round.len() <= mark {
            return Err(payload);
        }
        if let AnswerTo::Here { player, .. } = &to {
            let Some(seat) = self.roster.seat_mut(*player) else { return Err(payload) };
            seat.awaiting = Some(Awaiting { since: self.now, client_time });
        }
        let round = self.persistent.next_round;
        self.persistent.durable.push(Durable { round, to, client_time, payload, since: self.now });
        Ok(())
    }

    /// How many writes this round holds so far (see [`ShardCore::done_when_saved`]).
    pub(crate) fn writes_so_far(&self) -> usize {
        self.persistent.round.len()
    }

    fn answer_durable(&mut self, answer: Durable) {
        let reply = ActionAnswer {
            client_time: answer.client_time,
            done: true,
            payload: answer.payload,
            rejected: String::new(),
        };
        match answer.to {
            AnswerTo::Here { player, .. } => self.action_answer(player, reply),
            AnswerTo::Origin { shard, actor } => {
                self.peer_out.push(shard, peer_at(actor, (0, 0), Peer::Answer(reply)))
            }
        }
    }

    /// Answers waiting longer than the origin waits for them are dropped (the player was
    /// answered `UNAVAILABLE` meanwhile).
    fn expire_durable(&mut self) {
        let now = self.now;
        self.persistent.durable.retain(|d| {
            now.saturating_duration_since(d.since) <= crate::game::ACTION_ANSWER_WITHIN
        });
    }

    /// Saves the store refused: a newer owner has these entities, so the copies owned
    /// here go (their removal is not saved).
    fn entities_refused(&mut self, ids: Vec<u64>) {
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
            let (round, saves) = (persistent.next_round, std::mem::take(&mut persistent.round));
            persistent.next_round += 1;
            out.push(Transmit::SaveEntities { round, saves });
        }
        if !persistent.claims.is_empty() {
            out.push(Transmit::ClaimEntities(std::mem::take(&mut persistent.claims)));
        }
        if persistent.load_wanted && !persistent.loading {
            persistent.load_wanted = false;
            persistent.loading = true;
            out.push(Transmit::LoadEntities { areas: self.geometry.my_areas() });
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

impl ShardCore {
    /// The NPCs owned here, where they stand, and whether each is persistent (for the
    /// simulator's checks).
    pub fn owned_npcs(&self) -> Vec<(PlayerId, Position, bool)> {
        self.world
            .npcs()
            .map(|(npc, at, _)| {
                (npc, at, self.roster.seat(npc).is_some_and(|seat| seat.persistent))
            })
            .collect()
    }
}
