//! Shard output into client output: each delivery of a shard's batch goes to its
//! connection (already framed; copied once, re-headed for WebSocket), in order across a
//! handoff: output of a new owner is held until the old owner's `released_to` marker,
//! answers to a resume or a takeover settle the session, and answered moves are counted
//! off. Called by `links` (bytes from a link), by `timers` (a handoff to a shard whose link
//! the routing table now has: the session follows the player there) and by the door's test
//! mail.

use std::sync::Arc;

use meridian_cluster::ShardId;
use meridian_protocol::next_frame;
use meridian_protocol::pb::ErrorCode;
use meridian_rpc::pb::Delivery;
use tracing::debug;

use super::conn::{PendingOwner, Session, Takeover};
use super::{Closing, Conn, Core, Ctx};
use crate::routing::ShardLink;
use crate::shared::{session_id, session_parts, session_worker};
use crate::websocket;

/// The first byte of a `ServerMessage` body carrying `ViewReset` (field 8) or `LoginOk`
/// (field 1): the field's key, length-delimited.
const VIEW_RESET_TAG: u8 = (8 << 3) | 2;
const LOGIN_OK_TAG: u8 = (1 << 3) | 2;

/// Where the first `ViewReset` frame starts in a run of whole frames, if there is one.
/// Only each frame's first body byte is looked at: a `ServerMessage` is one oneof field,
/// and `view_reset` is field 8, length-delimited.
fn view_reset_at(frames: &[u8]) -> Option<usize> {
    message_at(frames, VIEW_RESET_TAG)
}

/// Where in `frames` the first message of the kind `tag` starts.
fn message_at(frames: &[u8], tag: u8) -> Option<usize> {
    let mut at = 0;
    while let Ok(Some(header)) = next_frame(&frames[at..], usize::MAX) {
        if header.body(&frames[at..]).first() == Some(&tag) {
            return Some(at);
        }
        at += header.total_len();
    }
    None
}

impl Core {
    /// A batch of a shard's output for this worker's connections, in link order.
    pub(super) fn apply_deliveries(&mut self, from: ShardId, deliveries: Vec<Delivery>) {
        for mut delivery in deliveries {
            if session_worker(delivery.session) != self.ctx.worker {
                // Not this lane's: the shard routes by the session's lane, so never.
                continue;
            }
            let (_, slot, generation) = session_parts(delivery.session);
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            if conn.generation_slot != generation || conn.closing == Closing::Abort {
                continue;
            }
            if matches!(conn.session, Session::Anonymous) {
                // An answer to a resume this connection gave up on: its player was told
                // to leave again (see `tick`), so nothing of it is for this client.
                continue;
            }
            if let Session::Resuming { player, waiting, login, .. } = &mut conn.session {
                let player = *player;
                if delivery.resume_refused {
                    *waiting = waiting.saturating_sub(1);
                    if *waiting == 0 {
                        let login = login.take();
                        conn.session = Session::Anonymous;
                        conn.opened_at = self.ctx.now;
                        match login {
                            // Online nowhere: a login like any other.
                            Some(login) => {
                                let session =
                                    session_id(self.ctx.worker, slot, conn.generation_slot);
                                let Takeover { name, spawn, saved, generation } = *login;
                                let at = spawn.or(saved);
                                self.ctx.place(conn, slot, session, player, name, at, generation);
                            }
                            None => {
                                let detail = "nothing to resume: this token was used already, \
                                              or the resume window has passed";
                                self.ctx.refuse(conn, slot, ErrorCode::InvalidToken, detail, 0);
                            }
                        }
                    }
                    continue;
                }
                let first = if login.is_some() { LOGIN_OK_TAG } else { VIEW_RESET_TAG };
                if message_at(&delivery.frames, first).is_none() {
                    // Not the answer to the resume (that starts with a ViewReset): output
                    // of a shard the player was handed on to from the one that took it
                    // back, which overtook that one's answer and release marker. Held
                    // for the marker, like any new owner's early output.
                    conn.held_bytes += delivery.frames.len();
                    conn.held.push((from, delivery));
                    let session = session_id(self.ctx.worker, slot, conn.generation_slot);
                    self.ctx.bound_output(conn, slot, session);
                    continue;
                }
                // The shard that held the player took it back: it owns the player now.
                let Some(link) = self.ctx.routing().read(|t| t.link(from).cloned()) else {
                    continue;
                };
                if let Some(login) = login.take() {
                    self.ctx.shared.metrics.logins.inc();
                    conn.name = login.name;
                }
                let kept = conn.take_kept_budgets(&self.ctx.shared.admission, player, self.ctx.now);
                if !kept && delivery.budgets.is_none() {
                    // The shard gives no budgets when it took the player over from a
                    // connection still open: that one's gateway holds them, and they come
                    // later, with its Leave, through the shard. Until then, none to spend:
                    // a reconnect must not buy a fresh burst in that race (issue 31 item 3).
                    conn.empty_budgets(self.ctx.shared.admission.limits(), self.ctx.now);
                }
                conn.session = Session::Playing { player, link };
            }
            if delivery.resume_refused {
                // A shard that did not hold the player, answering a resume another shard
                // has taken already: nothing for the client. (Held like a new owner's
                // output, it would block every later delivery behind it.)
                continue;
            }
            let owner = match &conn.session {
                Session::Playing { link, .. } => Some(link.id),
                _ => None,
            };
            // Handed to a shard not linked yet (`pending_owner`): the old owner spoke its
            // last for that ownership with its marker, so what it sends now is of a later
            // one (the player came straight back) and waits behind the pending owner's
            // output and marker like anyone's (`meridian-sim` seed 2949).
            if conn.pending_owner.is_some() || owner.is_some_and(|owner| owner != from) {
                if delivery.released_to != 0
                    && delivery.released_generation != 0
                    && delivery.released_generation <= conn.released_through
                {
                    // A copy of a release this connection followed already (a restore
                    // passed on by a shard that had let go of the player, its first marker
                    // read after the restore went): held, it would send the client away
                    // from the player's next ownership there (`meridian-sim` seed 5823).
                    debug!(%from, player = ?owner, "a copy of a release marker already followed dropped");
                    delivery.released_to = 0;
                    if delivery.frames.is_empty() && delivery.position.is_none() && !delivery.close
                    {
                        continue;
                    }
                }
                // A new owner already speaking: wait for the old owner's release. What
                // waits counts toward the output bound: an old owner that never
                // releases costs the client its connection, not the gateway its memory.
                if delivery.position.is_some()
                    && delivery.generation > conn.generation
                    && conn.claim.is_none_or(|(_, g)| delivery.generation > g)
                {
                    conn.claim = Some((from, delivery.generation));
                }
                conn.held_bytes += delivery.frames.len();
                conn.held.push((from, delivery));
                let session = session_id(self.ctx.worker, slot, conn.generation_slot);
                self.ctx.bound_output(conn, slot, session);
                continue;
            }
            self.ctx.deliver(conn, slot, delivery);
        }
    }
}

