//! The embedded store: one SQLite file, in WAL mode with full syncs (a save reported
//! written survives a crash of the machine, not only of the process). Each call runs on
//! the blocking pool, one transaction each, except logins: those that arrive while one
//! commits are committed together in the next transaction (group commit).
//!
//! Why logins are grouped: SQLite has one writer at a time for the whole file, shared by
//! every gateway and shard of a `meridian up`, and each commit waits for its sync. A burst of
//! new accounts (a gateway runs 16 lookups at once, each creating its player) queued one
//! transaction per login behind each other's syncs, and on a loaded machine the last ones
//! waited past the 5 s busy timeout and failed "database is locked". Grouped, a burst costs
//! a few transactions instead of one per login (BENCHMARKS.md, "Logins in one transaction").

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{params, Connection, ErrorCode, OptionalExtension};

use crate::{
    to_i64, to_u64, EntityReport, EntityRow, EntityWrite, KvEntry, KvWrite, Player, Save,
    SaveReport, Saved, StoreError,
};

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
    CREATE TABLE IF NOT EXISTS meridian_game_kv (
        key     BLOB PRIMARY KEY NOT NULL,
        value   BLOB NOT NULL,
        version INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS meridian_game_kv_clock (
        one     INTEGER PRIMARY KEY CHECK (one = 1),
        version INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO meridian_game_kv_clock (one, version) VALUES (1, 0);
    CREATE TABLE IF NOT EXISTS meridian_entities (
        id         INTEGER PRIMARY KEY NOT NULL,
        kind       INTEGER NOT NULL,
        name       TEXT NOT NULL,
        x          INTEGER NOT NULL,
        y          INTEGER NOT NULL,
        state      BLOB NOT NULL,
        private    BLOB NOT NULL,
        generation INTEGER NOT NULL,
        shard      INTEGER NOT NULL,
        incarnation INTEGER NOT NULL DEFAULT 0,
        removed    INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS meridian_entities_at ON meridian_entities (x, y);
    CREATE INDEX IF NOT EXISTS meridian_entities_shard ON meridian_entities (shard);
";

const COLUMNS: &str = "account, player_id, name, x, y, state, generation";

/// Tries at setting the file up when other processes are opening it too (about 4 s).
const OPEN_TRIES: u64 = 50;

/// Logins one transaction carries at most; the rest wait for the next one. (The queue itself
/// is bounded by its callers: a gateway runs 16 lookups at once.)
const LOGINS_PER_TRANSACTION: usize = 256;

pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
    logins: Arc<Logins>,
}

/// The logins waiting for the next transaction, and whether a task is committing them.
#[derive(Default)]
struct Logins {
    queue: Mutex<LoginQueue>,
    /// Transactions that committed logins, for [`SqliteStore::login_transactions`].
    transactions: AtomicU64,
}

#[derive(Default)]
struct LoginQueue {
    waiting: Vec<Login>,
    /// A blocking task is committing (and will take what waits when it is done).
    committing: bool,
    /// Logins in the transaction being committed now.
    in_transaction: usize,
}

struct Login {
    account: String,
    name: String,
    new_id: u64,
    answer: tokio::sync::oneshot::Sender<Result<Player, StoreError>>,
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
        Ok(SqliteStore { connection: Arc::new(Mutex::new(connection)), logins: Arc::default() })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let connection = Arc::clone(&self.connection);
        tokio::task::spawn_blocking(move || work(&mut lock(&connection)))
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
    }

    /// The account's player, created with `new_id` and `name` if the account is new. Logins
    /// that arrive while another transaction of logins commits wait for the next one, which
    /// carries them all (up to [`LOGINS_PER_TRANSACTION`]).
    pub async fn player(
        &self,
        account: &str,
        name: &str,
        new_id: u64,
    ) -> Result<Player, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let login = Login { account: account.to_string(), name: name.to_string(), new_id, answer };
        let start = {
            let mut queue = lock(&self.logins.queue);
            queue.waiting.push(login);
            !std::mem::replace(&mut queue.committing, true)
        };
        if start {
            let (connection, logins) = (Arc::clone(&self.connection), Arc::clone(&self.logins));
            tokio::task::spawn_blocking(move || commit_logins(&connection, &logins));
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable("the login's transaction ended without an answer".into()))
        })
    }

    /// Transactions that have committed logins so far (fewer than the logins when bursts
    /// were grouped).
    pub fn login_transactions(&self) -> u64 {
        self.logins.transactions.load(Ordering::Relaxed)
    }

    /// Logins waiting for a transaction now, and logins in the one being committed.
    pub fn logins_queued(&self) -> (usize, usize) {
        let queue = lock(&self.logins.queue);
        (queue.waiting.len(), queue.in_transaction)
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

    pub async fn kv_get(&self, key: &[u8]) -> Result<Option<KvEntry>, StoreError> {
        let key = key.to_vec();
        self.with(move |connection| {
            connection
                .query_row(
                    "SELECT value, version FROM meridian_game_kv WHERE key = ?1",
                    params![key],
                    |row| Ok(KvEntry { value: row.get(0)?, version: to_u64(row.get(1)?) }),
                )
                .optional()
                .map_err(unavailable)
        })
        .await
    }

    /// One immediate transaction: the entry's version checked, the space's counter drawn
    /// from, the entry written.
    pub async fn kv_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<KvWrite, StoreError> {
        let (key, value) = (key.to_vec(), value.map(<[u8]>::to_vec));
        self.with(move |connection| {
            let transaction = connection
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let current = transaction
                .query_row(
                    "SELECT value, version FROM meridian_game_kv WHERE key = ?1",
                    params![key],
                    |row| Ok(KvEntry { value: row.get(0)?, version: to_u64(row.get(1)?) }),
                )
                .optional()
                .map_err(unavailable)?;
            let now = current.as_ref().map_or(0, |entry| entry.version);
            if expected.is_some_and(|expected| expected != now) {
                return Ok(KvWrite::Conflict { current });
            }
            let version = match value {
                Some(value) => {
                    let version: i64 = transaction
                        .query_row(
                            "UPDATE meridian_game_kv_clock SET version = version + 1 WHERE one = 1
                             RETURNING version",
                            [],
                            |row| row.get(0),
                        )
                        .map_err(unavailable)?;
                    transaction
                        .execute(
                            "INSERT INTO meridian_game_kv (key, value, version) VALUES (?1, ?2, ?3)
                             ON CONFLICT (key) DO UPDATE
                             SET value = excluded.value, version = excluded.version",
                            params![key, value, version],
                        )
                        .map_err(unavailable)?;
                    to_u64(version)
                }
                None => {
                    transaction
                        .execute("DELETE FROM meridian_game_kv WHERE key = ?1", params![key])
                        .map_err(unavailable)?;
                    0
                }
            };
            transaction.commit().map_err(unavailable)?;
            Ok(KvWrite::Done { version })
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

    /// One immediate transaction, an upsert per write with the fence in its `WHERE` (see
    /// `entities`): a write the fence refuses changes no row.
    pub async fn save_entities(
        &self,
        writes: Vec<EntityWrite>,
    ) -> Result<EntityReport, StoreError> {
        self.with(move |connection| {
            let transaction = connection
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            let mut report = EntityReport::default();
            {
                let mut upsert = transaction
                    .prepare_cached(
                        "INSERT INTO meridian_entities
                             (id, kind, name, x, y, state, private, generation, shard, removed,
                              incarnation)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                         ON CONFLICT (id) DO UPDATE
                         SET kind = excluded.kind, name = excluded.name, x = excluded.x,
                             y = excluded.y, state = excluded.state, private = excluded.private,
                             generation = excluded.generation, shard = excluded.shard,
                             removed = excluded.removed, incarnation = excluded.incarnation
                         WHERE meridian_entities.generation < excluded.generation
                            OR (meridian_entities.generation = excluded.generation
                                AND meridian_entities.shard = excluded.shard
                                AND (excluded.removed OR NOT meridian_entities.removed))",
                    )
                    .map_err(unavailable)?;
                for write in &writes {
                    let (row, removed) = write.row();
                    let changed = upsert
                        .execute(params![
                            to_i64(row.id),
                            row.kind,
                            row.name,
                            row.at.0,
                            row.at.1,
                            row.state,
                            row.private,
                            to_i64(row.generation),
                            row.shard,
                            removed,
                            to_i64(row.incarnation),
                        ])
                        .map_err(unavailable)?;
                    if changed == 1 {
                        report.written.push(row.id);
                    } else {
                        report.refused.push(row.id);
                    }
                }
            }
            transaction.commit().map_err(unavailable)?;
            Ok(report)
        })
        .await
    }

    /// Every entity not removed, or those in `areas` or saved by `shard` (one
    /// `(x >= ? AND x < ? AND y >= ? AND y < ?)` per area).
    pub async fn entities(
        &self,
        filter: Option<(&[crate::Area], u32)>,
    ) -> Result<Vec<EntityRow>, StoreError> {
        let mut sql = String::from(
            "SELECT id, kind, name, x, y, state, private, generation, shard, incarnation
             FROM meridian_entities WHERE NOT removed",
        );
        let mut values: Vec<i64> = Vec::new();
        if let Some((areas, shard)) = filter {
            sql.push_str(" AND (shard = ?1");
            values.push(i64::from(shard));
            for area in areas {
                let n = values.len();
                sql.push_str(&format!(
                    " OR (x >= ?{} AND x < ?{} AND y >= ?{} AND y < ?{})",
                    n + 1,
                    n + 2,
                    n + 3,
                    n + 4
                ));
                values.extend([area.x0, area.x1, area.y0, area.y1].map(i64::from));
            }
            sql.push(')');
        }
        sql.push_str(" ORDER BY id");
        self.with(move |connection| {
            let mut select = connection.prepare_cached(&sql).map_err(unavailable)?;
            let rows = select
                .query_map(rusqlite::params_from_iter(values.iter()), |row| {
                    Ok(EntityRow {
                        id: to_u64(row.get(0)?),
                        kind: row.get(1)?,
                        name: row.get(2)?,
                        at: (row.get(3)?, row.get(4)?),
                        state: row.get(5)?,
                        private: row.get(6)?,
                        generation: to_u64(row.get(7)?),
                        shard: row.get(8)?,
                        incarnation: to_u64(row.get(9)?),
                    })
                })
                .map_err(unavailable)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
        })
        .await
    }
}

/// Commits what waits in `logins`, a transaction at a time, until nothing does.
fn commit_logins(connection: &Mutex<Connection>, logins: &Logins) {
    // Should this thread panic, the logins waiting are answered (their senders dropped:
    // "ended without an answer") and the next login starts a new committer.
    struct Reset<'a>(&'a Logins);
    impl Drop for Reset<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let mut queue = lock(&self.0.queue);
                queue.waiting.clear();
                queue.committing = false;
                queue.in_transaction = 0;
            }
        }
    }
    let _reset = Reset(logins);
    loop {
        let batch: Vec<Login> = {
            let mut queue = lock(&logins.queue);
            if queue.waiting.is_empty() {
                queue.committing = false;
                queue.in_transaction = 0;
                return;
            }
            let take = queue.waiting.len().min(LOGINS_PER_TRANSACTION);
            queue.in_transaction = take;
            queue.waiting.drain(..take).collect()
        };
        let answers = upsert_players(&mut lock(connection), &batch);
        logins.transactions.fetch_add(1, Ordering::Relaxed);
        for (login, answer) in batch.into_iter().zip(answers) {
            let _ = login.answer.send(answer);
        }
    }
}

