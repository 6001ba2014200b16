//! Simulated clients: they speak `client.proto` to a gateway core, keep the view the
//! protocol builds for them, and check as they go that every Move is answered once, in
//! order, and that no notification contradicts their view.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use meridian_protocol::pb::{
    self as client_pb, client_message::Kind as C, server_message::Kind as S,
};
use meridian_protocol::{encode_frame, next_frame};
use prost::Message;
use rand::rngs::SmallRng;
use rand::Rng;

use crate::{Ev, Settings, Sim, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientState {
    /// Not connected (yet, or again after a logout).
    Idle,
    LoggingIn,
    Playing,
    /// On a new connection, waiting for the answer to its Resume.
    Resuming,
    /// Closed by the gateway; out of the run.
    Gone,
}

pub struct Client {
    pub gateway: u32,
    slot: Option<u32>,
    /// The session id shards address the current connection by.
    pub session: u64,
    pub id: u64,
    name: String,
    pub state: ClientState,
    pub at: (u32, u32),
    pub view: BTreeMap<u64, (u32, u32)>,
    outstanding: VecDeque<u64>,
    next_time: u64,
    token: Vec<u8>,
    spawn: (u32, u32),
    zig: (i32, u32),
    read: Vec<u8>,
}

impl Client {
    pub fn new(index: u32, gateway: u32, settings: &Settings, rng: &mut SmallRng) -> Client {
        let map = settings.map;
        let middle = map / 2;
        let spawn = match settings.workload {
            Workload::RandomWalk | Workload::Churn => {
                (rng.random_range(0..map), rng.random_range(0..map))
            }
            Workload::Corners => {
                let near = |rng: &mut SmallRng| {
                    middle.saturating_sub(15) + rng.random_range(0..30).min(map - 1)
                };
                (near(rng), near(rng))
            }
            Workload::ZigZag => {
                (middle.saturating_sub(3) + rng.random_range(0..6), rng.random_range(0..map))
            }
            Workload::Battle => {
                let (x0, y0, side) = Workload::battle_box(map, settings.view_range);
                (x0 + rng.random_range(0..side), y0 + rng.random_range(0..side))
            }
            Workload::March => {
                let side = settings.view_range;
                let x0 = middle.saturating_sub(side + side / 2);
                let y0 = middle.saturating_sub(side / 2) + side;
                (x0 + rng.random_range(0..side), y0 + rng.random_range(0..side))
            }
        };
        Client {
            gateway,
            slot: None,
            session: 0,
            id: 0,
            name: format!("p{index}"),
            state: ClientState::Idle,
            at: spawn,
            view: BTreeMap::new(),
            outstanding: VecDeque::new(),
            next_time: 1,
            token: Vec::new(),
            spawn,
            zig: (1, 0),
            read: Vec::new(),
        }
    }

    /// Waiting for an answer.
    pub fn busy(&self) -> bool {
        !self.outstanding.is_empty()
            || matches!(self.state, ClientState::LoggingIn | ClientState::Resuming)
    }
}

fn frame(kind: C) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(&client_pb::ClientMessage { kind: Some(kind) }, &mut out);
    out
}

impl Sim {
    fn write(&mut self, i: usize, kind: C) {
        let client = &self.clients[i];
        let (g, Some(slot)) = (client.gateway, client.slot) else { return };
        let bytes = frame(kind);
        let now = self.now();
        let node = self.gateways.get_mut(&g).expect("the client's gateway exists");
        node.harness.set_now(now);
        node.harness.bytes(slot, &bytes);
        self.pump_gateway(g);
    }

    /// The client's next action, and when it acts again.
    pub(crate) fn client_step(&mut self, i: usize) {
        if !self.playing {
            return;
        }
        let next = Duration::from_millis(self.rng.random_range(60..120));
        match self.clients[i].state {
            ClientState::Gone => return,
            ClientState::Idle => {
                let g = self.clients[i].gateway;
                let harness = &mut self.gateways.get_mut(&g).expect("exists").harness;
                let slot = harness.connect();
                let session = harness.session(slot).unwrap_or(0);
                let client = &mut self.clients[i];
                client.slot = Some(slot);
                client.session = session;
                client.read.clear();
                client.state = ClientState::LoggingIn;
                let spawn = Some(client_pb::Position { x: client.spawn.0, y: client.spawn.1 });
                let login =
                    client_pb::Login { name: client.name.clone(), spawn, token: String::new() };
                self.write(i, C::Login(login));
            }
            ClientState::LoggingIn | ClientState::Resuming => {}
            ClientState::Playing => {
                let churn = self.settings.workload == Workload::Churn;
                let roll = self.rng.random_range(0..1000);
                if churn && roll < 15 {
                    self.drop_and_resume(i);
                } else if churn && roll < 25 && self.clients[i].outstanding.is_empty() {
                    self.write(i, C::Logout(client_pb::Logout {}));
                    let client = &mut self.clients[i];
                    client.state = ClientState::Idle;
                    client.view.clear();
                    client.spawn = client.at;
                    let (g, slot) = (client.gateway, client.slot.take());
                    if let Some(slot) = slot {
                        // The client reads nothing more on it (the gateway closes it).
                        let node = self.gateways.get_mut(&g).expect("exists");
                        let _ = node.harness.take_output(slot);
                    }
                } else if self.clients[i].outstanding.is_empty() {
                    self.send_move(i);
                }
            }
        }
        self.after(next, Ev::Client(i));
    }

