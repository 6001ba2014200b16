//! The game in the shard: the core is the game's [`Host`], and this module is everything
//! the core does for games. NPCs, their ids, public and private state, actions (here or at
//! the target's owner), game messages between entities and game events.
//!
//! An NPC is an entity like a player: it has a seat (with no connection), is mirrored to
//! the neighbours that can see it (ghosts, with its kind and public state), and is handed
//! off with its state when the game steps it across a border. The game runs one instance
//! per shard and is called with the game taken out of the core, so a hook cannot re-enter
//! it: what a hook causes for another hook (a message to an entity owned here, an arrival)
//! waits in `game_mail` and is handled after the hook returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_game::{
    Action, Context, Entity, EntityId, Game, GameError, Host, KvAnswer, KvTicket, Reply,
};
use meridian_protocol::pb::{Action as ClientAction, ErrorCode, ServerMessage};
use meridian_protocol::{server, validate_name, MAX_GAME_BYTES};
use meridian_rpc::pb::{
    peer_message::Kind as Peer, ActionAnswer, ActionRequest, EntityEvent, EntityMessage,
    PlayerInput, StateChange,
};
use meridian_world::{Direction, Look, PlayerId, Position, WorldError};
use rand::RngCore;
use tracing::{debug, warn};

use crate::core::ShardCore;
use crate::game_slot::GameMail;
use crate::kv::{KvOp, KvReply};
use crate::messages::peer_at;
use crate::persistent_slot::AnswerTo;
use crate::types::{Awaiting, LinkId, Seat, Transmit, PENDING_LIMIT};

/// How long an action sent to its target's owner waits for the answer before it is
/// answered `UNAVAILABLE` (the owner died or is cut off).
pub(crate) const ACTION_ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// Game mail handled per round at most: a game whose messages keep making messages
/// (entities answering each other without end) must not stall the shard.
const MAIL_PER_ROUND: usize = 65_536;
fn id(entity: EntityId) -> PlayerId {
    PlayerId(entity.0)
}

fn entity_id(player: PlayerId) -> EntityId {
    EntityId(player.0)
}

fn checked_state(state: &[u8]) -> Result<(), GameError> {
    if state.len() > MAX_GAME_BYTES {
        return Err(GameError::TooLarge(state.len()));
    }
    Ok(())
}

