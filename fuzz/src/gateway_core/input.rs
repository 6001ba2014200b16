//! The input format of `gateway_core`: operations, their bytes, and what a client sends.

use meridian_gateway_core::fuzzing::resume_key;
use meridian_protocol::pb::{
    client_message::Kind as C, ClientMessage, Login, Move, Ping, Position,
};
use meridian_protocol::TokenKey;

use crate::{Cursor, Writer};

/// What a client sends in one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp {
    /// A name of `name_len % 40` bytes (0 and over 32 are refused), and a spawn if given.
    Login {
        name_len: u8,
        spawn: Option<(u16, u16)>,
    },
    /// `direction % 6` (0 and 5 are not directions); the `client_time` is the next unique one.
    Move {
        direction: u8,
    },
    /// A text of `len % 300` bytes (0 and over 256 are refused).
    Chat {
        len: u16,
    },
    Ping {
        client_time: u8,
    },
    Logout,
    /// `token % 3`: 0 a genuine token for `player`, 1 one signed with another key, 2 garbage.
    Resume {
        token: u8,
        player: u8,
    },
    /// A `ClientMessage` without a kind.
    Empty,
    /// Any body (at most 255 bytes) in a well-formed frame.
    Body(Vec<u8>),
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new client connection (at most 16 per input).
    Connect,
    /// A frame from open connection `conn % open`, read in two pieces cut at `split`.
    Send {
        conn: u8,
        split: u8,
        message: ClientOp,
    },
    /// Raw bytes (at most 255) from a connection, in one read.
    Raw {
        conn: u8,
        bytes: Vec<u8>,
    },
    /// The client closed its side (or its socket failed).
    Closed {
        conn: u8,
    },
    /// Shard `shard % n + 1` takes its relayed inputs and applies up to `budget` of them;
    /// `accept_resume` says whether it holds players that resume.
    ShardStep {
        shard: u8,
        budget: u8,
        accept_resume: bool,
    },
    /// The fake cluster hands the connection's player to shard `to % n + 1`. Flags: bit 0,
    /// the new owner speaks before the old owner's release marker reaches the gateway;
    /// bit 1, the marker (and the old owner's output after it) goes with the old owner's
    /// next step instead of at once.
    Handoff {
        conn: u8,
        to: u8,
        flags: u8,
    },
    LinkDown {
        shard: u8,
    },
    LinkUp {
        shard: u8,
    },
    /// The shard left the cluster; its region goes to the lowest shard left. A shard that
    /// crashed fails its stream first; a `hung` one keeps it open until it is dropped.
    ShardGone {
        shard: u8,
        hung: bool,
    },
    /// The end of an event loop iteration: mail, relay batches, writes.
    Flush,
    Tick,
    Advance {
        millis: u16,
    },
    /// A delivery that answers no Move. Flags: bit 0 a chat frame, bit 1 close, bit 2
    /// resume refused, bit 3 addressed to a stale session, bit 4 a release marker to
    /// shard `to % 6` (which may not exist).
    ShardNoise {
        shard: u8,
        conn: u8,
        flags: u8,
        to: u8,
    },
    ShutDown,
}

const N_OPS: u8 = 14;

impl Op {
    pub fn decode(input: &mut Cursor<'_>) -> Op {
        match input.u8() % N_OPS {
            0 => Op::Connect,
            1 => Op::Send { conn: input.u8(), split: input.u8(), message: ClientOp::decode(input) },
            2 => {
                let conn = input.u8();
                let len = usize::from(input.u8());
                Op::Raw { conn, bytes: input.bytes(len).to_vec() }
            }
            3 => Op::Closed { conn: input.u8() },
            4 => {
                let shard = input.u8();
                let budget = input.u8();
                Op::ShardStep { shard, budget, accept_resume: input.u8() & 1 == 1 }
            }
            5 => Op::Handoff { conn: input.u8(), to: input.u8(), flags: input.u8() },
            6 => Op::LinkDown { shard: input.u8() },
            7 => Op::LinkUp { shard: input.u8() },
            8 => Op::ShardGone { shard: input.u8(), hung: input.u8() & 1 == 1 },
            9 => Op::Flush,
            10 => Op::Tick,
            11 => Op::Advance { millis: input.u16() },
            12 => Op::ShardNoise {
                shard: input.u8(),
                conn: input.u8(),
                flags: input.u8(),
                to: input.u8(),
            },
            _ => Op::ShutDown,
        }
    }

