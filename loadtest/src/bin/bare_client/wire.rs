//! The few bytes of the client protocol this client needs, written by hand from
//! `proto/client.proto` and `docs/protocol.md`, section 3.
//!
//! Written apart from `meridian-protocol` on purpose: a second client that shared the
//! server's codec would share its mistakes. It encodes three `ClientMessage`s (`Login`,
//! `Move`, `Logout`) the way protobuf does (fields in number order, zero values left out),
//! and it reads a `ServerMessage` only as far as this client must: which kind it is, and
//! for `LoginOk`, `Moved` and `Error` the ids and `client_time` it matches answers by.
//! Everything else in a body is stepped over without being decoded, so the reader costs
//! little per notification.

use std::fmt;

/// The largest frame body either side may send (the prefix not counted).
pub const MAX_FRAME: usize = 4096;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `ClientMessage` oneof fields.
const LOGIN: u32 = 1;
const MOVE: u32 = 2;
const LOGOUT: u32 = 5;

/// `ServerMessage` oneof fields this client tells apart; the others (up to
/// `LAST_SERVER_KIND`) only count as notifications.
const LOGIN_OK: u32 = 1;
const MOVED: u32 = 3;
const ERROR: u32 = 7;
const VIEW_RESET: u32 = 8;
const LAST_SERVER_KIND: u32 = 11;

/// Why bytes from the server cannot be read. Every one of them ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// A length prefix announcing a body over [`MAX_FRAME`] (known before the body, and
    /// sometimes before the prefix is complete).
    FrameTooLarge(u64),
    /// A varint longer than ten bytes or overflowing 64 bits.
    BadVarint,
    /// A body that is not protobuf: a field running past the end, field number 0, a wire
    /// type protobuf does not use, or a known kind without the wire type of a message.
    Malformed(&'static str),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::FrameTooLarge(len) => {
                write!(f, "frame of at least {len} bytes is over the {MAX_FRAME}-byte limit")
            }
            WireError::BadVarint => f.write_str("invalid varint"),
            WireError::Malformed(why) => write!(f, "malformed message body: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// A step direction (`Direction` in the proto; 0 is "unspecified" and never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Up = 1,
    Down = 2,
    Left = 3,
    Right = 4,
}

impl Direction {
    pub const ALL: [Direction; 4] =
        [Direction::Up, Direction::Down, Direction::Left, Direction::Right];
}

/// What one `ServerMessage` means to this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEvent {
    LoginOk {
        player_id: u64,
    },
    Moved {
        player_id: u64,
        client_time: u64,
    },
    Error {
        code: i32,
        client_time: u64,
    },
    ViewReset,
    /// Any other kind (field number), unread: `Entered`, `Left`, `Pong`, ...
    Other(u32),
    /// No kind this client knows: an empty body, or only fields newer than this client.
    Unknown,
}

// ---- encoding -------------------------------------------------------------------------

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

/// A varint field; proto3 leaves zero values out.
fn put_uint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        put_key(out, field, VARINT);
        put_varint(out, value);
    }
}

