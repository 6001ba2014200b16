//! Meridian's game API: where a studio's rules live.
//!
//! A game is a [`Game`]: hooks the shard calls when a player logs in or out, when a client
//! `Action` arrives, when an entity is handed to this shard, when a game message reaches an
//! entity owned here, and on a fixed-rate tick (10 Hz by default) for NPC behaviour. Every
//! hook gets a [`Context`], through which the game reads the world around it and changes
//! what this shard owns: it spawns and despawns NPCs, steps entities one cell at a time
//! (the same rules and rate limit as players), sets an entity's public state (shown to
//! everyone who sees it, sent at most once per tick) and private state (saved with a player,
//! carried in handoffs), sends game events to players, and sends messages to entities
//! owned by other shards.
//!
//! One game instance runs per shard and sees only that shard's part of the seamless world:
//! the entities it owns, and the copies (ghosts) of entities near its borders that
//! neighbours own. An entity crossing a border is handed to the next shard with its state;
//! the game there is told with [`Game::arrived`]. A game must keep what an entity needs in
//! the entity's state (public or private), not in the game instance, or it will not follow
//! the entity across borders.
//!
//! Like `meridian-world`, this crate does no I/O and reads no clock: time and randomness
//! come from the context, which the shard derives from its events and its seed, so the
//! same events give the same game (and `meridian-sim` can run games too).
//!
//! Actions that create entities need a budget: an NPC costs its shard for as long as it
//! lives, so the action rate limit alone lets one player fill a shard. [`budget`] has a
//! small helper for that, [`SpawnBudget`]: a cap on what one player may have alive, a cap
//! on what the shard may hold, and a token bucket per player, driven by
//! [`Context::now`]; refused, the game answers `REJECTED` with the refusal's text. The
//! example game (`meridian-wolves`) uses it for SUMMON. The API has no metrics of its own:
//! a refusal answered `REJECTED` is counted with every other rejected action in the
//! shard's `meridian_shard_actions_rejected_total`, and [`SpawnBudget::refusals`] counts
//! them by reason for the game to log.

use std::sync::Arc;
use std::time::Duration;

pub use meridian_world::{Direction, Position};

pub mod budget;
pub use budget::{Rate, SpawnBudget, SpawnLimits, SpawnRefusal, SpawnRefusals};

/// An entity's id: players and NPCs share one id space, unique across the cluster.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EntityId(pub u64);

impl std::fmt::Display for EntityId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The largest public or private state, and the largest action payload, in bytes.
pub const MAX_STATE_BYTES: usize = 1024;

/// The longest key of the game's key-value space, in bytes (at least 1).
pub const KV_KEY_MAX: usize = 128;
/// The largest value of the game's key-value space, in bytes.
pub const KV_VALUE_MAX: usize = 16 * 1024;

/// A request to the game's key-value space, as [`Context::kv_get`] and [`Context::kv_set`]
/// hand it out: its answer comes to [`Game::kv_answer`] with the same ticket, in a later
/// round. Tickets are unique within a shard's life.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct KvTicket(pub u64);

/// An entry of the game's key-value space: its value and version. Every write gives an
/// entry a new version, never reused (not even after a delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvValue {
    pub value: Vec<u8>,
    pub version: u64,
}

/// What the store answered a key-value request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvAnswer {
    /// A read: the entry, or `None` if the key has none.
    Found(Option<KvValue>),
    /// A write happened: the entry's new version (0 after a delete).
    Written { version: u64 },
    /// A conditional write did not happen: the entry's version was not the one expected.
    /// The entry as it is now (`None`: absent); read-modify-write again from it.
    Conflict(Option<KvValue>),
    /// The store failed or could not be reached; nothing is known to have been written.
    Failed(String),
}

/// A client's `Action`, as the game gets it.
#[derive(Debug, Clone, Copy)]
pub struct Action<'a> {
    /// Game-defined, never 0.
    pub kind: u32,
    pub payload: &'a [u8],
    /// The entity acted on, if any: owned by this shard (an action on an entity another
    /// shard owns is carried out there).
    pub target: Option<EntityId>,
}

/// The answer to an action: `ActionDone` with a payload, or `REJECTED` with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Done(Vec<u8>),
    Rejected(String),
}

impl Reply {
    pub fn done() -> Reply {
        Reply::Done(Vec::new())
    }

    pub fn rejected(why: impl Into<String>) -> Reply {
        Reply::Rejected(why.into())
    }
}

/// What the game sees of an entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    pub id: EntityId,
    pub position: Position,
    pub name: Arc<str>,
    /// 0 for a player; the game's kind for an NPC.
    pub kind: u32,
    /// Its public state.
    pub state: Arc<[u8]>,
    /// Owned by this shard (the game may change it); else a copy of a neighbour's.
    pub owned: bool,
    /// Saved in the store and restored from it ([`Context::persist`]).
    pub persistent: bool,
}