impl Ctx {
    /// Writes a shard's delivery for a connection and follows a handoff marker, then
    /// releases anything the new owner sent meanwhile.
    pub(super) fn deliver(&mut self, conn: &mut Conn, slot: u32, mut delivery: Delivery) {
        if conn.shards_silenced {
            // Its moves in flight were refused at shutdown; it closes soon.
            return;
        }
        if conn.restoring && !delivery.frames.is_empty() {
            // Restoring, the client's view starts over at the ViewReset that answers the
            // restore: output before it was against a view the client never got (lost with
            // the broken link; say, from the shard a player was handed to just as its
            // link broke, which the restore was passed on to). Every move in flight was
            // answered when the link broke, and moves wait while restoring, so no
            // answer is among what is dropped.
            let start = view_reset_at(&delivery.frames).unwrap_or(delivery.frames.len());
            delivery.frames = delivery.frames.slice(start..);
        }
        // A restore is answered by output (its ViewReset); a bare marker is not an answer
        // (the shard passed the restore on to the player's new owner).
        if !delivery.frames.is_empty() {
            conn.restoring = false;
        }
        if delivery.position.is_some() {
            // Only a shard that holds the player says where it stands (a refusal for a
            // player it does not have says nothing of the kind): the handoff is complete.
            conn.handed_from = None;
        }
        match conn.ws.as_deref() {
            None => conn.out.extend_from_slice(&delivery.frames),
            Some(ws) if ws.writable() => websocket::write_frames(&mut conn.out, &delivery.frames),
            Some(_) => {}
        }
        if delivery.has_state {
            conn.state = std::mem::take(&mut delivery.state);
        }
        if let Some(budgets) = &delivery.budgets {
            // Parked with the player by its shard (a resume's or login's answer), or handed
            // on from a connection this one took the player from.
            conn.lower_budgets(self.shared.admission.limits(), budgets, self.now);
        }
        if let Some(at) = delivery.position {
            conn.last_position = Some((at.x, at.y));
            conn.generation = delivery.generation;
            match &conn.session {
                // Its owner says it holds the player while a restore waits to be sent (the
                // owner took the player over once its link was back, say): the restore
                // goes to it.
                Session::Playing { link, .. } if conn.restore_due.is_some() => {
                    conn.claim = Some((link.id, delivery.generation));
                }
                _ if conn.claim.is_some_and(|(_, g)| g <= delivery.generation) => {
                    conn.claim = None;
                }
                _ => {}
            }
        }
        if delivery.move_answers > 0 {
            let now = self.now;
            for _ in 0..delivery.move_answers {
                if let Some((_, seq, read_at)) = conn.inflight.pop_front() {
                    self.shared.metrics.move_delay.observe((now - read_at).as_secs_f64());
                    while conn.unconfirmed.front().is_some_and(|input| input.seq <= seq) {
                        conn.unconfirmed.pop_front();
                    }
                }
            }
        }
        if conn.inflight.is_empty() && !conn.refused_after_logout.is_empty() {
            self.refuse_after_logout(conn, slot);
        }
        self.goodbye_once_answered(conn, slot);
        if delivery.close {
            conn.session = Session::Gone;
            if conn.closing == Closing::No {
                conn.closing = Closing::AfterFlush;
                conn.closing_since = Some(self.now);
            }
        }
        self.after_output(conn, slot, delivery.session);
        if delivery.released_to == 0 {
            return;
        }
        let to = ShardId(delivery.released_to);
        let incarnation = delivery.released_incarnation;
        let generation = delivery.generation.max(conn.generation);
        let Session::Playing { player, .. } = conn.session else {
            return;
        };
        conn.released_through = conn.released_through.max(delivery.released_generation);
        let pending = PendingOwner { to, incarnation, generation, since: self.now };
        match self.routing().read(|table| table.link(to).cloned()) {
            Some(link) if link.replaced(incarnation) => {
                self.handed_to_lost(conn, slot, player, link, generation)
            }
            Some(link) if link.earlier_than(incarnation) => {
                // Handed to a later life of the shard than this gateway's view has: the
                // link to it comes with the view (this one goes).
                debug!(%to, player, "player handed to a later life of a shard");
                conn.pending_owner = Some(pending);
            }
            Some(link) if !link.accepts_inputs() => {
                self.handed_to_lost(conn, slot, player, link, generation)
            }
            Some(link) => self.switch_owner(conn, slot, player, link),
            None => {
                // The shard is so new that this gateway's view does not have it yet. Inputs
                // keep going to the old owner (which forwards them); the new owner's output
                // waits in `held` until the next tick finds the link.
                debug!(%to, player, "player handed to a shard not linked yet");
                conn.pending_owner = Some(pending);
            }
        }
    }

