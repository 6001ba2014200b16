//! Target `frame`: the client codec of `meridian-protocol`.
//!
//! Input: `limit (1) | n (1) | piece lengths (n % 16 bytes) | stream`. `limit` picks the
//! largest frame body from [`LIMITS`]; the stream is pushed into a `FrameReader` in pieces
//! of the given lengths (each byte + 1, used in turn; none: one piece), draining every
//! whole frame after each piece.
//!
//! Properties:
//! - nothing panics, whatever the bytes and the cut points;
//! - the reader sees the same frames, and the same error at the same place, as
//!   `next_frame` walking the whole stream at once: where the stream is cut never matters;
//! - after a drain that stops for want of bytes, the reader holds less than
//!   `limit + MAX_PREFIX_BYTES` bytes (at most a prefix and an incomplete body: what it
//!   buffers is bounded by the limit, not by the peer); after an error the caller closes;
//! - every body that decodes as a `ClientMessage` or `ServerMessage` re-encodes to a frame
//!   that decodes to the same message (round trip), and the validators agree with the
//!   limits the protocol states for the fields they judge.

use meridian_protocol::pb::{client_message, server_message, ClientMessage, ServerMessage};
use meridian_protocol::{
    decode_body, encode_frame, next_frame, validate_chat, validate_direction, validate_name,
    FrameError, FrameHeader, FrameReader, InvalidArgument, DEFAULT_MAX_FRAME, MAX_CHAT_BYTES,
    MAX_NAME_BYTES, MAX_PREFIX_BYTES,
};
use prost::Message;

use crate::Cursor;

/// Largest frame bodies the target tries: the default, the extremes and varint edges.
pub const LIMITS: [usize; 8] = [DEFAULT_MAX_FRAME, 0, 1, 64, 127, 128, 16_383, 16_384];

/// How a stream of frames ends: cleanly, with an incomplete frame, or with an error.
#[derive(Debug, PartialEq)]
enum End {
    /// Bytes of an incomplete frame (possibly none).
    Incomplete(Vec<u8>),
    Error(FrameError),
}

pub fn check(data: &[u8]) {
    let mut input = Cursor::new(data);
    let limit = LIMITS[usize::from(input.u8()) % LIMITS.len()];
    let n_pieces = usize::from(input.u8() % 16);
    let pieces: Vec<usize> = input.bytes(n_pieces).iter().map(|&b| usize::from(b) + 1).collect();
    let stream = input.rest();

    let (bodies, end) = whole(stream, limit);
    let (read_bodies, read_end) = pieced(stream, &pieces, limit);
    assert_eq!(read_bodies, bodies, "FrameReader and next_frame disagree on the frames");
    assert_eq!(read_end, end, "FrameReader and next_frame disagree on how the stream ends");

    for body in &bodies {
        check_body(body);
    }
    // The stream as one body too: most fuzz inputs are not frames at all.
    check_body(stream);
    check_validators(stream);
}

/// The frames of `stream` by `next_frame` alone, over the whole stream at once.
fn whole(stream: &[u8], limit: usize) -> (Vec<Vec<u8>>, End) {
    let mut bodies = Vec::new();
    let mut at = 0;
    loop {
        match next_frame(&stream[at..], limit) {
            Ok(Some(header)) => {
                check_header(header, &stream[at..], limit);
                bodies.push(header.body(&stream[at..]).to_vec());
                at += header.total_len();
            }
            Ok(None) => return (bodies, End::Incomplete(stream[at..].to_vec())),
            Err(error) => return (bodies, End::Error(error)),
        }
    }
}

/// The frames of `stream` through a `FrameReader`, fed in pieces.
fn pieced(stream: &[u8], pieces: &[usize], limit: usize) -> (Vec<Vec<u8>>, End) {
    let mut reader = FrameReader::new(limit);
    let mut bodies = Vec::new();
    let mut rest = stream;
    let mut turn = 0;
    loop {
        let take = pieces.get(turn % pieces.len().max(1)).copied().unwrap_or(rest.len());
        let (piece, after) = rest.split_at(take.min(rest.len()));
        rest = after;
        turn += 1;
        reader.extend(piece);
        loop {
            match reader.next_body() {
                Ok(Some(body)) => bodies.push(body.to_vec()),
                Ok(None) => break,
                Err(error) => return (bodies, End::Error(error)),
            }
        }
        let held = reader.buffered().len();
        assert!(
            held < limit + MAX_PREFIX_BYTES,
            "the reader holds {held} bytes after a drain; the limit is {limit}"
        );
        if rest.is_empty() {
            return (bodies, End::Incomplete(reader.buffered().to_vec()));
        }
    }
}

fn check_header(header: FrameHeader, buf: &[u8], limit: usize) {
    assert!(header.body_len <= limit, "a frame over the limit was accepted");
    assert!((1..=MAX_PREFIX_BYTES).contains(&header.prefix_len));
    assert!(header.total_len() <= buf.len());
}

