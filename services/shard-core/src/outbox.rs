//! Assembles one round's output: per gateway link, one `Delivery` per connection holding
//! all of that connection's frames back to back, encoded once and never touched again.
//!
//! A round's output for a link goes as as many `ShardBatch`es as the batch limits need
//! (a crowd chatting can make it any size), and a connection whose output alone is over a
//! batch's budget gets it in several deliveries, cut between frames. Each piece counts its
//! own move answers; the position goes with the piece holding the frames it follows, and
//! the handoff marker, the close and the resume refusal with the last piece. The gateway
//! handles a link's deliveries in order, so the client reads the same bytes either way.

use bytes::Bytes;
use rustc_hash::FxHashMap;

use meridian_cluster::ShardId;
use meridian_protocol::pb::{server_message::Kind, ErrorCode, ServerMessage};
use meridian_protocol::{encode_frame, next_frame};
use meridian_rpc::pb::{Delivery, PeerMessage, ShardBatch};
use meridian_rpc::{split_entries, SHARD_BATCH};

use meridian_world::Notification;

use crate::routes::Route;
use crate::types::{LinkId, Memo, MemoAt};

/// Starting size of a connection's frame buffer in a round: a few notifications fit
/// without growing it (growing showed as ~4% of a busy shard's time in realloc).
const FRAMES_CAPACITY: usize = 256;
/// Frame bytes in one `Delivery` at most. The rest of a delivery (session, counts, marker,
/// position) and its key and length in the batch take well under the 256 bytes left.
const MAX_DELIVERY_FRAMES: usize = SHARD_BATCH.max_entry_bytes - 256;

/// One connection's frames this round.
struct Frames {
    bytes: Vec<u8>,
    /// How many of the bytes were there when the position was last tracked.
    tracked_at: usize,
}

#[derive(Default)]
struct LinkOut {
    deliveries: Vec<Delivery>,
    frames: Vec<Frames>,
    by_session: FxHashMap<u64, usize>,
    /// A connection's frame buffer starts this big: the mean a connection of this link
    /// was sent last round (a battle's viewers get kilobytes a round each; growing to
    /// that showed as reallocations and their copies).
    frames_capacity: usize,
    /// Where each move answer ends in its connection's frames: (delivery index, offset),
    /// in the order pushed. Read only to cut a connection's output into pieces.
    move_answer_ends: Vec<(usize, usize)>,
}

/// The last notification [`Outbox::push_shared`] encoded, and its frame: the same
/// notification for the next viewer is copied, not encoded again.
#[derive(Default)]
struct LastShared {
    note: Option<Notification>,
    /// Its frame; empty if the notification has no frame (a game's that it does not send).
    frame: Vec<u8>,
}

/// Output of one round of the world task. Reused across rounds: the links keep their
/// capacity; only the frame buffers handed to gRPC are new.
#[derive(Default)]
pub struct Outbox {
    /// Per link, its output this round (a shard has a gateway link or a few: a scan).
    links: Vec<(LinkId, LinkOut)>,
    /// Counts rounds (and forgotten links), so a [`Memo`] of an earlier one is stale.
    round: u64,
    last_shared: LastShared,
    /// Messages pushed since the last drain.
    n_messages: u64,
    /// Errors among them, by code (for the errors-by-code metric).
    n_errors: Vec<(ErrorCode, u64)>,
}

impl Outbox {
    /// Messages pushed since the last [`Outbox::drain`] (for the notifications metric).
    pub fn n_messages(&self) -> u64 {
        self.n_messages
    }

