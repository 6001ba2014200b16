//! What a client is sent and how it is closed: replies and errors framed for its front
//! (length-delimited or WebSocket), the per-client and gateway-wide output bounds, and the
//! start of a close (a player still in the world leaves it). Called by every other room.

use std::sync::Arc;

use meridian_protocol::pb::{ErrorCode, ServerMessage};
use meridian_protocol::{encode_frame, server};
use meridian_rpc::pb::{player_input::Kind as Input, Leave};
use tracing::{debug, warn};

use super::{Closing, Conn, Core, Ctx, Session};
use crate::shared::session_id;
use crate::websocket;

impl Core {
    /// Output queued (and held) for every client of this worker. Past the gateway-wide
    /// budget (the sum over workers), this worker cuts its clients with the most queued
    /// first, down to its share, and the gateway takes no new connection until the total
    /// is back under three quarters of the budget.
    pub(super) fn bound_total_output(&mut self) {
        let shared = Arc::clone(&self.ctx.shared);
        let mut sizes: Vec<(usize, u32)> = Vec::new();
        let mut mine = 0usize;
        for (slot, conn) in self.endpoints.conns() {
            let queued = conn.queued();
            mine += queued;
            if queued > 0 && conn.closing != Closing::Abort {
                sizes.push((queued, slot));
            }
        }
        let total = shared.report_output(self.ctx.worker, mine);
        shared.metrics.output_bytes.set(total as i64);
        let budget = shared.admission.limits().max_output_total;
        if total <= budget {
            if shared.admission.overloaded() && total <= budget / 4 * 3 {
                tracing::info!(total, budget, "output back under budget; accepting again");
                shared.admission.set_overloaded(false);
            }
            return;
        }
        if !shared.admission.overloaded() {
            warn!(
                total,
                budget,
                "gateway output over budget: cutting the largest queues, refusing new connections"
            );
            shared.admission.set_overloaded(true);
        }
        // This worker's share of the excess, largest queues first.
        let target = (mine as u128 * budget as u128 / total as u128) as usize;
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for (queued, slot) in sizes {
            if mine <= target {
                break;
            }
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            let session = session_id(self.ctx.worker, slot, conn.generation_slot);
            shared.metrics.overload_cuts.inc();
            conn.out.clear();
            conn.held.clear();
            conn.held_bytes = 0;
            self.ctx.close(conn, slot, session, Closing::Abort);
            mine -= queued;
        }
        shared.report_output(self.ctx.worker, mine);
    }
}

impl Ctx {
    /// Answers what a logging-out client is still owed: moves in flight (their shard will
    /// not answer: its link failed, or the connection is closing), then moves sent after
    /// the Logout.
    pub(super) fn refuse_after_logout(&mut self, conn: &mut Conn, slot: u32) {
        for (client_time, ..) in std::mem::take(&mut conn.inflight) {
            self.refuse(conn, slot, ErrorCode::Unavailable, "shard unavailable", client_time);
        }
        for client_time in std::mem::take(&mut conn.refused_after_logout) {
            self.refuse(conn, slot, ErrorCode::Unavailable, "logged out", client_time);
        }
    }

    /// If the gateway is stopping and `conn` is owed nothing more (no move or action in
    /// flight), tells it `SHUTTING_DOWN`; it closes [`crate::GOODBYE_GRACE`] later (see
    /// `timers.rs`), what it sends meanwhile answered so.
    pub(super) fn goodbye_once_answered(&mut self, conn: &mut Conn, slot: u32) {
        if self.shutting_down.is_none()
            || conn.goodbye_at.is_some()
            || conn.closing != Closing::No
            || !conn.inflight.is_empty()
        {
            return;
        }
        let goodbye = server::error(ErrorCode::ShuttingDown, "gateway is shutting down", 0);
        self.reply(conn, slot, &goodbye);
        self.mark_dirty(conn, slot);
        conn.goodbye_at = Some(self.now);
        let close_at = self.now + crate::GOODBYE_GRACE;
        self.wake_at = Some(self.wake_at.map_or(close_at, |at| at.min(close_at)));
    }

