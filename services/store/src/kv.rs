//! The game's key-value space (issue 34 item 2): durable entries a game reads and writes
//! from any shard (guild rosters, an auction house, quest flags, world events), in the same
//! store as the players, in a table of their own (`meridian_game_kv`).
//!
//! Every write gives the entry a new **version**, drawn from one counter for the whole
//! space, so a version is never reused, not even after a delete and a re-create (no ABA).
//! A write may be conditional: it happens only if the entry's version is still the one the
//! game read (`expected`; 0: the key must be absent). That is the compare-and-set two shards
//! updating one key rely on: of two writes expecting the same version, exactly one
//! happens; the other is told the entry as it is now, and the game decides again. An
//! unconditional write (`expected: None`) simply wins over whatever was there.
//!
//! Bounded: a key is 1 to [`KV_KEY_MAX`] bytes, a value at most [`KV_VALUE_MAX`]; a bigger
//! one is refused (`StoreError::TooBig`) before the store is asked.

use crate::{Store, StoreError};

/// The longest key, in bytes.
pub const KV_KEY_MAX: usize = 128;
/// The longest value, in bytes.
pub const KV_VALUE_MAX: usize = 16 * 1024;

/// An entry of the game's key-value space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    pub value: Vec<u8>,
    /// Changes with every write; never reused.
    pub version: u64,
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvWrite {
    /// Written (or deleted): the entry's new version (0 after a delete).
    Done { version: u64 },
    /// Not written: the entry's version was not the one expected. What is there now.
    Conflict { current: Option<KvEntry> },
}

fn check(key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > KV_KEY_MAX {
        return Err(StoreError::TooBig(format!(
            "a key is 1 to {KV_KEY_MAX} bytes, this one {}",
            key.len()
        )));
    }
    match value {
        Some(value) if value.len() > KV_VALUE_MAX => Err(StoreError::TooBig(format!(
            "a value is at most {KV_VALUE_MAX} bytes, this one {}",
            value.len()
        ))),
        _ => Ok(()),
    }
}

impl Store {
    /// The entry at `key`, if there is one.
    pub async fn kv_get(&self, key: &[u8]) -> Result<Option<KvEntry>, StoreError> {
        check(key, None)?;
        match self {
            Store::Sqlite(s) => s.kv_get(key).await,
            Store::Postgres(s) => s.kv_get(key).await,
        }
    }

    /// Writes `value` at `key` (`None`: deletes it), if the entry's version is `expected`
    /// (0: no entry), or whatever it is with `expected: None`.
    pub async fn kv_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<KvWrite, StoreError> {
        check(key, value)?;
        match self {
            Store::Sqlite(s) => s.kv_set(key, expected, value).await,
            Store::Postgres(s) => s.kv_set(key, expected, value).await,
        }
    }
}