impl ShardCore {
    /// Runs one hook with the game taken out of the core, then what it left in the mail.
    /// A hook called while another runs (it cannot happen by the core's own paths) is
    /// skipped with a warning.
    pub(crate) fn run_game<R>(
        &mut self,
        hook: impl FnOnce(&mut dyn Game, &mut Context<'_>) -> R,
    ) -> Option<R> {
        let Some(mut game) = self.game.take_game() else {
            warn!("a game hook was called from inside another; skipped");
            return None;
        };
        let result = {
            let mut ctx = Context::new(self);
            // A game's bug must not take the shard (and every player on it) down: a hook
            // that panics did what it did up to the panic, and is counted.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&mut *game, &mut ctx)))
        };
        self.game.put_game(game);
        let Ok(result) = result else {
            self.metrics.game_panics.inc();
            tracing::error!("a game hook panicked; the shard goes on");
            return None;
        };
        self.game_mail();
        Some(result)
    }

    /// Hands the game what its hooks left for other hooks, in order.
    pub(crate) fn run_game_mail(&mut self) {
        self.game_mail();
    }

    fn game_mail(&mut self) {
        let mut handled = 0;
        while handled < MAIL_PER_ROUND {
            let Some(mail) = self.game.next_mail() else { return };
            handled += 1;
            let Some(mut game) = self.game.take_game() else {
                self.game.mail_first(mail);
                return;
            };
            let handled = {
                let mut ctx = Context::new(self);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match mail {
                    GameMail::Message { to, from, kind, payload } => {
                        game.message(&mut ctx, entity_id(to), entity_id(from), kind, &payload)
                    }
                    GameMail::Arrived(entity) => game.arrived(&mut ctx, entity_id(entity)),
                }))
            };
            self.game.put_game(game);
            if handled.is_err() {
                self.metrics.game_panics.inc();
                tracing::error!("a game hook panicked; the shard goes on");
            }
        }
        if self.game.mail_waiting() > 0 {
            warn!(
                waiting = self.game.mail_waiting(),
                "game mail keeps making mail; the rest waits for the next round"
            );
        }
    }

    /// The game's tick: its hook, then every public state that changed since the last one
    /// is told (once per entity per tick). How long it took is the shell's to measure (the
    /// core reads no clock): it reads `game_ticks` before and after an event to know whether
    /// a tick ran in it.
    pub(crate) fn game_tick(&mut self) {
        self.run_game(|game, ctx| game.tick(ctx));
        self.game_mail();
        self.announce_states();
        self.metrics.game_ticks.inc();
        self.metrics.npcs.set(self.world.n_npcs() as i64);
        self.want_ids();
    }

    /// Asks the shell for entity ids when few are left (once until they come).
    pub(crate) fn want_ids(&mut self) {
        self.game.want_ids();
    }

    pub(crate) fn ids_arrived(&mut self, ids: std::ops::Range<u64>) {
        self.game.ids_arrived(ids);
    }

    pub(crate) fn flush_game(&mut self, out: &mut Vec<Transmit>) {
        if self.game.take_ids_wanted() {
            out.push(Transmit::WantIds);
        }
        if let Some(requests) = self.game.kv.take() {
            out.push(Transmit::Kv(requests));
        }
        self.flush_entities(out);
        self.metrics.kv_in_flight.set(self.game.kv.in_flight() as i64);
    }

    /// A key-value request of the game, queued for the shell (or refused, counted).
    fn kv_ask(&mut self, key: &[u8], op: KvOp) -> Result<KvTicket, GameError> {
        let asked = self.game.kv.ask(key, op);
        match &asked {
            Err(GameError::KvBusy(_)) => self.metrics.kv_requests.inc("busy"),
            Err(GameError::KvTooBig(_)) => self.metrics.kv_requests.inc("too_big"),
            Err(_) => self.metrics.kv_requests.inc("no_store"),
            Ok(_) => {}
        }
        asked
    }

    /// The store's answers to the game's key-value requests: each to its hook, in order.
    pub(crate) fn kv_answers(&mut self, replies: Vec<KvReply>) {
        for reply in replies {
            self.game.kv.answered();
            let outcome = match &reply.answer {
                KvAnswer::Found(_) => "found",
                KvAnswer::Written { .. } => "written",
                KvAnswer::Conflict(_) => "conflict",
                KvAnswer::Failed(_) => "failed",
            };
            self.metrics.kv_requests.inc(outcome);
            let KvReply { ticket, key, answer } = reply;
            self.run_game(|game, ctx| game.kv_answer(ctx, ticket, &key, answer));
        }
    }

    /// Tells everyone who sees them the new public state of the entities whose state
    /// changed: observers here, and every shard mirroring them.
    fn announce_states(&mut self) {
        let mut dirty = self.game.take_changed();
        if dirty.is_empty() {
            return self.game.reuse_changed(dirty);
        }
        for entity in dirty.drain(..) {
            let Some(seat) = self.roster.seat(entity) else { continue };
            let version = (seat.generation, seat.subject_seq);
            let holders = seat.ghosted_at.clone();
            if self.world.announce_state(entity, &mut self.envelopes).is_err() {
                continue;
            }
            let Some(state) = self.world.state(entity).map(|s| s.to_vec()) else { continue };
            for holder in holders {
                let change = Peer::State(StateChange { state: state.clone() });
                self.peer_out.push(holder, peer_at(entity, version, change));
            }
            self.metrics.state_changes.inc();
        }
        self.route_envelopes();
        self.game.reuse_changed(dirty);
    }

    /// The `Entered` a client gets for `subject` at `at`: with its kind and public state
    /// (for a player with no state, the same bytes as a plain `Entered`).
    pub(crate) fn entered_message(&self, subject: PlayerId, at: Position) -> ServerMessage {
        match self.world.look(subject) {
            Some(look) => {
                server::entered_as(subject.0, at.x, at.y, &*look.name, look.kind, &look.state)
            }
            None => server::entered(subject.0, at.x, at.y, ""),
        }
    }

    /// A player's action, applied in its turn. On an entity another shard owns, it is sent
    /// there and the player's later inputs wait for the answer.
    pub(crate) fn action(&mut self, player: PlayerId, action: ClientAction) {
        let Some(seat) = self.roster.seat(player) else { return };
        let (link, session) = (seat.link, seat.session);
        self.metrics.actions.inc();
        let target = (action.target != 0).then_some(PlayerId(action.target));
        match target.map(|t| self.world.is_local(t)) {
            Some(None) => {
                let detail = "the target is not in sight";
                self.answer_action(link, session, action.client_time, Reply::rejected(detail));
            }
            Some(Some(false)) => {
                let target = target.expect("checked");
                let Some(owner) = self.ghosts.source(target) else {
                    let detail = "the target's owner is not known";
                    let reply = Reply::rejected(detail);
                    return self.answer_action(link, session, action.client_time, reply);
                };
                let client_time = action.client_time;
                let request =
                    ActionRequest { actor: player.0, action: Some(action), origin: self.id.0 };
                self.peer_out.push(owner, peer_at(target, (0, 0), Peer::Action(request)));
                self.metrics.actions_forwarded.inc();
                if let Some(seat) = self.roster.seat_mut(player) {
                    seat.awaiting = Some(Awaiting { since: self.now, client_time });
                }
            }
            _ => {
                let mark = self.writes_so_far();
                let reply = match self.run_action(player, &action) {
                    Reply::Done(payload) => {
                        let to = AnswerTo::Here { player };
                        match self.done_when_saved(mark, to, action.client_time, payload) {
                            Ok(()) => return,
                            Err(payload) => Reply::Done(payload),
                        }
                    }
                    rejected => rejected,
                };
                self.answer_action(link, session, action.client_time, reply);
            }
        }
    }

    /// The game's answer to an action on this shard.
    fn run_action(&mut self, actor: PlayerId, action: &ClientAction) -> Reply {
        let game_action = Action {
            kind: action.kind,
            payload: &action.payload,
            target: (action.target != 0).then_some(EntityId(action.target)),
        };
        self.run_game(|game, ctx| game.action(ctx, entity_id(actor), game_action))
            .unwrap_or_else(|| Reply::rejected("the game failed to answer"))
    }

    fn answer_action(&mut self, link: LinkId, session: u64, client_time: u64, reply: Reply) {
        let message = match reply {
            Reply::Done(payload) => server::action_done(client_time, &payload),
            Reply::Rejected(detail) => {
                self.metrics.actions_rejected.inc();
                server::error(ErrorCode::Rejected, detail, client_time)
            }
        };
        self.outbox.push_move_answer(link, session, &message);
    }

    /// A player's action on an entity owned here, from the player's shard: carried out and
    /// answered there; passed on if the entity was handed off.
    pub(crate) fn action_request(
        &mut self,
        from: ShardId,
        target: PlayerId,
        request: ActionRequest,
    ) {
        let Some(action) = request.action else { return };
        let origin = if request.origin == 0 { from } else { ShardId(request.origin) };
        let actor = PlayerId(request.actor);
        if self.world.is_local(target) != Some(true) {
            if let Some(handed) = self.handoffs.handed(target) {
                let request =
                    ActionRequest { actor: actor.0, action: Some(action), origin: origin.0 };
                self.peer_out.push(handed.to, peer_at(target, (0, 0), Peer::Action(request)));
                return;
            }
            let answer = ActionAnswer {
                client_time: action.client_time,
                done: false,
                payload: Vec::new(),
                rejected: "the target is gone".into(),
            };
            self.peer_out.push(origin, peer_at(actor, (0, 0), Peer::Answer(answer)));
            return;
        }
        let mark = self.writes_so_far();
        let reply = match self.run_action(actor, &action) {
            Reply::Done(payload) => {
                let to = AnswerTo::Origin { shard: origin, actor };
                match self.done_when_saved(mark, to, action.client_time, payload) {
                    Ok(()) => return,
                    Err(payload) => Reply::Done(payload),
                }
            }
            rejected => rejected,
        };
        let answer = match reply {
            Reply::Done(payload) => ActionAnswer {
                client_time: action.client_time,
                done: true,
                payload,
                rejected: String::new(),
            },
            Reply::Rejected(why) => ActionAnswer {
                client_time: action.client_time,
                done: false,
                payload: Vec::new(),
                rejected: why,
            },
        };
        self.peer_out.push(origin, peer_at(actor, (0, 0), Peer::Answer(answer)));
    }

    /// The answer to an action this shard sent to its target's owner: to the player, then
    /// the inputs that waited behind it.
    pub(crate) fn action_answer(&mut self, player: PlayerId, answer: ActionAnswer) {
        let Some(seat) = self.roster.seat_mut(player) else { return };
        if seat.awaiting.map(|a| a.client_time) != Some(answer.client_time) {
            debug!(%player, client_time = answer.client_time, "late action answer dropped");
            return;
        }
        seat.awaiting = None;
        let (link, session) = (seat.link, seat.session);
        let reply = if answer.done {
            Reply::Done(answer.payload)
        } else {
            Reply::Rejected(answer.rejected)
        };
        self.answer_action(link, session, answer.client_time, reply);
        self.unblock(player);
    }

    /// Holds an input of a player that waits for an action's answer. Past the limit it is
    /// refused at once.
    pub(crate) fn block(&mut self, player: PlayerId, input: PlayerInput) {
        let Some(seat) = self.roster.seat_mut(player) else { return };
        if seat.blocked.len() < PENDING_LIMIT {
            seat.blocked.push_back(input);
            return;
        }
        let (link, session) = (seat.link, seat.session);
        self.answer_refused(link, session, input, "too many inputs waiting for an action");
    }

    /// Applies the inputs that waited for an action's answer, in order, until one of them
    /// waits again (another action on a neighbour's entity): the rest wait behind it.
    fn unblock(&mut self, player: PlayerId) {
        let Some(seat) = self.roster.seat_mut(player) else { return };
        let mut waiting = std::mem::take(&mut seat.blocked);
        while let Some(input) = waiting.pop_front() {
            self.apply(player, input);
            let Some(seat) = self.roster.seat_mut(player) else { return };
            if seat.awaiting.is_some() {
                waiting.extend(seat.blocked.drain(..));
                seat.blocked = waiting;
                return;
            }
        }
    }

    /// Actions whose target's owner did not answer in time are answered `UNAVAILABLE`.
    pub(crate) fn expire_actions(&mut self, now: Instant) {
        let overdue: Vec<PlayerId> = self.roster.seated_where(|seat| {
            seat.awaiting
                .is_some_and(|a| now.saturating_duration_since(a.since) > ACTION_ANSWER_WITHIN)
        });
        for player in overdue {
            let Some(seat) = self.roster.seat_mut(player) else { continue };
            let Some(awaiting) = seat.awaiting.take() else { continue };
            let (link, session) = (seat.link, seat.session);
            warn!(%player, "the target's shard did not answer an action in time");
            let error = server::error(
                ErrorCode::Unavailable,
                "the target's shard did not answer",
                awaiting.client_time,
            );
            self.outbox.push_move_answer(link, session, &error);
            self.unblock(player);
        }
    }

    /// A game message for an entity: to the game if the entity is owned here, on to its
    /// owner if it is a ghost here (or was handed off from here), dropped otherwise.
    fn route_message(&mut self, to: PlayerId, message: EntityMessage) {
        match self.world.is_local(to) {
            Some(true) => self.game.mail(GameMail::Message {
                to,
                from: PlayerId(message.from),
                kind: message.kind,
                payload: message.payload,
            }),
            Some(false) => match self.ghosts.source(to) {
                Some(owner) => {
                    self.peer_out.push(owner, peer_at(to, (0, 0), Peer::EntityMessage(message)))
                }
                None => {
                    debug!(entity = %to, "game message for a ghost with no known owner dropped")
                }
            },
            None => match self.handoffs.handed(to) {
                Some(handed) => {
                    let to_shard = handed.to;
                    self.peer_out.push(to_shard, peer_at(to, (0, 0), Peer::EntityMessage(message)))
                }
                None => debug!(entity = %to, "game message for an entity not here dropped"),
            },
        }
    }

    /// A game message from a peer.
    pub(crate) fn entity_message(&mut self, to: PlayerId, message: EntityMessage) {
        self.route_message(to, message);
        self.game_mail();
    }

    /// A game event for one player (`event.to`), from a peer or from here: delivered if the
    /// player is owned here, sent on to its owner if it is a ghost here.
    pub(crate) fn event_for_player(&mut self, source: PlayerId, event: EntityEvent) {
        let to = PlayerId(event.to);
        if let Some(seat) = self.roster.seat(to).filter(|seat| !seat.npc) {
            let (link, session) = (seat.link, seat.session);
            let message = server::game_event(source.0, event.kind, &event.payload);
            self.outbox.push(link, session, &message);
            return;
        }
        let owner = match self.world.is_local(to) {
            Some(false) => self.ghosts.source(to),
            _ => self.handoffs.handed(to).map(|h| h.to),
        };
        match owner {
            Some(owner) if owner != self.id => {
                self.peer_out.push(owner, peer_at(source, (0, 0), Peer::Event(event)))
            }
            _ => debug!(player = %to, "game event for a player not here dropped"),
        }
    }

    /// An NPC handed in (or restored): seated with its state, mirrored, and the game told.
    /// A persistent one (`persistent`) is saved at once under its new generation.
    pub(crate) fn npc_in(
        &mut self,
        npc: PlayerId,
        look: Look,
        at: Position,
        (generation, subject_seq): (u64, u64),
        private: Vec<u8>,
        persistent: bool,
    ) -> Result<(), WorldError> {
        self.ghosts.forget(npc);
        let ready = if self.world.is_local(npc) == Some(false) {
            self.world
                .upsert_ghost_as(npc, look, at, &mut self.envelopes)
                .and_then(|()| self.world.promote_to_npc(npc))
        } else {
            let now = self.elapsed();
            self.world.spawn_npc(npc, look, at, now, &mut self.envelopes)
        };
        ready?;
        let seat = Seat { persistent, ..Seat::npc(generation, subject_seq, private) };
        self.roster.insert_seat(npc, seat);
        self.history.record(npc, (generation, subject_seq), at);
        self.route_envelopes();
        self.mirror(npc);
        self.save_entity(npc);
        self.game.mail(GameMail::Arrived(npc));
        Ok(())
    }

    /// After the partition changed: NPCs whose owner died, mirrored here, come back to life
    /// from this copy on the shard that owns their cell now (this one: promoted; another:
    /// sent there as a handoff, which that shard takes once whichever holder's copy comes
    /// first). Their private state died with their owner; their public state is the last the
    /// owner sent.
    pub(crate) fn restore_orphaned_npcs(&mut self) {
        self.game.set_orphans_waiting(false);
        let orphans: Vec<(PlayerId, Position)> = self
            .world
            .ghosts()
            .filter(|(id, _)| self.world.game_kind(*id).is_some_and(|kind| kind != 0))
            .filter(|(id, _)| self.ghosts.is_orphaned(*id))
            // A persistent NPC comes back from the store, private state and all.
            .filter(|(id, _)| !self.persistent.is_persistent_ghost(*id))
            .collect();
        for (npc, at) in orphans {
            let Some(owner) = self.geometry.owner_of(at) else { continue };
            let Some(look) = self.world.look(npc) else { continue };
            let generation = self.ghosts.generation(npc).unwrap_or(0) + 1;
            let subject_seq = self.history.version(npc).map(|v| v.1).unwrap_or(0);
            if owner == self.id {
                debug!(%npc, ?at, "NPC whose owner died restored here from its ghost");
                let version = (generation, subject_seq);
                if let Err(error) = self.npc_in(npc, look, at, version, Vec::new(), false) {
                    warn!(%npc, %error, "cannot restore an NPC");
                } else {
                    self.metrics.npcs_restored.inc();
                }
            } else if !self.peer_ready(owner) {
                self.game.set_orphans_waiting(true);
            } else {
                let handoff = meridian_rpc::pb::Handoff {
                    name: look.name.to_string(),
                    position: Some(meridian_protocol::pb::Position { x: at.x, y: at.y }),
                    subject_seq,
                    kind: look.kind,
                    state: look.state.to_vec(),
                    ..Default::default()
                };
                self.peer_out.push(owner, peer_at(npc, (generation, 0), Peer::Handoff(handoff)));
            }
        }
        self.game_mail();
    }
}

