//! Assembles one round's output: per gateway link, one `Delivery` per connection holding
//! all of that connection's frames back to back, encoded once and never touched again.

use rustc_hash::FxHashMap;

use meridian_protocol::encode_frame;
use meridian_protocol::pb::{server_message::Kind, ErrorCode, ServerMessage};
use meridian_rpc::pb::{Delivery, ShardBatch};

use crate::actor::LinkId;

/// Starting size of a connection's frame buffer in a round: a few notifications fit
/// without growing it (growing showed as ~4% of a busy shard's time in realloc).
const FRAMES_CAPACITY: usize = 256;

#[derive(Default)]
struct LinkOut {
    deliveries: Vec<Delivery>,
    frames: Vec<Vec<u8>>,
    by_session: FxHashMap<u64, usize>,
}

/// Output of one round of the world task. Reused across rounds: the maps keep their
/// capacity; only the frame buffers handed to gRPC are new.
#[derive(Default)]
pub struct Outbox {
    links: FxHashMap<LinkId, LinkOut>,
    pub n_messages: u64,
    /// Errors among them, by code (for the errors-by-code metric).
    pub n_errors: Vec<(ErrorCode, u64)>,
}

impl Outbox {
    fn slot(&mut self, link: LinkId, session: u64) -> (&mut LinkOut, usize) {
        let out = self.links.entry(link).or_default();
        let index = *out.by_session.entry(session).or_insert_with(|| {
            out.deliveries.push(Delivery { session, ..Default::default() });
            out.frames.push(Vec::with_capacity(FRAMES_CAPACITY));
            out.deliveries.len() - 1
        });
        (out, index)
    }

    /// Appends one framed message for a connection.
    pub fn push(&mut self, link: LinkId, session: u64, message: &ServerMessage) {
        let (out, index) = self.slot(link, session);
        encode_frame(message, &mut out.frames[index]);
        self.count(message);
    }

    /// Appends the answer to a Move (its ack or its error), counted for the gateway.
    pub fn push_move_answer(&mut self, link: LinkId, session: u64, message: &ServerMessage) {
        let (out, index) = self.slot(link, session);
        encode_frame(message, &mut out.frames[index]);
        out.deliveries[index].move_answers += 1;
        self.count(message);
    }

    fn count(&mut self, message: &ServerMessage) {
        self.n_messages += 1;
        if let Some(Kind::Error(error)) = &message.kind {
            let code = ErrorCode::try_from(error.code).unwrap_or(ErrorCode::ErrorUnspecified);
            match self.n_errors.iter_mut().find(|(c, _)| *c == code) {
                Some((_, n)) => *n += 1,
                None => self.n_errors.push((code, 1)),
            }
        }
    }

    /// Records the player's latest position and ownership generation for the gateway.
    pub fn track(&mut self, link: LinkId, session: u64, x: u32, y: u32, generation: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].position = Some(meridian_protocol::pb::Position { x, y });
        out.deliveries[index].generation = generation;
    }

    /// Answers a resume request for a player this shard does not hold.
    pub fn refuse_resume(&mut self, link: LinkId, session: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].resume_refused = true;
    }

    /// Tells the gateway the player now belongs to shard `to` (after these frames).
    pub fn release(&mut self, link: LinkId, session: u64, to: u32) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].released_to = to;
    }

    /// Asks the gateway to close the connection after its frames.
    pub fn close(&mut self, link: LinkId, session: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].close = true;
    }

    /// Takes the batches to send, one per link with output; leaves the outbox empty.
    pub fn drain(&mut self) -> impl Iterator<Item = (LinkId, ShardBatch, u64)> + '_ {
        self.n_messages = 0;
        self.links.iter_mut().filter(|(_, out)| !out.deliveries.is_empty()).map(|(link, out)| {
            out.by_session.clear();
            let mut bytes = 0;
            for (delivery, frames) in out.deliveries.iter_mut().zip(out.frames.drain(..)) {
                bytes += frames.len() as u64;
                delivery.frames = frames.into();
            }
            let deliveries = std::mem::take(&mut out.deliveries);
            (*link, ShardBatch { deliveries }, bytes)
        })
    }

    pub fn forget_link(&mut self, link: LinkId) {
        self.links.remove(&link);
    }
}