    /// The player was handed to a shard whose link failed, or to a registration of it that
    /// was taken for dead since (`link` is to its new one, which never saw the handoff): it
    /// let go of the player with the link, or takes it over when the link is back, or
    /// never had it. Either way the player is restored there, as if it had been on that
    /// link when it broke. (A link not opened yet is another matter: the shard holds
    /// the handoff until it opens.)
    pub(super) fn handed_to_lost(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        player: u64,
        link: Arc<ShardLink>,
        generation: u64,
    ) {
        let to = link.id;
        debug!(%to, player, "player handed to a shard whose link is down or that was replaced");
        self.switch_owner(conn, slot, player, link);
        if !matches!(&conn.session, Session::Playing { link, .. } if link.id == to) {
            // What that shard sent while held handed the player on (back to the shard that
            // took it back, whose output waited behind its marker): not lost (seed 7664).
            return;
        }
        self.let_go(conn, slot);
        conn.claim = Some((to, generation));
    }

    /// Makes `link` the player's owner and releases what it sent while held.
    pub(super) fn switch_owner(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        player: u64,
        link: Arc<ShardLink>,
    ) {
        conn.pending_owner = None;
        if let Session::Playing { link: old, .. } = &conn.session {
            debug!(player, from = %old.id, to = %link.id, "session follows its player to a new owner");
            conn.handed_from = Some(old.id);
        }
        for input in &conn.unconfirmed {
            self.enqueue(&link, input.clone());
        }
        conn.session = Session::Playing { player, link };
        // Everything the new owner sent while held goes out now, oldest first; a delivery
        // among it can hand the player on again (A -> B -> C), and then C's held output
        // follows in turn. Output of an owner further on stays held for its release.
        while let Session::Playing { link, .. } = &conn.session {
            let current = link.id;
            let Some(next) = conn.held.iter().position(|(from, _)| *from == current) else {
                break;
            };
            let (_, delivery) = conn.held.remove(next);
            conn.held_bytes -= delivery.frames.len();
            self.deliver(conn, slot, delivery);
        }
    }
}