    /// Errors pushed since the last call, by code.
    pub fn drain_errors(&mut self) -> std::vec::Drain<'_, (ErrorCode, u64)> {
        self.n_errors.drain(..)
    }

    fn slot(&mut self, link: LinkId, session: u64) -> (&mut LinkOut, usize) {
        slot(&mut self.links, link, session)
    }

    /// Appends the frame of `note`, which many viewers may be sent in a row, for a
    /// connection: `message` makes its message (`None`: nothing is sent for it), called
    /// only when `note` differs from the last one pushed this way.
    /// `memo` is the viewer's (its seat's): where its output is, if this round has some.
    #[cfg(test)]
    pub(crate) fn push_shared(
        &mut self,
        link: LinkId,
        session: u64,
        memo: &Memo,
        note: &Notification,
        message: impl FnOnce() -> Option<ServerMessage>,
    ) {
        let route = self.route(link, session, memo);
        self.push_shared_at(route, note, message);
    }

    /// Where a connection's output is this round (made if it has none yet): from `memo`,
    /// the viewer's (its seat's), if it is of this round, else found, and `memo` set.
    pub(crate) fn route(&mut self, link: LinkId, session: u64, memo: &Memo) -> Route {
        let at = memo
            .0
            .get()
            .filter(|at| at.round == self.round && at.link == link && at.session == session);
        let (link_at, index) = match at {
            Some(at) => (at.link_at, at.index),
            None => {
                let (link_at, index) = slot_at(&mut self.links, link, session);
                let round = self.round;
                let (link_at, index) = (link_at as u32, index as u32);
                memo.0.set(Some(MemoAt { round, session, link, link_at, index }));
                (link_at, index)
            }
        };
        Route { link_at, index }
    }

    /// [`Outbox::push_shared`] to a connection's output found by [`Outbox::route`] this
    /// round (the outbox's [`Outbox::round`] has not changed since).
    pub(crate) fn push_shared_at(
        &mut self,
        route: Route,
        note: &Notification,
        message: impl FnOnce() -> Option<ServerMessage>,
    ) {
        let last = &mut self.last_shared;
        if last.note.as_ref() != Some(note) {
            last.frame.clear();
            if let Some(message) = message() {
                encode_frame(&message, &mut last.frame);
            }
            last.note = Some(note.clone());
        }
        if last.frame.is_empty() {
            return;
        }
        let out = &mut self.links[route.link_at as usize].1;
        out.frames[route.index as usize].bytes.extend_from_slice(&last.frame);
        // Never an error: notifications are news about others.
        self.n_messages += 1;
    }

    /// Counts rounds and forgotten links: a [`Route`] found in another is stale.
    pub(crate) fn round(&self) -> u64 {
        self.round
    }

    /// Appends one framed message for a connection.
    pub fn push(&mut self, link: LinkId, session: u64, message: &ServerMessage) {
        let (out, index) = self.slot(link, session);
        encode_frame(message, &mut out.frames[index].bytes);
        self.count(message);
    }

    /// Appends the answer to a Move (its ack or its error), counted for the gateway.
    pub fn push_move_answer(&mut self, link: LinkId, session: u64, message: &ServerMessage) {
        let (out, index) = self.slot(link, session);
        let frames = &mut out.frames[index].bytes;
        encode_frame(message, frames);
        out.move_answer_ends.push((index, frames.len()));
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
        out.frames[index].tracked_at = out.frames[index].bytes.len();
    }

    /// Records the player's private game state for the gateway (kept to restore it).
    pub fn private_state(&mut self, link: LinkId, session: u64, state: &[u8]) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].has_state = true;
        out.deliveries[index].state = state.to_vec();
    }

    /// Gives the gateway the budgets a resumed player's last connection left with.
    pub fn budgets(&mut self, link: LinkId, session: u64, budgets: meridian_rpc::pb::Budgets) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].budgets = Some(budgets);
    }

    /// Answers a resume request for a player this shard does not hold.
    pub fn refuse_resume(&mut self, link: LinkId, session: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].resume_refused = true;
    }

    /// Tells the gateway the player now belongs to shard `to` (after these frames; its
    /// registration `incarnation`, 0 if unknown), ending its ownership generation `ends` here.
    pub fn release(&mut self, link: LinkId, session: u64, to: u32, incarnation: u64, ends: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].released_to = to;
        out.deliveries[index].released_incarnation = incarnation;
        out.deliveries[index].released_generation = ends;
    }

    /// Asks the gateway to close the connection after its frames.
    pub fn close(&mut self, link: LinkId, session: u64) {
        let (out, index) = self.slot(link, session);
        out.deliveries[index].close = true;
    }

    /// Takes the round's output: per link with output, its batches in the order they must
    /// be sent, each within the batch limits, and the frame bytes in them. Leaves the
    /// outbox empty.
    pub fn drain(&mut self) -> impl Iterator<Item = (LinkId, Vec<ShardBatch>, u64)> + '_ {
        self.n_messages = 0;
        self.round += 1;
        self.links.iter_mut().filter(|(_, out)| !out.deliveries.is_empty()).map(|(link, out)| {
            let (deliveries, bytes) = out.take();
            let batches = split_entries(deliveries, SHARD_BATCH)
                .into_iter()
                .map(|deliveries| ShardBatch { deliveries, refused: String::new() })
                .collect();
            (*link, batches, bytes)
        })
    }

    pub fn forget_link(&mut self, link: LinkId) {
        // The links after it move up: every memo of this round is stale.
        self.links.retain(|(l, _)| *l != link);
        self.round += 1;
    }
}

