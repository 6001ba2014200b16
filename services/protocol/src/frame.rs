//! Varint length-delimited framing: `varint(len) || body`.
//!
//! The limit is enforced on the prefix alone, so a peer that announces a frame over the
//! limit is refused before a single byte of its body is buffered or allocated.

use prost::Message;

use crate::pb::ErrorCode;

/// A varint never needs more than ten bytes for a `u64`.
pub const MAX_PREFIX_BYTES: usize = 10;

/// Why a byte stream cannot be split into frames. Both end the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The prefix announces a body over the limit (the prefix may not even be complete:
    /// a varint only grows with more bytes, so a lower bound over the limit is enough).
    #[error("frame of at least {len} bytes exceeds the limit of {max}")]
    TooLarge { len: u64, max: usize },
    /// More than ten bytes of continuation: not a varint.
    #[error("length prefix is not a valid varint")]
    BadPrefix,
}

/// Everything that can go wrong turning bytes into one message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The body is not a valid protobuf of the expected message: bad wire data, a wrong
    /// wire type on a known field, or invalid UTF-8 in a string.
    #[error("undecodable frame body: {0}")]
    Malformed(#[from] prost::DecodeError),
}

impl FrameError {
    /// The protocol error code this failure is reported with.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::BadPrefix => ErrorCode::Malformed,
        }
    }
}

impl CodecError {
    /// The protocol error code this failure is reported with. Both close the connection.
    pub fn code(&self) -> ErrorCode {
        match self {
            CodecError::Frame(frame) => frame.code(),
            CodecError::Malformed(_) => ErrorCode::Malformed,
        }
    }
}

/// Where a complete frame sits at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub prefix_len: usize,
    pub body_len: usize,
}

impl FrameHeader {
    /// Prefix plus body.
    pub fn total_len(&self) -> usize {
        self.prefix_len + self.body_len
    }

    /// The body of this frame inside the buffer it was found in.
    pub fn body<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.prefix_len..self.total_len()]
    }
}

/// Looks for one whole frame at the front of `buf`.
///
/// `Ok(None)` means "not yet": the prefix or the body is incomplete. An error is returned
/// as soon as the prefix proves the frame is over `max_body`, before the body arrives.
pub fn next_frame(buf: &[u8], max_body: usize) -> Result<Option<FrameHeader>, FrameError> {
    let mut len: u64 = 0;
    for (i, &byte) in buf.iter().enumerate() {
        if i == MAX_PREFIX_BYTES {
            return Err(FrameError::BadPrefix);
        }
        // The tenth byte may carry only the 64th bit; anything more overflows a u64.
        if i == MAX_PREFIX_BYTES - 1 && byte & 0x7f > 1 {
            return Err(FrameError::BadPrefix);
        }
        len |= u64::from(byte & 0x7f) << (7 * i as u32);
        if len > max_body as u64 {
            return Err(FrameError::TooLarge { len, max: max_body });
        }
        if byte & 0x80 == 0 {
            let header = FrameHeader { prefix_len: i + 1, body_len: len as usize };
            return Ok((buf.len() >= header.total_len()).then_some(header));
        }
    }
    if buf.len() >= MAX_PREFIX_BYTES {
        return Err(FrameError::BadPrefix);
    }
    Ok(None)
}

/// Decodes one frame body as message `M`.
pub fn decode_body<M: Message + Default>(body: &[u8]) -> Result<M, CodecError> {
    Ok(M::decode(body)?)
}

/// Appends `varint(len) || body` of `message` to `out`, reusing `out`'s capacity.
pub fn encode_frame<M: Message>(message: &M, out: &mut Vec<u8>) {
    message.encode_length_delimited(out).expect("invariant: a Vec<u8> grows to fit any message");
}

/// A reassembly buffer for a byte stream: push what the socket gave, pop whole messages.
///
/// The buffer is reused across reads; consumed bytes are dropped lazily so a run of small
/// frames costs no copying until the buffer has to make room.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    max_body: usize,
}

