//! Target `websocket`: the gateway's WebSocket upgrade and framing (`WsState`), what a
//! browser client's bytes go through before the core sees them.
//!
//! Input: `head (1) | n (1) | piece lengths (n % 16 bytes) | stream`. Bits 0-2 of `head`
//! pick the frame limit from [`LIMITS`], bits 3-6 the input budget (`b`: the budget pays
//! for `b` frames per read, as if it refilled between reads; 0: it pays for everything),
//! bit 7 says the session was refused admission and is to be told so once upgraded; the
//! stream (an upgrade request, then client frames, as far as it goes) is read in pieces of
//! the given lengths (each byte + 1, used in turn; none: one piece), and then, with the
//! budget refilled before each, with no new bytes until nothing waits for the budget.
//!
//! Properties:
//! - nothing panics, whatever the bytes and the cut points;
//! - the frames handed to the core and the bytes written back are the same however the
//!   stream is cut and however small the budget (frames refused wait, unread, and lose
//!   nothing);
//! - nothing is read before it is paid for: the frames handed to the core are at most the
//!   frames paid for, and the bytes written back after the upgrade's answer (pongs, the
//!   close) at most the bytes paid for; nothing is paid for twice (no more than the
//!   stream's bytes);
//! - what is handed to the core is whole length-delimited frames within the limit, possibly
//!   followed by one bare prefix announcing a message over it (the core refuses it from the
//!   prefix), and nothing after that;
//! - what is held between reads, when nothing waits for the budget, is bounded by the
//!   protocol's limits (twice the request bound while upgrading; one frame's header and
//!   body (at least a control frame's) plus one message once upgraded), not by the peer
//!   (what waits for the budget the core bounds);
//! - the first bytes written back are the upgrade's answer: `101`, or an HTTP error that
//!   ends the session; a refused session ends at its upgrade; nothing is read once ended.

use meridian_gateway_core::fuzzing::{WsRead, WsState, WS_MAX_REQUEST, WS_UNDECODABLE};
use meridian_protocol::next_frame;

use crate::Cursor;

/// Frame limits the target tries: the default, tiny ones and the WebSocket length edges.
pub const LIMITS: [usize; 6] = [4096, 0, 1, 125, 126, 65_536];

/// Everything one way of reading the stream produced.
#[derive(Debug, PartialEq)]
struct Outcome {
    frames: Vec<u8>,
    out: Vec<u8>,
    upgraded: bool,
    ended: bool,
}

pub fn check(data: &[u8]) {
    let mut input = Cursor::new(data);
    let head = input.u8();
    let limit = LIMITS[usize::from(head & 0x07) % LIMITS.len()];
    let budget = u32::from((head >> 3) & 0x0f);
    let refused = head & 0x80 != 0;
    let n_pieces = usize::from(input.u8() % 16);
    let pieces: Vec<usize> = input.bytes(n_pieces).iter().map(|&b| usize::from(b) + 1).collect();
    let stream = input.rest();

    let whole = read(stream, &[], limit, refused, 0);
    let pieced = read(stream, &pieces, limit, refused, budget);
    assert_eq!(pieced, whole, "where the stream is cut, or the budget, changed what was read");
    check_frames(&whole.frames, limit);
    if whole.upgraded {
        assert!(whole.out.starts_with(b"HTTP/1.1 101 "), "upgraded without a 101");
    } else if !whole.out.is_empty() {
        assert!(whole.out.starts_with(b"HTTP/1.1 4"), "an answer that is no HTTP error");
        assert!(whole.ended, "a failed upgrade must end the session");
        assert!(whole.frames.is_empty(), "frames read without an upgrade");
    }
    if refused && whole.upgraded {
        assert!(whole.ended && whole.frames.is_empty(), "a refused session was served");
    }
}

fn refusal() -> Vec<u8> {
    let mut frame = Vec::new();
    let error = meridian_protocol::server::error(
        meridian_protocol::pb::ErrorCode::Unavailable,
        "server full",
        0,
    );
    meridian_protocol::encode_frame(&error, &mut frame);
    frame
}

/// What the budget paid for so far.
#[derive(Default)]
struct Paid {
    frames: usize,
    bytes: usize,
}