impl Entity {
    pub fn is_player(&self) -> bool {
        self.kind == 0
    }
}

/// Why the context refused a change. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GameError {
    #[error("entity {0} is not owned by this shard")]
    NotOwned(EntityId),
    #[error("entity {0} is not here")]
    Unknown(EntityId),
    #[error("{0} is outside the map or not in this shard's region")]
    NotHere(Position),
    #[error("too many moves")]
    RateLimited,
    #[error("state is {0} bytes, the limit is 1024")]
    TooLarge(usize),
    #[error("an NPC's kind must not be 0 (that is a player)")]
    NoKind,
    #[error("an NPC's name must be a valid player name (1..=32 bytes once normalised; see validate_name)")]
    BadName,
    #[error("no entity ids to hand out yet (etcd is slow or unreachable)")]
    NoIds,
    #[error("too many NPCs on this shard (limit {0})")]
    TooMany(usize),
    #[error("players are moved by their clients")]
    IsPlayer(EntityId),
    #[error("this shard has no store (run it with --store)")]
    NoStore,
    #[error("a key is 1 to 128 bytes and a value at most 16 KiB; this one is {0} bytes")]
    KvTooBig(usize),
    #[error("too many key-value requests waiting for the store on this shard (limit {0})")]
    KvBusy(usize),
}

/// What a shard offers a game: implemented by the shard's core. Games use it through
/// [`Context`].
pub trait Host {
    /// Time since the shard started.
    fn now(&self) -> Duration;
    /// This shard's id.
    fn shard(&self) -> u32;
    /// The map's size and the view range.
    fn map(&self) -> (u32, u32, u32);
    fn entity(&self, id: EntityId) -> Option<Entity>;
    /// Entities within `range` cells (Chebyshev) of `at`, owned or mirrored here; through
    /// the sector grid, so as far as the sight range reaches.
    fn within(&self, at: Position, range: u32, out: &mut Vec<EntityId>);
    /// NPCs owned here.
    fn npcs(&self, out: &mut Vec<EntityId>);
    /// Players owned here.
    fn players(&self, out: &mut Vec<EntityId>);
    /// Whether this shard owns the cell.
    fn owns(&self, at: Position) -> bool;
    /// A uniformly random cell of this shard's region, if it has one.
    fn random_cell(&mut self) -> Option<Position>;
    /// The next number of the shard's deterministic random sequence.
    fn random(&mut self) -> u64;
    fn spawn(
        &mut self,
        kind: u32,
        name: &str,
        at: Position,
        state: Vec<u8>,
    ) -> Result<EntityId, GameError>;
    fn despawn(&mut self, id: EntityId) -> Result<(), GameError>;
    /// Makes an NPC owned here persistent.
    fn persist(&mut self, id: EntityId) -> Result<(), GameError>;
    /// Whether this shard has a store (persistent entities, the key-value space).
    fn has_store(&self) -> bool;
    fn step(&mut self, id: EntityId, direction: Direction) -> Result<Position, GameError>;
    fn set_state(&mut self, id: EntityId, state: Vec<u8>) -> Result<(), GameError>;
    fn private_state(&self, id: EntityId) -> Option<&[u8]>;
    fn set_private_state(&mut self, id: EntityId, state: Vec<u8>) -> Result<(), GameError>;
    /// A `GameEvent` for one player (wherever it is owned).
    fn event_to(&mut self, player: EntityId, source: Option<EntityId>, kind: u32, payload: &[u8]);
    /// A `GameEvent` for everyone who sees `source` (on every shard).
    fn event_around(&mut self, source: EntityId, kind: u32, payload: &[u8]);
    /// A message for `to`, handled by its owner's [`Game::message`].
    fn send(&mut self, to: EntityId, from: EntityId, kind: u32, payload: &[u8]);
    /// Asks the store for the entry at `key`.
    fn kv_get(&mut self, key: &[u8]) -> Result<KvTicket, GameError>;
    /// Asks the store to write `value` at `key` (`None`: delete), if the entry's version is
    /// `expected` (0: absent), or unconditionally with `expected: None`.
    fn kv_set(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        expected: Option<u64>,
    ) -> Result<KvTicket, GameError>;
}

/// What a hook can read and change. Changes take effect at once (a spawned NPC can be
/// stepped in the same hook); what they tell clients is sent with the shard's round.
pub struct Context<'a> {
    host: &'a mut dyn Host,
}