impl FrameReader {
    pub fn new(max_body: usize) -> Self {
        FrameReader { buf: Vec::with_capacity(max_body + MAX_PREFIX_BYTES), start: 0, max_body }
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Appends bytes read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.capacity() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame body, if one is buffered. The slice lives until the next call.
    pub fn next_body(&mut self) -> Result<Option<&[u8]>, FrameError> {
        match next_frame(&self.buf[self.start..], self.max_body)? {
            None => Ok(None),
            Some(header) => {
                let begin = self.start + header.prefix_len;
                self.start += header.total_len();
                Ok(Some(&self.buf[begin..self.start]))
            }
        }
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<M: Message + Default>(&mut self) -> Result<Option<M>, CodecError> {
        match self.next_body()? {
            None => Ok(None),
            Some(body) => decode_body(body).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{client_message::Kind, ClientMessage, Move, Ping};
    use crate::DEFAULT_MAX_FRAME;
    use proptest::prelude::*;

    fn prefix(len: u64) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_varint(len, &mut out);
        out
    }

    #[test]
    fn limit_is_inclusive_and_checked_on_the_prefix_alone() {
        let at_limit = prefix(4096);
        assert_eq!(next_frame(&at_limit, DEFAULT_MAX_FRAME), Ok(None), "4096 waits for its body");
        let over = prefix(4097);
        assert_eq!(
            next_frame(&over, DEFAULT_MAX_FRAME),
            Err(FrameError::TooLarge { len: 4097, max: 4096 }),
            "4097 is refused before any body byte arrives"
        );
    }

    #[test]
    fn incomplete_prefix_that_already_exceeds_the_limit_is_refused() {
        // 0x80 0x80 0x01... : the third byte alone says >= 16384.
        assert!(matches!(next_frame(&[0x80, 0x80, 0x01], 4096), Err(FrameError::TooLarge { .. })));
        // A lone continuation byte is just incomplete.
        assert_eq!(next_frame(&[0x80], 4096), Ok(None));
    }

    #[test]
    fn overlong_prefix_is_bad() {
        // Non-canonical zero padding that never ends.
        let bytes = [0x80u8; 11];
        assert_eq!(next_frame(&bytes, usize::MAX), Err(FrameError::BadPrefix));
    }

    #[test]
    fn empty_body_is_a_frame() {
        assert_eq!(next_frame(&[0x00], 4096), Ok(Some(FrameHeader { prefix_len: 1, body_len: 0 })));
    }

    #[test]
    fn garbage_body_is_malformed() {
        // Field 1 with wire type 7 does not exist.
        let err = decode_body::<ClientMessage>(&[0x0f, 0x01]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Malformed);
        // Truncated length-delimited field.
        let err = decode_body::<ClientMessage>(&[0x0a, 0x05, 0x01]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Malformed);
        // Login.name with invalid UTF-8.
        let err = decode_body::<ClientMessage>(&[0x0a, 0x03, 0x0a, 0x01, 0xff]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Malformed);
        // Wrong wire type on a known field: `move` (2) as a varint.
        let err = decode_body::<ClientMessage>(&[0x10, 0x01]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Malformed);
    }

    #[test]
    fn reader_yields_frames_split_at_every_byte() {
        let messages: Vec<ClientMessage> = (1..=50u64)
            .map(|t| ClientMessage {
                kind: Some(if t % 2 == 0 {
                    Kind::Ping(Ping { client_time: t })
                } else {
                    Kind::Move(Move { direction: 1, client_time: t })
                }),
            })
            .collect();
        let mut wire = Vec::new();
        for m in &messages {
            encode_frame(m, &mut wire);
        }
        let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
        let mut got = Vec::new();
        for byte in wire {
            reader.extend(&[byte]);
            while let Some(m) = reader.next_message::<ClientMessage>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, messages);
        assert!(reader.buffered().is_empty());
    }

    proptest! {
        #[test]
        fn round_trip_any_chat(text in ".{0,200}", chunk in 1usize..64) {
            let msg = ClientMessage { kind: Some(Kind::Chat(crate::pb::Chat { text })) };
            let mut wire = Vec::new();
            encode_frame(&msg, &mut wire);
            encode_frame(&msg, &mut wire);
            let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                reader.extend(piece);
                while let Some(m) = reader.next_message::<ClientMessage>().unwrap() {
                    got.push(m);
                }
            }
            prop_assert_eq!(got, vec![msg.clone(), msg]);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut reader = FrameReader::new(256);
            reader.extend(&bytes);
            for _ in 0..bytes.len() + 1 {
                match reader.next_message::<ClientMessage>() {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
        }

        #[test]
        fn truncation_is_incomplete_not_an_error(t in 1u64.., cut in 0usize..12) {
            let msg = ClientMessage { kind: Some(Kind::Ping(Ping { client_time: t })) };
            let mut wire = Vec::new();
            encode_frame(&msg, &mut wire);
            let cut = cut.min(wire.len() - 1);
            prop_assert_eq!(next_frame(&wire[..cut], DEFAULT_MAX_FRAME), Ok(None));
        }
    }
}
