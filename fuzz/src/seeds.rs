//! The seed corpora under `fuzz/corpus/<target>/`, generated from the targets' input
//! formats: `MERIDIAN_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml` rewrites
//! them; without the variable the tests check that the committed seeds are current and
//! that every file in the corpora passes its target's checks.

use meridian_protocol::pb::{
    client_message::Kind as C, server_message::Kind as S, Chat, ClientMessage, ErrorCode, Login,
    LoginOk, Logout, Move, Ping, Position, Resume, ServerMessage,
};
use meridian_protocol::{encode_frame, server, TokenKey, DEFAULT_MAX_FRAME, TOKEN_LEN};

use crate::frame::LIMITS;
use crate::gateway_core::{encode_run, ClientOp, Op};
use crate::Writer;

/// One seed: the target it is for, its file name, its bytes.
pub struct Seed {
    pub target: &'static str,
    pub name: &'static str,
    pub bytes: Vec<u8>,
}

pub fn all() -> Vec<Seed> {
    let mut seeds = frame_seeds();
    seeds.extend(token_seeds());
    seeds.extend(core_seeds());
    seeds.extend(websocket_seeds());
    seeds
}

fn seed(target: &'static str, name: &'static str, bytes: Vec<u8>) -> Seed {
    Seed { target, name, bytes }
}

fn client(kind: Option<C>) -> ClientMessage {
    ClientMessage { kind }
}

fn frames<M: prost::Message>(messages: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        encode_frame(message, &mut out);
    }
    out
}

/// A `frame` input: the limit (an index into [`LIMITS`]), the piece lengths, the stream.
fn frame_input(limit: usize, pieces: &[u8], stream: &[u8]) -> Vec<u8> {
    let index = LIMITS.iter().position(|&l| l == limit).expect("a limit the target knows");
    let mut out = Writer::default();
    out.u8(index as u8).u8(pieces.len() as u8).bytes(pieces).bytes(stream);
    out.0
}

fn every_client_kind() -> Vec<ClientMessage> {
    let token = TokenKey::new(vec![7; 32]).expect("key").mint(42, u64::MAX);
    vec![
        client(Some(C::Login(Login {
            name: "ann".into(),
            spawn: Some(Position { x: 3, y: 4 }),
            token: String::new(),
        }))),
        client(Some(C::Move(Move { direction: 4, client_time: 1_000 }))),
        client(Some(C::Chat(Chat { text: "hello, world".into() }))),
        client(Some(C::Ping(Ping { client_time: 77 }))),
        client(Some(C::Logout(Logout {}))),
        client(Some(C::Resume(Resume { token }))),
        client(None),
    ]
}

fn every_server_kind() -> Vec<ServerMessage> {
    vec![
        ServerMessage {
            kind: Some(S::LoginOk(LoginOk {
                player_id: 1,
                position: server::position(5, 6),
                resume_token: vec![1; TOKEN_LEN],
                map_width: 400,
                map_height: 400,
                view_range: 5,
            })),
        },
        server::entered(2, 7, 8, "bo"),
        server::moved(1, 6, 6, 1_000),
        server::left(2),
        server::chat(2, "hi"),
        server::pong(77),
        server::error(ErrorCode::RateLimited, "slow down", 1_001),
        server::view_reset(1, 9, 9),
    ]
}

