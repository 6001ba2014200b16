//! The public client protocol of Meridian (`docs/protocol.md`, `proto/client.proto`),
//! without any I/O.
//!
//! Bytes in, messages out, and back: varint length-delimited framing with a frame limit
//! that is checked as soon as the length prefix is read, decoding of `ClientMessage` /
//! `ServerMessage` bodies, and validation of the fields whose limits the protocol states.
//! The gateway, the QUIC front, the shard, the load test and the test kit all share this
//! crate, so a frame is judged the same way everywhere.
//!
//! This crate must never touch a socket, a clock or a thread: callers feed it bytes.

mod frame;
mod messages;
mod token;
mod validate;

/// Types generated from `proto/client.proto` (package `meridian.client.v1`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/meridian.client.v1.rs"));
}

pub use frame::{
    decode_body, encode_frame, next_frame, CodecError, FrameError, FrameHeader, FrameReader,
    MAX_PREFIX_BYTES,
};
pub use messages::{error_codes, server};
pub use token::{Token, TokenError, TokenKey, TokenKeys, TOKEN_LEN};
pub use validate::{
    validate_action, validate_chat, validate_direction, validate_name, InvalidArgument,
    MAX_CHAT_BYTES, MAX_GAME_BYTES, MAX_NAME_BYTES,
};

/// The default largest frame body, in bytes, in both directions (the prefix not counted).
pub const DEFAULT_MAX_FRAME: usize = 4096;