    /// The gateway has stopped waiting for the shards' answers ([`crate::SHUTDOWN_WAIT`]):
    /// what `conn` still has in flight is refused, then it is told `SHUTTING_DOWN`.
    pub(super) fn goodbye_now(&mut self, conn: &mut Conn, slot: u32) {
        conn.shards_silenced |= !conn.inflight.is_empty();
        for (client_time, ..) in std::mem::take(&mut conn.inflight) {
            let detail = "gateway shutting down before the shard answered";
            self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
        }
        self.goodbye_once_answered(conn, slot);
    }

    pub(super) fn refuse(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        code: ErrorCode,
        detail: &str,
        client_time: u64,
    ) {
        self.shared.metrics.error(code);
        self.reply(conn, slot, &server::error(code, detail, client_time));
    }

    pub(super) fn reply(&mut self, conn: &mut Conn, slot: u32, message: &ServerMessage) {
        if conn.closing == Closing::Abort {
            return; // Cut off: nothing more is written to it.
        }
        match conn.ws.as_deref() {
            None => encode_frame(message, &mut conn.out),
            Some(ws) if ws.writable() => websocket::write_message(&mut conn.out, message),
            // Not upgraded (the login deadline passed first, say) or closed: nothing is said.
            Some(_) => {}
        }
        let session = session_id(self.worker, slot, conn.generation_slot);
        self.after_output(conn, slot, session);
    }

    /// Enforces the output bound and queues the connection for writing.
    pub(super) fn after_output(&mut self, conn: &mut Conn, slot: u32, session: u64) {
        self.bound_output(conn, slot, session);
        self.mark_dirty(conn, slot);
    }

    /// Cuts off a client whose output (queued for writing, or held for an old owner's
    /// release) passed the bound: it is not keeping up, or its old owner never released it.
    pub(super) fn bound_output(&mut self, conn: &mut Conn, slot: u32, session: u64) {
        let queued = conn.queued();
        if queued > self.shared.config.max_output_bytes && conn.closing != Closing::Abort {
            debug!(
                session,
                queued,
                held = conn.held_bytes,
                "client output over the bound; cutting it off"
            );
            self.shared.metrics.slow_clients_cut.inc();
            conn.out.clear();
            conn.held.clear();
            conn.held_bytes = 0;
            self.close(conn, slot, session, Closing::Abort);
        }
    }

    /// Starts closing a connection; a player still in the world leaves it now.
    pub(super) fn close(&mut self, conn: &mut Conn, slot: u32, session: u64, how: Closing) {
        match std::mem::replace(&mut conn.session, Session::Gone) {
            Session::Playing { player, link } => {
                // The budgets are the player's: kept here for its next connection to this
                // gateway, and parked with it on its shard for one to any gateway.
                self.shared.admission.keep_budgets(player, conn.chats, conn.actions, self.now);
                let budgets = Some(conn.budgets(self.shared.admission.limits(), self.now));
                let leave = Input::Leave(Leave { logout: false, budgets });
                self.relay(&link, session, player, conn.take_seq(), leave);
            }
            Session::Resuming { player, .. } => {
                // A shard may restore the player on this session before it hears the
                // connection is gone: every shard asked gets a Leave after the Resume (on
                // the same link), which parks the player again where it was restored. This
                // connection never had the player's budgets (they come with the answer),
                // so it gives none: the shard parks the player with the ones it had, and
                // what this gateway kept stays kept.
                self.leave_everywhere(conn, session, player);
            }
            // The moves in flight are still the shard's to answer (output keeps flowing to
            // a connection closing after a flush); the ones after the Logout follow them.
            Session::Anonymous | Session::LoggingOut { .. } | Session::Gone => {}
        }
        let stronger =
            matches!((conn.closing, how), (Closing::No, _) | (Closing::AfterFlush, Closing::Abort));
        if stronger {
            conn.closing = how;
            conn.closing_since.get_or_insert(self.now);
            if how == Closing::Abort {
                conn.out.clear();
            }
        }
        self.mark_dirty(conn, slot);
    }
}
