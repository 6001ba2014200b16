//! Players (and NPCs) changing hands: mirrored to the neighbours that can see them
//! (ghosts), handed off when they step out of the region, taken over when handed in.
//!
//! Handoff, in one round of the old owner A: the move that leaves A's region is applied
//! and acknowledged by A; the player becomes a ghost on A; every other peer gets
//! `Released` (this generation is over); the new owner B gets `Handoff` with the player's
//! state, its next input sequence number and its current view; the gateway gets the
//! `released_to` marker after the ack. B promotes its ghost, sends the player the
//! difference between what it was told and B's world, mirrors it to B's neighbours under
//! the next generation, and confirms. Inputs that still reach A are forwarded to B, which
//! applies inputs in sequence order whichever path they took.
//!
//! `ShardCore`'s own orchestration, an `impl ShardCore` block that reaches the parts
//! through their methods (`Roster`, `Handoffs`, `Ghosts`, `History`, `Inputs`, ...).
//! Called from `core.rs` (peer messages, new partitions, housekeeping), `players.rs` and
//! `resume.rs` (a player placed or moved), and `game.rs` (NPCs).

use std::sync::Arc;

use meridian_cluster::ShardId;
use meridian_protocol::pb as client_pb;
use meridian_rpc::pb::{
    peer_message::Kind as Peer, player_input::Kind as Input, GhostNeeded, GhostRemove, GhostUpsert,
    Handoff, HandoffAck, PlayerInput, Released,
};
use meridian_world::{PlayerId, Position};
use tracing::{debug, warn};

use crate::core::ShardCore;
use crate::game_slot::GameMail;
use crate::handoffs::told_view;
use crate::history::{Divergent, Told};
use crate::messages::{peer, peer_at, recent_steps, upsert_of, wire};
use crate::types::{GatewayLane, HandedOff, Seat};

impl ShardCore {
    /// Brings the neighbours' ghosts of a local player up to date with its position:
    /// full state to shards that just came into range, the new cell to those still in
    /// range, removal (with the cell) for those out of range. Whether a removed copy goes
    /// is the holder's call: one whose players still see it keeps it and says so
    /// (`GhostNeeded`), and is mirrored again. Borders that other shards have not applied
    /// yet cost a round trip, never a wrong view.
    pub(crate) fn mirror(&mut self, player: PlayerId) {
        let Some(at) = self.world.position(player) else {
            return;
        };
        let Some(look) = self.world.look(player) else {
            return;
        };
        self.geometry.ghost_holders(at, &mut self.holders);
        let Some(seat) = self.roster.seat_mut(player) else {
            return;
        };
        let version = (seat.generation, seat.subject_seq);
        let persistent = seat.persistent;
        let before = std::mem::replace(&mut seat.ghosted_at, self.holders.clone());
        for holder in &self.holders {
            let kind = if before.contains(holder) {
                Peer::Moved(client_pb::Position { x: at.x, y: at.y })
            } else {
                Peer::Upsert(GhostUpsert {
                    persistent,
                    ..upsert_of(&look, at, &self.history, player)
                })
            };
            self.peer_out.push(*holder, peer_at(player, version, kind));
        }
        for gone in before.iter().filter(|s| !self.holders.contains(s)) {
            debug!(%player, to = %gone, ?at, epoch = self.geometry.epoch, "ghost no longer needed there");
            let remove = GhostRemove { left_world: false, position: wire(at) };
            self.peer_out.push(*gone, peer_at(player, version, Peer::Remove(remove)));
        }
    }

    /// The old owner, and the shards it kept ghosts of a player on, hold copies of the
    /// player handed over here. Those not among this shard's holders would stay frozen
    /// where the player was: they are told to drop them (and keep them, saying so, if
    /// their players still see them, as for any removal in [`ShardCore::mirror`]).
    fn release_old_ghosts(&mut self, player: PlayerId, old_holders: &[ShardId]) {
        let Some(at) = self.world.position(player) else {
            return;
        };
        let Some(seat) = self.roster.seat_mut(player) else {
            return;
        };
        let version = (seat.generation, seat.subject_seq);
        for &holder in old_holders {
            if seat.ghosted_at.contains(&holder) {
                continue;
            }
            let remove = GhostRemove { left_world: false, position: wire(at) };
            self.peer_out.push(holder, peer_at(player, version, Peer::Remove(remove)));
        }
    }

