//! Players whose shard or link failed: a dead shard's players restored on the owners of
//! their last acknowledged cells, a broken link's players let go (every move in flight
//! answered) and restored once a shard can take them, or told to resume. Called by
//! `links` (a link failed), the door (a dead shard's mail), `timers`, `delivery` (a player
//! handed to a shard it lost) and `output` (a closing player's `Leave` to every shard).

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_protocol::pb::ErrorCode;
use meridian_rpc::pb::{player_input::Kind as Input, Join, Leave};
use tracing::{debug, warn};

use super::{Closing, Conn, Core, Ctx, Session};
use crate::routing::ShardLink;
use crate::shared::session_id;

/// How long a player whose link broke waits for a shard to restore it on before it is
/// told to resume.
const RESTORE_WAIT: Duration = Duration::from_secs(20);

impl Core {
    /// Brings every player of a dead shard back on the shards that now own their last
    /// acknowledged positions (the coordinator has already reassigned the dead region).
    pub(super) fn restore(&mut self, dead: ShardId) {
        let mut restored = 0;
        let now = self.ctx.now;
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            let Session::Playing { link, .. } = &conn.session else { continue };
            if link.id != dead && conn.handed_from != Some(dead) {
                continue;
            }
            conn.handed_from = None;
            if conn.claim.is_some_and(|(shard, _)| shard == dead) {
                conn.claim = None;
            }
            let session = session_id(self.ctx.worker, slot, conn.generation_slot);
            conn.restore_due.get_or_insert(now);
            if self.ctx.restore_on_owner(conn, slot, session) {
                restored += 1;
            }
        }
        if restored > 0 {
            tracing::info!(worker = self.ctx.worker, %dead, restored, "restoring players of a dead shard");
        }
    }

    /// Answers every move in flight on a failed link with UNAVAILABLE, in order, and drops
    /// this iteration's inputs for it.
    pub(super) fn link_down(&mut self, link: &Arc<ShardLink>) {
        let dropped = self.ctx.outgoing.drop_for(link);
        if dropped > 0 {
            warn!(worker = self.ctx.worker, shard = %link.id, dropped, "inputs queued for a failed link dropped");
        }
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            if matches!(&conn.session, Session::LoggingOut { link: l } if Arc::ptr_eq(l, link)) {
                // Its close will not come: what the client is owed is answered, then it is
                // closed (the shard parked or removed the player with the link).
                let session = session_id(self.ctx.worker, slot, conn.generation_slot);
                self.ctx.refuse_after_logout(conn, slot);
                conn.session = Session::Gone;
                self.ctx.close(conn, slot, session, Closing::AfterFlush);
                continue;
            }
            // A player handed to this shard whose gateway had no link to it yet when the
            // release marker came (`pending_owner`) is on it too: the shard owns it, and
            // let go of it with the link.
            // (Not one waiting for a later life of the shard than this link's.)
            let on_link = matches!(&conn.session, Session::Playing { link: l, .. } if Arc::ptr_eq(l, link))
                || conn
                    .pending_owner
                    .is_some_and(|p| p.to == link.id && !link.earlier_than(p.incarnation));
            if !on_link {
                continue;
            }
            conn.pending_owner = None;
            self.ctx.let_go(conn, slot);
            // The shard parked the player (or takes it over from a handoff once the link
            // is back): the restore goes back to it, so that no parked copy is left behind
            // to answer a later resume. Should it die instead, its link leaves the routing
            // table and the restore goes to the owner of the player's last cell.
            // (A shard that said it holds the player at a newer generation keeps the claim.)
            if conn.claim.is_none_or(|(_, g)| g <= conn.generation) {
                conn.claim = Some((link.id, conn.generation));
            }
        }
    }
}

impl Ctx {
    /// The player's shard let go of it with its link (or died): it is restored on the
    /// owner of its last acknowledged cell once a link is up (`tick`), and until its
    /// ViewReset its moves are refused.
    pub(super) fn let_go(&mut self, conn: &mut Conn, slot: u32) {
        conn.restoring = true;
        conn.restore_due.get_or_insert(self.now);
        conn.held.clear();
        conn.held_bytes = 0;
        conn.unconfirmed.clear();
        let unanswered = std::mem::take(&mut conn.inflight);
        for (client_time, ..) in unanswered {
            self.refuse(conn, slot, ErrorCode::Unavailable, "shard unavailable", client_time);
        }
    }

