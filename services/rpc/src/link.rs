//! The relay link between a gateway's event-loop worker and a shard: length-delimited
//! protobuf frames on one TCP connection (TLS 1.3 inside when the cluster's mutual TLS is
//! on), with no HTTP/2 and no gRPC.
//!
//! The gateway opens it on the shard's gRPC port. Plain, it starts with [`MAGIC`]; the
//! shard tells it from an HTTP/2 preface by its first bytes. With TLS, the client offers
//! only [`ALPN`], and [`MAGIC`] follows inside. Then:
//!
//! - gateway to shard: a `GatewayBatch` hello (`gateway_id`, `lane`), then `GatewayBatch`es;
//! - shard to gateway: `ShardBatch`es (one with `refused` set, then the close, if the shard
//!   refuses the link).
//!
//! Each frame is a little-endian `u32` length, then that many bytes of the message. A frame
//! of length 0 is a heartbeat: each end sends one when it has sent nothing for
//! [`HEARTBEAT`], and takes the link for dead when it has heard nothing for [`SILENCE`].

use std::time::Duration;

/// What a gateway writes first on a relay link (inside TLS when there is TLS).
pub const MAGIC: &[u8; 8] = b"MRDNLNK1";
/// The ALPN protocol a relay link's TLS handshake names (gRPC's is `h2`).
pub const ALPN: &[u8] = b"meridian-relay/1";
/// An end that has sent nothing for this long sends a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// An end that has heard nothing for this long takes the link for dead.
pub const SILENCE: Duration = Duration::from_secs(3);
/// The largest frame either end takes: [`crate::MAX_GRPC_MESSAGE_BYTES`], as on gRPC.
pub const MAX_FRAME_BYTES: usize = crate::MAX_GRPC_MESSAGE_BYTES;
/// Bytes of a frame's length prefix.
pub const PREFIX: usize = 4;

/// The lane (the gateway's worker) a session belongs to: the top 16 bits of its id.
pub fn session_lane(session: u64) -> u32 {
    (session >> 48) as u32
}

/// Appends `message` to `out` as one frame.
pub fn put_frame<M: prost::Message>(out: &mut Vec<u8>, message: &M) {
    let len = message.encoded_len();
    out.reserve(PREFIX + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    // A Vec grows as needed: encoding into it cannot fail.
    let _ = message.encode(out);
}

/// Appends a heartbeat (an empty frame) to `out`.
pub fn put_heartbeat(out: &mut Vec<u8>) {
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// A frame no end of this protocol writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTooLong(pub usize);

impl std::fmt::Display for FrameTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a relay frame of {} bytes (at most {MAX_FRAME_BYTES})", self.0)
    }
}

impl std::error::Error for FrameTooLong {}

/// The first whole frame at the start of `buf`: how many bytes it takes, and its body
/// (empty for a heartbeat). `None` until the frame is all there.
pub fn next_frame(buf: &[u8]) -> Result<Option<(usize, &[u8])>, FrameTooLong> {
    let Some(prefix) = buf.get(..PREFIX) else { return Ok(None) };
    let len = u32::from_le_bytes(prefix.try_into().expect("invariant: 4 bytes")) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameTooLong(len));
    }
    Ok(buf.get(PREFIX..PREFIX + len).map(|body| (PREFIX + len, body)))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::pb::{GatewayBatch, ShardBatch};

    #[test]
    fn frames_read_back_whole_and_in_order_however_the_bytes_are_cut() {
        let mut wire = Vec::new();
        put_frame(&mut wire, &GatewayBatch { gateway_id: 7, lane: 3, inputs: Vec::new() });
        put_heartbeat(&mut wire);
        put_frame(&mut wire, &ShardBatch { deliveries: Vec::new(), refused: "no".into() });
        for cut in 0..=wire.len() {
            let mut buf = wire[..cut].to_vec();
            let mut bodies = Vec::new();
            let mut take = |buf: &mut Vec<u8>| {
                while let Some((used, body)) = next_frame(buf).expect("not too long") {
                    bodies.push(body.to_vec());
                    buf.drain(..used);
                }
            };
            take(&mut buf);
            buf.extend_from_slice(&wire[cut..]);
            take(&mut buf);
            assert!(buf.is_empty(), "cut at {cut}");
            assert_eq!(bodies.len(), 3);
            let hello = GatewayBatch::decode(&bodies[0][..]).expect("hello");
            assert_eq!((hello.gateway_id, hello.lane), (7, 3));
            assert!(bodies[1].is_empty(), "a heartbeat");
            assert_eq!(ShardBatch::decode(&bodies[2][..]).expect("refusal").refused, "no");
        }
    }

    #[test]
    fn a_length_over_the_limit_is_refused_before_its_bytes_arrive() {
        let too_long = (MAX_FRAME_BYTES as u32 + 1).to_le_bytes();
        assert_eq!(next_frame(&too_long), Err(FrameTooLong(MAX_FRAME_BYTES + 1)));
        let max = (MAX_FRAME_BYTES as u32).to_le_bytes();
        assert_eq!(next_frame(&max), Ok(None), "the largest frame waits for its bytes");
    }

    #[test]
    fn the_lane_is_the_top_sixteen_bits() {
        assert_eq!(session_lane(3 << 48 | 0x00ff_ffff_ffff), 3);
        assert_eq!(session_lane(0xffff << 48), 0xffff);
    }
}
