//! The world task: the one place the shard's world is mutated.
//!
//! Commands from every gateway stream arrive on one bounded queue and are applied in
//! arrival order, a batch at a time; the notifications of a whole batch are grouped per
//! connection and sent as one `ShardBatch` per gateway link. One task owns the world, so
//! the rules need no locks, and per-player order is the queue's order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_protocol::pb::{self as client_pb, ErrorCode, ServerMessage};
use meridian_protocol::{server, InvalidArgument};
use meridian_rpc::pb::{player_input::Kind, PlayerInput, ShardBatch};
use meridian_world::{Direction, Envelope, Notification, PlayerId, Position, World};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{debug, warn};

use crate::outbox::Outbox;
use crate::{ShardConfig, ShardMetrics};

/// Batches a gateway link may have queued before it counts as not keeping up and is cut.
pub const LINK_QUEUE: usize = 1024;
/// Commands queued for the world task before gateway streams are slowed down.
const COMMAND_QUEUE: usize = 4096;
/// Commands applied per round before output is flushed.
const ROUND: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkId(pub u32);

pub enum Command {
    Open {
        link: LinkId,
        out: mpsc::Sender<Result<ShardBatch, Status>>,
    },
    Inputs {
        link: LinkId,
        inputs: Vec<PlayerInput>,
    },
    Closed {
        link: LinkId,
    },
}

/// Where a player's output goes: which gateway stream, which connection on it.
#[derive(Debug, Clone, Copy)]
struct Seat {
    link: LinkId,
    session: u64,
}

pub struct WorldActor {
    id: ShardId,
    world: World,
    dev_mode: bool,
    view: Arc<EpochCell<ClusterView>>,
    metrics: Arc<ShardMetrics>,
    commands: mpsc::Receiver<Command>,
    links: HashMap<LinkId, mpsc::Sender<Result<ShardBatch, Status>>>,
    seats: HashMap<PlayerId, Seat>,
    outbox: Outbox,
    envelopes: Vec<Envelope>,
    rng: SmallRng,
    started: Instant,
    resume_key: meridian_protocol::TokenKey,
}

