//! The types the shard's core and its shell share: what goes into the core
//! ([`Event`]), what comes out ([`Transmit`]), and the records the core keeps per player.
//! Nothing here does I/O or reads a clock.

use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, ShardId};
use meridian_protocol::pb as client_pb;
use meridian_protocol::{InvalidArgument, TokenKeys};
use meridian_rpc::pb::{Budgets, PeerMessage, PlayerInput, ShardBatch};
use meridian_world::{Direction, Position, WorldConfig};

use crate::sequence::InputSequence;

/// One gateway stream into this shard, numbered by the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub u32);

/// Out-of-order inputs held per local player; beyond that, the newest is refused.
pub(crate) const PENDING_LIMIT: usize = 1024;

/// What the core needs to know about itself: no addresses, no etcd, no clock.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub id: ShardId,
    pub world: WorldConfig,
    /// Seeds random spawns.
    /// This life of the shard (`ShardRecord::incarnation`): non-zero, later lives larger.
    pub incarnation: u64,
    pub seed: u64,
    /// How long a player whose connection dropped can be resumed with its token.
    pub resume_window: Duration,
    /// Sign the resume tokens handed out in LoginOk and ViewReset (the current key), and
    /// check those that come back (the current and previous keys).
    pub resume_keys: TokenKeys,
    /// With a player store: how often players whose cell changed are saved (they are
    /// saved on logout and when their connection drops, too). `None`: nothing is saved.
    pub save_interval: Option<Duration>,
    /// The shard's etcd lease TTL: a shard that did not run for longer than this (a stopped
    /// process, a frozen VM) may have been taken for dead, and acts on nothing until etcd
    /// says whether its lease is alive ([`Event::LeaseConfirmed`], [`Event::LeaseExpired`]).
    pub lease_ttl: Duration,
    /// NPCs this shard owns at most (spawns past it are refused, `GameError::TooMany`).
    pub max_npcs: usize,
}

/// NPCs a shard owns at most, by default.
pub const DEFAULT_MAX_NPCS: usize = 20_000;

/// A local player's state for the player store, at its ownership generation (the store
/// keeps a save only over one of an older or the same generation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveRecord {
    pub player: u64,
    pub generation: u64,
    pub at: (u32, u32),
    /// The game's private state of the player.
    pub state: Vec<u8>,
}

/// A persistent entity as the store keeps it (issue 34): everything needed to bring it
/// back, and the ownership it was saved under: its generation and the owning shard's id
/// and life (incarnation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityRecord {
    pub id: u64,
    pub kind: u32,
    pub name: String,
    pub at: (u32, u32),
    /// Its public state and its private (game) state.
    pub state: Vec<u8>,
    pub private: Vec<u8>,
    pub generation: u64,
    pub shard: u32,
    pub incarnation: u64,
}

/// A write of a persistent entity to the store, fenced by its generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntitySave {
    Upsert(EntityRecord),
    /// Despawned by its owner: gone for good.
    Remove {
        id: u64,
        generation: u64,
        shard: u32,
        incarnation: u64,
    },
}

impl EntitySave {
    pub fn id(&self) -> u64 {
        match self {
            EntitySave::Upsert(record) => record.id,
            EntitySave::Remove { id, .. } => *id,
        }
    }

    pub fn generation(&self) -> u64 {
        match self {
            EntitySave::Upsert(record) => record.generation,
            EntitySave::Remove { generation, .. } => *generation,
        }
    }
}