    /// Re-joins a player whose shard died or whose link broke on the shard that owns its
    /// last acknowledged cell (`Join.restore`: the client gets `ViewReset`). Returns false
    /// if no shard can take it yet (`tick` tries again).
    pub(super) fn restore_on_owner(&mut self, conn: &mut Conn, slot: u32, session: u64) -> bool {
        let Session::Playing { player, .. } = conn.session else { return false };
        let Some((x, y)) = conn.last_position else { return false };
        let claimed = conn.claim.and_then(|(shard, generation)| {
            let link = self.routing().read(|t| t.link(shard).cloned());
            link.map(|link| (link, generation))
        });
        let (target, generation) = match claimed {
            // It holds the player, or let go of it with its link, or takes it over once
            // the link is back: the restore waits for that link.
            Some((link, _)) if !link.is_up() => return false,
            Some((link, generation)) => (Some(link), generation.max(conn.generation)),
            None => (self.routing().read(|t| t.owner_link(x, y).cloned()), conn.generation),
        };
        let Some(target) = target.filter(|l| l.accepts_inputs()) else {
            debug!(player, x, y, "no shard to restore a player on yet");
            return false;
        };
        conn.claim = None;
        let join = Join {
            name: conn.name.clone(),
            spawn: Some(meridian_protocol::pb::Position { x, y }),
            restore: true,
            generation,
            gateway_id: 0,
            epoch: self.routing().read(|t| t.epoch()),
            state: conn.state.clone(),
            login_stamp: conn.login_stamp,
            budgets: None,
        };
        conn.held.clear();
        conn.held_bytes = 0;
        // Moves the old shard took and never answered (a hung shard keeps its connection
        // open, so no link failure answered them) are refused now, in order, before the
        // ViewReset: every move gets exactly one answer.
        conn.unconfirmed.clear();
        let unanswered = std::mem::take(&mut conn.inflight);
        for (client_time, ..) in unanswered {
            let detail = "shard failed before answering";
            self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
        }
        conn.restoring = true;
        conn.restore_due = None;
        let seq = conn.take_seq();
        self.relay(&target, session, player, seq, Input::Join(join));
        conn.session = Session::Playing { player, link: target };
        self.shared.metrics.restores.inc();
        true
    }

    /// A player whose link broke: restored once a shard can take it; past
    /// [`RESTORE_WAIT`] (or with no acknowledged cell to restore it at) told and closed,
    /// so that the client resumes.
    pub(super) fn restore_after_link_loss(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        since: Instant,
        now: Instant,
    ) {
        if conn.last_position.is_some() && self.restore_on_owner(conn, slot, session) {
            return;
        }
        if conn.last_position.is_none() || now.saturating_duration_since(since) > RESTORE_WAIT {
            conn.restore_due = None;
            // Every move still in flight gets its one answer before the notice.
            conn.unconfirmed.clear();
            for (client_time, ..) in std::mem::take(&mut conn.inflight) {
                let detail = "shard failed before answering";
                self.refuse(conn, slot, ErrorCode::Unavailable, detail, client_time);
            }
            let detail = "lost the connection to your shard: resume with your token";
            self.refuse(conn, slot, ErrorCode::Unavailable, detail, 0);
            self.close(conn, slot, session, Closing::AfterFlush);
        }
    }

    /// Sends a Leave for `player` to every linked shard, behind a Resume that went to all.
    pub(super) fn leave_everywhere(&mut self, conn: &mut Conn, session: u64, player: u64) {
        let links: Vec<Arc<ShardLink>> =
            self.routing().read(|t| t.links.iter().filter(|l| l.is_up()).cloned().collect());
        let seq = conn.take_seq();
        for link in &links {
            let leave = Input::Leave(Leave { logout: false, budgets: None });
            self.relay(link, session, player, seq, leave);
        }
    }
}
