//! The core's periodic work, at each [`Core::handle_timeout`]: the links' heartbeats and
//! silence, resumes no shard answered in time, handoffs to a shard the routing table now
//! knows, players waiting to be restored, paused reading resumed, the login and idle
//! deadlines, the linger of a close, and the gateway-wide output budget. Called by the
//! door only.

use std::time::{Duration, Instant};

use meridian_protocol::pb::ErrorCode;
use tracing::{debug, warn};

use super::conn::RESUME_WAIT;
use super::{Closing, Core, Session, GOODBYE_GRACE, LINGER, SHUTDOWN_WAIT};
use crate::shared::session_id;

/// How long a player handed to a shard the routing table does not know yet waits for it
/// before it is restored instead.
pub(super) const PENDING_OWNER_WAIT: Duration = Duration::from_secs(10);

impl Core {
    /// Periodic work at `now`: resumes that no shard answered in time are refused;
    /// handoffs to a shard the routing table now knows complete; players whose link broke
    /// are restored; paused reading resumes; the login and idle deadlines and the
    /// gateway-wide output budget are enforced; connections lingering in their close past
    /// [`LINGER`] are cut.
    pub(super) fn tick(&mut self, now: Instant) {
        self.ctx.now = now;
        self.reconcile_links();
        self.tick_links(now);
        let limits = self.ctx.shared.admission.limits();
        let (login_timeout, idle_timeout) = (limits.login_timeout, limits.idle_timeout);
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            if conn.closing != Closing::No {
                // Closing for longer than LINGER: the client never closed its side, so the
                // close is forced.
                if conn
                    .closing_since
                    .is_some_and(|since| now.saturating_duration_since(since) > LINGER)
                {
                    conn.closing = Closing::Abort;
                    self.ctx.mark_dirty(conn, slot);
                }
                continue;
            }
            if let Some(at) = conn.goodbye_at {
                let close_at = at + GOODBYE_GRACE;
                if now >= close_at {
                    let session = session_id(self.ctx.worker, slot, conn.generation_slot);
                    self.ctx.close(conn, slot, session, Closing::AfterFlush);
                } else {
                    // Not due yet: the wake-up this timeout spent is asked for again.
                    self.ctx.wake_at = Some(self.ctx.wake_at.map_or(close_at, |w| w.min(close_at)));
                }
                continue;
            }
            if self.ctx.shutting_down.is_some_and(|since| now - since >= SHUTDOWN_WAIT) {
                self.ctx.goodbye_now(conn, slot);
                continue;
            }
            let session = session_id(self.ctx.worker, slot, conn.generation_slot);
            if let (Some(pending), Session::Playing { player, .. }) =
                (conn.pending_owner, &conn.session)
            {
                let player = *player;
                match self.ctx.routing().read(|t| t.link(pending.to).cloned()) {
                    Some(link) if link.replaced(pending.incarnation) => {
                        self.ctx.handed_to_lost(conn, slot, player, link, pending.generation)
                    }
                    Some(link) if !link.earlier_than(pending.incarnation) => {
                        self.ctx.switch_owner(conn, slot, player, link)
                    }
                    _ if now.saturating_duration_since(pending.since) > PENDING_OWNER_WAIT => {
                        warn!(to = %pending.to, player, "the shard a player was handed to never appeared; restoring the player");
                        conn.pending_owner = None;
                        self.ctx.let_go(conn, slot);
                    }
                    _ => {}
                }
            }
            if let Session::Resuming { since, player, ref login, .. } = conn.session {
                if now.saturating_duration_since(since) > RESUME_WAIT {
                    // A shard may still answer and place the player on this session: every
                    // shard asked gets a Leave behind its Resume, so the holder parks it
                    // again instead of keeping it on a session that is no longer resuming.
                    let (code, detail) = match login {
                        Some(_) => (ErrorCode::Unavailable, "no shard answered the login in time"),
                        None => (ErrorCode::InvalidToken, "no shard answered the resume"),
                    };
                    self.ctx.leave_everywhere(conn, session, player);
                    conn.session = Session::Anonymous;
                    conn.opened_at = now;
                    self.ctx.refuse(conn, slot, code, detail, 0);
                }
            }
            if let Some(since) = conn.restore_due {
                self.ctx.restore_after_link_loss(conn, slot, session, since, now);
            }
            let deadline = match conn.session {
                Session::Anonymous => Some((conn.opened_at, login_timeout)),
                Session::Playing { .. } | Session::Resuming { .. } | Session::LoggingOut { .. } => {
                    Some((conn.last_input_at, idle_timeout))
                }
                Session::Gone => None,
            };
            if let Some((from, timeout)) = deadline {
                if now.saturating_duration_since(from) >= timeout {
                    let anonymous = matches!(conn.session, Session::Anonymous);
                    let (code, detail, what) = if anonymous {
                        (ErrorCode::NotLoggedIn, "no Login or Resume in time", "login")
                    } else {
                        (
                            ErrorCode::Unavailable,
                            "nothing received for too long: send Ping when quiet",
                            "idle",
                        )
                    };
                    debug!(session, what, "closing a connection at its deadline");
                    self.ctx.shared.metrics.deadlines.inc(what);
                    self.ctx.refuse(conn, slot, code, detail, 0);
                    self.ctx.close(conn, slot, session, Closing::AfterFlush);
                }
            }
        }
        self.resume_reading(now);
        self.bound_total_output();
    }
}
