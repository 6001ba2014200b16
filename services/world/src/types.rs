//! The vocabulary of the world: ids, positions, directions, what the world tells players,
//! and the errors it returns.

use std::fmt;
use std::sync::Arc;

/// A player's id, unique across the whole cluster (DESIGN.md section 2: ids start at 1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct PlayerId(pub u64);

impl fmt::Display for PlayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A cell of the map; `0 <= x < width`, `0 <= y < height` for any position the world stores.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct Position {
    pub x: u32,
    pub y: u32,
}

impl Position {
    pub const fn new(x: u32, y: u32) -> Position {
        Position { x, y }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.x, self.y)
    }
}

/// One step on the map. `Up` decreases `y`, as in the client protocol.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Direction {
    Up,
    Down,
    Left,
    Right,
}

impl Direction {
    /// Every direction, so tests and bots can pick one without a match.
    pub const ALL: [Direction; 4] =
        [Direction::Up, Direction::Down, Direction::Left, Direction::Right];
}

/// Whether an entity belongs to this world (`Local`: a player that moves here and receives
/// notifications; `Npc`: an entity the game moves here, told nothing) or is a copy of an
/// entity owned by a neighbouring shard (`Ghost`: seen, never told anything).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum EntityKind {
    Local,
    Npc,
    Ghost,
}

impl EntityKind {
    /// Owned by this world: a local player or an NPC.
    pub fn is_local(self) -> bool {
        matches!(self, EntityKind::Local | EntityKind::Npc)
    }

    /// Told what it sees: a local player.
    pub fn is_observer(self) -> bool {
        self == EntityKind::Local
    }
}

/// What observers are shown of an entity besides where it is: its name, its game kind (0 for
/// a player) and its public state (game-defined bytes).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Look {
    pub name: Arc<str>,
    pub kind: u32,
    pub state: Arc<[u8]>,
}

/// What one player is told about one event. Names and chat texts are shared (`Arc<str>`), so
/// fanning a notification out to many observers costs a reference-count bump, not a copy.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Notification {
    /// `subject` came into sight at `position`; `kind` is 0 for a player, the game's kind for
    /// an NPC, and `state` the subject's public state.
    Entered { subject: PlayerId, position: Position, name: Arc<str>, kind: u32, state: Arc<[u8]> },
    /// `subject`, already in sight, is now at `position`. `client_time` is non-zero only in the
    /// mover's own acknowledgement, where it echoes the value the client sent.
    Moved { subject: PlayerId, position: Position, client_time: u64 },
    /// `subject` left sight or left the world.
    Left { subject: PlayerId },
    /// `speaker` said `text`.
    Chat { speaker: PlayerId, text: Arc<str> },
    /// `subject`'s public state is now `state`.
    StateChanged { subject: PlayerId, state: Arc<[u8]> },
    /// A game event from `source` (0: the world).
    Event { source: PlayerId, kind: u32, payload: Arc<[u8]> },
}

/// A notification addressed to one local player.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Envelope {
    pub to: PlayerId,
    pub note: Notification,
}

/// Why the world refused an operation. Nothing is applied and nothing is emitted when an
/// operation returns an error, so the caller can simply answer the client.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum WorldError {
    /// The id is not in this world: the caller routed a message to the wrong place, or the
    /// player has already left. The client gets `NOT_LOGGED_IN` or nothing.
    #[error("player {0} is not in this world")]
    UnknownPlayer(PlayerId),
    /// The id is already in this world, as a local player or as a ghost.
    #[error("player {0} is already in this world")]
    AlreadyPresent(PlayerId),
    /// The position is outside the map; the client (or a neighbour) sent a bad position.
    #[error("position {0} is outside the map")]
    OutsideMap(Position),
    /// The player moved faster than `move_rate` allows; the client gets `RATE_LIMITED`.
    #[error("too many moves")]
    RateLimited,
    /// A player operation (move, chat, logout, demote) named a ghost: the caller mixed up which
    /// shard owns the player.
    #[error("player {0} is a ghost here, not a local player")]
    NotLocal(PlayerId),
    /// A ghost operation (upsert, remove, chat, promote) named a local player: a neighbour
    /// claims a player this world owns.
    #[error("player {0} is a local player here, not a ghost")]
    NotGhost(PlayerId),
}