fn frame_seeds() -> Vec<Seed> {
    let clients = frames(&every_client_kind());
    let servers = frames(&every_server_kind());
    let chat = frames(&[client(Some(C::Chat(Chat { text: "x".repeat(200) })))]);
    let mut at_limit = Vec::new();
    prost::encoding::encode_varint(128, &mut at_limit);
    at_limit.extend(std::iter::repeat_n(0u8, 128));
    let mut oversize = Vec::new();
    prost::encoding::encode_varint(DEFAULT_MAX_FRAME as u64 + 1, &mut oversize);
    vec![
        seed("frame", "client-every-kind", frame_input(DEFAULT_MAX_FRAME, &[0, 2, 6], &clients)),
        seed("frame", "server-every-kind", frame_input(DEFAULT_MAX_FRAME, &[], &servers)),
        // A two-byte prefix, then half the body: incomplete, not an error.
        seed("frame", "truncated-body", frame_input(DEFAULT_MAX_FRAME, &[0], &chat[..100])),
        seed("frame", "truncated-prefix", frame_input(DEFAULT_MAX_FRAME, &[], &chat[..1])),
        seed("frame", "oversize-prefix", frame_input(DEFAULT_MAX_FRAME, &[0], &oversize)),
        // 0x80 0x80 0x01: at least 16384, refused before the prefix is even complete.
        seed("frame", "oversize-partial-prefix", frame_input(64, &[], &[0x80, 0x80, 0x01])),
        seed("frame", "overlong-prefix", frame_input(16_384, &[3], &[0x80; 11])),
        seed("frame", "body-at-limit", frame_input(128, &[127, 0], &at_limit)),
        // Login.name with invalid UTF-8; a known field with the wrong wire type.
        seed(
            "frame",
            "malformed-bodies",
            frame_input(64, &[], &[5, 0x0a, 0x03, 0x0a, 0x01, 0xff, 2, 0x10, 0x01]),
        ),
        seed("frame", "empty-body", frame_input(0, &[], &[0x00, 0x00])),
    ]
}

/// A `resume_token` input: key, the player and nonce to mint, the flip, the candidate.
fn token_input(secret: &[u8], player: u64, nonce: u64, candidate: &[u8]) -> Vec<u8> {
    assert!((16..80).contains(&secret.len()));
    let mut out = Writer::default();
    out.u8((secret.len() - 16) as u8).bytes(secret).u64(player).u64(nonce).u8(9);
    out.bytes(candidate);
    out.0
}

fn token_seeds() -> Vec<Seed> {
    let secret = [7u8; 32];
    let key = TokenKey::new(secret.to_vec()).expect("key");
    let valid = key.mint(42, 7);
    let long_secret: Vec<u8> = (0..79).collect();
    let long_key = TokenKey::new(long_secret.clone()).expect("key");
    let other = TokenKey::new(vec![8; 32]).expect("key").mint(42, 7);
    let mut first_version = valid.clone();
    first_version[0] = 1;
    vec![
        seed("resume_token", "valid", token_input(&secret, 42, 7, &valid)),
        seed("resume_token", "other-key", token_input(&secret, 42, 7, &other)),
        seed("resume_token", "first-version", token_input(&secret, 42, 7, &first_version)),
        seed("resume_token", "cut-short", token_input(&secret, 1, 2, &valid[..TOKEN_LEN - 1])),
        seed(
            "resume_token",
            "long-key",
            token_input(&long_secret, u64::MAX, u64::MAX, &long_key.mint(u64::MAX, u64::MAX)),
        ),
    ]
}

fn login(conn: u8) -> Op {
    Op::Send { conn, split: 0, message: ClientOp::Login { name_len: 3, spawn: None } }
}

fn step(conn: u8, split: u8) -> Op {
    Op::Send { conn, split, message: ClientOp::Move { direction: 4 } }
}

fn shard(shard: u8) -> Op {
    Op::ShardStep { shard, budget: 255, accept_resume: true }
}

/// Header byte 0 for `gateway_core`: frame limit index, shards, relay room index, dev mode.
fn core_header(max_frame: u8, shards: u8, relay_room: u8, dev: bool) -> u8 {
    max_frame | (shards - 1) << 2 | relay_room << 4 | u8::from(dev) << 7
}