impl<'a> Context<'a> {
    pub fn new(host: &'a mut dyn Host) -> Context<'a> {
        Context { host }
    }

    pub fn now(&self) -> Duration {
        self.host.now()
    }

    pub fn shard(&self) -> u32 {
        self.host.shard()
    }

    /// (width, height, view range) of the map.
    pub fn map(&self) -> (u32, u32, u32) {
        self.host.map()
    }

    pub fn entity(&self, id: EntityId) -> Option<Entity> {
        self.host.entity(id)
    }

    pub fn position(&self, id: EntityId) -> Option<Position> {
        self.host.entity(id).map(|e| e.position)
    }

    /// Entities within `range` cells of `at` (at most the view range is guaranteed).
    pub fn within(&self, at: Position, range: u32) -> Vec<EntityId> {
        let mut out = Vec::new();
        self.host.within(at, range, &mut out);
        out.sort_unstable();
        out
    }

    /// The NPCs this shard owns, in id order.
    pub fn npcs(&self) -> Vec<EntityId> {
        let mut out = Vec::new();
        self.host.npcs(&mut out);
        out.sort_unstable();
        out
    }

    /// The players this shard owns, in id order.
    pub fn players(&self) -> Vec<EntityId> {
        let mut out = Vec::new();
        self.host.players(&mut out);
        out.sort_unstable();
        out
    }

    pub fn owns(&self, at: Position) -> bool {
        self.host.owns(at)
    }

    pub fn random_cell(&mut self) -> Option<Position> {
        self.host.random_cell()
    }

    /// A deterministic random number in `0..n` (0 if `n` is 0).
    pub fn random_below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.host.random() % n
    }

    /// Spawns an NPC of `kind` (non-zero) at `at`, a cell this shard owns. Players that see
    /// it get `Entered` with its kind and state.
    pub fn spawn(
        &mut self,
        kind: u32,
        name: &str,
        at: Position,
        state: Vec<u8>,
    ) -> Result<EntityId, GameError> {
        self.host.spawn(kind, name, at, state)
    }

    /// Removes an NPC owned here; those that see it get `Left`. A persistent one is
    /// removed from the store too.
    pub fn despawn(&mut self, id: EntityId) -> Result<(), GameError> {
        self.host.despawn(id)
    }

    /// Makes an NPC owned here **persistent**: from now on its kind, name, cell, public and
    /// private state are saved in the store (at once, then every save interval if they
    /// changed, and when the shard stops), fenced by its owner's generation; it is handed
    /// off with its cell like any NPC, and after its shard dies, drains or the whole
    /// cluster restarts on the same store, the shard owning its cell brings it back from
    /// the store where it was last saved, private state included ([`Game::arrived`] is
    /// called there). A persistent entity stays until it is despawned. `NoStore` on a shard
    /// without a store. Players are persistent already (saved with their account).
    pub fn persist(&mut self, id: EntityId) -> Result<(), GameError> {
        self.host.persist(id)
    }

    /// [`Context::spawn`] and [`Context::persist`] in one: an NPC that outlives its shard.
    /// Without a store nothing is spawned (`NoStore`).
    pub fn spawn_persistent(
        &mut self,
        kind: u32,
        name: &str,
        at: Position,
        state: Vec<u8>,
    ) -> Result<EntityId, GameError> {
        if !self.host.has_store() {
            return Err(GameError::NoStore);
        }
        let id = self.host.spawn(kind, name, at, state)?;
        if let Err(error) = self.host.persist(id) {
            let _ = self.host.despawn(id);
            return Err(error);
        }
        Ok(id)
    }

    /// Steps an NPC owned here one cell (under the move rate limit). Stepping out of the
    /// region hands it to the neighbour that owns the cell.
    pub fn step(&mut self, id: EntityId, direction: Direction) -> Result<Position, GameError> {
        self.host.step(id, direction)
    }

    /// Sets the public state of an entity owned here (a player or an NPC); everyone who sees
    /// it gets `StateChanged` at the end of the tick.
    pub fn set_state(&mut self, id: EntityId, state: Vec<u8>) -> Result<(), GameError> {
        self.host.set_state(id, state)
    }

    /// The private state of an entity owned here (empty if never set).
    pub fn private_state(&self, id: EntityId) -> Option<&[u8]> {
        self.host.private_state(id)
    }

    /// Sets the private state of an entity owned here: never shown to clients, carried in
    /// handoffs, and saved with a player.
    pub fn set_private_state(&mut self, id: EntityId, state: Vec<u8>) -> Result<(), GameError> {
        self.host.set_private_state(id, state)
    }

    /// Sends a `GameEvent` to one player, wherever it is owned.
    pub fn event_to(
        &mut self,
        player: EntityId,
        source: Option<EntityId>,
        kind: u32,
        payload: &[u8],
    ) {
        self.host.event_to(player, source, kind, payload)
    }