impl Host for ShardCore {
    fn now(&self) -> Duration {
        self.elapsed()
    }

    fn shard(&self) -> u32 {
        self.id.0
    }

    fn map(&self) -> (u32, u32, u32) {
        let config = self.world.config();
        (config.width, config.height, config.view_range)
    }

    fn entity(&self, entity: EntityId) -> Option<Entity> {
        let player = id(entity);
        let position = self.world.position(player)?;
        let look = self.world.look(player)?;
        Some(Entity {
            id: entity,
            position,
            name: look.name,
            kind: look.kind,
            state: look.state,
            owned: self.world.is_local(player) == Some(true),
            persistent: self.roster.seat(player).is_some_and(|seat| seat.persistent)
                || self.persistent.is_persistent_ghost(player),
        })
    }

    fn within(&self, at: Position, range: u32, out: &mut Vec<EntityId>) {
        let mut found = Vec::new();
        self.world.within(at, range, &mut found);
        out.extend(found.into_iter().map(entity_id));
    }

    fn npcs(&self, out: &mut Vec<EntityId>) {
        out.extend(self.world.npcs().map(|(npc, ..)| entity_id(npc)));
    }

    fn players(&self, out: &mut Vec<EntityId>) {
        out.extend(self.world.local_players().map(|(player, _)| entity_id(player)));
    }