/// A length-delimited field (string, bytes or message), written even when empty: an empty
/// message in a oneof still says which case is set.
fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends one frame, `varint(len) || ClientMessage{ <case>: inner }`, to `out`.
fn put_client_frame(out: &mut Vec<u8>, case: u32, inner: &[u8]) {
    let mut body = Vec::with_capacity(inner.len() + 3);
    put_bytes(&mut body, case, inner);
    debug_assert!(body.len() <= MAX_FRAME, "invariant: callers keep frames small");
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

/// `Login{name, spawn}`: dev-mode servers put the player at `spawn`.
pub fn put_login(out: &mut Vec<u8>, name: &str, spawn: Option<(u32, u32)>) {
    let mut login = Vec::with_capacity(name.len() + 16);
    put_bytes(&mut login, 1, name.as_bytes());
    if let Some((x, y)) = spawn {
        let mut position = Vec::with_capacity(12);
        put_uint(&mut position, 1, u64::from(x));
        put_uint(&mut position, 2, u64::from(y));
        put_bytes(&mut login, 2, &position);
    }
    put_client_frame(out, LOGIN, &login);
}

/// `Move{direction, client_time}`; the server echoes `client_time` in the mover's ack.
pub fn put_move(out: &mut Vec<u8>, direction: Direction, client_time: u64) {
    let mut step = Vec::with_capacity(12);
    put_uint(&mut step, 1, direction as u64);
    put_uint(&mut step, 2, client_time);
    put_client_frame(out, MOVE, &step);
}

/// `Logout{}`.
pub fn put_logout(out: &mut Vec<u8>) {
    put_client_frame(out, LOGOUT, &[]);
}

// ---- decoding -------------------------------------------------------------------------

/// Reads a varint at the front of `bytes`: `Ok(None)` if it is cut off, else the value
/// and how many bytes it took.
fn varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, WireError> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate() {
        if i == 9 && byte > 1 {
            return Err(WireError::BadVarint);
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    Ok(None)
}

/// Finds the first whole frame in `buf`: `Ok(None)` until it has all arrived, else its
/// body and the bytes it takes (prefix included). The limit is checked on the prefix.
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, WireError> {
    let mut announced = 0u64;
    let mut prefix_len = None;
    for (i, &byte) in buf.iter().take(10).enumerate() {
        if i == 9 && byte > 1 {
            return Err(WireError::BadVarint);
        }
        announced |= u64::from(byte & 0x7f) << (7 * i);
        // A varint only grows with its later bytes: past the limit already is enough.
        if announced > MAX_FRAME as u64 {
            return Err(WireError::FrameTooLarge(announced));
        }
        if byte & 0x80 == 0 {
            prefix_len = Some(i + 1);
            break;
        }
    }
    let Some(prefix_len) = prefix_len else {
        return if buf.len() >= 10 { Err(WireError::BadVarint) } else { Ok(None) };
    };
    let end = prefix_len + announced as usize;
    Ok((buf.len() >= end).then(|| (&buf[prefix_len..end], end)))
}

/// One field of a message body: its number and, for varints, the value; for
/// length-delimited fields, the bytes.
enum Field<'a> {
    Varint(u32, u64),
    Bytes(u32, &'a [u8]),
    /// A fixed-width field, skipped.
    Fixed(u32),
}

/// Steps through the fields of a protobuf body.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Result<Option<Field<'a>>, WireError> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let truncated = WireError::Malformed("a field runs past the end of the body");
        let (key, used) = varint(self.rest)?.ok_or(truncated)?;
        self.rest = &self.rest[used..];
        let number = u32::try_from(key >> 3).map_err(|_| WireError::Malformed("field number"))?;
        if number == 0 {
            return Err(WireError::Malformed("field number 0"));
        }
        let skip = |rest: &mut &'a [u8], n: usize| -> Result<&'a [u8], WireError> {
            if rest.len() < n {
                return Err(truncated);
            }
            let (taken, left) = rest.split_at(n);
            *rest = left;
            Ok(taken)
        };
        match (key & 7) as u8 {
            VARINT => {
                let (value, used) = varint(self.rest)?.ok_or(truncated)?;
                self.rest = &self.rest[used..];
                Ok(Some(Field::Varint(number, value)))
            }
            LEN => {
                let (len, used) = varint(self.rest)?.ok_or(truncated)?;
                self.rest = &self.rest[used..];
                let len = usize::try_from(len).map_err(|_| truncated)?;
                Ok(Some(Field::Bytes(number, skip(&mut self.rest, len)?)))
            }
            FIXED64 => skip(&mut self.rest, 8).map(|_| Some(Field::Fixed(number))),
            FIXED32 => skip(&mut self.rest, 4).map(|_| Some(Field::Fixed(number))),
            _ => Err(WireError::Malformed("a wire type proto3 does not use")),
        }
    }
}

/// The varint fields `wanted` of a message body (0 where absent), in the order asked.
fn uints<const N: usize>(body: &[u8], wanted: [u32; N]) -> Result<[u64; N], WireError> {
    let mut values = [0u64; N];
    let mut fields = Fields { rest: body };
    while let Some(field) = fields.next_field()? {
        if let Field::Varint(number, value) = field {
            if let Some(slot) = wanted.iter().position(|&w| w == number) {
                values[slot] = value;
            }
        }
    }
    Ok(values)
}

/// Reads what this client needs of one `ServerMessage` body.
pub fn read_server_message(body: &[u8]) -> Result<ServerEvent, WireError> {
    // In a oneof the last case on the wire wins, as in every protobuf runtime.
    let mut kind: Option<(u32, &[u8])> = None;
    let mut fields = Fields { rest: body };
    while let Some(field) = fields.next_field()? {
        match field {
            Field::Bytes(number @ 1..=LAST_SERVER_KIND, inner) => kind = Some((number, inner)),
            Field::Varint(1..=LAST_SERVER_KIND, _) | Field::Fixed(1..=LAST_SERVER_KIND) => {
                return Err(WireError::Malformed("a message kind that is not a message"));
            }
            _ => {}
        }
    }
    Ok(match kind {
        None => ServerEvent::Unknown,
        Some((LOGIN_OK, inner)) => {
            let [player_id] = uints(inner, [1])?;
            ServerEvent::LoginOk { player_id }
        }
        Some((MOVED, inner)) => {
            let [player_id, client_time] = uints(inner, [1, 3])?;
            ServerEvent::Moved { player_id, client_time }
        }
        Some((ERROR, inner)) => {
            let [code, client_time] = uints(inner, [1, 3])?;
            // An int32 enum travels as a 64-bit varint; negative codes wrap back here.
            ServerEvent::Error { code: code as i32, client_time }
        }
        Some((VIEW_RESET, _)) => ServerEvent::ViewReset,
        Some((other, _)) => ServerEvent::Other(other),
    })
}

