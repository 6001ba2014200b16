//! Bytes in from a client connection: WebSocket frames turned into length-delimited ones,
//! frames split and checked against the frame limit, the input budget spent frame by
//! frame (reading pauses when it runs out, and resumes on a later tick), and what waits
//! while paused bounded by [`INBUF_LIMIT`]. Each whole frame goes to `messages`.
//!
//! Over TCP the budget pays for each length-delimited frame as it is handled. Over
//! WebSocket it pays for each WebSocket frame before the frame is even unmasked: whole
//! messages, every fragment of a fragmented one, pings, pongs and the close alike; the
//! messages they make reach the frame loop already paid for. Either way, a frame the
//! budget does not cover waits unread with everything behind it, reading pauses, and a
//! client whose input keeps arriving past [`INBUF_LIMIT`] is cut off.

use std::time::Instant;

use meridian_protocol::pb::{ClientMessage, ErrorCode};
use meridian_protocol::{decode_body, next_frame};
use tracing::debug;

use super::{Closing, Conn, Core, Ctx, INBUF_LIMIT};
use crate::shared::session_id;

impl Core {
    pub(super) fn read_client(&mut self, slot: u32, data: &[u8], now: Instant) {
        let Some(conn) = self.endpoints.conn_mut(slot) else { return };
        self.ctx.shared.metrics.bytes_in.add(data.len() as u64);
        if conn.closing != Closing::No {
            return; // Lingering before close: input is discarded.
        }
        let session = session_id(self.ctx.worker, slot, conn.generation_slot);
        if conn.ws.is_none() {
            return self.ctx.on_frames(conn, slot, session, data, now);
        }
        let mut frames = std::mem::take(&mut self.ws_frames);
        self.ctx.on_ws_bytes(conn, slot, session, data, &mut frames, now);
        self.ws_frames = frames;
    }

    /// Connections whose reading was paused and whose budget has refilled handle what
    /// waited; those with nothing left waiting are read again.
    pub(super) fn resume_reading(&mut self, now: Instant) {
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            if !conn.read_paused || conn.closing != Closing::No {
                continue;
            }
            conn.read_paused = false;
            let session = session_id(self.ctx.worker, slot, conn.generation_slot);
            if conn.ws.is_some() {
                // What waits is WebSocket frames not yet paid for: read on from them.
                let mut frames = std::mem::take(&mut self.ws_frames);
                self.ctx.on_ws_bytes(conn, slot, session, &[], &mut frames, now);
                self.ws_frames = frames;
            } else {
                let mut buf = std::mem::take(&mut conn.inbuf);
                let used = self.ctx.handle_frames(conn, slot, session, &buf, now, Paid::No);
                buf.drain(..used);
                conn.inbuf = buf;
            }
            self.ctx.mark_dirty(conn, slot);
        }
    }
}

/// Whether the frames handed to [`Ctx::handle_frames`] are paid for already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Paid {
    /// From TCP: each pays as it is handled.
    No,
    /// Made of WebSocket frames that each paid before they were read.
    AsWebSocketFrames,
}

impl Ctx {
    /// Bytes read from a WebSocket connection (none: go on with what waited for the
    /// budget). Each WebSocket frame is paid for before it is read; while reading is
    /// paused, nothing is, and what arrives waits behind what waited already.
    pub(super) fn on_ws_bytes(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        data: &[u8],
        frames: &mut Vec<u8>,
        now: Instant,
    ) {
        let Some(ws) = conn.ws.as_mut() else { return };
        frames.clear();
        let queued = conn.out.len();
        let max_frame = self.shared.config.max_frame;
        let limits = self.shared.admission.limits();
        let (frame_rate, byte_rate) = (limits.input_frames, limits.input_bytes);
        let paused = conn.read_paused;
        let input = &mut conn.input;
        let mut pay = |size| !paused && input.pay(frame_rate, byte_rate, size, now);
        let read = ws.read(data, max_frame, &mut pay, frames, &mut conn.out);
        let metrics = &self.shared.metrics;
        if read.upgraded {
            metrics.ws_handshakes.inc();
        }
        if read.upgrade_failed {
            metrics.ws_handshake_failures.inc();
        }
        metrics.ws_frames_in.add("fragment", u64::from(read.fragments));
        metrics.ws_frames_in.add("ping", u64::from(read.pings));
        metrics.ws_frames_in.add("pong", u64::from(read.pongs));
        if read.waiting {
            conn.read_paused = true;
        }
        if !frames.is_empty() {
            // Paid for as they were read, so handled now even if reading paused since.
            self.handle_frames(conn, slot, session, frames, now, Paid::AsWebSocketFrames);
        }
        if conn.read_paused && !data.is_empty() {
            self.shared.metrics.reads_paused.inc();
        }
        self.bound_input(conn, slot, session);
        if read.ended {
            self.close(conn, slot, session, Closing::AfterFlush);
        } else if conn.out.len() != queued {
            self.after_output(conn, slot, session);
        }
    }