/// Reads `stream` in `pieces` with a budget of `budget` frames per read (0: unlimited),
/// then reads on with no new bytes while frames wait for the budget.
fn read(stream: &[u8], pieces: &[usize], limit: usize, refused: bool, budget: u32) -> Outcome {
    let mut state = WsState::new(refused.then(refusal));
    let mut outcome =
        Outcome { frames: Vec::new(), out: Vec::new(), upgraded: false, ended: false };
    let mut paid = Paid::default();
    // Where the upgrade's answer ends in `out` (what follows it must be paid for).
    let mut answered = None;
    let mut rest = stream;
    let mut turn = 0;
    let mut waiting = false;
    // Every read with frames waiting pays for at least one (the budget is at least one
    // frame), so this many reads with no new bytes read everything that waits.
    let mut drains_left = stream.len() / 6 + 1;
    while !rest.is_empty() || (waiting && !outcome.ended) {
        let piece = if rest.is_empty() {
            assert!(drains_left > 0, "frames still wait after every one was paid for");
            drains_left -= 1;
            &[][..]
        } else {
            let take = pieces.get(turn % pieces.len().max(1)).copied().unwrap_or(rest.len());
            let (piece, after) = rest.split_at(take.min(rest.len()));
            rest = after;
            turn += 1;
            piece
        };
        let before = (outcome.frames.len(), outcome.out.len());
        let mut allowance = budget;
        let mut pay = |size: usize| {
            if budget != 0 {
                if allowance == 0 {
                    return false;
                }
                allowance -= 1;
            }
            paid.frames += 1;
            paid.bytes += size;
            true
        };
        let read: WsRead =
            state.read(piece, limit, &mut pay, &mut outcome.frames, &mut outcome.out);
        if outcome.ended {
            assert_eq!(before, (outcome.frames.len(), outcome.out.len()), "read after the end");
        }
        outcome.upgraded |= read.upgraded;
        outcome.ended |= read.ended;
        waiting = read.waiting;
        if outcome.upgraded && answered.is_none() {
            answered = Some(answer_len(&outcome.out));
        }
        check_paid(&outcome, &paid, answered, refused, stream.len());
        if !waiting {
            let held = state.held();
            let bound =
                if outcome.upgraded { 14 + limit.max(125) + limit } else { 2 * WS_MAX_REQUEST };
            assert!(held <= bound, "{held} bytes held between reads; the bound is {bound}");
        }
    }
    outcome
}

/// The length of the upgrade's answer at the start of `out` (its headers end the first
/// blank line).
fn answer_len(out: &[u8]) -> usize {
    out.windows(4).position(|w| w == b"\r\n\r\n").map_or(out.len(), |at| at + 4)
}

/// Nothing handed to the core or answered that was not paid for, nothing paid twice.
fn check_paid(
    outcome: &Outcome,
    paid: &Paid,
    answered: Option<usize>,
    refused: bool,
    stream: usize,
) {
    assert!(paid.bytes <= stream, "{} bytes paid for out of {stream}", paid.bytes);
    let mut messages = 0;
    let mut at = 0;
    while let Ok(Some(header)) = next_frame(&outcome.frames[at..], usize::MAX) {
        messages += 1;
        at += header.total_len();
    }
    // A refusal at the end (a text or broken frame, a message over the limit) is no
    // message read: nothing of it was paid for.
    let refusals =
        usize::from(at < outcome.frames.len() || outcome.frames.ends_with(&WS_UNDECODABLE));
    assert!(
        messages <= paid.frames + refusals,
        "{messages} messages handed to the core, {} frames paid for",
        paid.frames
    );
    if let (Some(answered), false) = (answered, refused) {
        let written = outcome.out.len() - answered;
        assert!(
            written <= paid.bytes,
            "{written} bytes written back after the upgrade, {} paid for",
            paid.bytes
        );
    }
}

/// Whole frames within the limit, then at most one refusal (the undecodable body, or a
/// bare prefix announcing a message over the limit), then nothing.
fn check_frames(frames: &[u8], limit: usize) {
    let mut at = 0;
    while at < frames.len() {
        let rest = &frames[at..];
        match next_frame(rest, limit) {
            Ok(Some(header)) => at += header.total_len(),
            Ok(None) => panic!("an incomplete frame handed to the core: {rest:?}"),
            Err(_) => {
                let bare_prefix = rest.iter().position(|b| b & 0x80 == 0) == Some(rest.len() - 1);
                assert!(
                    rest == WS_UNDECODABLE || bare_prefix,
                    "not a refusal at the end: {rest:?}"
                );
                return;
            }
        }
    }
}
