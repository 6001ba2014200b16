//! Target `websocket`: the gateway's WebSocket upgrade and framing (`WsState`), what a
//! browser client's bytes go through before the core sees them.
//!
//! Input: `limit (1) | n (1) | piece lengths (n % 16 bytes) | stream`. `limit` picks the
//! frame limit from [`LIMITS`] (bit 7 set: the session was refused admission and is to be
//! told so once upgraded); the stream (an upgrade request, then client frames, as far as it
//! goes) is read in pieces of the given lengths (each byte + 1, used in turn; none: one
//! piece).
//!
//! Properties:
//! - nothing panics, whatever the bytes and the cut points;
//! - the frames handed to the core and the bytes written back are the same however the
//!   stream is cut;
//! - what is handed to the core is whole length-delimited frames within the limit, possibly
//!   followed by one bare prefix announcing a message over it (the core refuses it from the
//!   prefix), and nothing after that;
//! - what is held between reads is bounded by the protocol's limits (twice the request
//!   bound while upgrading; one frame's header and body (at least a control frame's) plus
//!   one message once upgraded),
//!   not by the peer;
//! - the first bytes written back are the upgrade's answer: `101`, or an HTTP error that
//!   ends the session; a refused session ends at its upgrade; nothing is read once ended.

use meridian_gateway::fuzzing::{WsRead, WsState, WS_MAX_REQUEST, WS_UNDECODABLE};
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
    let limit = LIMITS[usize::from(head & 0x7f) % LIMITS.len()];
    let refused = head & 0x80 != 0;
    let n_pieces = usize::from(input.u8() % 16);
    let pieces: Vec<usize> = input.bytes(n_pieces).iter().map(|&b| usize::from(b) + 1).collect();
    let stream = input.rest();

    let whole = read(stream, &[], limit, refused);
    let pieced = read(stream, &pieces, limit, refused);
    assert_eq!(pieced, whole, "where the stream is cut changed what was read");
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

fn read(stream: &[u8], pieces: &[usize], limit: usize, refused: bool) -> Outcome {
    let mut state = WsState::new(refused.then(refusal));
    let mut outcome =
        Outcome { frames: Vec::new(), out: Vec::new(), upgraded: false, ended: false };
    let mut rest = stream;
    let mut turn = 0;
    while !rest.is_empty() {
        let take = pieces.get(turn % pieces.len().max(1)).copied().unwrap_or(rest.len());
        let (piece, after) = rest.split_at(take.min(rest.len()));
        rest = after;
        turn += 1;
        let before = (outcome.frames.len(), outcome.out.len());
        let read: WsRead = state.read(piece, limit, &mut outcome.frames, &mut outcome.out);
        if outcome.ended {
            assert_eq!(before, (outcome.frames.len(), outcome.out.len()), "read after the end");
        }
        outcome.upgraded |= read.upgraded;
        outcome.ended |= read.ended;
        let held = state.held();
        let bound = if outcome.upgraded { 14 + limit.max(125) + limit } else { 2 * WS_MAX_REQUEST };
        assert!(held <= bound, "{held} bytes held between reads; the bound is {bound}");
    }
    outcome
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
