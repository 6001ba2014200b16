//! The player store: every account's player (its cluster-wide `player_id`, display name,
//! last saved cell, game state and the ownership generation of that save), behind one
//! interface with two implementations:
//!
//! - **SQLite** (`sqlite:PATH`, or a plain path with no `SCHEME:` in front): an embedded file, the default for
//!   `meridian up` and single machines: zero setup;
//! - **PostgreSQL** (`postgres://...` or `postgresql://...`): for clusters, shared by every
//!   shard.
//!
//! Any other scheme is refused ([`Address::parse`]): a misspelt URL is not a file name.
//!
//! Saves are **fenced** and **batched**. A save carries the generation of the shard that owns
//! the player; a row is only overwritten by a save of the same generation or a newer one,
//! so an old owner (a shard paused past its lease that wakes up) cannot roll a player back.
//! [`Store::save`] writes a whole batch in one statement (PostgreSQL: one round trip of a
//! prepared statement over arrays; SQLite: one transaction), up to [`MAX_BATCH`] rows at a
//! time, and says which rows it refused.
//!
//! Persistent entities ([`Store::save_entities`]) are fenced too, by generation and by the
//! shard that wrote them, and a removed one leaves a tombstone (see `entities`).
//!
//! The store is async: PostgreSQL through `tokio-postgres`, SQLite on the blocking pool (its
//! calls are short, one transaction each, and never on the caller's task).

mod entities;
mod kv;
mod postgres;
mod sqlite;

pub use entities::{
    Area, EntityReport, EntityRow, EntityWrite, ENTITY_NAME_MAX, ENTITY_STATE_MAX, MAX_AREAS,
};
pub use kv::{KvEntry, KvWrite, KV_KEY_MAX, KV_VALUE_MAX};

use std::fmt;
use std::path::PathBuf;

/// Rows one [`Store::save`] statement carries at most; a bigger batch is split (each part
/// still one statement).
pub const MAX_BATCH: usize = 1_000;

/// A cell of the map.
pub type Cell = (u32, u32);

/// An account's player as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Player {
    pub account: String,
    pub player_id: u64,
    pub name: String,
    /// The last save, if the player was ever saved.
    pub saved: Option<Saved>,
}

/// What a save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub at: Cell,
    /// The game's private state of the player (opaque to the store).
    pub state: Vec<u8>,
    /// The ownership generation of the shard that saved it.
    pub generation: u64,
}

/// One player's state to save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Save {
    pub player_id: u64,
    pub generation: u64,
    pub at: Cell,
    pub state: Vec<u8>,
}

/// What a batch of saves did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaveReport {
    pub written: usize,
    /// Players whose row was not written: a newer generation is saved already (fenced out),
    /// or the store has no such player.
    pub refused: Vec<u64>,
}

#[derive(Debug, Clone)]
pub enum StoreError {
    /// The store cannot be reached or failed; worth trying again.
    Unavailable(String),
    /// The id offered for a new account belongs to another account already: offer another.
    IdTaken(u64),
    /// The store's address cannot be understood.
    BadAddress(String),
    /// A key or value of the game's key-value space over its bound (see `kv`).
    TooBig(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(why) => write!(f, "player store unavailable: {why}"),
            StoreError::IdTaken(id) => write!(f, "player id {id} belongs to another account"),
            StoreError::BadAddress(why) => write!(f, "bad player store address: {why}"),
            StoreError::TooBig(why) => write!(f, "too big for the store: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Where the store is, from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Address {
    /// `postgres://...` or `postgresql://...`: PostgreSQL; `sqlite:PATH` (or
    /// `sqlite://PATH`): an SQLite file at PATH; a plain path with no `SCHEME:` in front
    /// (`players.sqlite`, `./data/p.db`, `/var/lib/meridian/p.db`): an SQLite file too.
    /// Anything else that starts like a URL (`bogus:xyz`, `postgress://db/game`, `mysql://`)
    /// is refused rather than taken for a file name.
    pub fn parse(spec: &str) -> Result<Address, StoreError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(StoreError::BadAddress("empty".into()));
        }
        let Some((scheme, rest)) = url_scheme(spec) else {
            return Ok(Address::Sqlite(PathBuf::from(spec)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" if rest.starts_with("//") => {
                Ok(Address::Postgres(spec.to_string()))
            }
            "postgres" | "postgresql" => Err(StoreError::BadAddress(format!(
                "{spec:?}: a PostgreSQL address is a URL, postgres://USER@HOST/DATABASE"
            ))),
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    return Err(StoreError::BadAddress(format!("{spec:?}: sqlite: needs a path")));
                }
                Ok(Address::Sqlite(PathBuf::from(path)))
            }
            _ => Err(StoreError::BadAddress(format!(
                "{spec:?}: unknown scheme {scheme:?}; the store is sqlite:PATH, \
                 postgres://USER@HOST/DATABASE (or postgresql://), or a plain file path"
            ))),
        }
    }
}

/// The `SCHEME` and the rest of `SCHEME:REST` (RFC 3986's scheme: a letter, then letters,
/// digits, `+`, `-`, `.`), or `None` for a spec that does not start with one: a path. A
/// slash before the first colon (`./a:b`, `/tmp/x:y`) makes it a path.
fn url_scheme(spec: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = spec.split_once(':')?;
    let mut chars = scheme.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let scheme_chars = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (starts_with_letter && scheme_chars).then_some((scheme, rest))
}

/// The player store, whichever kind it is.
pub enum Store {
    Sqlite(sqlite::SqliteStore),
    Postgres(Box<postgres::PostgresStore>),
}

