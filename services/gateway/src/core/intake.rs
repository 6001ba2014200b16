//! Bytes in from a client connection: WebSocket frames turned into length-delimited ones,
//! frames split and checked against the frame limit, the input budget spent frame by
//! frame (reading pauses when it runs out, and resumes on a later tick), and what waits
//! while paused bounded by [`INBUF_LIMIT`]. Each whole frame goes to `messages`.

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
        let Some(ws) = conn.ws.as_mut() else {
            return self.ctx.on_frames(conn, slot, session, data, now);
        };
        let mut frames = std::mem::take(&mut self.ws_frames);
        frames.clear();
        let queued = conn.out.len();
        let max_frame = self.ctx.shared.config.max_frame;
        let read = ws.read(data, max_frame, &mut frames, &mut conn.out);
        let metrics = &self.ctx.shared.metrics;
        if read.upgraded {
            metrics.ws_handshakes.inc();
        }
        if read.upgrade_failed {
            metrics.ws_handshake_failures.inc();
        }
        if read.control_frames > 0 {
            // Pings and pongs spend the input budget like messages: the next message
            // finds it spent (and reading pauses) if they went past it.
            conn.frames.spend(read.control_frames);
            conn.bytes.spend(read.control_bytes);
        }
        if !frames.is_empty() {
            self.ctx.on_frames(conn, slot, session, &frames, now);
        }
        self.ws_frames = frames;
        if read.ended {
            self.ctx.close(conn, slot, session, Closing::AfterFlush);
        } else if conn.out.len() != queued {
            self.ctx.after_output(conn, slot, session);
        }
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
            let mut buf = std::mem::take(&mut conn.inbuf);
            let used = self.ctx.handle_frames(conn, slot, session, &buf, now);
            buf.drain(..used);
            conn.inbuf = buf;
            self.ctx.mark_dirty(conn, slot);
        }
    }
}

impl Ctx {
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
            let used = self.handle_frames(conn, slot, session, data, now);
            if conn.closing == Closing::No {
                conn.inbuf.extend_from_slice(&data[used..]);
            }
        } else if conn.read_paused {
            // Over budget: what was already on its way waits, up to a bound.
            conn.inbuf.extend_from_slice(data);
        } else {
            let mut buf = std::mem::take(&mut conn.inbuf);
            buf.extend_from_slice(data);
            let used = self.handle_frames(conn, slot, session, &buf, now);
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
        if conn.inbuf.len() > INBUF_LIMIT && conn.closing == Closing::No {
            debug!(
                session,
                waiting = conn.inbuf.len(),
                "client input over the bound; cutting it off"
            );
            self.shared.metrics.input_floods_cut.inc();
            conn.inbuf = Vec::new();
            self.refuse(conn, slot, ErrorCode::RateLimited, "sending faster than allowed", 0);
            self.close(conn, slot, session, Closing::AfterFlush);
        }
    }

    /// Handles every whole frame at the front of `data` that the connection's input budget
    /// pays for; returns the bytes consumed. When the budget runs out, reading pauses.
    pub(super) fn handle_frames(
        &mut self,
        conn: &mut Conn,
        slot: u32,
        session: u64,
        data: &[u8],
        now: Instant,
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
                    let cost = u32::try_from(header.total_len()).unwrap_or(u32::MAX);
                    if !conn.frames.has(frame_rate, 1, now) || !conn.bytes.has(byte_rate, cost, now)
                    {
                        conn.read_paused = true;
                        break;
                    }
                    conn.frames.spend(1);
                    conn.bytes.spend(cost);
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