/// The index of a connection's delivery in its link's output this round, made if new.
fn slot(links: &mut Vec<(LinkId, LinkOut)>, link: LinkId, session: u64) -> (&mut LinkOut, usize) {
    let (link_at, index) = slot_at(links, link, session);
    (&mut links[link_at].1, index)
}

/// Where a connection's delivery is this round (its link's place in `links`, its index in
/// that link's output), made if new.
fn slot_at(links: &mut Vec<(LinkId, LinkOut)>, link: LinkId, session: u64) -> (usize, usize) {
    let link_at = match links.iter().position(|(l, _)| *l == link) {
        Some(at) => at,
        None => {
            links.push((link, LinkOut::default()));
            links.len() - 1
        }
    };
    let out = &mut links[link_at].1;
    let index = *out.by_session.entry(session).or_insert_with(|| {
        out.deliveries.push(Delivery { session, ..Default::default() });
        let bytes = Vec::with_capacity(out.frames_capacity.max(FRAMES_CAPACITY));
        out.frames.push(Frames { bytes, tracked_at: 0 });
        out.deliveries.len() - 1
    });
    (link_at, index)
}

impl LinkOut {
    /// The round's deliveries with their frames in, a connection's output over the budget
    /// cut into several; and the frame bytes. Leaves the link empty for the next round.
    fn take(&mut self) -> (Vec<Delivery>, u64) {
        self.by_session.clear();
        let bytes = self.frames.iter().map(|f| f.bytes.len() as u64).sum();
        let mean = bytes as usize / self.frames.len().max(1);
        self.frames_capacity = mean.next_power_of_two().min(MAX_DELIVERY_FRAMES);
        let mut deliveries = std::mem::take(&mut self.deliveries);
        if self.frames.iter().all(|f| f.bytes.len() <= MAX_DELIVERY_FRAMES) {
            for (delivery, frames) in deliveries.iter_mut().zip(self.frames.drain(..)) {
                delivery.frames = frames.bytes.into();
            }
        } else {
            let mut pieces = Vec::with_capacity(deliveries.len() + 1);
            for (index, (mut delivery, frames)) in
                deliveries.into_iter().zip(self.frames.drain(..)).enumerate()
            {
                if frames.bytes.len() <= MAX_DELIVERY_FRAMES {
                    delivery.frames = frames.bytes.into();
                    pieces.push(delivery);
                    continue;
                }
                // Scanned per oversized connection: rare, and a round has few of them.
                let ends = self.move_answer_ends.iter().filter(|(i, _)| *i == index);
                let ends = ends.map(|(_, end)| *end);
                split_delivery(delivery, frames, ends, MAX_DELIVERY_FRAMES, &mut pieces);
            }
            deliveries = pieces;
        }
        self.move_answer_ends.clear();
        (deliveries, bytes)
    }
}

