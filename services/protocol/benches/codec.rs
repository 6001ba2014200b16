//! Micro-benchmarks of the client codec: what the gateway and the load test do per frame.
//!
//! `cargo bench -p meridian-protocol --bench codec`. Numbers are per frame (or per batch of
//! frames, as named); compare runs on one machine, not across machines.

use divan::{black_box, Bencher};
use meridian_protocol::pb::{client_message, ClientMessage, Direction, Move, ServerMessage};
use meridian_protocol::{encode_frame, next_frame, server, FrameReader, DEFAULT_MAX_FRAME};

fn main() {
    divan::main();
}

fn a_move(client_time: u64) -> ClientMessage {
    ClientMessage {
        kind: Some(client_message::Kind::Move(Move {
            direction: Direction::Right as i32,
            client_time,
        })),
    }
}

/// One `Moved` notification, the most common server frame, into a reused buffer.
#[divan::bench]
fn encode_moved(bencher: Bencher) {
    let message = server::moved(42, 123, 321, 0);
    let mut out = Vec::with_capacity(64);
    bencher.bench_local(|| {
        out.clear();
        encode_frame(black_box(&message), &mut out);
        black_box(out.len())
    });
}

/// One `Entered` (carries the name), into a reused buffer.
#[divan::bench]
fn encode_entered(bencher: Bencher) {
    let message = server::entered(42, 123, 321, "bot-12345");
    let mut out = Vec::with_capacity(64);
    bencher.bench_local(|| {
        out.clear();
        encode_frame(black_box(&message), &mut out);
        black_box(out.len())
    });
}

/// Splits and decodes a burst of client `Move` frames, as a gateway worker does per recv.
#[divan::bench(args = [1, 16, 256])]
fn decode_moves(bencher: Bencher, frames: u64) {
    let mut bytes = Vec::new();
    for client_time in 1..=frames {
        encode_frame(&a_move(client_time), &mut bytes);
    }
    bencher.counter(divan::counter::ItemsCount::new(frames)).bench_local(|| {
        let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
        reader.extend(black_box(&bytes));
        let mut sum = 0u64;
        while let Ok(Some(message)) = reader.next_message::<ClientMessage>() {
            if let Some(client_message::Kind::Move(m)) = message.kind {
                sum += m.client_time;
            }
        }
        sum
    });
}

/// Only the framing (length prefix and limit) of a burst, without decoding bodies: the
/// part a relay that moves bytes without re-encoding them pays.
#[divan::bench]
fn split_frames_only(bencher: Bencher) {
    let mut bytes = Vec::new();
    for client_time in 1..=256 {
        encode_frame(&server::moved(7, 1, 2, client_time), &mut bytes);
    }
    bencher.counter(divan::counter::ItemsCount::new(256u64)).bench_local(|| {
        let mut rest = black_box(&bytes[..]);
        let mut n = 0u32;
        while let Ok(Some(header)) = next_frame(rest, DEFAULT_MAX_FRAME) {
            rest = &rest[header.total_len()..];
            n += 1;
        }
        n
    });
}

/// Decodes a burst of server frames as the load-test bots do.
#[divan::bench]
fn decode_server_frames(bencher: Bencher) {
    let mut bytes = Vec::new();
    for id in 1..=256 {
        encode_frame(&server::moved(id, 10, 20, 0), &mut bytes);
    }
    bencher.counter(divan::counter::ItemsCount::new(256u64)).bench_local(|| {
        let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
        reader.extend(black_box(&bytes));
        let mut n = 0u32;
        while let Ok(Some(_)) = reader.next_message::<ServerMessage>() {
            n += 1;
        }
        n
    });
}
