//! What happens to local players: joining, their inputs, leaving, being mirrored to the
//! neighbours that can see them, and changing owner when they step out of the region.
//!
//! Handoff, in one round of the old owner A: the move that leaves A's region is applied
//! and acknowledged by A; the player becomes a ghost on A; every other peer gets
//! `Released` (this generation is over); the new owner B gets `Handoff` with the player's
//! state, its next input sequence number and its current view; the gateway gets the
//! `released_to` marker after the ack. B promotes its ghost, sends the player the
//! difference between what it was told and B's world, mirrors it to B's neighbours under
//! the next generation, and confirms. Inputs that still reach A are forwarded to B, which
//! applies inputs in sequence order whichever path they took.

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_cluster::{OrderKind, PlayerOrder, ShardId};
use meridian_protocol::pb::{self as client_pb, ErrorCode, ServerMessage};
use meridian_protocol::server;
use meridian_rpc::pb::{
    peer_message::Kind as Peer, player_input::Kind as Input, GhostNeeded, GhostRemove, Handoff,
    HandoffAck, Join, MoveRefused, PlayerInput, Released, ViewEntry,
};
use meridian_world::{PlayerId, Position, WorldError};
use tracing::{debug, info, warn};

use crate::core::ShardCore;
use crate::game_slot::GameMail;
use crate::handoffs::told_view;
use crate::handoffs::{Answer, BehindView};
use crate::history::{Divergent, Told};
use crate::messages::{peer, peer_at, recent_steps, upsert_of, wire};
use crate::roster::{fresh_nonce, TokenCheck};
use crate::sequence::InputSequence;
use crate::types::{
    world_direction, GatewayLane, HandedOff, LinkId, Parked, SaveRecord, Seat, PENDING_LIMIT,
};

impl ShardCore {
    pub(crate) fn join(&mut self, link: LinkId, input: PlayerInput) {
        let player = PlayerId(input.player_id);
        let session = input.session;
        let Some(Input::Join(join)) = input.kind else {
            return;
        };
        if join.restore {
            return self.restore(link, input.seq, session, player, join);
        }
        let gateway = self.links.gateway_of(link).unwrap_or(0);
        // The gateway sends a spawn only where the player must go: a dev-mode Login's own,
        // or the cell its account was saved at.
        let spawn = match join.spawn {
            Some(p) => Some(Position { x: p.x, y: p.y }),
            None => self.geometry.random_cell(&mut self.rng),
        };
        // A returning account continues from the generation it was saved at, so its saves
        // are newer than the ones before.
        let generation = join.generation;
        let Some(at) = spawn else {
            let error = server::error(ErrorCode::Unavailable, "shard holds no region yet", 0);
            self.outbox.push(link, session, &error);
            self.outbox.close(link, session);
            return;
        };
        if self.roster.is_seated(player) {
            // The same account logged in twice at once and both logins found it nowhere
            // (or raced a takeover): the later login wins, as a takeover would.
            let (old_link, old_session) =
                self.roster.seat(player).map(|s| (s.link, s.session)).expect("checked");
            self.remove(player, false);
            self.tell_replaced(old_link, old_session);
            self.outbox.close(old_link, old_session);
            self.metrics.logins_replaced.inc();
        }
        self.roster.take_parked(player);
        let nonce = self.resume_nonce();
        let login_ok = self.login_ok(player, at, nonce);
        let join_epoch = join.epoch;
        let join_state = join.state;
        let name: Arc<str> = join.name.into();
        let now = self.since(self.started);
        // LoginOk goes first: the Entered messages the login causes for this player follow.
        match self.world.login(player, Arc::clone(&name), at, now, &mut self.envelopes) {
            Ok(()) => {
                self.outbox.push(link, session, &login_ok);
                self.outbox.track(link, session, at.x, at.y, generation);
                let mut seat = Seat::new(link, session, gateway, generation, input.seq + 1);
                seat.private = join_state;
                seat.resume_nonce = nonce;
                self.roster.insert_seat(player, seat);
                self.inputs.back(player);
                self.history.record(player, (generation, 0), at);
                self.metrics.logins.inc();
                self.metrics.players.set(self.world.n_local() as i64);
                self.route_envelopes();
                self.mirror(player);
                self.run_game(|game, ctx| {
                    game.player_joined(ctx, meridian_game::EntityId(player.0))
                });
                if self.roster.seat(player).is_some_and(|seat| !seat.private.is_empty()) {
                    let private = self.roster.seat(player).expect("checked").private.clone();
                    self.outbox.private_state(link, session, &private);
                }
                if !self.geometry.owns(at) && join_epoch <= self.geometry.epoch {
                    // A spawn placed by a gateway with an older partition map. (One with a
                    // newer map than this shard's waits here for it: see `Join.epoch`.)
                    self.hand_off(player);
                }
            }
            Err(error) => {
                warn!(%player, %error, "join refused by the world");
                let message = server::error(ErrorCode::InvalidArgument, error.to_string(), 0);
                self.outbox.push(link, session, &message);
            }
        }
    }