    fn owns(&self, at: Position) -> bool {
        self.geometry.owns(at)
    }

    fn random_cell(&mut self) -> Option<Position> {
        self.geometry.random_cell(self.game.rng())
    }

    fn random(&mut self) -> u64 {
        self.game.rng().next_u64()
    }

    fn spawn(
        &mut self,
        kind: u32,
        name: &str,
        at: Position,
        state: Vec<u8>,
    ) -> Result<EntityId, GameError> {
        if kind == 0 {
            return Err(GameError::NoKind);
        }
        // An NPC's name follows the players' rules, and is shown normalised as theirs are.
        let name = validate_name(name).map_err(|_| GameError::BadName)?;
        checked_state(&state)?;
        if !self.geometry.owns(at) {
            return Err(GameError::NotHere(at));
        }
        if self.world.n_npcs() >= self.game.max_npcs() {
            return Err(GameError::TooMany(self.game.max_npcs()));
        }
        let Some(raw) = self.game.take_id() else {
            self.want_ids();
            return Err(GameError::NoIds);
        };
        self.want_ids();
        let npc = PlayerId(raw);
        let look = Look { name: Arc::from(name), kind, state: Arc::from(state) };
        let now = self.elapsed();
        self.world
            .spawn_npc(npc, look, at, now, &mut self.envelopes)
            .map_err(|_| GameError::NotHere(at))?;
        self.roster.insert_seat(npc, Seat::npc(0, 0, Vec::new()));
        self.history.record(npc, (0, 0), at);
        self.route_envelopes();
        self.mirror(npc);
        self.metrics.npcs_spawned.inc();
        Ok(EntityId(raw))
    }