#[cfg(test)]
mod tests {
    use meridian_protocol::pb::{self, client_message, server_message};
    use prost::Message as _;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn frames_match_the_protocol_guide_byte_for_byte() {
        // docs/protocol.md, section 3: "A few frames, byte by byte".
        let mut out = Vec::new();
        put_login(&mut out, "ann", None);
        assert_eq!(hex(&out), "07 0a 05 0a 03 61 6e 6e");
        out.clear();
        put_move(&mut out, Direction::Right, 1);
        assert_eq!(hex(&out), "06 12 04 08 04 10 01");
        out.clear();
        put_logout(&mut out);
        assert_eq!(hex(&out), "02 2a 00");
        let moved = [0x0c, 0x1a, 0x0a, 0x08, 0x03, 0x12, 0x04, 0x08, 0x0b, 0x10, 0x0a, 0x18, 0x01];
        let (body, used) = split_frame(&moved).unwrap().unwrap();
        assert_eq!(used, moved.len());
        assert_eq!(
            read_server_message(body),
            Ok(ServerEvent::Moved { player_id: 3, client_time: 1 })
        );
    }

    /// Our frames decode with the generated types to what was meant, and are exactly the
    /// bytes prost writes for the same message.
    #[test]
    fn client_frames_equal_what_the_generated_types_write() {
        let mut rng = SmallRng::seed_from_u64(17);
        for round in 0..2_000 {
            let client_time = match round % 3 {
                0 => rng.random_range(0..300),
                1 => rng.random(),
                _ => 1 << rng.random_range(0..64),
            };
            let direction = Direction::ALL[round % 4];
            let spawn = (round % 5 != 0).then(|| (rng.random_range(0..3), rng.random()));
            let name = format!("bare-{round}");
            let expected = [
                client_message::Kind::Move(pb::Move { direction: direction as i32, client_time }),
                client_message::Kind::Login(pb::Login {
                    name: name.clone(),
                    spawn: spawn.map(|(x, y)| pb::Position { x, y }),
                    token: String::new(),
                }),
                client_message::Kind::Logout(pb::Logout {}),
            ];
            for (i, kind) in expected.into_iter().enumerate() {
                let mut ours = Vec::new();
                match i {
                    0 => put_move(&mut ours, direction, client_time),
                    1 => put_login(&mut ours, &name, spawn),
                    _ => put_logout(&mut ours),
                }
                let message = pb::ClientMessage { kind: Some(kind) };
                let mut theirs = Vec::new();
                message.encode_length_delimited(&mut theirs).unwrap();
                assert_eq!(hex(&ours), hex(&theirs), "round {round}, {message:?}");
                let decoded = pb::ClientMessage::decode_length_delimited(&ours[..]).unwrap();
                assert_eq!(decoded, message);
            }
        }
    }

    fn server_body(kind: server_message::Kind) -> Vec<u8> {
        pb::ServerMessage { kind: Some(kind) }.encode_to_vec()
    }

    #[test]
    fn every_server_kind_is_told_apart_and_the_answers_read_in_full() {
        let position = Some(pb::Position { x: 7, y: 9 });
        let cases = [
            (
                server_message::Kind::LoginOk(pb::LoginOk {
                    player_id: u64::MAX,
                    position,
                    resume_token: vec![1; 32],
                    map_width: 400,
                    map_height: 400,
                    view_range: 12,
                }),
                ServerEvent::LoginOk { player_id: u64::MAX },
            ),
            (
                server_message::Kind::Moved(pb::Moved { player_id: 5, position, client_time: 0 }),
                ServerEvent::Moved { player_id: 5, client_time: 0 },
            ),
            (
                server_message::Kind::Moved(pb::Moved {
                    player_id: 1 << 40,
                    position,
                    client_time: 123_456_789,
                }),
                ServerEvent::Moved { player_id: 1 << 40, client_time: 123_456_789 },
            ),
            (
                server_message::Kind::Error(pb::Error {
                    code: pb::ErrorCode::RateLimited as i32,
                    detail: "slow down".into(),
                    client_time: 42,
                }),
                ServerEvent::Error { code: pb::ErrorCode::RateLimited as i32, client_time: 42 },
            ),
            (
                server_message::Kind::Error(pb::Error {
                    code: -3,
                    detail: String::new(),
                    client_time: 0,
                }),
                ServerEvent::Error { code: -3, client_time: 0 },
            ),
            (
                server_message::Kind::ViewReset(pb::ViewReset {
                    player_id: 1,
                    position,
                    resume_token: vec![],
                }),
                ServerEvent::ViewReset,
            ),
            (
                server_message::Kind::Entered(pb::Entered {
                    player_id: 2,
                    position,
                    name: "wolf".into(),
                    kind: 1,
                    state: b"{\"hp\":10}".to_vec(),
                }),
                ServerEvent::Other(2),
            ),
            (server_message::Kind::Left(pb::Left { player_id: 0 }), ServerEvent::Other(4)),
            (server_message::Kind::Pong(pb::Pong { client_time: 3 }), ServerEvent::Other(6)),
            (
                server_message::Kind::ActionDone(pb::ActionDone {
                    client_time: 1,
                    payload: vec![0xff; 100],
                }),
                ServerEvent::Other(11),
            ),
        ];
        for (kind, expected) in cases {
            let body = server_body(kind.clone());
            assert_eq!(read_server_message(&body), Ok(expected), "{kind:?}");
        }
        assert_eq!(read_server_message(&[]), Ok(ServerEvent::Unknown));
        // A field newer than this client, alone: skipped, no kind.
        assert_eq!(read_server_message(&[0x60, 0x01]), Ok(ServerEvent::Unknown));
    }