    /// A holder still needs its copy of `player` (its players see it): mirror it there
    /// again from the current state. A player handed off since is passed on to its new
    /// owner; one no longer in the world here is removed there for good.
    pub(crate) fn ghost_needed(&mut self, holder: ShardId, player: PlayerId, generation: u64) {
        if holder == self.id {
            return;
        }
        if let (Some(seat), Some(at), Some(look)) =
            (self.roster.seat_mut(player), self.world.position(player), self.world.look(player))
        {
            if !seat.ghosted_at.contains(&holder) {
                seat.ghosted_at.push(holder);
                seat.ghosted_at.sort_unstable();
            }
            let version = (seat.generation, seat.subject_seq);
            let upsert = GhostUpsert {
                persistent: seat.persistent,
                ..upsert_of(&look, at, &self.history, player)
            };
            let upsert = Peer::Upsert(upsert);
            self.peer_out.push(holder, peer_at(player, version, upsert));
            return;
        }
        if let Some(handed) = self.handoffs.handed(player) {
            if handed.to != holder {
                let needed = Peer::Needed(GhostNeeded { holder: holder.0 });
                self.peer_out.push(handed.to, peer(player, generation, needed));
                return;
            }
        }
        let gone = Peer::Remove(GhostRemove { left_world: true, position: None });
        self.peer_out.push(holder, peer(player, generation, gone));
    }

    /// Gives a local player that stands outside this shard's region to its owner.
    pub(crate) fn hand_off(&mut self, player: PlayerId) {
        let Some(at) = self.world.position(player) else {
            return;
        };
        let Some(to) = self.geometry.owner_of(at) else {
            return;
        };
        if to == self.id || !self.peer_ready(to) {
            return;
        }
        if self.roster.seat(player).is_some_and(|s| s.awaiting.is_some() || !s.blocked.is_empty()) {
            // An action's answer is on its way here: the player goes once it is in (the
            // next move, tick or partition).
            return;
        }
        let Some(seat) = self.roster.unseat(player) else {
            return;
        };
        let look = self.world.look(player);
        let name = look.as_ref().map(|l| l.name.to_string()).unwrap_or_default();
        // What the player has been told: an NPC has no view.
        let view = match self.roster.take_divergent(player) {
            _ if seat.npc => Vec::new(),
            divergent => told_view(player, at, divergent, &self.world, &self.history),
        };
        if let Err(error) = self.world.demote_to_ghost(player) {
            warn!(%player, %error, "cannot demote a player being handed off");
        }
        let next_generation = seat.generation + 1;
        let incarnation = self.peers.incarnation_of(to);
        debug!(%player, %to, next_generation, ?at, epoch = self.geometry.epoch, "hand off");
        self.ghosts.demoted(player, next_generation, to, self.now);
        if seat.persistent {
            // Its copy here must not be promoted should `to` die: the store brings it back.
            self.persistent.ghosts.insert(player);
        }
        for other in self.geometry.peers() {
            if other != to {
                let released = Peer::Released(Released { new_owner: to.0 });
                self.peer_out.push(other, peer(player, seat.generation, released));
            }
        }
        // The inputs held here go with the player, and so do the seqs refused here ahead
        // of their turn, so the new owner does not wait for them.
        let (next_seq, held) = seat.inputs.into_handoff(player.0, seat.session);
        let handoff = Handoff {
            name,
            position: wire(at),
            session: seat.session,
            gateway_id: seat.gateway,
            next_seq,
            view,
            subject_seq: seat.subject_seq,
            ghosted_at: seat.ghosted_at.iter().map(|s| s.0).collect(),
            kind: look.as_ref().map_or(0, |l| l.kind),
            state: look.as_ref().map(|l| l.state.to_vec()).unwrap_or_default(),
            private_state: seat.private,
            recent: recent_steps(&self.history, player),
            resume_nonce: seat.resume_nonce,
            resume_previous: seat.resume_previous.unwrap_or(0),
            login_stamp: seat.login.0,
            login_session: seat.login.1,
            persistent: seat.persistent,
        };
        self.peer_out.push(to, peer(player, next_generation, Peer::Handoff(handoff)));
        for input in held {
            self.peer_out.push(to, peer(player, next_generation, Peer::Forwarded(input)));
        }
        if !seat.npc {
            self.outbox.release(seat.link, seat.session, to.0, incarnation, seat.generation);
        }
        let now = self.now;
        self.handoffs.handed_off(
            player,
            HandedOff {
                to,
                incarnation,
                generation: seat.generation,
                at,
                acked: None,
                since: now,
                forwarded: Vec::new(),
                npc: seat.npc,
            },
        );
        self.metrics.handoffs_out.inc();
        self.metrics.players.set(self.world.n_local() as i64);
    }