/// Something that happened to the shard, handed to the core (`ShardCore::handle`) with
/// the time it happened.
pub enum Event {
    /// A gateway's lane (one of its event-loop workers) opened its link. A session's
    /// inputs and output travel on its lane's link only (`meridian_rpc::link::session_lane`).
    LinkOpened { link: LinkId, gateway: u32, lane: u32 },
    /// A batch of inputs arrived on a gateway stream.
    Inputs { link: LinkId, inputs: Vec<PlayerInput> },
    /// A gateway stream ended.
    LinkClosed { link: LinkId },
    /// A gateway stream stopped reading (its queue is full): it is cut, its players leave.
    LinkCut { link: LinkId },
    /// After a round was sent: how many batches wait in a gateway stream's queue, and the
    /// frame bytes in them. A backlog makes the shard apply fewer moves (see `overload.rs`)
    /// long before the queue is full.
    LinkBacklog { link: LinkId, queued: Backlog },
    /// A batch of messages from a peer shard, in its stream's order.
    Peer { from: ShardId, messages: Vec<PeerMessage> },
    /// The cluster view changed (members, partition map).
    View(ClusterView),
    /// Which peer streams are open now: players are handed only to a reachable peer.
    PeersUp(Vec<ShardId>),
    /// etcd let this shard's lease expire: the cluster took it for dead. `partition` is the
    /// partition etcd held when the expiry was found (read then, not the watch's copy, which
    /// may lag behind the reassignment), if that read succeeded; it decides only for a shard
    /// that kept running (a stalled etcd), as one that did not run past its lease starts a
    /// new life. The shard registers again only once its core has taken this event, so the
    /// record that comes back says which life it is.
    LeaseExpired { partition: Option<PartitionMap> },
    /// etcd answered a keep-alive sent at `asked` with the lease alive.
    LeaseConfirmed { asked: Instant },
    /// The player store has these players' latest saves (written, or refused for a newer
    /// one): a logout waiting for its save can close.
    Saved { players: Vec<u64> },
    /// The shard is about to exit: every local player is saved where it stands now (what
    /// a drain could not hand off, or a whole cluster stopping at once).
    SaveAll,
    /// The periodic timer (every `core::TICK`).
    Tick,
    /// The game's fixed-rate tick (`--game-tick`; only with a game).
    GameTick,
    /// A block of cluster-unique entity ids for the NPCs this shard spawns (asked for with
    /// [`Transmit::WantIds`]).
    Ids(std::ops::Range<u64>),
    /// The store's answers to the game's key-value requests ([`Transmit::Kv`]).
    KvAnswers(Vec<crate::kv::KvReply>),
    /// The persistent entities the store holds ([`Transmit::LoadEntities`]).
    EntitiesFound(Vec<EntityRecord>),
    /// The claims of [`Transmit::ClaimEntities`] the store took (the rest were refused: a
    /// newer owner had saved them).
    EntitiesClaimed(Vec<EntityRecord>),
    /// The store has every write of persistent entities of the rounds up to `through`
    /// ([`Transmit::SaveEntities`]'s `round`), but for `refused`: a newer owner has those.
    EntitiesSaved { through: u64, refused: Vec<u64> },
}

/// Output of the core for the shell to send.
#[derive(Debug)]
pub enum Transmit {
    /// A batch for a gateway stream. If the stream cannot take it, the shell reports
    /// [`Event::LinkCut`] and sends nothing more on it.
    Gateway { link: LinkId, batch: ShardBatch },
    /// A round of messages for a peer shard, to be sent in order after earlier rounds.
    Peer { to: ShardId, messages: Vec<PeerMessage> },
    /// End this gateway stream (the gateway answers what it sent on it, reconnects and
    /// restores what it routes here). Nothing more is sent on it.
    CloseLink { link: LinkId },
    /// Players to save in the player store (only with `CoreConfig::save_interval`).
    Save(Vec<SaveRecord>),
    /// The core is running low on entity ids for NPCs: claim a block and hand it in with
    /// [`Event::Ids`]. Not repeated until that block arrives.
    WantIds,
    /// The game's key-value requests, to carry out in this order and answer with
    /// [`Event::KvAnswers`] (only with `CoreConfig::save_interval`: a shard with a store).
    Kv(Vec<crate::kv::KvRequest>),
    /// Persistent entities to save, fenced by generation (a newer write of one entity
    /// replaces an older one still waiting), in rounds numbered from 1: once the store has
    /// the writes of this round and every earlier one, the shell says so with
    /// [`Event::EntitiesSaved`] (with what the store refused).
    SaveEntities { round: u64, saves: Vec<EntitySave> },
    /// Read the persistent entities in the store that stand in one of `areas` (this
    /// shard's regions, `[x0, y0, x1, y1]` half-open) or were saved last by this shard,
    /// and hand them in with [`Event::EntitiesFound`] (retried until the store answers).
    LoadEntities { areas: Vec<[u32; 4]> },
    /// Write these records (each a newer generation under this shard) and hand in those
    /// the store took with [`Event::EntitiesClaimed`] (retried until the store answers).
    ClaimEntities(Vec<EntityRecord>),
}