fn core_seeds() -> Vec<Seed> {
    let two = core_header(0, 2, 0, true);
    let mut play =
        vec![Op::Connect, Op::Connect, login(0), login(1), Op::Flush, shard(0), shard(1)];
    play.extend([step(0, 1), step(0, 2), step(1, 0), Op::Flush, shard(0), shard(1), Op::Flush]);
    play.extend([
        Op::Send { conn: 1, split: 1, message: ClientOp::Chat { len: 5 } },
        Op::Send { conn: 0, split: 0, message: ClientOp::Ping { client_time: 9 } },
        Op::Flush,
        shard(0),
        shard(1),
        Op::Send { conn: 0, split: 0, message: ClientOp::Logout },
        Op::Flush,
        shard(0),
        shard(1),
        Op::Flush,
        Op::Closed { conn: 0 },
        Op::Flush,
    ]);

    let mut handoff = vec![Op::Connect, login(0), Op::Flush, shard(0), shard(1), Op::Flush];
    handoff.extend([step(0, 0), step(0, 0), Op::Flush]);
    // The new owner speaks first; the old owner's marker follows on its next round.
    handoff.extend([Op::Handoff { conn: 0, to: 1, flags: 3 }, Op::Flush, step(0, 0), Op::Flush]);
    handoff.extend([shard(1), Op::Flush, shard(0), Op::Flush, shard(1), Op::Flush]);

    let mut link_down = vec![Op::Connect, login(0), Op::Flush, shard(0), shard(1), Op::Flush];
    link_down.extend([step(0, 0), step(0, 3), Op::Flush, Op::LinkDown { shard: 0 }, Op::Flush]);
    link_down.extend([step(0, 0), Op::Flush, Op::LinkUp { shard: 0 }, step(0, 0), Op::Flush]);
    link_down.extend([shard(0), shard(1), Op::Flush]);

    let mut gone = vec![Op::Connect, login(0), Op::Flush, shard(0), shard(1), Op::Flush];
    gone.extend([
        step(0, 0),
        step(0, 0),
        Op::Flush,
        Op::ShardGone { shard: 0, hung: true },
        Op::Flush,
    ]);
    gone.extend([step(0, 0), Op::Flush, shard(1), Op::Flush, step(0, 0), Op::Flush, shard(1)]);

    let resume =
        |token: u8| Op::Send { conn: 0, split: 2, message: ClientOp::Resume { token, player: 5 } };
    let mut resumes = vec![Op::Connect, resume(0), Op::Flush, step(0, 0)];
    resumes.extend([
        Op::ShardStep { shard: 0, budget: 9, accept_resume: false },
        shard(1),
        Op::Flush,
    ]);
    resumes.extend([step(0, 0), Op::Flush, shard(1), Op::Flush]);
    resumes.extend([
        Op::Connect,
        Op::Send { conn: 1, split: 0, message: ClientOp::Resume { token: 1, player: 5 } },
    ]);
    resumes.extend([
        Op::Send { conn: 1, split: 0, message: ClientOp::Resume { token: 2, player: 5 } },
        Op::Flush,
    ]);

    let mut oversize = Vec::new();
    prost::encoding::encode_varint(DEFAULT_MAX_FRAME as u64 + 1, &mut oversize);
    let garbage = vec![
        Op::Connect,
        Op::Connect,
        Op::Connect,
        Op::Send { conn: 0, split: 0, message: ClientOp::Empty },
        Op::Send { conn: 0, split: 0, message: ClientOp::Chat { len: 280 } },
        step(0, 0),
        Op::Send {
            conn: 0,
            split: 0,
            message: ClientOp::Login { name_len: 35, spawn: Some((500, 1)) },
        },
        Op::Send { conn: 0, split: 0, message: ClientOp::Body(vec![0x0a, 0x03, 0x0a, 0x01, 0xff]) },
        Op::Raw { conn: 1, bytes: oversize },
        Op::Send { conn: 2, split: 0, message: ClientOp::Logout },
        Op::Flush,
        Op::Closed { conn: 0 },
        Op::Flush,
    ];

    // A client that never reads: pings answered by the gateway pile up past the bound.
    let mut slow = vec![Op::Connect];
    slow.extend((0..80).map(|t| Op::Send {
        conn: 0,
        split: 0,
        message: ClientOp::Ping { client_time: 128 + t },
    }));
    slow.push(Op::Flush);

    // One batch of room per relay queue: inputs wait in the core, in order.
    let mut stall = vec![Op::Connect, login(0), Op::Flush];
    for _ in 0..6 {
        stall.extend([step(0, 0), Op::Flush]);
    }
    for _ in 0..7 {
        stall.extend([shard(0), Op::Flush]);
    }
    stall.extend([Op::Tick, Op::ShutDown, Op::Flush]);

    vec![
        seed("gateway_core", "play", encode_run([two, 60], &play)),
        seed("gateway_core", "handoff", encode_run([two, 60], &handoff)),
        seed("gateway_core", "link-down", encode_run([two, 60], &link_down)),
        seed("gateway_core", "shard-gone", encode_run([core_header(0, 3, 0, true), 60], &gone)),
        seed("gateway_core", "resume", encode_run([two, 60], &resumes)),
        seed("gateway_core", "garbage", encode_run([core_header(0, 1, 0, false), 0], &garbage)),
        seed("gateway_core", "slow-client", encode_run([core_header(1, 1, 0, true), 0], &slow)),
        seed("gateway_core", "relay-stall", encode_run([core_header(0, 1, 1, true), 60], &stall)),
    ]
}