    fn send_move(&mut self, i: usize) {
        let map = self.settings.map;
        let zigzag = self.settings.workload == Workload::ZigZag;
        let pick = self.rng.random_range(0..4);
        let client = &mut self.clients[i];
        let (x, y) = client.at;
        let direction = if self.settings.workload == Workload::March {
            // East half the time: the crowd drifts across the middle.
            match pick {
                0 | 1 => client_pb::Direction::Right,
                2 => client_pb::Direction::Up,
                _ => client_pb::Direction::Down,
            }
        } else if zigzag {
            if client.zig.1 == 0 {
                client.zig = (-client.zig.0, 4);
            }
            client.zig.1 -= 1;
            if client.zig.0 > 0 {
                client_pb::Direction::Right
            } else {
                client_pb::Direction::Left
            }
        } else {
            match pick {
                0 => client_pb::Direction::Up,
                1 => client_pb::Direction::Down,
                2 => client_pb::Direction::Left,
                _ => client_pb::Direction::Right,
            }
        };
        let direction = if self.settings.workload == Workload::Battle {
            // Turn back at the box's edge.
            let (x0, y0, side) = Workload::battle_box(map, self.settings.view_range);
            match direction {
                client_pb::Direction::Up if y <= y0 => client_pb::Direction::Down,
                client_pb::Direction::Down if y + 1 >= y0 + side => client_pb::Direction::Up,
                client_pb::Direction::Left if x <= x0 => client_pb::Direction::Right,
                client_pb::Direction::Right if x + 1 >= x0 + side => client_pb::Direction::Left,
                other => other,
            }
        } else {
            direction
        };
        let inside = match direction {
            client_pb::Direction::Up => y > 0,
            client_pb::Direction::Down => y + 1 < map,
            client_pb::Direction::Left => x > 0,
            _ => x + 1 < map,
        };
        if !inside {
            return;
        }
        let client_time = client.next_time;
        client.next_time += 1;
        client.outstanding.push_back(client_time);
        self.outcome.moves += 1;
        let id = client.id;
        self.note(&[id], || {
            format!("client {id} sends Move {direction:?} t{client_time} from ({x}, {y})")
        });
        self.write(i, C::Move(client_pb::Move { direction: direction as i32, client_time }));
    }

    /// The client's connection drops; it comes back on a new one with its token.
    fn drop_and_resume(&mut self, i: usize) {
        let client = &mut self.clients[i];
        let (g, Some(slot)) = (client.gateway, client.slot.take()) else { return };
        let id = client.id;
        client.outstanding.clear();
        client.view.clear();
        client.state = ClientState::Resuming;
        client.read.clear();
        let node = self.gateways.get_mut(&g).expect("exists");
        let _ = node.harness.take_output(slot);
        node.harness.closed(slot);
        let slot = node.harness.connect();
        self.clients[i].session = node.harness.session(slot).unwrap_or(0);
        self.clients[i].slot = Some(slot);
        self.note(&[id], || format!("client {id} drops its connection and resumes"));
        let token = self.clients[i].token.clone();
        self.write(i, C::Resume(client_pb::Resume { token }));
    }