    /// An input another shard forwarded, for the player's ownership `generation` as that
    /// shard knows it.
    pub(crate) fn on_forwarded(&mut self, generation: u64, input: PlayerInput) {
        let player = PlayerId(input.player_id);
        let handed_back = !matches!(input.kind, Some(Input::Join(_)))
            && !self.roster.is_seated(player)
            && self.handoffs.handed(player).is_some_and(|h| generation > h.generation + 1);
        if handed_back {
            // For a later ownership than the one this shard handed over: the player was
            // handed back here since, and its handoff waits (for its gateway lane's link,
            // say). Forwarded on by the older handoff's record, it would go round between
            // the two shards for good (`meridian-sim` seed 67713).
            debug!(%player, seq = input.seq, generation, "input for a handoff still to be taken held");
            if let Some((link, input)) = self.inputs.hold(player, None, input, self.now) {
                self.refuse_unplaced(link, input);
            }
            return;
        }
        self.on_input(None, input)
    }

    /// Takes over a player from `from`.
    pub(crate) fn handoff_in(
        &mut self,
        from: ShardId,
        player: PlayerId,
        generation: u64,
        mut handoff: Handoff,
    ) {
        if self.world.is_local(player) == Some(true) {
            // Two copies met (a resume answered by a stale parked copy elsewhere, or a
            // restore here while the handoff was held up on its stream, say): the one here
            // stays. The sender demoted its copy to a ghost it expects this shard to
            // mirror, and the shards it mirrored to wait for this shard's word after its
            // Released: each is told to drop its copy (keeping it if its players see it,
            // as for any removal; seed 30971) and the handoff is confirmed, so the sender
            // does not wait.
            warn!(%player, %from, "handoff for a player already owned here; ignored");
            if let (Some(seat), Some(at)) = (self.roster.seat(player), self.world.position(player))
            {
                // At the generation the sender demoted its copy to, or it would be dropped
                // there as stale.
                let version = (seat.generation.max(generation), seat.subject_seq);
                let holders = handoff.ghosted_at.iter().map(|&s| ShardId(s)).chain([from]);
                let mut told = Vec::new();
                for holder in holders {
                    if holder == self.id
                        || seat.ghosted_at.contains(&holder)
                        || told.contains(&holder)
                    {
                        continue;
                    }
                    told.push(holder);
                    let remove = GhostRemove { left_world: false, position: wire(at) };
                    self.peer_out.push(holder, peer_at(player, version, Peer::Remove(remove)));
                }
            }
            self.peer_out.push(from, peer(player, generation, Peer::HandoffAck(HandoffAck {})));
            return;
        }
        let passed_on = self.handoffs.handed(player).is_some_and(|h| h.generation >= generation);
        if passed_on || self.ghosts.generation(player).is_some_and(|g| g > generation) {
            // Stale: the player has been here at this generation or later already and moved
            // on (this handoff was held up on its stream while the player was restored here
            // and handed on, say), or is known at a newer generation elsewhere. Taking it
            // would make a second copy. Confirmed, so the sender does not wait for it.
            warn!(%player, %from, generation, "stale handoff ignored");
            self.peer_out.push(from, peer(player, generation, Peer::HandoffAck(HandoffAck {})));
            return;
        }
        if handoff.kind != 0 {
            return self.npc_handoff_in(from, player, generation, handoff);
        }
        // The player's output goes on the link of its session's lane of its gateway.
        let lane = GatewayLane::of_session(handoff.gateway_id, handoff.session);
        let Some(link) = self.links.of_lane(lane) else {
            // That lane has not opened its link here yet (this shard just joined): take the
            // player over when it does.
            let (gateway, lane_id) = (lane.gateway, lane.lane);
            warn!(%player, gateway, lane = lane_id, "handoff waits for its gateway lane's link");
            self.handoffs.wait_for_lane(lane, (from, player, generation, handoff, self.now));
            return;
        };
        let at = handoff.position.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default();
        let look = meridian_world::Look {
            name: handoff.name.into(),
            kind: 0,
            state: Arc::from(std::mem::take(&mut handoff.state)),
        };
        debug!(%player, %from, generation, ?at, epoch = self.geometry.epoch, "handoff in");
        self.ghosts.forget(player);
        let recent = std::mem::take(&mut handoff.recent);
        let version = (generation, handoff.subject_seq);
        crate::ghosts::catch_up(
            &mut self.world,
            &mut self.history,
            player,
            recent,
            version,
            &mut self.envelopes,
        );
        // Observers here see the ghost arrive at (or move to) the handoff position...
        let ready = self
            .world
            .upsert_ghost_as(player, look, at, &mut self.envelopes)
            .and_then(|()| self.world.promote_to_local(player));
        if let Err(error) = ready {
            warn!(%player, %error, "cannot take over a player");
            return;
        }
        let seat =
            Seat::new(link, handoff.session, handoff.gateway_id, generation, handoff.next_seq);
        let private = std::mem::take(&mut handoff.private_state);
        let resume_nonce = handoff.resume_nonce;
        let resume_previous = (handoff.resume_previous != 0).then_some(handoff.resume_previous);
        self.roster.insert_seat(
            player,
            Seat {
                subject_seq: handoff.subject_seq,
                private,
                resume_nonce,
                resume_previous,
                login: (handoff.login_stamp, handoff.login_session),
                ..seat
            },
        );

        self.game.mail(GameMail::Arrived(player));
        self.inputs.back(player);
        self.history.record(player, (generation, handoff.subject_seq), at);
        let returned = self.handoffs.returned(player);
        self.route_envelopes();
        self.outbox.track(link, handoff.session, at.x, at.y, generation);
        // ...and the player's view follows this world from what it was told: replayed where
        // this world is ahead, held where it is behind (see views.rs).
        let told = handoff
            .view
            .iter()
            .map(|e| {
                let at = e.position.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default();
                let version = (e.generation, e.subject_seq);
                let told = Told { at, version, seen: e.seen, gone: e.gone };
                (PlayerId(e.player_id), told)
            })
            .collect();
        let divergent = Divergent { told, since: self.now };
        self.roster.set_divergent(player, divergent);
        self.resync(player);
        self.mirror(player);
        let mut old_holders: Vec<ShardId> =
            handoff.ghosted_at.iter().map(|&s| ShardId(s)).filter(|s| *s != self.id).collect();
        old_holders.push(from);
        self.release_old_ghosts(player, &old_holders);
        self.peer_out.push(from, peer(player, generation, Peer::HandoffAck(HandoffAck {})));
        self.metrics.handoffs_in.inc();
        self.metrics.players.set(self.world.n_local() as i64);
        // Inputs this shard forwarded while the player was away that the shard handing it
        // back had not applied: they may never come back (that shard dies with them).
        // What does come back later is a duplicate, dropped by the sequence.
        // They join the inputs that waited here, one of each (the same input may have come
        // back already), in seq order.
        let forwarded = returned.map(|r| r.forwarded).unwrap_or_default();
        self.inputs.hold_returned(player, forwarded, handoff.next_seq, self.now);
        self.take_early_inputs(player, handoff.session);
        self.run_game_mail();
        // An older login of an account whose newer login is seated elsewhere (its claim
        // came here first): it arrived only to leave.
        if self.claims.beaten(player, handoff.login_stamp, self.now) {
            return self.replace_older(player);
        }
        if !self.geometry.owns(at) {
            self.hand_off(player);
        }
    }

    /// Takes over an NPC from `from` (a handoff, or a restore from a ghost of it there).
    fn npc_handoff_in(&mut self, from: ShardId, npc: PlayerId, generation: u64, handoff: Handoff) {
        let at = handoff.position.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default();
        let look = meridian_world::Look {
            name: handoff.name.into(),
            kind: handoff.kind,
            state: Arc::from(handoff.state),
        };
        debug!(%npc, %from, generation, ?at, "NPC handoff in");
        let _ = self.handoffs.returned(npc);
        let (private, version) = (handoff.private_state, (generation, handoff.subject_seq));
        if let Err(error) = self.npc_in(npc, look, at, version, private, handoff.persistent) {
            warn!(%npc, %error, "cannot take over an NPC");
            return;
        }
        let mut old_holders: Vec<ShardId> =
            handoff.ghosted_at.iter().map(|&s| ShardId(s)).filter(|s| *s != self.id).collect();
        old_holders.push(from);
        self.release_old_ghosts(npc, &old_holders);
        self.peer_out.push(from, peer(npc, generation, Peer::HandoffAck(HandoffAck {})));
        self.metrics.handoffs_in.inc();
        self.run_game_mail();
        if !self.geometry.owns(at) {
            self.hand_off(npc);
        }
    }
}