/// A `websocket` input: the limit (an index into its `LIMITS`), no budget, bit 7 for a
/// refused session, the piece lengths, the stream.
fn ws_input(limit: usize, refused: bool, pieces: &[u8], stream: &[u8]) -> Vec<u8> {
    ws_input_paid(limit, 0, refused, pieces, stream)
}

/// A `websocket` input whose budget pays for `budget` frames per read (1..=15).
fn ws_input_paid(limit: usize, budget: u8, refused: bool, pieces: &[u8], stream: &[u8]) -> Vec<u8> {
    let limits = crate::websocket::LIMITS;
    let index = limits.iter().position(|&l| l == limit).expect("a limit the target knows");
    let head = index as u8 | (budget & 0x0f) << 3 | u8::from(refused) << 7;
    let mut out = Writer::default();
    out.u8(head).u8(pieces.len() as u8).bytes(pieces).bytes(stream);
    out.0
}

fn ws_request(extra: &str) -> Vec<u8> {
    format!(
        "GET /play HTTP/1.1\r\nHost: g\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// A client's frame: `first` is FIN and opcode, masked with a fixed key.
fn ws_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut frame = vec![first];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

fn websocket_seeds() -> Vec<Seed> {
    let bodies: Vec<Vec<u8>> =
        every_client_kind().iter().map(prost::Message::encode_to_vec).collect();
    let mut session = ws_request("Sec-WebSocket-Protocol: meridian.v1\r\n");
    for body in &bodies {
        session.extend(ws_frame(0x82, body));
    }
    let mut fragmented = ws_request("");
    fragmented.extend(ws_frame(0x02, &bodies[0][..2]));
    fragmented.extend(ws_frame(0x89, b"ping"));
    fragmented.extend(ws_frame(0x80, &bodies[0][2..]));
    fragmented.extend(ws_frame(0x88, &1000u16.to_be_bytes()));
    let mut oversized = ws_request("");
    oversized.extend(ws_frame(0x82, &[0; 4097]));
    let mut text = ws_request("");
    text.extend(ws_frame(0x81, b"{}"));
    let mut unmasked = ws_request("");
    unmasked.extend([0x82, 0x01, 0x08]);
    // Issue 31: empty fragments and pings, more of them than the budget pays for at once.
    let mut fragment_flood = ws_request("");
    fragment_flood.extend(ws_frame(0x02, &[]));
    for _ in 0..40 {
        fragment_flood.extend(ws_frame(0x00, &[]));
    }
    fragment_flood.extend(ws_frame(0x80, &bodies[3]));
    let mut ping_flood = ws_request("");
    for i in 0..40u8 {
        ping_flood.extend(ws_frame(0x89, &[i; 3]));
        ping_flood.extend(ws_frame(0x8a, &[]));
    }
    ping_flood.extend(ws_frame(0x88, &1005u16.to_be_bytes()));
    vec![
        seed("websocket", "session-every-kind", ws_input(4096, false, &[], &session)),
        seed("websocket", "session-in-pieces", ws_input(4096, false, &[0, 6, 40], &session)),
        seed("websocket", "fragmented-ping-close", ws_input(4096, false, &[2], &fragmented)),
        seed("websocket", "oversized", ws_input(4096, false, &[], &oversized)),
        seed("websocket", "text", ws_input(125, false, &[], &text)),
        seed("websocket", "unmasked", ws_input(4096, false, &[], &unmasked)),
        seed("websocket", "refused", ws_input(4096, true, &[9], &session)),
        seed("websocket", "not-an-upgrade", ws_input(0, false, &[], b"GET / HTTP/1.1\r\n\r\n")),
        seed(
            "websocket",
            "fragment-flood-paid",
            ws_input_paid(4096, 3, false, &[30], &fragment_flood),
        ),
        seed("websocket", "ping-flood-paid", ws_input_paid(4096, 1, false, &[], &ping_flood)),
        seed(
            "websocket",
            "session-paid-in-pieces",
            ws_input_paid(4096, 2, false, &[0, 6, 40], &session),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn corpus(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
    }

    fn check(target: &str, data: &[u8]) {
        match target {
            "frame" => crate::frame::check(data),
            "resume_token" => crate::resume_token::check(data),
            "gateway_core" => crate::gateway_core::check(data),
            "websocket" => crate::websocket::check(data),
            other => panic!("no target {other}"),
        }
    }

    #[test]
    fn seeds_are_committed_and_current() {
        let write = std::env::var_os("MERIDIAN_WRITE_SEEDS").is_some();
        let mut stale = Vec::new();
        for seed in all() {
            let path = corpus(seed.target).join(format!("seed-{}", seed.name));
            if write {
                std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
                std::fs::write(&path, &seed.bytes).expect("write the seed");
            } else if std::fs::read(&path).ok().as_deref() != Some(&seed.bytes[..]) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "seeds missing or stale (rewrite with MERIDIAN_WRITE_SEEDS=1): {stale:?}"
        );
    }

    #[test]
    fn every_seed_passes_its_checks() {
        for seed in all() {
            check(seed.target, &seed.bytes);
        }
    }

    fn core_seed(name: &str) -> Vec<u8> {
        all().into_iter().find(|s| s.name == name).expect("a seed of that name").bytes
    }

    #[test]
    fn core_seeds_reach_what_they_are_named_for() {
        use crate::gateway_core::run;
        let summary = |name: &str| {
            let summary = run(&core_seed(name));
            eprintln!("{name}: {summary:?}");
            summary
        };
        let play = summary("play");
        assert_eq!((play.moves, play.acks, play.refusals), (3, 3, 0), "three moves, three acks");
        let handoff = summary("handoff");
        assert_eq!((handoff.moves, handoff.acks, handoff.refusals), (3, 3, 0));
        let link_down = summary("link-down");
        assert_eq!(link_down.moves, 4);
        assert!(link_down.refusals >= 3, "in flight and while down: UNAVAILABLE");
        let gone = summary("shard-gone");
        assert!(gone.refusals >= 2 && gone.acks >= 1, "refused at the restore, acked after");
        let resume = summary("resume");
        assert!(resume.acks >= 1, "a resumed player moves");
        assert_eq!(summary("slow-client").aborted, 1, "a client that never reads is cut off");
        let stall = summary("relay-stall");
        assert_eq!((stall.moves, stall.acks), (6, 6), "stalled inputs all arrive");
    }

    #[test]
    fn every_corpus_file_passes_its_checks() {
        for target in ["frame", "resume_token", "gateway_core"] {
            let Ok(entries) = std::fs::read_dir(corpus(target)) else { continue };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let data = std::fs::read(&path).expect("read a corpus file");
                eprintln!("{}", path.display());
                check(target, &data);
            }
        }
    }
}
