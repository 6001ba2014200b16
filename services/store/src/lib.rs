//! The player store: every account's player (its cluster-wide `player_id`, display name,
//! last saved cell, game state and the ownership generation of that save), behind one
//! interface with two implementations:
//!
//! - **SQLite** (`sqlite:PATH`, or a bare path): an embedded file, the default for
//!   `meridian up` and single machines: zero setup;
//! - **PostgreSQL** (`postgres://...`): for clusters, shared by every shard.
//!
//! Saves are **fenced** and **batched**. A save carries the generation of the shard that owns
//! the player; a row is only overwritten by a save of the same generation or a newer one,
//! so an old owner (a shard paused past its lease that wakes up) cannot roll a player back.
//! [`Store::save`] writes a whole batch in one statement (PostgreSQL: one round trip of a
//! prepared statement over arrays; SQLite: one transaction), up to [`MAX_BATCH`] rows at a
//! time, and says which rows it refused.
//!
//! The store is async: PostgreSQL through `tokio-postgres`, SQLite on the blocking pool (its
//! calls are short, one transaction each, and never on the caller's task).

mod postgres;
mod sqlite;

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
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(why) => write!(f, "player store unavailable: {why}"),
            StoreError::IdTaken(id) => write!(f, "player id {id} belongs to another account"),
            StoreError::BadAddress(why) => write!(f, "bad player store address: {why}"),
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
    /// `postgres://...` or `postgresql://...`: PostgreSQL; `sqlite:PATH` or anything else:
    /// an SQLite file at that path.
    pub fn parse(spec: &str) -> Result<Address, StoreError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(StoreError::BadAddress("empty".into()));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(Address::Postgres(spec.to_string()));
        }
        let path = spec.strip_prefix("sqlite://").or_else(|| spec.strip_prefix("sqlite:"));
        Ok(Address::Sqlite(PathBuf::from(path.unwrap_or(spec))))
    }
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
        assert!(Address::parse("  ").is_err());
    }

    #[test]
    fn a_batch_keeps_each_players_last_save() {
        let save =
            |player_id, generation| Save { player_id, generation, at: (1, 1), state: vec![] };
        let deduped = dedup_last(&[save(1, 1), save(2, 1), save(1, 3), save(1, 2)]);
        assert_eq!(deduped, vec![save(1, 2), save(2, 1)]);
    }
}