/// How long a resume token stays valid; the resume window after a drop is shorter and is
/// enforced by the server separately.
const TOKEN_LIFETIME_SECS: u64 = 24 * 3600;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl WorldActor {
    pub fn new(
        config: &ShardConfig,
        view: Arc<EpochCell<ClusterView>>,
        metrics: Arc<ShardMetrics>,
    ) -> (mpsc::Sender<Command>, WorldActor) {
        let (sender, commands) = mpsc::channel(COMMAND_QUEUE);
        let actor = WorldActor {
            id: config.id,
            world: World::new(config.world.clone()),
            dev_mode: config.dev_mode,
            view,
            metrics,
            commands,
            links: HashMap::new(),
            seats: HashMap::new(),
            outbox: Outbox::default(),
            envelopes: Vec::with_capacity(1024),
            rng: SmallRng::seed_from_u64(config.seed ^ u64::from(config.id.0)),
            started: Instant::now(),
            resume_key: config.resume_key.clone(),
        };
        (sender, actor)
    }

    pub async fn run(mut self) {
        let mut round = Vec::with_capacity(ROUND);
        while self.commands.recv_many(&mut round, ROUND).await > 0 {
            for command in round.drain(..) {
                match command {
                    Command::Open { link, out } => {
                        self.links.insert(link, out);
                        self.metrics.links.set(self.links.len() as i64);
                    }
                    Command::Inputs { link, inputs } => {
                        self.metrics.batches_in.inc();
                        for input in inputs {
                            self.apply(link, input);
                        }
                    }
                    Command::Closed { link } => self.drop_link(link),
                }
            }
            self.flush();
        }
        debug!(shard = %self.id, "world task stopped");
    }

    fn apply(&mut self, link: LinkId, input: PlayerInput) {
        let player = PlayerId(input.player_id);
        let session = input.session;
        let Some(kind) = input.kind else {
            return;
        };
        if let Kind::Join(join) = kind {
            self.join(link, session, player, join);
            return;
        }
        let Some(&seat) = self.seats.get(&player) else {
            // The player is not here (already gone, or never placed on this shard).
            match &kind {
                Kind::Move(m) => {
                    let detail = "player is not on this shard";
                    let error = server::error(ErrorCode::Unavailable, detail, m.client_time);
                    self.outbox.push_move_answer(link, session, &error);
                }
                Kind::Ping(ping) => {
                    self.outbox
                        .push(link, session, &server::pong(ping.client_time))
                }
                _ => {}
            }
            return;
        };
        let now = self.started.elapsed();
        match kind {
            Kind::Join(_) => {}
            Kind::Move(m) => match world_direction(m.direction) {
                Err(invalid) => {
                    let error = server::error(invalid.code(), invalid.to_string(), m.client_time);
                    self.outbox
                        .push_move_answer(seat.link, seat.session, &error);
                }
                Ok(direction) => {
                    match self.world.move_player(
                        player,
                        direction,
                        m.client_time,
                        now,
                        &mut self.envelopes,
                    ) {
                        Ok(_) => self.metrics.moves.inc(),
                        Err(meridian_world::WorldError::RateLimited) => {
                            self.metrics.moves_rate_limited.inc();
                            let error = server::error(
                                ErrorCode::RateLimited,
                                "more moves per second than the limit",
                                m.client_time,
                            );
                            self.outbox
                                .push_move_answer(seat.link, seat.session, &error);
                        }
                        Err(error) => {
                            warn!(%player, %error, "move refused by the world");
                            let error = server::error(
                                ErrorCode::Unavailable,
                                error.to_string(),
                                m.client_time,
                            );
                            self.outbox
                                .push_move_answer(seat.link, seat.session, &error);
                        }
                    }
                }
            },
            Kind::Chat(chat) => {
                self.metrics.chats.inc();
                if let Err(error) = self
                    .world
                    .chat(player, chat.text.into(), &mut self.envelopes)
                {
                    warn!(%player, %error, "chat refused by the world");
                }
            }
            Kind::Ping(ping) => {
                self.outbox
                    .push(seat.link, seat.session, &server::pong(ping.client_time));
            }
            Kind::Leave(leave) => {
                self.remove(player);
                if leave.logout {
                    self.outbox.close(seat.link, seat.session);
                }
            }
        }
        self.route_envelopes();
    }

    fn join(&mut self, link: LinkId, session: u64, player: PlayerId, join: meridian_rpc::pb::Join) {
        let config = self.world.config().clone();
        let spawn = match join.spawn {
            Some(p) if self.dev_mode => Some(Position { x: p.x, y: p.y }),
            _ => self.random_cell(),
        };
        let Some(at) = spawn else {
            let error = server::error(ErrorCode::Unavailable, "shard holds no region yet", 0);
            self.outbox.push(link, session, &error);
            self.outbox.close(link, session);
            return;
        };
        let name: Arc<str> = join.name.into();
        let now = self.started.elapsed();
        // LoginOk goes first: the Entered messages the login causes for this player follow.
        let login_ok = ServerMessage {
            kind: Some(client_pb::server_message::Kind::LoginOk(
                client_pb::LoginOk {
                    player_id: player.0,
                    position: server::position(at.x, at.y),
                    resume_token: self
                        .resume_key
                        .mint(player.0, unix_now() + TOKEN_LIFETIME_SECS),
                    map_width: config.width,
                    map_height: config.height,
                    view_range: config.view_range,
                },
            )),
        };
        match self.world.login(player, name, at, now, &mut self.envelopes) {
            Ok(()) => {
                self.outbox.push(link, session, &login_ok);
                self.seats.insert(player, Seat { link, session });
                self.metrics.logins.inc();
                self.metrics.players.set(self.seats.len() as i64);
                self.route_envelopes();
            }
            Err(error) => {
                warn!(%player, %error, "join refused by the world");
                let message = server::error(ErrorCode::InvalidArgument, error.to_string(), 0);
                self.outbox.push(link, session, &message);
            }
        }
    }

    /// A uniformly random cell of this shard's regions (by area), if it holds any.
    fn random_cell(&mut self) -> Option<Position> {
        let me = self.id;
        let regions: Vec<meridian_cluster::Region> = self.view.read(|v| {
            v.partition
                .as_ref()
                .map(|p| p.regions_of(me).copied().collect())
                .unwrap_or_default()
        });
        let total: u64 = regions.iter().map(|r| r.area()).sum();
        if total == 0 {
            return None;
        }
        let mut pick = self.rng.random_range(0..total);
        for region in regions {
            if pick < region.area() {
                let width = u64::from(region.x1 - region.x0);
                let x = region.x0 + (pick % width) as u32;
                let y = region.y0 + (pick / width) as u32;
                return Some(Position { x, y });
            }
            pick -= region.area();
        }
        None
    }

    fn remove(&mut self, player: PlayerId) {
        if self.seats.remove(&player).is_some() {
            if let Err(error) = self.world.logout(player, &mut self.envelopes) {
                warn!(%player, %error, "leave refused by the world");
            }
            self.metrics.leaves.inc();
            self.metrics.players.set(self.seats.len() as i64);
        }
    }

    /// Turns the world's envelopes into frames for their recipients' connections.
    fn route_envelopes(&mut self) {
        for envelope in self.envelopes.drain(..) {
            let Some(seat) = self.seats.get(&envelope.to) else {
                continue;
            };
            let message = match envelope.note {
                Notification::Entered {
                    subject,
                    position,
                    name,
                } => server::entered(subject.0, position.x, position.y, &*name),
                Notification::Moved {
                    subject,
                    position,
                    client_time,
                } => {
                    let message = server::moved(subject.0, position.x, position.y, client_time);
                    if subject == envelope.to {
                        // The mover's own ack: counted so the gateway knows it is answered.
                        self.outbox
                            .push_move_answer(seat.link, seat.session, &message);
                        continue;
                    }
                    message
                }
                Notification::Left { subject } => server::left(subject.0),
                Notification::Chat { speaker, text } => server::chat(speaker.0, &*text),
            };
            self.outbox.push(seat.link, seat.session, &message);
        }
    }

    fn drop_link(&mut self, link: LinkId) {
        self.links.remove(&link);
        self.outbox.forget_link(link);
        let gone: Vec<PlayerId> = self
            .seats
            .iter()
            .filter(|(_, seat)| seat.link == link)
            .map(|(id, _)| *id)
            .collect();
        for player in gone {
            self.remove(player);
        }
        self.route_envelopes();
        self.metrics.links.set(self.links.len() as i64);
    }

    /// Sends this round's output. A link whose queue is full has stopped reading: it is cut
    /// (its players leave the world) rather than allowed to slow every other gateway.
    fn flush(&mut self) {
        self.metrics.notifications.add(self.outbox.n_messages);
        let mut cut = Vec::new();
        for (link, batch, bytes) in self.outbox.drain() {
            let Some(out) = self.links.get(&link) else {
                continue;
            };
            self.metrics.delivery_bytes.add(bytes);
            self.metrics.batches_out.inc();
            if out.try_send(Ok(batch)).is_err() {
                cut.push(link);
            }
        }
        for link in cut {
            warn!(link = link.0, "gateway link not keeping up; cutting it");
            self.metrics.links_cut.inc();
            self.drop_link(link);
        }
    }
}

/// The world's direction for a wire value; `DIRECTION_UNSPECIFIED` and unknown values are
/// refused (proto3 enums are open, so any i32 can arrive).
fn world_direction(raw: i32) -> Result<Direction, InvalidArgument> {
    match client_pb::Direction::try_from(raw) {
        Ok(client_pb::Direction::Up) => Ok(Direction::Up),
        Ok(client_pb::Direction::Down) => Ok(Direction::Down),
        Ok(client_pb::Direction::Left) => Ok(Direction::Left),
        Ok(client_pb::Direction::Right) => Ok(Direction::Right),
        Ok(client_pb::Direction::Unspecified) | Err(_) => Err(InvalidArgument::BadDirection(raw)),
    }
}