    pub fn encode(&self, out: &mut Writer) {
        match self {
            Op::Connect => {
                out.u8(0);
            }
            Op::Send { conn, split, message } => {
                out.u8(1).u8(*conn).u8(*split);
                message.encode(out);
            }
            Op::Raw { conn, bytes } => {
                let len = bytes.len().min(255);
                out.u8(2).u8(*conn).u8(len as u8).bytes(&bytes[..len]);
            }
            Op::Closed { conn } => {
                out.u8(3).u8(*conn);
            }
            Op::ShardStep { shard, budget, accept_resume } => {
                out.u8(4).u8(*shard).u8(*budget).u8(u8::from(*accept_resume));
            }
            Op::Handoff { conn, to, flags } => {
                out.u8(5).u8(*conn).u8(*to).u8(*flags);
            }
            Op::LinkDown { shard } => {
                out.u8(6).u8(*shard);
            }
            Op::LinkUp { shard } => {
                out.u8(7).u8(*shard);
            }
            Op::ShardGone { shard, hung } => {
                out.u8(8).u8(*shard).u8(u8::from(*hung));
            }
            Op::Flush => {
                out.u8(9);
            }
            Op::Tick => {
                out.u8(10);
            }
            Op::Advance { millis } => {
                out.u8(11).u16(*millis);
            }
            Op::ShardNoise { shard, conn, flags, to } => {
                out.u8(12).u8(*shard).u8(*conn).u8(*flags).u8(*to);
            }
            Op::ShutDown => {
                out.u8(13);
            }
        }
    }
}

impl ClientOp {
    fn decode(input: &mut Cursor<'_>) -> ClientOp {
        match input.u8() % 8 {
            0 => {
                let name_len = input.u8();
                let spawn = (input.u8() & 1 == 1).then(|| (input.u16(), input.u16()));
                ClientOp::Login { name_len, spawn }
            }
            1 => ClientOp::Move { direction: input.u8() },
            2 => ClientOp::Chat { len: input.u16() },
            3 => ClientOp::Ping { client_time: input.u8() },
            4 => ClientOp::Logout,
            5 => ClientOp::Resume { token: input.u8(), player: input.u8() },
            6 => ClientOp::Empty,
            _ => {
                let len = usize::from(input.u8());
                ClientOp::Body(input.bytes(len).to_vec())
            }
        }
    }

    fn encode(&self, out: &mut Writer) {
        match self {
            ClientOp::Login { name_len, spawn } => {
                out.u8(0).u8(*name_len);
                match spawn {
                    Some((x, y)) => {
                        out.u8(1).u16(*x).u16(*y);
                    }
                    None => {
                        out.u8(0);
                    }
                }
            }
            ClientOp::Move { direction } => {
                out.u8(1).u8(*direction);
            }
            ClientOp::Chat { len } => {
                out.u8(2).u16(*len);
            }
            ClientOp::Ping { client_time } => {
                out.u8(3).u8(*client_time);
            }
            ClientOp::Logout => {
                out.u8(4);
            }
            ClientOp::Resume { token, player } => {
                out.u8(5).u8(*token).u8(*player);
            }
            ClientOp::Empty => {
                out.u8(6);
            }
            ClientOp::Body(body) => {
                let len = body.len().min(255);
                out.u8(7).u8(len as u8).bytes(&body[..len]);
            }
        }
    }

    /// The frame body, drawing a `client_time` for a Move.
    pub(super) fn body(&self, next_client_time: &mut u64) -> Vec<u8> {
        let kind = match self {
            ClientOp::Login { name_len, spawn } => Some(C::Login(Login {
                name: "n".repeat(usize::from(*name_len) % 40),
                spawn: spawn.map(|(x, y)| Position { x: u32::from(x), y: u32::from(y) }),
                token: String::new(),
            })),
            ClientOp::Move { direction } => {
                let client_time = *next_client_time;
                *next_client_time += 1;
                Some(C::Move(Move { direction: i32::from(*direction % 6), client_time }))
            }
            ClientOp::Chat { len } => Some(C::Chat(meridian_protocol::pb::Chat {
                text: "c".repeat(usize::from(*len) % 300),
            })),
            ClientOp::Ping { client_time } => {
                Some(C::Ping(Ping { client_time: u64::from(*client_time) }))
            }
            ClientOp::Logout => Some(C::Logout(meridian_protocol::pb::Logout {})),
            ClientOp::Resume { token, player } => {
                let id = u64::from(*player) + 1;
                let token = match token % 3 {
                    0 => resume_key().mint(id, 1),
                    1 => TokenKey::new(vec![8; 32]).expect("a key").mint(id, 1),
                    _ => vec![*player; 7],
                };
                Some(C::Resume(meridian_protocol::pb::Resume { token }))
            }
            ClientOp::Empty => None,
            ClientOp::Body(body) => return body.clone(),
        };
        prost::Message::encode_to_vec(&ClientMessage { kind })
    }
}

/// Writes a run: the header, then the operations.
pub fn encode_run(header: [u8; 2], ops: &[Op]) -> Vec<u8> {
    let mut out = Writer::default();
    out.u8(header[0]).u8(header[1]);
    for op in ops {
        op.encode(&mut out);
    }
    out.0
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
