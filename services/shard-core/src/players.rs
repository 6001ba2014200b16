//! Local players here: joining, their inputs applied in turn, moving (players and NPCs),
//! leaving (parked for a resume, or logged out), and operators' orders (kick, move).
//!
//! `ShardCore`'s own orchestration, an `impl ShardCore` block that reaches the parts
//! through their methods (`Roster`, `Inputs`, `Saves`, `Outbox`, ...). Called from
//! `core.rs` (inputs routed to their player, views of the cluster), `game.rs` (NPC steps
//! and despawns) and the other player files: `handover.rs` (mirroring, handoffs out and
//! in) and `resume.rs` (resume and restore).

use std::sync::Arc;

use meridian_cluster::OrderKind;
use meridian_protocol::pb::{self as client_pb, ErrorCode, ServerMessage};
use meridian_protocol::server;
use meridian_rpc::pb::{
    peer_message::Kind as Peer, player_input::Kind as Input, Claim, GhostRemove, Join, Leave,
    MoveRefused, PeerMessage, PlayerInput,
};
use meridian_world::{PlayerId, Position, WorldError};
use tracing::{info, warn};

use crate::core::ShardCore;
use crate::handoffs::Answer;
use crate::messages::{peer, wire};
use crate::types::{world_direction, LinkId, Parked, SaveRecord, Seat};

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
            None => self.random_spawn(),
        };
        // A returning account continues from the generation it was saved at, so its saves
        // are newer than the ones before.
        let generation = join.generation;
        let login = (join.login_stamp, session);
        let seated_newer = self
            .roster
            .seat(player)
            .is_some_and(|seat| seat.login.0 != 0 && seat.login.0 > login.0);
        if self.claims.beaten(player, login.0, self.now) || seated_newer {
            // A newer login of this account is seated already, here or on another shard.
            return self.refuse_older_login(link, session);
        }
        let Some(at) = spawn else {
            let error = server::error(ErrorCode::Unavailable, "shard holds no region yet", 0);
            self.outbox.push(link, session, &error);
            self.outbox.close(link, session);
            return;
        };
        if self.roster.is_seated(player) {
            // The same account logged in twice at once and both logins found it nowhere
            // (or raced a takeover): the later login (this one) wins, as a takeover would.
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
        let now = self.elapsed();
        // LoginOk goes first: the Entered messages the login causes for this player follow.
        match self.world.login(player, Arc::clone(&name), at, now, &mut self.envelopes) {
            Ok(()) => {
                self.outbox.push(link, session, &login_ok);
                self.outbox.track(link, session, at.x, at.y, generation);
                let mut seat = Seat::new(link, session, gateway, generation, input.seq + 1);
                seat.private = join_state;
                seat.resume_nonce = nonce;
                seat.login = login;
                self.roster.insert_seat(player, seat);
                self.claim(player);
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

    /// Carries out an operator's order seen for the first time (see
    /// `ShardCore::carry_out_orders`), if its player is here (seated, or parked after its
    /// connection dropped).
    pub(crate) fn carry_out_order(&mut self, player: PlayerId, order: &OrderKind) {
        match order {
            OrderKind::Kick { reason } => self.kick(player, reason),
            OrderKind::Move { x, y } => self.teleport(player, Position { x: *x, y: *y }),
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
                login_stamp: parked.login.0,
                // Still online: its gateway holds its budgets.
                budgets: None,
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

    /// The answer to a login placed here at `at`, with a fresh resume token.
    pub(crate) fn login_ok(&self, player: PlayerId, at: Position, nonce: u64) -> ServerMessage {
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
                if self.overload.shed_move() {
                    self.metrics.moves_shed.inc();
                    let detail = "the shard is overloaded: this move was not applied; try again";
                    let error = server::error(ErrorCode::RateLimited, detail, m.client_time);
                    return self.outbox.push_move_answer(link, session, &error);
                }
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
                if let (Some(budgets), Some(seat)) = (leave.budgets, self.roster.seat_mut(player)) {
                    seat.budgets = Some((budgets, self.now));
                }
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

    /// The Leave of a connection the player was taken from (a resume or login on a new one,
    /// while the old one was still open) carries what that connection spent: handed on to
    /// the player's connection now, so taking a player over buys no fresh budgets either.
    pub(crate) fn budgets_of_a_left_session(&mut self, player: PlayerId, input: PlayerInput) {
        let Some(Input::Leave(Leave { budgets: Some(budgets), .. })) = input.kind else {
            return;
        };
        if let Some(seat) = self.roster.seat(player).filter(|seat| !seat.npc) {
            let (link, session) = (seat.link, seat.session);
            self.outbox.budgets(link, session, budgets);
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
        let now = self.elapsed();
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

    /// Queues a save of a local player where it stands now (with a player store).
    pub(crate) fn save(&mut self, player: PlayerId) {
        if let (Some(seat), Some(at)) = (self.roster.seat(player), self.world.position(player)) {
            self.saves.save(player, seat, at);
        }
    }

    /// Every save interval: saves the local players whose cell changed since their last
    /// save (or who were never saved).
    pub(crate) fn save_changed(&mut self) {
        for player in self.saves.changed(self.roster.seats(), &self.world, self.now) {
            self.save(player);
        }
        self.save_changed_entities();
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
                    login: seat.login,
                    budgets: seat.budgets,
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
}

impl ShardCore {
    // ---- one account, one player (see `claims.rs`)

    /// Tells every other shard of the login seated here for `player`.
    pub(crate) fn claim(&mut self, player: PlayerId) {
        let Some(seat) = self.roster.seat(player) else { return };
        let (login_stamp, session) = seat.login;
        let generation = seat.generation;
        for to in self.peers.others() {
            let message = PeerMessage {
                player_id: player.0,
                generation,
                subject_seq: 0,
                kind: Some(Peer::Claim(Claim { login_stamp, session })),
            };
            self.peer_out.push(to, message);
        }
    }

    /// Another shard seated a login of `player`: an older one here ends.
    pub(crate) fn on_claim(&mut self, player: PlayerId, claim: Claim) {
        let login = claim.login_stamp;
        self.claims.record(player, login, self.now);
        // (A seat of unknown stamp is a session going on, not a racing login: see `beaten`.)
        let older_here = self
            .roster
            .seat(player)
            .is_some_and(|seat| !seat.npc && seat.login.0 != 0 && seat.login.0 < login);
        if older_here {
            self.replace_older(player);
        }
    }

    /// Refuses a login that arrives after a newer login of its account was seated (here, or
    /// claimed by another shard): `REPLACED`, closed.
    pub(crate) fn refuse_older_login(&mut self, link: LinkId, session: u64) {
        self.tell_replaced(link, session);
        self.outbox.close(link, session);
        self.metrics.logins_replaced.inc();
    }

    /// Ends the older of two logins of `player`, seated here: `REPLACED`, closed, gone.
    pub(crate) fn replace_older(&mut self, player: PlayerId) {
        let Some(seat) = self.roster.seat(player) else { return };
        let (link, session) = (seat.link, seat.session);
        info!(%player, "a newer login of this account is seated on another shard; ending this one");
        self.remove(player, false);
        self.tell_replaced(link, session);
        self.outbox.close(link, session);
        self.metrics.logins_replaced.inc();
        self.route_envelopes();
    }
}