    /// Length-delimited frames read from a connection (from TCP as they came, or made of
    /// WebSocket messages): handled now, or kept while the input budget is spent.
    pub(super) fn on_frames(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        data: &[u8],
        now: Instant,
    ) {
        if conn.inbuf.is_empty() && !conn.read_paused {
            let used = self.handle_frames(conn, slot, session, data, now, Paid::No);
            if conn.closing == Closing::No {
                conn.inbuf.extend_from_slice(&data[used..]);
            }
        } else if conn.read_paused {
            // Over budget: what was already on its way waits, up to a bound.
            conn.inbuf.extend_from_slice(data);
        } else {
            let mut buf = std::mem::take(&mut conn.inbuf);
            buf.extend_from_slice(data);
            let used = self.handle_frames(conn, slot, session, &buf, now, Paid::No);
            buf.drain(..used);
            conn.inbuf = buf;
        }
        if conn.read_paused {
            self.shared.metrics.reads_paused.inc();
        }
        self.bound_input(conn, slot, session);
    }

    /// Cuts off a client that keeps sending while its reading is paused, once what waits
    /// passes [`INBUF_LIMIT`].
    pub(super) fn bound_input(&mut self, conn: &mut Conn, slot: u32, session: u64) {
        let waiting = conn.waiting_input();
        if waiting > INBUF_LIMIT && conn.closing == Closing::No {
            debug!(session, waiting, "client input over the bound; cutting it off");
            self.shared.metrics.input_floods_cut.inc();
            conn.inbuf = Vec::new();
            if let Some(ws) = conn.ws.as_mut() {
                ws.stop_reading();
            }
            self.refuse(conn, slot, ErrorCode::RateLimited, "sending faster than allowed", 0);
            self.close(conn, slot, session, Closing::AfterFlush);
        }
    }

    /// Handles every whole frame at the front of `data` that the connection's input budget
    /// pays for (all of them if they are [`Paid`] already); returns the bytes consumed.
    /// When the budget runs out, reading pauses.
    pub(super) fn handle_frames(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        data: &[u8],
        now: Instant,
        paid: Paid,
    ) -> usize {
        let max = self.shared.config.max_frame;
        let limits = self.shared.admission.limits();
        let (frame_rate, byte_rate) = (limits.input_frames, limits.input_bytes);
        let mut used = 0;
        while conn.closing == Closing::No {
            match next_frame(&data[used..], max) {
                Ok(None) => break,
                Err(error) => {
                    debug!(session, %error, "closing connection on a bad frame");
                    self.refuse(conn, slot, error.code(), &error.to_string(), 0);
                    self.close(conn, slot, session, Closing::AfterFlush);
                    break;
                }
                Ok(Some(header)) => {
                    if paid == Paid::No
                        && !conn.input.pay(frame_rate, byte_rate, header.total_len(), now)
                    {
                        conn.read_paused = true;
                        break;
                    }
                    conn.last_input_at = now;
                    let body = header.body(&data[used..]);
                    used += header.total_len();
                    self.shared.metrics.frames_in.inc();
                    match decode_body::<ClientMessage>(body) {
                        Ok(message) => self.handle_message(conn, slot, session, message, now),
                        Err(error) => {
                            debug!(session, %error, "closing connection on a malformed frame");
                            self.refuse(conn, slot, ErrorCode::Malformed, &error.to_string(), 0);
                            self.close(conn, slot, session, Closing::AfterFlush);
                        }
                    }
                }
            }
        }
        used
    }
}
