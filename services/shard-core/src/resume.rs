//! Players coming back: a resume (a client's new connection with its token, or a login of
//! its account taking it over), a restore after its shard died (at its last acknowledged
//! cell), and restores that wait for this shard's view of the cluster.
//!
//! `ShardCore`'s own orchestration, an `impl ShardCore` block that reaches the parts
//! through their methods (`Roster` for seats, parked players and tokens, `Handoffs`,
//! `Inputs`, `Outbox`, ...). Called from `core.rs` (inputs routed to their player, new
//! views, housekeeping) and `players.rs` (a join that is a restore, an operator's move).

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_protocol::pb::{self as client_pb, ErrorCode};
use meridian_protocol::server;
use meridian_rpc::pb::{
    peer_message::Kind as Peer, player_input::Kind as Input, Join, PlayerInput, ViewEntry,
};
use meridian_world::{PlayerId, Position};
use tracing::{debug, warn};

use crate::core::ShardCore;
use crate::handoffs::{Answer, BehindView};
use crate::messages::{peer, wire};
use crate::roster::TokenCheck;
use crate::sequence::InputSequence;
use crate::types::{aged, LinkId, Seat, PENDING_LIMIT};

impl ShardCore {
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
            if request.login && seat.login.0 != 0 && seat.login.0 > request.login_stamp {
                // Two logins raced and this older one arrived after the newer was seated:
                // the later login wins here as it does across shards (`claims.rs`). Not
                // taken over: the gateway places the login, and wherever it lands it is
                // refused as older (this shard's claim, or its seat).
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
                    // A login takes the player over as a new login; a resume by token
                    // goes on as the login it was.
                    login_stamp: if request.login { request.login_stamp } else { parked.login.0 },
                    budgets: parked.budgets.as_ref().map(|kept| aged(kept, self.now)),
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
    pub(crate) fn restore(
        &mut self,
        link: LinkId,
        seq: u64,
        session: u64,
        player: PlayerId,
        join: Join,
    ) {
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
    pub(crate) fn tell_replaced(&mut self, link: LinkId, session: u64) {
        let detail = "your account logged in on another connection";
        self.outbox.push(link, session, &server::error(ErrorCode::Replaced, detail, 0));
    }

    /// As [`Self::restore`], answering the new session with `answer`.
    pub(crate) fn restore_as(
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
                    self.outbox.release(link, session, to.0, handed.incarnation, handed.generation);
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
            seat.inputs = InputSequence::new(seq + 1, PENDING_LIMIT);
            let generation = seat.generation;
            self.roster.relink(player, link, gateway);
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
        let now = self.elapsed();
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
        seat.login = (join.login_stamp, session);
        let budgets = join.budgets.take();
        seat.budgets = budgets.map(|budgets| (budgets, self.now));
        self.roster.insert_seat(player, seat);
        if matches!(answer, Answer::LoginOk) {
            // A login took the player over here: any older one elsewhere ends.
            self.claim(player);
        }
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
        if let Some(budgets) = budgets {
            // Beside the answer, so the gateway takes them with it.
            self.outbox.budgets(link, session, budgets);
        }
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