    /// Carries out each operator's order the first time it is seen, if its player is here
    /// (seated, or parked after its connection dropped); a shard the player reaches later
    /// has seen the order too and leaves it be.
    pub(crate) fn carry_out_orders(&mut self, orders: &BTreeMap<u64, PlayerOrder>) {
        self.orders_seen.retain(|id| orders.values().any(|order| order.id == *id));
        for (&player, order) in orders {
            if !self.orders_seen.insert(order.id) {
                continue;
            }
            let player = PlayerId(player);
            match &order.kind {
                OrderKind::Kick { reason } => self.kick(player, reason),
                OrderKind::Move { x, y } => self.teleport(player, Position { x: *x, y: *y }),
            }
        }
    }

    /// Out of the world: the connection is told why and closed; saved where it stood.
    fn kick(&mut self, player: PlayerId, reason: &str) {
        if let Some(seat) = self.roster.seat(player).filter(|seat| !seat.npc) {
            let (link, session) = (seat.link, seat.session);
            info!(%player, reason, "player removed by an operator");
            self.remove(player, false);
            let detail = format!("removed by an operator: {reason}");
            self.outbox.push(link, session, &server::error(ErrorCode::Unavailable, detail, 0));
            self.outbox.close(link, session);
        } else if self.roster.take_parked(player).is_some() {
            info!(%player, reason, "parked player removed by an operator");
        } else {
            return;
        }
        self.metrics.player_orders.inc("kick");
    }

    /// To `at` at once, on the same connection: the client gets ViewReset there (handed
    /// on if another shard owns the cell); saved there.
    fn teleport(&mut self, player: PlayerId, at: Position) {
        let config = self.world.config();
        if at.x >= config.width || at.y >= config.height {
            return warn!(%player, x = at.x, y = at.y, "move order outside the map ignored");
        }
        let spawn = Some(client_pb::Position { x: at.x, y: at.y });
        if let Some(seat) = self.roster.seat(player).filter(|seat| !seat.npc) {
            let (link, session, next) = (seat.link, seat.session, seat.inputs.next());
            info!(%player, x = at.x, y = at.y, "player moved by an operator");
            self.remove(player, true);
            let Some(parked) = self.roster.take_parked(player) else { return };
            let join = Join {
                name: parked.name,
                spawn,
                restore: true,
                generation: parked.generation,
                gateway_id: 0,
                epoch: 0,
                state: parked.private,
            };
            self.restore_as(link, next.saturating_sub(1), session, player, join, Answer::ViewReset);
            let _ = self.world.set_state(player, parked.state);
            self.save(player);
        } else if let Some(parked) = self.roster.parked_mut(player) {
            info!(%player, x = at.x, y = at.y, "parked player moved by an operator");
            parked.at = at;
            let save = SaveRecord {
                player: player.0,
                generation: parked.generation,
                at: (at.x, at.y),
                state: parked.private.clone(),
            };
            self.saves.save_record(save);
        } else {
            return;
        }
        self.metrics.player_orders.inc("move");
    }