/// Each login's player in one transaction: a new account's row is created, an existing
/// one's name updated. A login whose offered id is another account's gets `IdTaken` and
/// the others still commit (a failed statement is undone alone: SQLite's ABORT). If the
/// transaction fails, every login in it is answered `Unavailable`.
fn upsert_players(connection: &mut Connection, batch: &[Login]) -> Vec<Result<Player, StoreError>> {
    let failed = |error: StoreError| batch.iter().map(|_| Err(error.clone())).collect();
    let transaction =
        match connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
            Ok(transaction) => transaction,
            Err(error) => return failed(unavailable(error)),
        };
    let mut answers = Vec::with_capacity(batch.len());
    {
        let sql = format!(
            "INSERT INTO meridian_players (account, player_id, name) VALUES (?1, ?2, ?3)
             ON CONFLICT (account) DO UPDATE SET name = excluded.name
             RETURNING {COLUMNS}"
        );
        let mut upsert = match transaction.prepare_cached(&sql) {
            Ok(statement) => statement,
            Err(error) => return failed(unavailable(error)),
        };
        for login in batch {
            let row = upsert
                .query_row(params![login.account, to_i64(login.new_id), login.name], row_to_player);
            answers.push(row.map_err(|e| match e.sqlite_error_code() {
                Some(ErrorCode::ConstraintViolation) => StoreError::IdTaken(login.new_id),
                _ => unavailable(e),
            }));
        }
    }
    match transaction.commit() {
        Ok(()) => answers,
        Err(error) => failed(unavailable(error)),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