    fn despawn(&mut self, entity: EntityId) -> Result<(), GameError> {
        let npc = id(entity);
        match self.roster.seat(npc) {
            Some(seat) if seat.npc => {}
            Some(_) => return Err(GameError::IsPlayer(entity)),
            None => return Err(GameError::NotOwned(entity)),
        }
        self.entity_removed(npc);
        self.remove(npc, false);
        self.metrics.npcs_despawned.inc();
        Ok(())
    }

    fn step(&mut self, entity: EntityId, direction: Direction) -> Result<Position, GameError> {
        let npc = id(entity);
        match self.roster.seat(npc) {
            Some(seat) if seat.npc => {}
            Some(_) => return Err(GameError::IsPlayer(entity)),
            None => return Err(GameError::NotOwned(entity)),
        }
        self.step_entity(npc, direction, 0).map_err(|error| match error {
            WorldError::RateLimited => GameError::RateLimited,
            _ => GameError::NotOwned(entity),
        })
    }

    fn set_state(&mut self, entity: EntityId, state: Vec<u8>) -> Result<(), GameError> {
        checked_state(&state)?;
        let subject = id(entity);
        if !self.roster.is_seated(subject) {
            return Err(GameError::NotOwned(entity));
        }
        if self.world.state(subject).is_some_and(|old| **old == *state) {
            return Ok(());
        }
        self.world.set_state(subject, Arc::from(state)).map_err(|_| GameError::NotOwned(entity))?;
        self.game.state_changed(subject);
        Ok(())
    }