    /// A nonce for a fresh resume token (see [`fresh_nonce`]).
    fn resume_nonce(&mut self) -> u64 {
        fresh_nonce(&mut self.rng)
    }

    /// The answer to a login placed here at `at`, with a fresh resume token.
    fn login_ok(&self, player: PlayerId, at: Position, nonce: u64) -> ServerMessage {
        let config = self.world.config();
        ServerMessage {
            kind: Some(client_pb::server_message::Kind::LoginOk(client_pb::LoginOk {
                player_id: player.0,
                position: wire(at),
                resume_token: self.roster.mint_token(player, nonce),
                map_width: config.width,
                map_height: config.height,
                view_range: config.view_range,
            })),
        }
    }

    /// Answers a move the gateway refused (its rate limit) with the gateway's code, in the
    /// place of the move among the player's answers.
    pub(crate) fn answer_move_refused(&mut self, link: LinkId, session: u64, refused: MoveRefused) {
        let code = ErrorCode::try_from(refused.code).unwrap_or(ErrorCode::RateLimited);
        let error = server::error(code, refused.detail, refused.client_time);
        self.outbox.push_move_answer(link, session, &error);
    }

    /// Applies one in-sequence input of a local player.
    pub(crate) fn apply(&mut self, player: PlayerId, input: PlayerInput) {
        let Some(seat) = self.roster.seat(player) else {
            return;
        };
        if seat.awaiting.is_some() || !seat.blocked.is_empty() {
            // Behind an action whose answer comes from another shard: in order after it.
            return self.block(player, input);
        }
        let (link, session) = (seat.link, seat.session);
        match input.kind {
            None | Some(Input::Join(_)) => {}
            Some(Input::Move(m)) => {
                let direction = match world_direction(m.direction) {
                    Ok(direction) => direction,
                    Err(invalid) => {
                        let error =
                            server::error(invalid.code(), invalid.to_string(), m.client_time);
                        return self.outbox.push_move_answer(link, session, &error);
                    }
                };
                match self.step_entity(player, direction, m.client_time) {
                    Ok(_) => {}
                    Err(WorldError::RateLimited) => {
                        self.metrics.moves_rate_limited.inc();
                        let detail = "more moves per second than the limit";
                        let error = server::error(ErrorCode::RateLimited, detail, m.client_time);
                        self.outbox.push_move_answer(link, session, &error);
                    }
                    Err(error) => {
                        warn!(%player, %error, "move refused by the world");
                        let error =
                            server::error(ErrorCode::Unavailable, error.to_string(), m.client_time);
                        self.outbox.push_move_answer(link, session, &error);
                    }
                }
            }
            Some(Input::Chat(chat)) => {
                self.metrics.chats.inc();
                let text: Arc<str> = chat.text.into();
                if let Err(error) = self.world.chat(player, Arc::clone(&text), &mut self.envelopes)
                {
                    warn!(%player, %error, "chat refused by the world");
                }
                self.route_envelopes();
                let generation = self.roster.seat(player).map(|s| s.generation).unwrap_or(0);
                for holder in
                    self.roster.seat(player).map(|s| s.ghosted_at.clone()).unwrap_or_default()
                {
                    let chat = client_pb::Chat { text: text.to_string() };
                    self.peer_out.push(holder, peer(player, generation, Peer::Chat(chat)));
                }
            }
            Some(Input::Ping(ping)) => {
                self.outbox.push(link, session, &server::pong(ping.client_time))
            }
            Some(Input::Refused(refused)) => self.answer_move_refused(link, session, refused),
            Some(Input::Action(action)) => self.action(player, action),
            Some(Input::Resume(_)) => {}
            Some(Input::Leave(leave)) => {
                // A dropped connection parks the player for the resume window; a logout ends it.
                self.remove(player, !leave.logout);
                if leave.logout {
                    if self.saves.enabled() {
                        // Closed once its save is in the store, so that a login right after
                        // the logout finds it there.
                        self.saves.close_after_save(player, link, session, self.now);
                    } else {
                        self.outbox.close(link, session);
                    }
                }
            }
        }
    }