/// Cuts one connection's output into deliveries of at most `max_frames` frame bytes (one
/// frame bigger than that goes alone), between frames, in order. `answer_ends` are where
/// its move answers end, ascending.
fn split_delivery(
    whole: Delivery,
    frames: Frames,
    answer_ends: impl Iterator<Item = usize>,
    max_frames: usize,
    into: &mut Vec<Delivery>,
) {
    let bytes = Bytes::from(frames.bytes);
    let mut cuts = Vec::new();
    let (mut start, mut at) = (0, 0);
    while at < bytes.len() {
        let frame_len = match next_frame(&bytes[at..], usize::MAX) {
            Ok(Some(header)) => header.total_len(),
            // Frames encoded here are whole; were one not, the rest would go as it is.
            Ok(None) | Err(_) => bytes.len() - at,
        };
        if at > start && at + frame_len - start > max_frames {
            cuts.push(at);
            start = at;
        }
        at += frame_len;
    }
    cuts.push(bytes.len());
    let mut answer_ends = answer_ends.peekable();
    let (mut start, mut answers_before) = (0, 0);
    let last = cuts.len() - 1;
    for (n, end) in cuts.into_iter().enumerate() {
        let mut piece = Delivery {
            session: whole.session,
            frames: bytes.slice(start..end),
            ..Default::default()
        };
        while answer_ends.next_if(|&answer_end| answer_end <= end).is_some() {
            piece.move_answers += 1;
        }
        let tracked = frames.tracked_at;
        let position_here = if tracked == 0 { n == 0 } else { start < tracked && tracked <= end };
        if position_here {
            piece.position = whole.position;
            piece.generation = whole.generation;
        }
        if n == 0 {
            // With the resume's answer, which a session's first frames are.
            piece.budgets = whole.budgets;
        }
        if n == last {
            // Whatever was not placed by offset (nothing, unless the counts disagree) goes
            // last, so the pieces always add up to the whole.
            piece.move_answers = whole.move_answers.saturating_sub(answers_before);
            piece.released_to = whole.released_to;
            piece.released_incarnation = whole.released_incarnation;
            piece.close = whole.close;
            piece.resume_refused = whole.resume_refused;
            piece.has_state = whole.has_state;
            piece.state = whole.state.clone();
        }
        answers_before += piece.move_answers;
        into.push(piece);
        start = end;
    }
}

/// One round's messages for peer shards, by peer, taken whole when the round ends.
/// Peers come out in id order, so the same round always gives the same output.
#[derive(Default)]
pub struct PeerRounds {
    rounds: std::collections::BTreeMap<ShardId, Vec<PeerMessage>>,
}

impl PeerRounds {
    pub fn push(&mut self, to: ShardId, message: PeerMessage) {
        self.rounds.entry(to).or_default().push(message);
    }

    /// Every peer's round with messages in it, in peer id order; leaves the rounds empty
    /// (keeping each peer's buffer's capacity is not worth a clone: the messages move on).
    pub fn drain(&mut self) -> impl Iterator<Item = (ShardId, Vec<PeerMessage>)> + '_ {
        self.rounds
            .iter_mut()
            .filter(|(_, messages)| !messages.is_empty())
            .map(|(to, messages)| (*to, std::mem::take(messages)))
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use meridian_protocol::server;

    use super::*;

    /// The link the helpers' rounds are for.
    pub const LINK: LinkId = LinkId(1);

    /// Every batch of the round for `LINK`, in order.
    pub fn drained(outbox: &mut Outbox) -> Vec<ShardBatch> {
        outbox
            .drain()
            .filter(|(link, _, _)| *link == LINK)
            .flat_map(|(_, batches, _)| batches)
            .collect()
    }

    /// What one connection is sent in the big round: chats, with a move answer (the
    /// connection's own ack) after every 16th and its position tracked with it.
    pub fn big_round(outbox: &mut Outbox, session: u64, chats: u64) -> Vec<u8> {
        let text = "x".repeat(256);
        let mut expected = Vec::new();
        for i in 1..=chats {
            let chat = server::chat(i, text.as_str());
            encode_frame(&chat, &mut expected);
            outbox.push(LINK, session, &chat);
            if i % 16 == 0 {
                let ack = server::moved(session, i as u32, 0, i);
                encode_frame(&ack, &mut expected);
                outbox.push_move_answer(LINK, session, &ack);
                outbox.track(LINK, session, i as u32, 0, 3);
            }
        }
        expected
    }
}

#[cfg(test)]
mod tests {
    use meridian_protocol::server;
    use meridian_rpc::MAX_DELIVERIES_PER_BATCH;
    use prost::Message;

    use super::testing::{drained, LINK};
    use super::*;

