//! The clustered store: PostgreSQL through `tokio-postgres`. A few connections ([`POOL`])
//! with their statements prepared once, so calls from concurrent login lookups run side by
//! side; a failed connection is dropped and opened again on the next call that takes it.
//! A batch of saves, or of entity writes, is one execution of a prepared statement over
//! arrays (one round trip, whatever its size).

use std::str::FromStr;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};
use tracing::warn;

use crate::{
    to_i64, to_u64, EntityReport, EntityRow, EntityWrite, KvEntry, KvWrite, Player, Save,
    SaveReport, Saved, StoreError,
};

/// How long opening a connection, or one call, may take before the store counts as
/// unavailable.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
const CALL_WITHIN: Duration = Duration::from_secs(10);

/// Connections a store keeps (opened as calls need them): a gateway's login lookups run
/// this many at a time at most.
pub const POOL: usize = 4;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS meridian_players (
        account    TEXT PRIMARY KEY,
        player_id  BIGINT NOT NULL UNIQUE,
        name       TEXT NOT NULL,
        x          INTEGER,
        y          INTEGER,
        state      BYTEA NOT NULL DEFAULT '',
        generation BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS meridian_game_kv (
        key     BYTEA PRIMARY KEY,
        value   BYTEA NOT NULL,
        version BIGINT NOT NULL
    );
    CREATE SEQUENCE IF NOT EXISTS meridian_game_kv_version;
    CREATE TABLE IF NOT EXISTS meridian_entities (
        id         BIGINT PRIMARY KEY,
        kind       BIGINT NOT NULL,
        name       TEXT NOT NULL,
        x          BIGINT NOT NULL,
        y          BIGINT NOT NULL,
        state      BYTEA NOT NULL,
        private    BYTEA NOT NULL,
        generation BIGINT NOT NULL,
        shard      BIGINT NOT NULL,
        incarnation BIGINT NOT NULL DEFAULT 0,
        removed    BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE INDEX IF NOT EXISTS meridian_entities_at ON meridian_entities (x, y);
    CREATE INDEX IF NOT EXISTS meridian_entities_shard ON meridian_entities (shard);
";

const COLUMNS: &str = "account, player_id, name, x, y, state, generation";

struct Connected {
    client: Client,
    player: Statement,
    load: Statement,
    save: Statement,
    save_entities: Statement,
}

pub struct PostgresStore {
    config: Config,
    connections: Vec<Mutex<Option<Connected>>>,
    /// Which connection a call waits for when all are busy.
    next: std::sync::atomic::AtomicUsize,
}

impl PostgresStore {
    pub async fn open(url: &str) -> Result<PostgresStore, StoreError> {
        let mut config =
            Config::from_str(url).map_err(|e| StoreError::BadAddress(format!("{url}: {e}")))?;
        config.connect_timeout(CONNECT_WITHIN);
        let connections = (0..POOL).map(|_| Mutex::new(None)).collect();
        let store = PostgresStore { config, connections, next: Default::default() };
        // Connect (and create the table) now, so a bad address or credentials show at once.
        let mut connected = store.connections[0].lock().await;
        *connected = Some(store.connect().await?);
        drop(connected);
        Ok(store)
    }

    async fn connect(&self) -> Result<Connected, StoreError> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(unavailable)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                warn!(%error, "player store connection ended");
            }
        });
        // Nodes starting together race to create the table: PostgreSQL's `IF NOT EXISTS`
        // does not stop two sessions from both trying (the loser gets a unique violation
        // in its catalog). The loser's next try sees the table.
        let mut tries = 0;
        while let Err(error) = client.batch_execute(SCHEMA).await {
            tries += 1;
            if tries == 3 {
                return Err(unavailable(error));
            }
            tokio::time::sleep(Duration::from_millis(50 * tries)).await;
        }
        let player = client
            .prepare(&format!(
                "INSERT INTO meridian_players (account, player_id, name) VALUES ($1, $2, $3)
                 ON CONFLICT (account) DO UPDATE SET name = EXCLUDED.name
                 RETURNING {COLUMNS}"
            ))
            .await
            .map_err(unavailable)?;
        let load = client
            .prepare(&format!("SELECT {COLUMNS} FROM meridian_players WHERE player_id = $1"))
            .await
            .map_err(unavailable)?;
        let save = client
            .prepare(
                "UPDATE meridian_players AS p
                 SET x = v.x, y = v.y, state = v.state, generation = v.generation
                 FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::int[], $5::bytea[])
                     AS v(player_id, generation, x, y, state)
                 WHERE p.player_id = v.player_id AND p.generation <= v.generation
                 RETURNING p.player_id",
            )
            .await
            .map_err(unavailable)?;
        // The fence (see `entities`) is the `WHERE` of the conflict's update: a row another
        // session is writing is waited for and the `WHERE` checked on what it committed, so
        // of two claims at one generation the second finds the first's shard and is refused.
        let save_entities = client
            .prepare(
                "INSERT INTO meridian_entities AS e
                     (id, kind, name, x, y, state, private, generation, shard, removed,
                      incarnation)
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[],
                     $5::bigint[], $6::bytea[], $7::bytea[], $8::bigint[], $9::bigint[],
                     $10::bool[], $11::bigint[])
                 ON CONFLICT (id) DO UPDATE
                 SET kind = EXCLUDED.kind, name = EXCLUDED.name, x = EXCLUDED.x, y = EXCLUDED.y,
                     state = EXCLUDED.state, private = EXCLUDED.private,
                     generation = EXCLUDED.generation, shard = EXCLUDED.shard,
                     removed = EXCLUDED.removed, incarnation = EXCLUDED.incarnation
                 WHERE e.generation < EXCLUDED.generation
                    OR (e.generation = EXCLUDED.generation AND e.shard = EXCLUDED.shard
                        AND (EXCLUDED.removed OR NOT e.removed))
                 RETURNING e.id",
            )
            .await
            .map_err(unavailable)?;
        Ok(Connected { client, player, load, save, save_entities })
    }

    /// Runs `call` on the connection (opened first if there is none), bounded by
    /// [`CALL_WITHIN`]; a connection that failed is dropped, for the next call to open.
    async fn call<T>(
        &self,
        call: impl AsyncFnOnce(&Connected) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut connected = self.connection().await;
        let result = tokio::time::timeout(CALL_WITHIN, async {
            if connected.as_ref().is_none_or(|c| c.client.is_closed()) {
                *connected = Some(self.connect().await?);
            }
            call(connected.as_ref().expect("just connected")).await
        })
        .await
        .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("no answer in {CALL_WITHIN:?}"))));
        if matches!(result, Err(StoreError::Unavailable(_))) {
            *connected = None;
        }
        result
    }

    /// A free connection, or (all busy) the next one in turn once it is free.
    async fn connection(&self) -> tokio::sync::MutexGuard<'_, Option<Connected>> {
        for slot in &self.connections {
            if let Ok(guard) = slot.try_lock() {
                return guard;
            }
        }
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.connections[turn % self.connections.len()].lock().await
    }

    pub async fn player(
        &self,
        account: &str,
        name: &str,
        new_id: u64,
    ) -> Result<Player, StoreError> {
        self.call(async |c: &Connected| {
            let id = to_i64(new_id);
            match c.client.query_one(&c.player, &[&account, &id, &name]).await {
                Ok(row) => row_to_player(&row),
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    Err(StoreError::IdTaken(new_id))
                }
                Err(e) => Err(unavailable(e)),
            }
        })
        .await
    }

    pub async fn load(&self, player_id: u64) -> Result<Option<Player>, StoreError> {
        self.call(async |c: &Connected| {
            let row =
                c.client.query_opt(&c.load, &[&to_i64(player_id)]).await.map_err(unavailable)?;
            row.as_ref().map(row_to_player).transpose()
        })
        .await
    }

    pub async fn find(&self, account: &str) -> Result<Option<Player>, StoreError> {
        self.call(async |c: &Connected| {
            let sql = format!("SELECT {COLUMNS} FROM meridian_players WHERE account = $1");
            let row = c.client.query_opt(&sql, &[&account]).await.map_err(unavailable)?;
            row.as_ref().map(row_to_player).transpose()
        })
        .await
    }

    pub async fn place(&self, player_id: u64, at: crate::Cell) -> Result<bool, StoreError> {
        let (x, y) =
            (i32::try_from(at.0).unwrap_or(i32::MAX), i32::try_from(at.1).unwrap_or(i32::MAX));
        self.call(async |c: &Connected| {
            let sql = "UPDATE meridian_players SET x = $2, y = $3 WHERE player_id = $1";
            let changed =
                c.client.execute(sql, &[&to_i64(player_id), &x, &y]).await.map_err(unavailable)?;
            Ok(changed == 1)
        })
        .await
    }

    pub async fn kv_get(&self, key: &[u8]) -> Result<Option<KvEntry>, StoreError> {
        self.call(async |c: &Connected| {
            let sql = "SELECT value, version FROM meridian_game_kv WHERE key = $1";
            let row = c.client.query_opt(sql, &[&key]).await.map_err(unavailable)?;
            row.as_ref().map(row_to_entry).transpose()
        })
        .await
    }

    /// One statement per write, the check in its `WHERE`: of two writes expecting the same
    /// version, the second finds the row changed (or, creating, the key taken) and writes
    /// nothing; it is then told the entry as it is.
    pub async fn kv_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<KvWrite, StoreError> {
        let expected_i64 = expected.map(to_i64).unwrap_or(0);
        let value_bytes = value.unwrap_or_default();
        let (sql, params): (&str, Vec<&(dyn ToSql + Sync)>) = match (value, expected) {
            (Some(_), None) => (
                "INSERT INTO meridian_game_kv (key, value, version)
                 VALUES ($1, $2, nextval('meridian_game_kv_version'))
                 ON CONFLICT (key) DO UPDATE
                 SET value = EXCLUDED.value, version = EXCLUDED.version
                 RETURNING version",
                vec![&key, &value_bytes],
            ),
            (Some(_), Some(0)) => (
                "INSERT INTO meridian_game_kv (key, value, version)
                 VALUES ($1, $2, nextval('meridian_game_kv_version'))
                 ON CONFLICT (key) DO NOTHING
                 RETURNING version",
                vec![&key, &value_bytes],
            ),
            (Some(_), Some(_)) => (
                "UPDATE meridian_game_kv
                 SET value = $2, version = nextval('meridian_game_kv_version')
                 WHERE key = $1 AND version = $3
                 RETURNING version",
                vec![&key, &value_bytes, &expected_i64],
            ),
            (None, None) => {
                ("DELETE FROM meridian_game_kv WHERE key = $1 RETURNING 0::bigint", vec![&key])
            }
            (None, Some(_)) => (
                "DELETE FROM meridian_game_kv WHERE key = $1 AND version = $2
                 RETURNING 0::bigint",
                vec![&key, &expected_i64],
            ),
        };
        let written = self
            .call(async |c: &Connected| {
                let row = c.client.query_opt(sql, &params).await.map_err(unavailable)?;
                Ok(row.map(|row| to_u64(row.get(0))))
            })
            .await?;
        match (written, value, expected) {
            (Some(version), ..) => Ok(KvWrite::Done { version }),
            // Deleting what was not there, unconditionally: done.
            (None, None, None) => Ok(KvWrite::Done { version: 0 }),
            // Expecting nothing there, deleting: done if so.
            (None, None, Some(0)) => match self.kv_get(key).await? {
                None => Ok(KvWrite::Done { version: 0 }),
                current => Ok(KvWrite::Conflict { current }),
            },
            (None, ..) => Ok(KvWrite::Conflict { current: self.kv_get(key).await? }),
        }
    }

    pub async fn save(&self, saves: &[Save]) -> Result<SaveReport, StoreError> {
        let ids: Vec<i64> = saves.iter().map(|s| to_i64(s.player_id)).collect();
        let generations: Vec<i64> = saves.iter().map(|s| to_i64(s.generation)).collect();
        let xs: Vec<i32> =
            saves.iter().map(|s| i32::try_from(s.at.0).unwrap_or(i32::MAX)).collect();
        let ys: Vec<i32> =
            saves.iter().map(|s| i32::try_from(s.at.1).unwrap_or(i32::MAX)).collect();
        let states: Vec<&[u8]> = saves.iter().map(|s| s.state.as_slice()).collect();
        let written = self
            .call(async |c: &Connected| {
                let rows = c
                    .client
                    .query(&c.save, &[&ids, &generations, &xs, &ys, &states])
                    .await
                    .map_err(unavailable)?;
                Ok(rows.iter().map(|row| to_u64(row.get(0))).collect::<Vec<u64>>())
            })
            .await?;
        let written_ids: std::collections::HashSet<u64> = written.iter().copied().collect();
        let refused =
            saves.iter().map(|s| s.player_id).filter(|id| !written_ids.contains(id)).collect();
        Ok(SaveReport { written: written.len(), refused })
    }

    /// One statement over arrays (one round trip, one transaction), its rows in id order so
    /// that two batches naming the same entities lock them in the same order (no deadlock).
    pub async fn save_entities(&self, writes: &[EntityWrite]) -> Result<EntityReport, StoreError> {
        let mut rows: Vec<_> = writes.iter().map(EntityWrite::row).collect();
        rows.sort_by_key(|(row, _)| row.id);
        let ids: Vec<i64> = rows.iter().map(|(row, _)| to_i64(row.id)).collect();
        let kinds: Vec<i64> = rows.iter().map(|(row, _)| i64::from(row.kind)).collect();
        let names: Vec<&str> = rows.iter().map(|(row, _)| row.name.as_str()).collect();
        let xs: Vec<i64> = rows.iter().map(|(row, _)| i64::from(row.at.0)).collect();
        let ys: Vec<i64> = rows.iter().map(|(row, _)| i64::from(row.at.1)).collect();
        let states: Vec<&[u8]> = rows.iter().map(|(row, _)| row.state.as_slice()).collect();
        let privates: Vec<&[u8]> = rows.iter().map(|(row, _)| row.private.as_slice()).collect();
        let generations: Vec<i64> = rows.iter().map(|(row, _)| to_i64(row.generation)).collect();
        let shards: Vec<i64> = rows.iter().map(|(row, _)| i64::from(row.shard)).collect();
        let removed: Vec<bool> = rows.iter().map(|(_, removed)| *removed).collect();
        let lives: Vec<i64> = rows.iter().map(|(row, _)| to_i64(row.incarnation)).collect();
        let params: [&(dyn ToSql + Sync); 11] = [
            &ids,
            &kinds,
            &names,
            &xs,
            &ys,
            &states,
            &privates,
            &generations,
            &shards,
            &removed,
            &lives,
        ];
        let written: std::collections::HashSet<u64> = self
            .call(async |c: &Connected| {
                let rows = c.client.query(&c.save_entities, &params).await.map_err(unavailable)?;
                Ok(rows.iter().map(|row| to_u64(row.get(0))).collect())
            })
            .await?;
        let (written, refused) =
            writes.iter().map(EntityWrite::id).partition(|id| written.contains(id));
        Ok(EntityReport { written, refused })
    }

    /// Every entity not removed, or those in `areas` (arrays of corners, one element per
    /// area) or saved by `shard`.
    pub async fn entities(
        &self,
        filter: Option<(&[crate::Area], u32)>,
    ) -> Result<Vec<EntityRow>, StoreError> {
        const COLUMNS: &str =
            "id, kind, name, x, y, state, private, generation, shard, incarnation";
        let Some((areas, shard)) = filter else {
            return self
                .call(async |c: &Connected| {
                    let sql = format!(
                        "SELECT {COLUMNS} FROM meridian_entities WHERE NOT removed ORDER BY id"
                    );
                    let rows = c.client.query(&sql, &[]).await.map_err(unavailable)?;
                    rows.iter().map(row_to_entity).collect()
                })
                .await;
        };
        let corner = |f: fn(&crate::Area) -> u32| -> Vec<i64> {
            areas.iter().map(|a| i64::from(f(a))).collect()
        };
        let (x0, y0, x1, y1) =
            (corner(|a| a.x0), corner(|a| a.y0), corner(|a| a.x1), corner(|a| a.y1));
        let shard = i64::from(shard);
        self.call(async |c: &Connected| {
            let sql = format!(
                "SELECT {COLUMNS} FROM meridian_entities e WHERE NOT removed AND (shard = $1
                 OR EXISTS (SELECT 1 FROM unnest($2::bigint[], $3::bigint[], $4::bigint[],
                     $5::bigint[]) AS r(x0, y0, x1, y1)
                     WHERE e.x >= r.x0 AND e.x < r.x1 AND e.y >= r.y0 AND e.y < r.y1))
                 ORDER BY id"
            );
            let params: [&(dyn ToSql + Sync); 5] = [&shard, &x0, &y0, &x1, &y1];
            let rows = c.client.query(&sql, &params).await.map_err(unavailable)?;
            rows.iter().map(row_to_entity).collect()
        })
        .await
    }
}