    /// Moves a local entity (player or NPC) one step: its ack to itself if it is a player,
    /// the view diff to those that see it, its ghosts updated, and a handoff if it left the
    /// region. Returns where it stands.
    pub(crate) fn step_entity(
        &mut self,
        entity: PlayerId,
        direction: meridian_world::Direction,
        client_time: u64,
    ) -> Result<Position, WorldError> {
        let now = self.since(self.started);
        let before = self.world.position(entity);
        let after =
            self.world.move_player(entity, direction, client_time, now, &mut self.envelopes)?;
        self.metrics.moves.inc();
        self.route_envelopes();
        if before != Some(after) {
            if let Some(seat) = self.roster.seat_mut(entity) {
                seat.subject_seq += 1;
                let version = (seat.generation, seat.subject_seq);
                self.history.record(entity, version, after);
            }
            self.mirror(entity);
            if !self.geometry.owns(after) {
                self.hand_off(entity);
            }
        }
        Ok(after)
    }

    /// The player leaves the world: observers here and on neighbours get Left. With `park`,
    /// its name, cell and generation are kept for the resume window.
    pub(crate) fn remove(&mut self, player: PlayerId, park: bool) {
        // Leaving (logged out, or its connection dropped): saved where it stands.
        self.save(player);
        if self.roster.seat(player).is_some_and(|seat| !seat.npc) {
            // The game sees the player leave while it is still in the world.
            self.run_game(|game, ctx| game.player_left(ctx, meridian_game::EntityId(player.0)));
        }
        let Some(seat) = self.roster.unseat(player) else {
            return;
        };
        self.inputs.session_ended(player, seat.session, self.now);
        if park {
            if let (Some(name), Some(at)) = (self.world.name(player), self.world.position(player)) {
                let parked = Parked {
                    name: name.to_string(),
                    at,
                    move_budget: self.world.move_budget(player),
                    generation: seat.generation,
                    since: self.now,
                    private: seat.private.clone(),
                    state: self.world.state(player).cloned().unwrap_or_else(|| Arc::from(&[][..])),
                    resume_nonce: seat.resume_nonce,
                    resume_previous: seat.resume_previous,
                };
                self.roster.park(player, parked);
            }
        }
        self.history.forget(player, true, self.now);
        self.roster.take_divergent(player);
        if let Err(error) = self.world.logout(player, &mut self.envelopes) {
            warn!(%player, %error, "leave refused by the world");
        }
        self.route_envelopes();
        for holder in seat.ghosted_at {
            self.peer_out.push(
                holder,
                peer(
                    player,
                    seat.generation,
                    Peer::Remove(GhostRemove { left_world: true, position: None }),
                ),
            );
        }
        self.metrics.leaves.inc();
        self.metrics.players.set(self.world.n_local() as i64);
    }

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
        let before = std::mem::replace(&mut seat.ghosted_at, self.holders.clone());
        for holder in &self.holders {
            let kind = if before.contains(holder) {
                Peer::Moved(client_pb::Position { x: at.x, y: at.y })
            } else {
                Peer::Upsert(upsert_of(&look, at, &self.history, player))
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
            let upsert = Peer::Upsert(upsert_of(&look, at, &self.history, player));
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
        };
        self.peer_out.push(to, peer(player, next_generation, Peer::Handoff(handoff)));
        for input in held {
            self.peer_out.push(to, peer(player, next_generation, Peer::Forwarded(input)));
        }
        if !seat.npc {
            self.outbox.release(seat.link, seat.session, to.0, incarnation);
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

    /// Takes over a player from `from`.
    pub(crate) fn handoff_in(
        &mut self,
        from: ShardId,
        player: PlayerId,
        generation: u64,
        mut handoff: Handoff,
    ) {
        if self.world.is_local(player) == Some(true) {
            // Two copies met (a resume answered by a stale parked copy elsewhere, say):
            // the one here stays. The sender demoted its copy to a ghost it expects this
            // shard to mirror; it is told to drop it (keeping it if its players see it,
            // as for any removal) and its handoff is confirmed, so it does not wait.
            warn!(%player, %from, "handoff for a player already owned here; ignored");
            if let (Some(seat), Some(at)) = (self.roster.seat(player), self.world.position(player))
            {
                if !seat.ghosted_at.contains(&from) {
                    // At the generation the sender demoted its copy to, or it would be
                    // dropped there as stale.
                    let version = (seat.generation.max(generation), seat.subject_seq);
                    let remove = GhostRemove { left_world: false, position: wire(at) };
                    self.peer_out.push(from, peer_at(player, version, Peer::Remove(remove)));
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
        let private = handoff.private_state;
        if let Err(error) = self.npc_in(npc, look, at, generation, handoff.subject_seq, private) {
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

    /// A client came back with a valid resume token on a new connection. If this shard
    /// holds the player (parked, or still attached to an old connection, which is closed so
    /// the player never exists twice), it is placed back at its last position exactly like
    /// a restore; otherwise the gateway is told so.
    ///
    /// A login of the player's account (`ResumeRequest.login`) takes the player over the
    /// same way, except that the old connection is told `REPLACED` and the new one gets
    /// `LoginOk`.
    pub(crate) fn resume(&mut self, link: LinkId, input: PlayerInput) {
        let player = PlayerId(input.player_id);
        let Some(Input::Resume(request)) = &input.kind else { return };
        let request = request.clone();
        self.roster.forget_resumed_with();
        if !request.login && !self.token_takes_back(player, &request.token) {
            return self.outbox.refuse_resume(link, input.session);
        }
        if let Some(seat) = self.roster.seat(player) {
            let (old_link, old_session) = (seat.link, seat.session);
            // Session ids are unique per gateway only: the same number from another gateway
            // is another connection.
            let gateway = self.links.gateway_of(link);
            if old_session == input.session && gateway == Some(seat.gateway) {
                // This resume placed the player here already (it reached this shard twice,
                // say passed on and sent again): the seat is the resuming session's own.
                // Taking the player away from it would close the very client resuming.
                return self.outbox.refuse_resume(link, input.session);
            }
            self.remove(player, true);
            if request.login {
                self.tell_replaced(old_link, old_session);
            }
            self.outbox.close(old_link, old_session);
        }
        match self.roster.take_parked(player) {
            Some(parked)
                if request.login || self.roster.within_resume_window(parked.since, self.now) =>
            {
                let spawn =
                    request.spawn.unwrap_or(client_pb::Position { x: parked.at.x, y: parked.at.y });
                let join = Join {
                    name: if request.login { request.name } else { parked.name },
                    spawn: Some(spawn),
                    restore: true,
                    generation: parked.generation,
                    gateway_id: 0,
                    epoch: 0,
                    state: parked.private,
                };
                let answer = if request.login {
                    self.metrics.logins_replaced.inc();
                    Answer::LoginOk
                } else {
                    self.metrics.resumes.inc();
                    Answer::ViewReset
                };
                self.restore_as(link, input.seq, input.session, player, join, answer);
                let _ = self.world.set_state(player, parked.state);
                // The budget it left with comes back with it: a reconnect buys no burst.
                if let Some(budget) = parked.move_budget {
                    let _ = self.world.set_move_budget(player, budget);
                }
            }
            _ => self.outbox.refuse_resume(link, input.session),
        }
    }

    /// Brings back a player whose shard died, at its last acknowledged position: the
    /// client gets ViewReset and then Entered for everything in sight; observers here get
    /// Entered (or Moved, if they still showed the dead shard's ghost of it).
    fn restore(&mut self, link: LinkId, seq: u64, session: u64, player: PlayerId, join: Join) {
        self.restore_as(link, seq, session, player, join, Answer::ViewReset)
    }

    /// Takes the restores that waited for this shard's view and now may go: the view has
    /// reached their epoch, or they waited long enough.
    pub(crate) fn restores_behind_view(&mut self) {
        let epoch = self.geometry.epoch;
        for BehindView { link, seq, session, player, mut join, answer, .. } in
            self.handoffs.due_behind_view(epoch, self.now)
        {
            join.epoch = join.epoch.min(epoch);
            self.restore_as(link, seq, session, player, join, answer);
        }
    }

    /// Whether a resume token takes `player` back from here: genuine, for that player, and
    /// the one token issued last to the player this shard holds (seated, or parked within
    /// the resume window). A shard that does not hold the player says nothing; one that
    /// does counts what it refuses.
    fn token_takes_back(&mut self, player: PlayerId, token: &[u8]) -> bool {
        match self.roster.check_token(player, token) {
            TokenCheck::TakesBack => true,
            TokenCheck::NotHeld => false,
            TokenCheck::Refused(reason) => {
                debug!(%player, reason, "resume token refused");
                self.metrics.resume_tokens_refused.inc(reason);
                false
            }
        }
    }

    /// Ends a connection whose account logged in again elsewhere (its close follows).
    fn tell_replaced(&mut self, link: LinkId, session: u64) {
        let detail = "your account logged in on another connection";
        self.outbox.push(link, session, &server::error(ErrorCode::Replaced, detail, 0));
    }

    /// As [`Self::restore`], answering the new session with `answer`.
    fn restore_as(
        &mut self,
        link: LinkId,
        seq: u64,
        session: u64,
        player: PlayerId,
        mut join: Join,
        answer: Answer,
    ) {
        if join.epoch > self.geometry.epoch {
            // The gateway chose this shard by a newer partition than this shard has seen:
            // what this shard would decide by its own map (pass the restore on along a
            // handoff, to a shard the newer map may have taken for dead) waits until its
            // watch catches up, at most BEHIND_VIEW_WAIT. The client's moves wait at the
            // gateway meanwhile (it refuses them until the ViewReset).
            let since = self.now;
            let waiting = BehindView { since, link, seq, session, player, join, answer };
            self.handoffs.wait_for_view(waiting);
            return;
        }
        let at = join.spawn.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default();
        let gateway = self.links.gateway_of(link).unwrap_or(0);
        if !self.roster.is_seated(player) {
            if let Some(handed) = self.handoffs.handed(player) {
                let same_registration = self.peers.incarnation_of(handed.to) == handed.incarnation;
                if join.generation <= handed.generation
                    && self.peer_ready(handed.to)
                    && same_registration
                {
                    // Handed off from here just as the gateway's stream broke, before the
                    // gateway read the release marker: the player is on the shard it went
                    // to (or further on). The gateway is told to follow it, and the restore
                    // goes there too, where the player is re-seated on its own session;
                    // restoring it here as well would make two of it. (If the shard it went
                    // to is dead or out of reach, the handoff is lost with it: the player is restored
                    // here.)
                    let (to, next) = (handed.to, handed.generation + 1);
                    debug!(%player, %to, "restore of a player handed off from here passed on");
                    self.outbox.release(link, session, to.0, handed.incarnation);
                    let gateway = self.links.gateway_of(link).unwrap_or(0);
                    let join =
                        Join { gateway_id: gateway, generation: join.generation.max(next), ..join };
                    let kind = Some(Input::Join(join));
                    let input = PlayerInput { session, player_id: player.0, seq, kind };
                    self.peer_out.push(to, peer(player, next, Peer::Forwarded(input)));
                    return;
                }
            }
        }
        // Restored here, it is no longer waiting to be resumed.
        self.roster.take_parked(player);
        if let Some(seat) = self.roster.seat_mut(player).filter(|seat| seat.session == session) {
            if seq < seat.inputs.next() {
                // A restore this seat has taken already (passed on, and resent by the
                // gateway after it followed the player): nothing to do twice.
                return;
            }
            // The same connection, re-joining over a new stream after its gateway's stream
            // broke before this shard noticed: the player stays where it is and its seat
            // moves to the new stream. Its view is sent whole (ViewReset), like any restore.
            seat.link = link;
            seat.gateway = gateway;
            seat.inputs = InputSequence::new(seq + 1, PENDING_LIMIT);
            let generation = seat.generation;
            let here = self.world.position(player).unwrap_or(at);
            debug!(%player, "restored on a new stream of its own session");
            // The client's view starts over at the ViewReset: what a handoff here said it
            // was told is void (resyncing from it would repeat what the ViewReset sends).
            self.roster.take_divergent(player);
            self.outbox.push(link, session, &server::view_reset(player.0, here.x, here.y));
            self.reconcile_view(player, link, session, &[]);
            self.outbox.track(link, session, here.x, here.y, generation);
            self.metrics.restores.inc();
            self.take_early_inputs(player, session);
            return;
        }
        let mut join_state = std::mem::take(&mut join.state);
        let name: Arc<str> = join.name.into();
        let generation = join.generation + 1;
        let now = self.since(self.started);
        self.ghosts.forget(player);
        let placed = if self.world.is_local(player) == Some(false) {
            self.world
                .upsert_ghost(player, Arc::clone(&name), at, &mut self.envelopes)
                .and_then(|()| self.world.promote_to_local(player))
        } else {
            // Observers get Entered; the player's own view is rebuilt below instead.
            let result = self.world.login(player, Arc::clone(&name), at, now, &mut self.envelopes);
            self.envelopes.retain(|e| e.to != player);
            result
        };
        if let Err(error) = placed {
            warn!(%player, %error, "cannot restore a player");
            let message = server::error(ErrorCode::Unavailable, error.to_string(), 0);
            return self.outbox.push(link, session, &message);
        }
        // A restore or a resume hands the client a fresh token (in its ViewReset or
        // LoginOk): the one it held is spent.
        let nonce = self.resume_nonce();
        let mut seat = Seat::new(link, session, gateway, generation, seq + 1);
        seat.private = std::mem::take(&mut join_state);
        seat.resume_nonce = nonce;
        seat.resume_previous = self.roster.take_resumed_with();
        self.roster.insert_seat(player, seat);
        self.inputs.back(player);
        self.roster.take_divergent(player);
        self.history.record(player, (generation, 0), at);
        self.route_envelopes();
        let first = match answer {
            Answer::ViewReset => {
                let token = self.roster.mint_token(player, nonce);
                server::view_reset_with_token(player.0, at.x, at.y, token)
            }
            Answer::LoginOk => self.login_ok(player, at, nonce),
        };
        self.outbox.push(link, session, &first);
        self.reconcile_view(player, link, session, &[]);
        self.outbox.track(link, session, at.x, at.y, generation);
        self.mirror(player);
        self.metrics.restores.inc();
        self.metrics.players.set(self.world.n_local() as i64);
        if let Some(private) = self.roster.seat(player).map(|s| s.private.clone()) {
            if !private.is_empty() {
                self.outbox.private_state(link, session, &private);
            }
        }
        self.run_game(|game, ctx| game.player_joined(ctx, meridian_game::EntityId(player.0)));
        // Inputs that waited here for the player: this session's are applied in turn,
        // an earlier session's (forwarded late by a shard it left) are dropped.
        self.take_early_inputs(player, session);
        if !self.geometry.owns(at) && join.epoch <= self.geometry.epoch {
            self.hand_off(player);
        }
    }

    fn reconcile_view(&mut self, player: PlayerId, link: LinkId, session: u64, told: &[ViewEntry]) {
        let told: BTreeMap<u64, Option<client_pb::Position>> =
            told.iter().map(|e| (e.player_id, e.position)).collect();
        let mut visible = Vec::new();
        self.world.visible_to(player, &mut visible);
        for id in &visible {
            let Some(at) = self.world.position(*id) else {
                continue;
            };
            match told.get(&id.0) {
                Some(seen) if *seen == wire(at) => {}
                Some(_) => self.outbox.push(link, session, &server::moved(id.0, at.x, at.y, 0)),
                None => {
                    let entered = self.entered_message(*id, at);
                    self.outbox.push(link, session, &entered);
                }
            }
        }
        for id in told.keys() {
            if !visible.contains(&PlayerId(*id)) {
                self.outbox.push(link, session, &server::left(*id));
            }
        }
    }
}