    /// The messages in a run of frames.
    fn decode(mut frames: &[u8]) -> Vec<ServerMessage> {
        let mut messages = Vec::new();
        while let Some(header) = next_frame(frames, usize::MAX).expect("whole frames") {
            messages.push(ServerMessage::decode(header.body(frames)).expect("a message"));
            frames = &frames[header.total_len()..];
        }
        assert!(frames.is_empty(), "a piece ends between frames");
        messages
    }

    fn is_move_answer(message: &ServerMessage) -> bool {
        matches!(&message.kind, Some(Kind::Moved(m)) if m.client_time != 0)
            || matches!(&message.kind, Some(Kind::Error(_)))
    }

    #[test]
    fn a_connection_over_the_budget_is_cut_between_frames_each_piece_with_its_own_counts() {
        let mut outbox = Outbox::default();
        let mut expected = Vec::new();
        for i in 1..=40u64 {
            let chat = server::chat(i, "y".repeat(i as usize * 5));
            encode_frame(&chat, &mut expected);
            outbox.push(LINK, 9, &chat);
            if i % 3 == 0 {
                let answer = if i % 2 == 0 {
                    server::moved(9, 1, 1, i)
                } else {
                    server::error(ErrorCode::RateLimited, "slow down", i)
                };
                encode_frame(&answer, &mut expected);
                outbox.push_move_answer(LINK, 9, &answer);
            }
            if i == 25 {
                outbox.track(LINK, 9, 25, 26, 4);
            }
        }
        outbox.release(LINK, 9, 3, 0, 1);
        outbox.close(LINK, 9);
        let (link_out, _) = outbox.slot(LINK, 9);
        let whole = std::mem::take(&mut link_out.deliveries[0]);
        let frames =
            std::mem::replace(&mut link_out.frames[0], Frames { bytes: Vec::new(), tracked_at: 0 });
        let tracked_at = frames.tracked_at;
        let ends: Vec<usize> = link_out.move_answer_ends.iter().map(|(_, end)| *end).collect();
        let mut pieces = Vec::new();
        split_delivery(whole, frames, ends.into_iter(), 700, &mut pieces);

        assert!(pieces.len() > 5, "cut: {} pieces", pieces.len());
        let mut joined = Vec::new();
        let mut at = 0;
        for (n, piece) in pieces.iter().enumerate() {
            assert_eq!(piece.session, 9);
            assert!(piece.frames.len() <= 700, "piece {n} within the budget");
            let messages = decode(&piece.frames);
            let answers = messages.iter().filter(|m| is_move_answer(m)).count() as u32;
            assert_eq!(piece.move_answers, answers, "piece {n} counts its own move answers");
            let holds_tracked = at < tracked_at && tracked_at <= at + piece.frames.len();
            assert_eq!(piece.position.is_some(), holds_tracked, "piece {n}: position");
            let last = n == pieces.len() - 1;
            assert_eq!((piece.released_to, piece.close), if last { (3, true) } else { (0, false) });
            at += piece.frames.len();
            joined.extend_from_slice(&piece.frames);
        }
        assert_eq!(joined, expected, "the same bytes in the same order");
        let tracked = pieces.iter().find_map(|p| p.position.map(|at| (at, p.generation)));
        assert_eq!(tracked, Some((meridian_protocol::pb::Position { x: 25, y: 26 }, 4)));
    }

    #[test]
    fn a_position_tracked_before_any_frame_goes_with_the_first_piece() {
        let frames = {
            let mut bytes = Vec::new();
            for i in 1..=10 {
                encode_frame(&server::chat(i, "z".repeat(100)), &mut bytes);
            }
            Frames { bytes, tracked_at: 0 }
        };
        let position = Some(meridian_protocol::pb::Position { x: 1, y: 2 });
        let whole = Delivery { session: 1, position, generation: 2, ..Default::default() };
        let mut pieces = Vec::new();
        split_delivery(whole, frames, std::iter::empty(), 300, &mut pieces);
        assert!(pieces.len() > 1);
        let with_position: Vec<bool> = pieces.iter().map(|p| p.position.is_some()).collect();
        assert!(with_position[0] && with_position[1..].iter().all(|p| !p));
    }

