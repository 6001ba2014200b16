//! `Move`, and what a Move and an Action share: relayed to the player's shard, which answers
//! each exactly once (its ack, `ActionDone` or an error carrying `client_time`), in order;
//! both count against the moves in flight, each with its own rate limit.

use std::time::Instant;

use meridian_protocol::pb::{ErrorCode, Move};
use meridian_rpc::pb::{player_input::Kind as Input, MoveRefused};

use super::super::{Conn, Ctx, Session};

/// Moves and actions a connection may have relayed and unanswered; past it they are
/// refused `RATE_LIMITED`.
const MAX_MOVES_IN_FLIGHT: usize = 1024;

impl Ctx {
    pub(super) fn move_to(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        m: Move,
        now: Instant,
    ) {
        let client_time = m.client_time;
        self.answered_input(conn, slot, session, client_time, Input::Move(m), now);
    }

    /// A Move or an Action: relayed to the player's shard, which answers it exactly once
    /// (its ack, `ActionDone` or an error carrying `client_time`), in order with the
    /// player's other answers. Both count against the moves in flight; each has its own rate
    /// limit, refused here when nothing is owed before it, else by the shard in turn.
    pub(super) fn answered_input(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        client_time: u64,
        input: Input,
        now: Instant,
    ) {
        if matches!(conn.session, Session::LoggingOut { .. }) {
            // After the Logout: refused, behind the answers to the inputs before it.
            conn.refused_after_logout.push(client_time);
            if conn.inflight.is_empty() {
                self.refuse_after_logout(conn, slot);
            }
            return;
        }
        if conn.goodbye_at.is_some() {
            // Sent before the client read the gateway's goodbye: not relayed.
            let detail = "gateway is shutting down: resume on another";
            return self.refuse(conn, slot, ErrorCode::ShuttingDown, detail, client_time);
        }
        if conn.inflight.len() >= MAX_MOVES_IN_FLIGHT {
            let detail = "too many moves and actions in flight";
            return self.refuse(conn, slot, ErrorCode::RateLimited, detail, client_time);
        }
        let Some((player, link)) = self.route(conn, slot, client_time) else { return };
        let limits = self.shared.admission.limits();
        let (allowed, what, detail) = match &input {
            Input::Action(_) => {
                (conn.actions.try_take(limits.actions, 1, now), "action", "action rate limit")
            }
            _ => (conn.moves.try_take(limits.moves, 1, now), "move", "move rate limit"),
        };
        if allowed {
            conn.inflight.push_back((client_time, conn.next_seq, now));
            return self.relay_in_game(conn, &link, session, player, input);
        }
        self.shared.metrics.rate_limited.inc(what);
        if conn.inflight.is_empty() {
            // Nothing earlier is unanswered: the answer can go now, in order.
            return self.refuse(conn, slot, ErrorCode::RateLimited, detail, client_time);
        }
        // Answers come in the order of the inputs: the shard answers this one after the
        // ones before it.
        conn.inflight.push_back((client_time, conn.next_seq, now));
        let code = ErrorCode::RateLimited as i32;
        let refused = MoveRefused { code, detail: detail.into(), client_time };
        self.relay_in_game(conn, &link, session, player, Input::Refused(refused));
    }
}