    fn private_state(&self, entity: EntityId) -> Option<&[u8]> {
        self.roster.seat(id(entity)).map(|seat| seat.private.as_slice())
    }

    fn set_private_state(&mut self, entity: EntityId, state: Vec<u8>) -> Result<(), GameError> {
        checked_state(&state)?;
        let Some(seat) = self.roster.seat_mut(id(entity)) else {
            return Err(GameError::NotOwned(entity));
        };
        if seat.private == state {
            return Ok(());
        }
        seat.private = state;
        if !seat.npc {
            // The gateway keeps the last one, to restore the player with it.
            let (link, session) = (seat.link, seat.session);
            self.outbox.private_state(link, session, &seat.private);
        }
        Ok(())
    }

    fn event_to(&mut self, player: EntityId, source: Option<EntityId>, kind: u32, payload: &[u8]) {
        let source = PlayerId(source.map_or(0, |s| s.0));
        let event = EntityEvent { to: player.0, kind, payload: payload.to_vec() };
        self.event_for_player(source, event);
        self.metrics.game_events.inc();
    }

    fn event_around(&mut self, source: EntityId, kind: u32, payload: &[u8]) {
        let subject = id(source);
        let payload: Arc<[u8]> = Arc::from(payload);
        if self.world.event(subject, kind, Arc::clone(&payload), &mut self.envelopes).is_err() {
            return;
        }
        self.route_envelopes();
        self.metrics.game_events.inc();
        let Some(seat) = self.roster.seat(subject) else { return };
        let version = (seat.generation, seat.subject_seq);
        for holder in seat.ghosted_at.clone() {
            let event = EntityEvent { to: 0, kind, payload: payload.to_vec() };
            self.peer_out.push(holder, peer_at(subject, version, Peer::Event(event)));
        }
    }

    fn send(&mut self, to: EntityId, from: EntityId, kind: u32, payload: &[u8]) {
        let message = EntityMessage { from: from.0, kind, payload: payload.to_vec() };
        self.route_message(id(to), message);
    }

    fn persist(&mut self, entity: EntityId) -> Result<(), GameError> {
        ShardCore::persist(self, entity)
    }

    fn has_store(&self) -> bool {
        self.persistent.enabled()
    }

    fn kv_get(&mut self, key: &[u8]) -> Result<KvTicket, GameError> {
        self.kv_ask(key, KvOp::Get)
    }

    fn kv_set(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        expected: Option<u64>,
    ) -> Result<KvTicket, GameError> {
        self.kv_ask(key, KvOp::Set { value: value.map(<[u8]>::to_vec), expected })
    }
}

#[cfg(test)]
#[path = "game_tests.rs"]
mod tests;