    #[test]
    fn a_round_within_the_limits_is_one_batch_and_many_connections_are_cut_by_count() {
        let mut outbox = Outbox::default();
        for session in 1..=3 {
            outbox.push(LINK, session, &server::pong(session));
        }
        let batches = drained(&mut outbox);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].deliveries.len(), 3, "one delivery per connection");
        for session in 1..=MAX_DELIVERIES_PER_BATCH as u64 + 10 {
            outbox.push(LINK, session, &server::pong(session));
        }
        let batches = drained(&mut outbox);
        let counts: Vec<usize> = batches.iter().map(|b| b.deliveries.len()).collect();
        assert_eq!(counts, vec![MAX_DELIVERIES_PER_BATCH, 10]);
        let sessions: Vec<u64> =
            batches.iter().flat_map(|b| b.deliveries.iter().map(|d| d.session)).collect();
        assert_eq!(sessions, (1..=MAX_DELIVERIES_PER_BATCH as u64 + 10).collect::<Vec<_>>());
        assert!(drained(&mut outbox).is_empty(), "the outbox is empty after a drain");
    }
}

#[cfg(test)]
mod memo_tests {
    use meridian_protocol::server;
    use meridian_world::{PlayerId, Position};

    use super::*;

    fn moved(subject: u64, x: u32) -> (Notification, ServerMessage) {
        let position = Position { x, y: 0 };
        let note = Notification::Moved { subject: PlayerId(subject), position, client_time: 0 };
        (note, server::moved(subject, x, 0, 0))
    }

    /// Per link, per session, the frames of the round.
    fn round(outbox: &mut Outbox) -> Vec<(LinkId, u64, Vec<u8>)> {
        let mut out: Vec<_> = outbox
            .drain()
            .flat_map(|(link, batches, _)| {
                batches
                    .into_iter()
                    .flat_map(|b| b.deliveries)
                    .map(move |d| (link, d.session, d.frames.to_vec()))
            })
            .collect();
        out.sort();
        out
    }

    /// The memo of a viewer's place in the outbox saves finding it again, and never sends
    /// its output astray: not in the next round, not after a link before it is forgotten,
    /// not when the seat moved to another link or session.
    #[test]
    fn a_viewers_memo_finds_its_own_output_and_only_this_rounds() {
        let (a, b, other) = (LinkId(1), LinkId(2), LinkId(3));
        let (memo_x, memo_y) = (Memo::default(), Memo::default());
        let mut outbox = Outbox::default();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for n in 0..3 {
            let (note, message) = moved(100 + n, n as u32);
            outbox.push_shared(b, 7, &memo_x, &note, || Some(message.clone()));
            outbox.push_shared(b, 8, &memo_y, &note, || Some(message.clone()));
            // Another path to the same connection's output lands in the same place.
            let ack = server::moved(7, 9, 9, 1 + n);
            outbox.push_move_answer(b, 7, &ack);
            for frame in [&message, &ack] {
                encode_frame(frame, &mut x);
            }
            encode_frame(&message, &mut y);
        }
        assert_eq!(round(&mut outbox), vec![(b, 7, x.clone()), (b, 8, y)]);

        // Next round: link `a` comes first, then `b`'s place moves up when `a` is forgotten.
        let (note, message) = moved(200, 1);
        outbox.push_shared(a, 7, &Memo::default(), &note, || Some(message.clone()));
        outbox.push_shared(b, 7, &memo_x, &note, || Some(message.clone()));
        outbox.forget_link(a);
        let (note, later) = moved(201, 2);
        outbox.push_shared(b, 7, &memo_x, &note, || Some(later.clone()));
        // The seat moved: the same memo, another link and session.
        outbox.push_shared(other, 9, &memo_x, &note, || Some(later.clone()));
        x.clear();
        encode_frame(&message, &mut x);
        encode_frame(&later, &mut x);
        let mut moved_seat = Vec::new();
        encode_frame(&later, &mut moved_seat);
        assert_eq!(round(&mut outbox), vec![(b, 7, x), (other, 9, moved_seat)]);
        assert!(round(&mut outbox).is_empty(), "a drained outbox is empty");
    }
}