    #[test]
    fn unknown_fields_of_every_wire_type_are_stepped_over() {
        let mut body = Vec::new();
        put_key(&mut body, 99, FIXED64);
        body.extend_from_slice(&[0; 8]);
        put_key(&mut body, 98, FIXED32);
        body.extend_from_slice(&[0; 4]);
        put_bytes(&mut body, 97, b"later");
        let mut moved = Vec::new();
        put_uint(&mut moved, 1, 8);
        put_key(&mut moved, 50, FIXED32);
        moved.extend_from_slice(&[1, 2, 3, 4]);
        put_uint(&mut moved, 3, 77);
        put_bytes(&mut body, MOVED, &moved);
        put_uint(&mut body, 96, 5);
        assert_eq!(
            read_server_message(&body),
            Ok(ServerEvent::Moved { player_id: 8, client_time: 77 })
        );
    }

    #[test]
    fn garbage_and_truncated_bodies_are_refused_never_panic() {
        let whole = server_body(server_message::Kind::Moved(pb::Moved {
            player_id: 300,
            position: Some(pb::Position { x: 1, y: 2 }),
            client_time: 1 << 50,
        }));
        for cut in 1..whole.len() {
            assert!(read_server_message(&whole[..cut]).is_err(), "cut at {cut}");
        }
        assert!(read_server_message(&[0x00]).is_err(), "field number 0");
        assert!(read_server_message(&[0x1b]).is_err(), "a group (wire type 3)");
        assert!(read_server_message(&[0x18, 0x01]).is_err(), "Moved as a varint");
        assert!(read_server_message(&[0x1d, 0, 0, 0, 0]).is_err(), "Moved as a fixed32");
        assert!(read_server_message(&[0x1a, 0xff]).is_err(), "a length cut off");
        let overlong = [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(read_server_message(&overlong), Err(WireError::BadVarint));
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..20_000 {
            let len = rng.random_range(0..40);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let _ = read_server_message(&bytes);
            let _ = split_frame(&bytes);
        }
    }

    #[test]
    fn frames_wait_for_all_their_bytes_and_refuse_oversize_prefixes_early() {
        let mut stream = Vec::new();
        put_move(&mut stream, Direction::Up, 1);
        put_login(&mut stream, "bob", Some((0, 5)));
        let first = 7;
        for cut in 0..first {
            assert_eq!(split_frame(&stream[..cut]), Ok(None), "cut at {cut}");
        }
        let (body, used) = split_frame(&stream).unwrap().unwrap();
        assert_eq!((body.len(), used), (6, first));
        assert_eq!(split_frame(&stream[first..]).unwrap().unwrap().1, stream.len() - first);

        // 4096 is the limit: announced, it waits for its body; 4097 is refused at once.
        assert_eq!(split_frame(&[0x80, 0x20]), Ok(None));
        assert_eq!(split_frame(&[0x81, 0x20]), Err(WireError::FrameTooLarge(4097)));
        // "80 80 01" proves at least 16384 before the prefix ends.
        assert_eq!(split_frame(&[0x80, 0x80, 0x01]), Err(WireError::FrameTooLarge(16384)));
        assert_eq!(split_frame(&[0x80; 9]), Ok(None), "nine continuation bytes of zero");
        assert_eq!(split_frame(&[0x80; 10]), Err(WireError::BadVarint));
        // An empty body is a frame (an empty ServerMessage).
        assert_eq!(split_frame(&[0x00, 0x07]), Ok(Some((&[][..], 1))));
    }
}
