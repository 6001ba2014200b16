//! Client messages and raw frames, so a test reads like the protocol table.

use meridian_protocol::encode_frame;
use meridian_protocol::pb::{self, client_message::Kind, ClientMessage, Direction};

fn wrap(kind: Kind) -> ClientMessage {
    ClientMessage { kind: Some(kind) }
}

pub fn login(name: &str, spawn: Option<(u32, u32)>) -> ClientMessage {
    wrap(Kind::Login(pb::Login {
        name: name.to_string(),
        spawn: spawn.map(|(x, y)| pb::Position { x, y }),
        token: String::new(),
    }))
}

pub fn move_(direction: Direction, client_time: u64) -> ClientMessage {
    move_raw(direction as i32, client_time)
}

/// A move with any direction value, including ones the enum does not know.
pub fn move_raw(direction: i32, client_time: u64) -> ClientMessage {
    wrap(Kind::Move(pb::Move { direction, client_time }))
}

/// A game action (`target` 0: none).
pub fn action(kind: u32, target: u64, payload: &[u8], client_time: u64) -> ClientMessage {
    wrap(Kind::Action(pb::Action { kind, payload: payload.to_vec(), target, client_time }))
}

pub fn chat(text: &str) -> ClientMessage {
    wrap(Kind::Chat(pb::Chat { text: text.to_string() }))
}

pub fn ping(client_time: u64) -> ClientMessage {
    wrap(Kind::Ping(pb::Ping { client_time }))
}

pub fn logout() -> ClientMessage {
    wrap(Kind::Logout(pb::Logout {}))
}

pub fn resume(token: &[u8]) -> ClientMessage {
    wrap(Kind::Resume(pb::Resume { token: token.to_vec() }))
}

/// A `ClientMessage` with no kind set: an empty body.
pub fn no_kind() -> ClientMessage {
    ClientMessage { kind: None }
}

/// `varint(len) || body` of `message`.
pub fn frame(message: &ClientMessage) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(message, &mut out);
    out
}

/// `varint(body.len()) || body`, for bodies that are not a valid `ClientMessage`.
pub fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut out = varint(body.len() as u64);
    out.extend_from_slice(body);
    out
}

/// The protobuf varint encoding of `value`.
pub fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A frame whose body is exactly `body_len` bytes and decodes as `Ping{client_time}`: the ping
/// followed by an unknown length-delimited field (number 15) of padding, which protobuf
/// decoders skip. `body_len` must leave room for the ping and the padding's header.
pub fn padded_ping_frame(client_time: u64, body_len: usize) -> Vec<u8> {
    let ping = frame(&ping(client_time));
    // `frame` put a one-byte prefix in front of the short ping body.
    let mut body = ping[1..].to_vec();
    // Field 15, wire type 2: tag byte 0x7a, then varint(len), then len bytes.
    let room = body_len - body.len() - 1;
    let mut pad_len = room - varint(room as u64).len();
    // The varint of the padding length may be shorter than the guess; grow until it fits.
    while 1 + varint(pad_len as u64).len() + pad_len + body.len() < body_len {
        pad_len += 1;
    }
    body.push(0x7a);
    body.extend(varint(pad_len as u64));
    body.resize(body.len() + pad_len, b'.');
    assert_eq!(body.len(), body_len, "padded ping body has the asked-for length");
    raw_frame(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::{decode_body, next_frame, DEFAULT_MAX_FRAME};

    #[test]
    fn varint_matches_the_codec() {
        for value in [0u64, 1, 127, 128, 300, 4096, 4097, u64::MAX] {
            let mut reference = Vec::new();
            encode_frame(&pb::Ping { client_time: value }, &mut reference);
            // The prefix of the reference frame is the varint of the body length; the body of
            // a non-zero ping is the tag 0x08 followed by the varint of the value.
            if value != 0 {
                assert_eq!(reference[2..], varint(value)[..], "value {value}");
            }
        }
        assert_eq!(varint(4097), vec![0x81, 0x20]);
        assert_eq!(varint(300), vec![0xac, 0x02]);
        assert_eq!(varint(0), vec![0x00]);
    }

    #[test]
    fn padded_ping_has_the_exact_length_and_decodes_as_the_ping() {
        for len in [20, 127, 128, 129, 130, 4095, 4096] {
            let wire = padded_ping_frame(77, len);
            let header = next_frame(&wire, DEFAULT_MAX_FRAME).unwrap().unwrap();
            assert_eq!(header.body_len, len);
            assert_eq!(header.total_len(), wire.len());
            let back: ClientMessage = decode_body(header.body(&wire)).unwrap();
            assert_eq!(back, ping(77), "len {len}");
        }
    }
}