fn row_to_player(row: &Row) -> Result<Player, StoreError> {
    let x: Option<i32> = row.try_get(3).map_err(unavailable)?;
    let y: Option<i32> = row.try_get(4).map_err(unavailable)?;
    let saved = match (x, y) {
        (Some(x), Some(y)) => Some(Saved {
            at: (x.max(0) as u32, y.max(0) as u32),
            state: row.try_get(5).map_err(unavailable)?,
            generation: to_u64(row.try_get(6).map_err(unavailable)?),
        }),
        _ => None,
    };
    Ok(Player {
        account: row.try_get(0).map_err(unavailable)?,
        player_id: to_u64(row.try_get(1).map_err(unavailable)?),
        name: row.try_get(2).map_err(unavailable)?,
        saved,
    })
}

fn row_to_entry(row: &Row) -> Result<KvEntry, StoreError> {
    let value = row.try_get(0).map_err(unavailable)?;
    Ok(KvEntry { value, version: to_u64(row.try_get(1).map_err(unavailable)?) })
}

fn row_to_entity(row: &Row) -> Result<EntityRow, StoreError> {
    // Kinds, cells and shards are stored as `bigint`, which holds every `u32`.
    let u32_at = |index| row.try_get(index).map(|value: i64| u32::try_from(value).unwrap_or(0));
    Ok(EntityRow {
        id: to_u64(row.try_get(0).map_err(unavailable)?),
        kind: u32_at(1).map_err(unavailable)?,
        name: row.try_get(2).map_err(unavailable)?,
        at: (u32_at(3).map_err(unavailable)?, u32_at(4).map_err(unavailable)?),
        state: row.try_get(5).map_err(unavailable)?,
        private: row.try_get(6).map_err(unavailable)?,
        generation: to_u64(row.try_get(7).map_err(unavailable)?),
        shard: u32_at(8).map_err(unavailable)?,
        incarnation: to_u64(row.try_get(9).map_err(unavailable)?),
    })
}

fn unavailable(error: tokio_postgres::Error) -> StoreError {
    // The server's own words when it gave any ("db error" alone says nothing).
    let why = match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(&error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    };
    StoreError::Unavailable(why)
}