pub(crate) struct Link {
    pub gateway: u32,
    pub lane: u32,
}

/// What waits on one gateway link's queue: batches, and the frame bytes in them (see
/// `overload.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub batches: usize,
    pub bytes: usize,
}

/// Which link of which gateway: a gateway opens one link per lane (event-loop worker) to
/// each shard, and a session belongs to one lane (the top 16 bits of its id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct GatewayLane {
    pub gateway: u32,
    pub lane: u32,
}

impl GatewayLane {
    /// The lane of `gateway` that `session` belongs to.
    pub fn of_session(gateway: u32, session: u64) -> GatewayLane {
        GatewayLane { gateway, lane: meridian_rpc::link::session_lane(session) }
    }
}

/// Where a connection's output is in this round's outbox, remembered with its seat: the
/// viewers of a battle get a hundred notifications a round each, and finding their
/// delivery by link and session every time was a tenth of a busy shard's time.
#[derive(Debug, Default, Clone)]
pub(crate) struct Memo(pub(crate) std::cell::Cell<Option<MemoAt>>);

#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoAt {
    pub(crate) round: u64,
    pub(crate) session: u64,
    pub(crate) link: LinkId,
    /// Index into the outbox's links, and of the delivery in that link's output (a link's
    /// output holds one delivery per connection: far below `u32::MAX`).
    pub(crate) link_at: u32,
    pub(crate) index: u32,
}

/// A local player: where its output goes and what its owner must remember.
pub(crate) struct Seat {
    pub link: LinkId,
    pub session: u64,
    pub gateway: u32,
    pub generation: u64,
    /// The player's inputs in `seq` order.
    pub inputs: InputSequence,
    /// Shards currently holding a ghost of this player.
    pub ghosted_at: Vec<ShardId>,
    /// Counts this player's position changes (see `PeerMessage.subject_seq`).
    pub subject_seq: u64,
    /// An NPC: moved by the game, no connection ([`NO_LINK`]), no inputs.
    pub npc: bool,
    /// A persistent NPC: saved in the store, restored from it (issue 34, `persistent.rs`).
    pub persistent: bool,
    /// The game's private state of the entity.
    pub private: Vec<u8>,
    /// An action on an entity another shard owns, sent there and not yet answered: the
    /// player's later inputs wait in `blocked` so its answers stay in order.
    pub awaiting: Option<Awaiting>,
    pub blocked: std::collections::VecDeque<PlayerInput>,
    /// The nonce of the player's valid resume token (see `meridian_protocol::token`).
    pub resume_nonce: u64,
    /// The nonce of the token this session resumed with, still good until the client
    /// speaks on the session (then it has the fresh one): a resume whose answer was lost
    /// with its connection does not lock the player out.
    pub resume_previous: Option<u64>,
    /// The login that seated the player: its `Join.login_stamp` and session (see
    /// `claims.rs`). Zero for a restore whose gateway gave none.
    pub login: (u64, u64),
    /// The chat and action budgets the gateway gave with the player's last dropped
    /// connection (`Leave.budgets`), and when: parked with the player when its connection
    /// drops, so that a resume on any gateway gets them back.
    pub budgets: Option<(Budgets, Instant)>,
    /// Where the player's output is in this round's outbox.
    pub outbox: Memo,
}

/// An action sent to its target's owner: when, and its client_time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Awaiting {
    pub since: Instant,
    pub client_time: u64,
}

/// The link of an NPC's seat: none. Output for it is never produced.
pub(crate) const NO_LINK: LinkId = LinkId(u32::MAX);