impl Store {
    /// Opens (and on first use creates) the store's table.
    pub async fn open(address: &Address) -> Result<Store, StoreError> {
        match address {
            Address::Sqlite(path) => Ok(Store::Sqlite(sqlite::SqliteStore::open(path).await?)),
            Address::Postgres(url) => {
                Ok(Store::Postgres(Box::new(postgres::PostgresStore::open(url).await?)))
            }
        }
    }

    /// "sqlite" or "postgres", for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// The account's player: created with `new_id` and `name` if the account is new; an
    /// existing one keeps its id and takes `name` as its display name (the login service's
    /// token says what it is now). `IdTaken` if `new_id` belongs to another account.
    pub async fn player(
        &self,
        account: &str,
        name: &str,
        new_id: u64,
    ) -> Result<Player, StoreError> {
        match self {
            Store::Sqlite(s) => s.player(account, name, new_id).await,
            Store::Postgres(s) => s.player(account, name, new_id).await,
        }
    }

    /// The player with this id, if there is one.
    pub async fn load(&self, player_id: u64) -> Result<Option<Player>, StoreError> {
        match self {
            Store::Sqlite(s) => s.load(player_id).await,
            Store::Postgres(s) => s.load(player_id).await,
        }
    }

    /// The account's player, if the account has one (an operator's lookup: creates nothing).
    pub async fn find(&self, account: &str) -> Result<Option<Player>, StoreError> {
        match self {
            Store::Sqlite(s) => s.find(account).await,
            Store::Postgres(s) => s.find(account).await,
        }
    }

    /// Sets the cell a player comes back at (an operator's move of a player who is not
    /// online). Not fenced: it keeps the player's generation, so the player's own next
    /// save, from any owner, wins over it. Whether the player exists.
    pub async fn place(&self, player_id: u64, at: Cell) -> Result<bool, StoreError> {
        match self {
            Store::Sqlite(s) => s.place(player_id, at).await,
            Store::Postgres(s) => s.place(player_id, at).await,
        }
    }

    /// Saves a batch, fenced by generation (see the module's doc): one statement per
    /// [`MAX_BATCH`] rows. A batch naming a player twice keeps its last save of it.
    pub async fn save(&self, saves: &[Save]) -> Result<SaveReport, StoreError> {
        let mut report = SaveReport::default();
        for chunk in dedup_last(saves).chunks(MAX_BATCH) {
            let part = match self {
                Store::Sqlite(s) => s.save(chunk).await?,
                Store::Postgres(s) => s.save(chunk).await?,
            };
            report.written += part.written;
            report.refused.extend(part.refused);
        }
        Ok(report)
    }
}

/// The batch with one save per player, its last, in first-appearance order (one statement
/// cannot update a row twice).
fn dedup_last(saves: &[Save]) -> Vec<Save> {
    let mut last = std::collections::HashMap::with_capacity(saves.len());
    for (index, save) in saves.iter().enumerate() {
        last.insert(save.player_id, index);
    }
    let mut seen = std::collections::HashSet::with_capacity(saves.len());
    let mut out = Vec::with_capacity(last.len());
    for save in saves {
        if seen.insert(save.player_id) {
            out.push(saves[last[&save.player_id]].clone());
        }
    }
    out
}

/// Player ids and generations are stored as signed 64-bit integers (both backends'
/// integer type): ids and generations up to 2^63 - 1, far beyond any use.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_their_kind() {
        let pg = "postgres://meridian@db:5432/meridian";
        assert_eq!(Address::parse(pg).unwrap(), Address::Postgres(pg.into()));
        let pg = "postgresql://db/meridian";
        assert_eq!(Address::parse(pg).unwrap(), Address::Postgres(pg.into()));
        assert_eq!(Address::parse("sqlite:/d/p.db").unwrap(), Address::Sqlite("/d/p.db".into()));
        assert_eq!(Address::parse("sqlite:///d/p.db").unwrap(), Address::Sqlite("/d/p.db".into()));
        assert_eq!(Address::parse("/d/p.db").unwrap(), Address::Sqlite("/d/p.db".into()));
        assert_eq!(Address::parse("p.db").unwrap(), Address::Sqlite("p.db".into()));
        assert_eq!(Address::parse("./a:b.db").unwrap(), Address::Sqlite("./a:b.db".into()));
        assert!(Address::parse("  ").is_err());
    }

    /// Issue 32: `bogus:xyz` made an SQLite file of that name, `postgress://me@db/game`
    /// the folders `./postgress:/me@db/game`.
    #[test]
    fn unknown_schemes_are_refused_not_taken_for_files() {
        for spec in [
            "bogus:xyz",
            "postgress://me@db/game",
            "mysql://db/game",
            "postgres:db",
            "sqlite:",
            "sqlite://",
        ] {
            let error = Address::parse(spec).expect_err(spec);
            assert!(matches!(error, StoreError::BadAddress(_)), "{spec}: {error}");
            assert!(error.to_string().contains(spec), "{spec}: the message names it: {error}");
        }
        let error = Address::parse("postgress://me@db/game").unwrap_err().to_string();
        assert!(error.contains("sqlite:PATH") && error.contains("postgres://"), "{error}");
        assert_eq!(
            Address::parse("SQLite:p.db").unwrap(),
            Address::Sqlite("p.db".into()),
            "schemes are case-insensitive"
        );
    }

    #[test]
    fn a_batch_keeps_each_players_last_save() {
        let save =
            |player_id, generation| Save { player_id, generation, at: (1, 1), state: vec![] };
        let deduped = dedup_last(&[save(1, 1), save(2, 1), save(1, 3), save(1, 2)]);
        assert_eq!(deduped, vec![save(1, 2), save(2, 1)]);
    }
}
