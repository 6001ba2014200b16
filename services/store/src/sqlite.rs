//! The embedded store: one SQLite file, in WAL mode with full syncs (a save reported
//! written survives a crash of the machine, not only of the process). Each call runs on
//! the blocking pool, one transaction each.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension};

use crate::{to_i64, to_u64, Player, Save, SaveReport, Saved, StoreError};

const SCHEMA: &str = "
    PRAGMA journal_mode = WAL;
    PRAGMA synchronous = FULL;
    CREATE TABLE IF NOT EXISTS meridian_players (
        account    TEXT PRIMARY KEY NOT NULL,
        player_id  INTEGER NOT NULL UNIQUE,
        name       TEXT NOT NULL,
        x          INTEGER,
        y          INTEGER,
        state      BLOB NOT NULL DEFAULT x'',
        generation INTEGER NOT NULL DEFAULT 0
    );
";

const COLUMNS: &str = "account, player_id, name, x, y, state, generation";

/// Tries at setting the file up when other processes are opening it too (about 4 s).
const OPEN_TRIES: u64 = 50;

pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        let connection = tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| StoreError::Unavailable(format!("{}: {e}", dir.display())))?;
            }
            let connection = Connection::open(&path).map_err(unavailable)?;
            connection.busy_timeout(std::time::Duration::from_secs(5)).map_err(unavailable)?;
            // Processes opening one file together (`meridian up` starts its shards and
            // gateways at once) race to switch it to WAL, which takes the file to itself:
            // the loser is told "locked" at once, without the busy timeout. It tries again.
            let mut tries = 0;
            while let Err(error) = connection.execute_batch(SCHEMA) {
                let busy = matches!(
                    error.sqlite_error_code(),
                    Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                );
                tries += 1;
                if !busy || tries == OPEN_TRIES {
                    return Err(unavailable(error));
                }
                std::thread::sleep(std::time::Duration::from_millis(10 * tries.min(10)));
            }
            Ok::<_, StoreError>(connection)
        })
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))??;
        Ok(SqliteStore { connection: Arc::new(Mutex::new(connection)) })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let connection = Arc::clone(&self.connection);
        tokio::task::spawn_blocking(move || {
            let mut connection = connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            work(&mut connection)
        })
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?
    }

    pub async fn player(
        &self,
        account: &str,
        name: &str,
        new_id: u64,
    ) -> Result<Player, StoreError> {
        let (account, name) = (account.to_string(), name.to_string());
        self.with(move |connection| {
            let sql = format!(
                "INSERT INTO meridian_players (account, player_id, name) VALUES (?1, ?2, ?3)
                 ON CONFLICT (account) DO UPDATE SET name = excluded.name
                 RETURNING {COLUMNS}"
            );
            connection
                .query_row(&sql, params![account, to_i64(new_id), name], row_to_player)
                .map_err(|e| match e.sqlite_error_code() {
                    Some(ErrorCode::ConstraintViolation) => StoreError::IdTaken(new_id),
                    _ => unavailable(e),
                })
        })
        .await
    }

    pub async fn load(&self, player_id: u64) -> Result<Option<Player>, StoreError> {
        self.with(move |connection| {
            let sql = format!("SELECT {COLUMNS} FROM meridian_players WHERE player_id = ?1");
            connection
                .query_row(&sql, params![to_i64(player_id)], row_to_player)
                .optional()
                .map_err(unavailable)
        })
        .await
    }

    pub async fn find(&self, account: &str) -> Result<Option<Player>, StoreError> {
        let account = account.to_string();
        self.with(move |connection| {
            let sql = format!("SELECT {COLUMNS} FROM meridian_players WHERE account = ?1");
            connection
                .query_row(&sql, params![account], row_to_player)
                .optional()
                .map_err(unavailable)
        })
        .await
    }

    pub async fn place(&self, player_id: u64, at: crate::Cell) -> Result<bool, StoreError> {
        self.with(move |connection| {
            let changed = connection
                .execute(
                    "UPDATE meridian_players SET x = ?2, y = ?3 WHERE player_id = ?1",
                    params![to_i64(player_id), at.0, at.1],
                )
                .map_err(unavailable)?;
            Ok(changed == 1)
        })
        .await
    }

    pub async fn save(&self, saves: &[Save]) -> Result<SaveReport, StoreError> {
        let saves = saves.to_vec();
        self.with(move |connection| {
            // Immediate: the write lock is taken (waiting up to the busy timeout) before the
            // first statement, never upgraded from a read lock midway.
            let transaction = connection
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let mut report = SaveReport::default();
            {
                let mut update = transaction
                    .prepare_cached(
                        "UPDATE meridian_players SET x = ?3, y = ?4, state = ?5, generation = ?2
                         WHERE player_id = ?1 AND generation <= ?2",
                    )
                    .map_err(unavailable)?;
                for save in &saves {
                    let changed = update
                        .execute(params![
                            to_i64(save.player_id),
                            to_i64(save.generation),
                            save.at.0,
                            save.at.1,
                            save.state,
                        ])
                        .map_err(unavailable)?;
                    if changed == 1 {
                        report.written += 1;
                    } else {
                        report.refused.push(save.player_id);
                    }
                }
            }
            transaction.commit().map_err(unavailable)?;
            Ok(report)
        })
        .await
    }
}

fn row_to_player(row: &rusqlite::Row<'_>) -> rusqlite::Result<Player> {
    let x: Option<u32> = row.get(3)?;
    let y: Option<u32> = row.get(4)?;
    let saved = match (x, y) {
        (Some(x), Some(y)) => {
            Some(Saved { at: (x, y), state: row.get(5)?, generation: to_u64(row.get(6)?) })
        }
        _ => None,
    };
    Ok(Player { account: row.get(0)?, player_id: to_u64(row.get(1)?), name: row.get(2)?, saved })
}

fn unavailable(error: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(error.to_string())
}