impl Seat {
    /// A seat whose next input is `next_seq`.
    pub fn new(link: LinkId, session: u64, gateway: u32, generation: u64, next_seq: u64) -> Seat {
        Seat {
            link,
            session,
            gateway,
            generation,
            inputs: InputSequence::new(next_seq, PENDING_LIMIT),
            ghosted_at: Vec::new(),
            subject_seq: 0,
            npc: false,
            persistent: false,
            private: Vec::new(),
            awaiting: None,
            blocked: Default::default(),
            resume_nonce: 0,
            resume_previous: None,
            login: (0, 0),
            budgets: None,
            outbox: Default::default(),
        }
    }

    /// The seat of an NPC owned here at `generation`.
    pub fn npc(generation: u64, subject_seq: u64, private: Vec<u8>) -> Seat {
        Seat { npc: true, private, subject_seq, ..Seat::new(NO_LINK, 0, 0, generation, 0) }
    }
}

/// A player whose connection dropped, kept for the resume window.
pub(crate) struct Parked {
    pub name: String,
    pub at: Position,
    pub generation: u64,
    pub since: Instant,
    /// The move budget it left with; given back when it resumes.
    pub move_budget: Option<meridian_world::MoveBudget>,
    /// Its private game state and public state.
    pub private: Vec<u8>,
    pub state: std::sync::Arc<[u8]>,
    /// The nonces of its valid resume tokens (see `Seat`).
    pub resume_nonce: u64,
    pub resume_previous: Option<u64>,
    /// The login that seated it (see `Seat::login`).
    pub login: (u64, u64),
    /// The budgets its connection left with (see `Seat::budgets`).
    pub budgets: Option<(Budgets, Instant)>,
}

/// `budgets` as they are at `now`: their age grows by the time since they were given.
pub(crate) fn aged((budgets, given): &(Budgets, Instant), now: Instant) -> Budgets {
    let since = now.saturating_duration_since(*given).as_millis();
    let since = u64::try_from(since).unwrap_or(u64::MAX);
    Budgets { age_ms: budgets.age_ms.saturating_add(since), ..*budgets }
}

/// Inputs for a player whose handoff has not arrived yet: since when, from which link.
pub(crate) type EarlyInputs = (Instant, Vec<(Option<LinkId>, PlayerInput)>);

pub(crate) struct HandedOff {
    /// Where inputs that still arrive here go: the shard the player was handed to, or
    /// whoever that shard (and so on) released it to since. Never back here: an input that
    /// arrives here while the player is on its way back was sent after the gateway
    /// switched, and the shard it is forwarded to sends it back after the handoff, on the
    /// same ordered stream.
    pub to: ShardId,
    /// The registration of `to` this shard knew when it handed the player there (see
    /// `ShardRecord::incarnation`; 0 if unknown): if `to` registers again, the handoff
    /// died with its old registration.
    pub incarnation: u64,
    pub generation: u64,
    pub at: Position,
    pub acked: Option<Instant>,
    pub since: Instant,
    /// Inputs forwarded from here since (at most [`FORWARDED_KEPT`]): should the player come
    /// back before the shard they went to applied them (it died with them, say), those
    /// after the returning handoff's `next_seq` are applied here.
    pub forwarded: Vec<PlayerInput>,
    /// An NPC (not listed among the players in the report).
    pub npc: bool,
}

/// Forwarded inputs a [`HandedOff`] keeps at most (the oldest are dropped first).
pub(crate) const FORWARDED_KEPT: usize = 256;

/// The world's direction for a wire value; `DIRECTION_UNSPECIFIED` and unknown values are
/// refused (proto3 enums are open, so any i32 can arrive).
pub(crate) fn world_direction(raw: i32) -> Result<Direction, InvalidArgument> {
    match client_pb::Direction::try_from(raw) {
        Ok(client_pb::Direction::Up) => Ok(Direction::Up),
        Ok(client_pb::Direction::Down) => Ok(Direction::Down),
        Ok(client_pb::Direction::Left) => Ok(Direction::Left),
        Ok(client_pb::Direction::Right) => Ok(Direction::Right),
        Ok(client_pb::Direction::Unspecified) | Err(_) => Err(InvalidArgument::BadDirection(raw)),
    }
}