/// Decodes a body both ways; whatever decodes must survive a round trip.
fn check_body(body: &[u8]) {
    if let Ok(message) = decode_body::<ClientMessage>(body) {
        round_trip(&message);
        check_client_fields(&message);
    }
    if let Ok(message) = decode_body::<ServerMessage>(body) {
        round_trip(&message);
        if let Some(server_message::Kind::Error(error)) = &message.kind {
            // Codes are an open enum: a value outside the table is kept, not refused.
            let _ = meridian_protocol::pb::ErrorCode::try_from(error.code);
        }
    }
}

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(message: &M) {
    let mut wire = Vec::new();
    encode_frame(message, &mut wire);
    let header = next_frame(&wire, usize::MAX)
        .expect("an encoded frame has a valid prefix")
        .expect("an encoded frame is complete");
    assert_eq!(header.total_len(), wire.len(), "one message encodes to exactly one frame");
    assert_eq!(header.body_len, message.encoded_len());
    let again: M = decode_body(header.body(&wire)).expect("an encoded message decodes");
    assert_eq!(&again, message, "decode(encode(message)) != message");
    let mut reader = FrameReader::new(header.body_len);
    reader.extend(&wire);
    let read: M = reader.next_message().expect("decodes").expect("complete");
    assert_eq!(&read, message, "FrameReader::next_message disagrees with decode_body");
}

fn check_client_fields(message: &ClientMessage) {
    match &message.kind {
        Some(client_message::Kind::Login(login)) => check_name(&login.name),
        Some(client_message::Kind::Chat(chat)) => check_chat(&chat.text),
        Some(client_message::Kind::Move(m)) => check_direction(m.direction),
        Some(client_message::Kind::Action(action)) => {
            let valid = action.kind != 0 && action.payload.len() <= 1024;
            assert_eq!(meridian_protocol::validate_action(action).is_ok(), valid, "{action:?}");
        }
        _ => {}
    }
}

/// What DESIGN.md section 2b forbids in names and chat, written out again here so the
/// validators are checked against the text of the rule, not against themselves: control
/// characters and the bidirectional formatting characters.
fn forbidden(c: char) -> bool {
    let code = u32::from(c);
    code < 0x20
        || (0x7f..=0x9f).contains(&code)
        || [0x200e, 0x200f, 0x061c].contains(&code)
        || (0x202a..=0x202e).contains(&code)
        || (0x2066..=0x2069).contains(&code)
}

/// The line and paragraph separators (docs/protocol.md: refused in names and chat).
fn separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// A name is refused if it is empty or holds a forbidden character or a separator; a name
/// taken comes back normalised: 1..=32 bytes, without those characters or zero-width ones,
/// with single inner spaces only, and taken again as itself (the normal form is stable).
fn check_name(name: &str) {
    let result = validate_name(name);
    if name.is_empty() {
        assert_eq!(result, Err(InvalidArgument::EmptyName));
    }
    if name.chars().any(|c| forbidden(c) || separator(c)) {
        assert!(result.is_err(), "validate_name({name:?}) took {result:?}");
    }
    if let Ok(stored) = &result {
        assert!(!stored.is_empty() && stored.len() <= MAX_NAME_BYTES, "{name:?} -> {stored:?}");
        let zero_width = |c: char| matches!(c, '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}');
        let bad = |c: char| forbidden(c) || separator(c) || zero_width(c);
        assert!(!stored.chars().any(bad), "{name:?} -> {stored:?}");
        assert!(!stored.starts_with(' ') && !stored.ends_with(' ') && !stored.contains("  "));
        assert_eq!(validate_name(stored).as_ref(), Ok(stored), "{name:?} -> {stored:?}");
    }
}

fn check_chat(text: &str) {
    let expected = match text.len() {
        0 => Err(InvalidArgument::EmptyChat),
        n if n > MAX_CHAT_BYTES => Err(InvalidArgument::ChatTooLong(n)),
        _ => match text.chars().find(|c| forbidden(*c) || separator(*c)) {
            Some(c) if separator(c) => Err(InvalidArgument::ChatSeparator(u32::from(c))),
            Some(c) => Err(InvalidArgument::ChatCharacter(u32::from(c))),
            None => Ok(()),
        },
    };
    assert_eq!(validate_chat(text), expected, "validate_chat({text:?})");
}

fn check_direction(raw: i32) {
    match validate_direction(raw) {
        Ok(direction) => {
            assert!((1..=4).contains(&raw), "direction {raw} accepted");
            assert_eq!(direction as i32, raw);
        }
        Err(error) => {
            assert!(!(1..=4).contains(&raw), "direction {raw} refused");
            assert_eq!(error, InvalidArgument::BadDirection(raw));
        }
    }
}

/// The validators on raw bytes: as text where they are UTF-8, as a number otherwise.
fn check_validators(stream: &[u8]) {
    let text = match std::str::from_utf8(stream) {
        Ok(text) => text,
        Err(error) => std::str::from_utf8(&stream[..error.valid_up_to()]).expect("valid prefix"),
    };
    check_name(text);
    check_chat(text);
    let mut number = [0u8; 4];
    for (slot, byte) in number.iter_mut().zip(stream) {
        *slot = *byte;
    }
    check_direction(i32::from_le_bytes(number));
}