    /// Sends a `GameEvent` from `source` to everyone who sees it, on every shard.
    pub fn event_around(&mut self, source: EntityId, kind: u32, payload: &[u8]) {
        self.host.event_around(source, kind, payload)
    }

    /// Sends a game message to an entity; its owner's [`Game::message`] handles it (here
    /// after the current hook, or on the neighbour that owns it). Lost if the entity is gone.
    pub fn send(&mut self, to: EntityId, from: EntityId, kind: u32, payload: &[u8]) {
        self.host.send(to, from, kind, payload)
    }

    /// Whether this shard has a store: without one nothing is persistent
    /// ([`Context::persist`]) and the key-value space refuses every request (`NoStore`).
    pub fn has_store(&self) -> bool {
        self.host.has_store()
    }

    /// Reads the entry at `key` of the game's key-value space, shared by every shard and
    /// kept in the store. The answer comes to [`Game::kv_answer`] in a later round. Refused
    /// at once without a store, with a key over [`KV_KEY_MAX`] bytes (or empty), or when the
    /// shard has too many requests waiting for the store (1,024; counted in
    /// `meridian_shard_kv_requests_total{outcome="busy"}`).
    pub fn kv_get(&mut self, key: &[u8]) -> Result<KvTicket, GameError> {
        self.host.kv_get(key)
    }

    /// Writes `value` at `key` (`None`: deletes it). With `expected: Some(version)` the
    /// write is a compare-and-set: it happens only if the entry's version is still
    /// `version` (0: the key must be absent), else the answer is [`KvAnswer::Conflict`] with
    /// the entry as it is now. Of two shards writing one key expecting the same version,
    /// exactly one succeeds. With `expected: None` the write wins over whatever is there.
    /// A shard's requests are carried out in the order it made them. Refused at once as
    /// [`Context::kv_get`] is, and for a value over [`KV_VALUE_MAX`] bytes.
    pub fn kv_set(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        expected: Option<u64>,
    ) -> Result<KvTicket, GameError> {
        self.host.kv_set(key, value, expected)
    }
}

/// A studio's game rules. Every hook has a default that does nothing (an action is
/// rejected), so the empty implementation is a world with no rules: today's Meridian.
pub trait Game: Send {
    /// The fixed-rate tick of this shard (`--game-tick`, 100 ms by default).
    fn tick(&mut self, ctx: &mut Context<'_>) {
        let _ = ctx;
    }

    /// A player logged in (or came back after its shard died, or resumed) on this shard.
    fn player_joined(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        let _ = (ctx, player);
    }

    /// A player logged out or its connection dropped; it is still in the world during the
    /// call, and gone after it.
    fn player_left(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        let _ = (ctx, player);
    }

    /// A player's action, on this shard (where the player is, or where its target is).
    /// The actor may be a copy of a neighbour's player. An action answered `Done` whose
    /// hook saved a persistent entity (spawned, persisted or despawned one) is answered
    /// only once the store has it: nothing acknowledged is lost with a shard killed right
    /// after; the player's later inputs wait behind it, and a store that does not confirm
    /// within 2 s gets it answered `UNAVAILABLE`.
    fn action(&mut self, ctx: &mut Context<'_>, actor: EntityId, action: Action<'_>) -> Reply {
        let _ = (ctx, actor, action);
        Reply::rejected("this world has no actions")
    }

    /// A message sent with [`Context::send`] to `to`, an entity owned here.
    fn message(
        &mut self,
        ctx: &mut Context<'_>,
        to: EntityId,
        from: EntityId,
        kind: u32,
        payload: &[u8],
    ) {
        let _ = (ctx, to, from, kind, payload);
    }

    /// An entity (player or NPC) was handed to this shard with its state, or an NPC was
    /// restored here after its shard died.
    fn arrived(&mut self, ctx: &mut Context<'_>, entity: EntityId) {
        let _ = (ctx, entity);
    }

    /// The store's answer to [`Context::kv_get`] or [`Context::kv_set`] (the request's
    /// ticket and key).
    fn kv_answer(&mut self, ctx: &mut Context<'_>, ticket: KvTicket, key: &[u8], answer: KvAnswer) {
        let _ = (ctx, ticket, key, answer);
    }
}

/// The game of the stock binary: no rules.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoGame;

impl Game for NoGame {}

/// Makes one game instance per shard (given the shard's id).
pub type GameFactory = Arc<dyn Fn(u32) -> Box<dyn Game> + Send + Sync>;

/// The factory of a game type that is `Default`.
pub fn factory<G: Game + Default + 'static>() -> GameFactory {
    Arc::new(|_| Box::new(G::default()))
}