    /// Reads what the gateway wrote to the client and applies it to its view.
    pub(crate) fn client_read(&mut self, i: usize) {
        let client = &mut self.clients[i];
        let (g, Some(slot)) = (client.gateway, client.slot) else { return };
        let node = self.gateways.get_mut(&g).expect("exists");
        let bytes = node.harness.take_output(slot);
        let open = node.harness.is_open(slot);
        let client = &mut self.clients[i];
        client.read.extend_from_slice(&bytes);
        let mut messages = Vec::new();
        let mut consumed = 0;
        while let Ok(Some(header)) = next_frame(&client.read[consumed..], usize::MAX) {
            let body = header.body(&client.read[consumed..]);
            if let Ok(message) = client_pb::ServerMessage::decode(body) {
                messages.extend(message.kind);
            }
            consumed += header.total_len();
        }
        client.read.drain(..consumed);
        for message in messages {
            self.client_apply(i, message);
        }
        let client = &mut self.clients[i];
        if !open && client.slot == Some(slot) && client.state != ClientState::Idle {
            let id = client.id;
            client.state = ClientState::Gone;
            client.outstanding.clear();
            client.slot = None;
            self.note(&[id], || format!("client {id}: the gateway closed its connection"));
        }
    }

    fn client_apply(&mut self, i: usize, message: S) {
        let me = self.clients[i].id;
        let line = format!("client {me} reads {message:?}");
        let subject = match &message {
            S::Entered(e) => e.player_id,
            S::Moved(m) => m.player_id,
            S::Left(l) => l.player_id,
            _ => me,
        };
        self.note(&[me, subject], || line);
        let client = &mut self.clients[i];
        let position = |p: Option<client_pb::Position>| p.map_or((0, 0), |p| (p.x, p.y));
        match message {
            S::LoginOk(ok) => {
                client.id = ok.player_id;
                client.at = position(ok.position);
                client.token = ok.resume_token;
                client.state = ClientState::Playing;
                client.view.clear();
            }
            S::ViewReset(reset) => {
                client.at = position(reset.position);
                if !reset.resume_token.is_empty() {
                    client.token = reset.resume_token;
                }
                client.view.clear();
                if client.state == ClientState::Resuming {
                    client.state = ClientState::Playing;
                }
            }
            S::Entered(entered) => {
                if entered.player_id == me {
                    return;
                }
                if client.view.insert(entered.player_id, position(entered.position)).is_some() {
                    let what = format!(
                        "player {me} told Entered for {}, already in its view",
                        entered.player_id
                    );
                    self.fail(what, vec![me, entered.player_id]);
                }
            }
            S::Moved(moved) => {
                let at = position(moved.position);
                if moved.player_id == me {
                    client.at = at;
                    if moved.client_time != 0 {
                        self.outcome.acks += 1;
                        self.answered(i, moved.client_time);
                    }
                    return;
                }
                match client.view.get_mut(&moved.player_id) {
                    Some(seen) => {
                        let was = *seen;
                        *seen = at;
                        let step = was.0.abs_diff(at.0) + was.1.abs_diff(at.1);
                        if step != 1 {
                            let what = format!(
                                "player {me} told Moved for {} from {was:?} to {at:?}: \
                                 observers see every step, one cell at a time",
                                moved.player_id
                            );
                            self.fail(what, vec![me, moved.player_id]);
                        }
                    }
                    None => {
                        let what = format!(
                            "player {me} told Moved for {}, not in its view",
                            moved.player_id
                        );
                        self.fail(what, vec![me, moved.player_id]);
                    }
                }
            }
            S::Left(left) => {
                if client.view.remove(&left.player_id).is_none() {
                    let what =
                        format!("player {me} told Left for {}, not in its view", left.player_id);
                    self.fail(what, vec![me, left.player_id]);
                }
            }
            S::Error(error) => {
                if client.state == ClientState::Resuming {
                    // The resume was refused (window passed, say): out of the run.
                    client.state = ClientState::Gone;
                    return;
                }
                if client.state == ClientState::LoggingIn {
                    client.state = ClientState::Gone;
                    return;
                }
                if error.client_time != 0 {
                    self.outcome.refused += 1;
                    self.answered(i, error.client_time);
                }
            }
            S::ActionDone(done) => self.answered(i, done.client_time),
            S::Chat(_) | S::Pong(_) | S::StateChanged(_) | S::Event(_) => {}
        }
    }

    /// A Move's answer: it must be the oldest one outstanding.
    fn answered(&mut self, i: usize, client_time: u64) {
        let client = &mut self.clients[i];
        let me = client.id;
        match client.outstanding.pop_front() {
            Some(expected) if expected == client_time => {}
            Some(expected) => {
                let what = format!(
                    "player {me}'s move t{client_time} answered while t{expected} was owed first"
                );
                self.fail(what, vec![me]);
            }
            None => {
                let what = format!("player {me}'s move t{client_time} answered twice");
                self.fail(what, vec![me]);
            }
        }
    }
}
