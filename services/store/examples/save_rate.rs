//! Saves per second the player store sustains, by batch size, for each backend in one run
//! (issue 12), and the same for persistent entities (issue 34, `--what entities`); the
//! figures are in BENCHMARKS.md.
//!
//! ```sh
//! cargo run --release -p meridian-store --example save_rate -- --players 5000 --seconds 5
//! cargo run --release -p meridian-store --example save_rate -- --what entities --seconds 3
//! ```
//!
//! For each backend it opens a fresh store, creates `--players` accounts in it (one
//! `Store::player` call each), then for each batch size saves batches of that many players,
//! one batch after another from a single writer, as a shard's saver does, for `--seconds`:
//! every save a new cell, so no two saves of a player write the same row. It reports saves
//! per second and the latency of one `Store::save` call (p50, p99), prints a progress line
//! every second, and after each batch size reads a sample of the players it saved back
//! through a second connection: a figure counts only if the rows hold what was written
//! last. It also reports the CPU time each save costs: this process's (user + system, all
//! threads: the caller's side of the store, and for SQLite the database engine itself,
//! which runs in the caller's process) and, for a server of its own, PostgreSQL's (the
//! postmaster and its backends, from /proc). The table at the end is Markdown.
//!
//! With `--what entities` the writer writes persistent entities instead
//! (`Store::save_entities`, upserts of kind 2 named "flag" at generation 1 of shard 1, life
//! 1): `--players` of them (ids far above a test's), each written once before the
//! measurement (in batches of [`MAX_BATCH`], reported as their creation), so the measured
//! writes overwrite rows as players' saves do. Every write a new cell, a public state of
//! `--state-bytes` and a private state of 16 bytes, both from the write's number; the
//! sample read back comes from `Store::entities` on the second connection.
//!
//! Backends: `sqlite` (a file in a new temporary directory: WAL, `synchronous = FULL`, as
//! the store always opens it), `postgres` (a server of this run's own from Debian's
//! `postgresql` package, started by `TempPostgres` with fsync on, or the server given by
//! `--postgres-url`), and `postgres-nofsync` (the same server started with fsync off, as
//! the tests run it: the difference is what waiting for the disk costs).
//!
//! Everything is bounded: players (at most 1,000,000), seconds per batch size (at most
//! 600), and the servers it starts listen on loopback and are stopped and removed at the
//! end.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use meridian_store::{
    Address, EntityRow, EntityWrite, Save, Saved, Store, ENTITY_STATE_MAX, MAX_BATCH,
};
use meridian_testkit::TempPostgres;

/// Ids given to the accounts this benchmark creates: far above what a test or a local
/// cluster hands out, so a shared `--postgres-url` database keeps its own players.
const FIRST_PLAYER_ID: u64 = 7_000_000_000;
/// Ids of the persistent entities this benchmark writes (`--what entities`), as far above
/// a test's.
const FIRST_ENTITY_ID: u64 = 8_000_000_000;
/// Bytes of private state in each entity write.
const ENTITY_PRIVATE_BYTES: usize = 16;
const MAX_PLAYERS: u64 = 1_000_000;
const MAX_SECONDS: u64 = 600;
/// Cells are drawn on a map of this side (the default map is 400 x 400).
const MAP_SIDE: u64 = 400;

/// The player store's save throughput by batch size, SQLite and PostgreSQL in one run.
#[derive(Debug, Parser)]
#[command(name = "save_rate")]
struct Cli {
    /// What the writer writes: `players` (`Store::save`) or `entities` (upserts of
    /// persistent entities, `Store::save_entities`).
    #[arg(long, default_value = "players")]
    what: What,
    /// Players (or entities, with `--what entities`) created in each store; batches cycle
    /// through them.
    #[arg(long, visible_alias = "entities", default_value_t = 5_000)]
    players: u64,
    /// Batch sizes, each measured for --seconds per backend.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    batches: Vec<usize>,
    /// Seconds each batch size is measured, per backend.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Backends, in order: sqlite, postgres, postgres-nofsync.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,postgres-nofsync")]
    backends: Vec<Backend>,
    /// The `postgres` backend on this server instead of one of the run's own
    /// (`postgres://...`). Accounts save-rate-0 ... are created in its meridian_players table.
    #[arg(long)]
    postgres_url: Option<String>,
    /// Directory for the SQLite file (default: a new temporary directory, removed at the end).
    #[arg(long)]
    sqlite_dir: Option<PathBuf>,
    /// Bytes of game state in each save (a shard saves none today); with `--what entities`,
    /// of the public state (at most 1,024).
    #[arg(long, default_value_t = 0)]
    state_bytes: usize,
    /// Players (or entities) read back after each batch size, through a second connection.
    #[arg(long, default_value_t = 200)]
    verify: usize,
}

/// What the writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    Players,
    Entities,
}

impl FromStr for What {
    type Err = String;

    fn from_str(text: &str) -> Result<What, String> {
        match text.trim() {
            "players" => Ok(What::Players),
            "entities" => Ok(What::Entities),
            other => Err(format!("unknown --what {other:?}: players, entities")),
        }
    }
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            What::Players => "players",
            What::Entities => "entities",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    PostgresNoFsync,
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(text: &str) -> Result<Backend, String> {
        match text.trim() {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" => Ok(Backend::Postgres),
            "postgres-nofsync" => Ok(Backend::PostgresNoFsync),
            other => Err(format!("unknown backend {other:?}: sqlite, postgres, postgres-nofsync")),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "SQLite (WAL, synchronous=FULL)",
            Backend::Postgres => "PostgreSQL (fsync on)",
            Backend::PostgresNoFsync => "PostgreSQL (fsync off)",
        })
    }
}

/// The command line, checked as a whole.
struct Config {
    what: What,
    players: u64,
    batches: Vec<usize>,
    phase: Duration,
    backends: Vec<Backend>,
    postgres_url: Option<String>,
    sqlite_dir: Option<PathBuf>,
    state_bytes: usize,
    verify: usize,
}

impl Config {
    fn from_cli(cli: Cli) -> anyhow::Result<Config> {
        let mut problems = Vec::new();
        if cli.players == 0 || cli.players > MAX_PLAYERS {
            problems.push(format!("--players {} must be 1 to {MAX_PLAYERS}", cli.players));
        }
        if cli.seconds == 0 || cli.seconds > MAX_SECONDS {
            problems.push(format!("--seconds {} must be 1 to {MAX_SECONDS}", cli.seconds));
        }
        for &batch in &cli.batches {
            // A batch names each player once (the store keeps one save per player anyway).
            if batch == 0 || batch as u64 > cli.players {
                problems.push(format!("batch size {batch} must be 1 to --players"));
            }
        }
        if cli.batches.is_empty() || cli.backends.is_empty() {
            problems.push("--batches and --backends need at least one value each".into());
        }
        if cli.state_bytes > 1 << 20 {
            problems.push(format!("--state-bytes {} is over 1 MiB", cli.state_bytes));
        }
        if cli.what == What::Entities && cli.state_bytes > ENTITY_STATE_MAX {
            problems.push(format!(
                "--state-bytes {} is over an entity's {ENTITY_STATE_MAX}",
                cli.state_bytes
            ));
        }
        if let Some(url) = &cli.postgres_url {
            if !matches!(Address::parse(url), Ok(Address::Postgres(_))) {
                problems.push(format!("--postgres-url {url:?} is not a postgres:// address"));
            }
        }
        if !problems.is_empty() {
            bail!("bad command line:\n  {}", problems.join("\n  "));
        }
        Ok(Config {
            what: cli.what,
            players: cli.players,
            batches: cli.batches,
            phase: Duration::from_secs(cli.seconds),
            backends: cli.backends,
            postgres_url: cli.postgres_url,
            sqlite_dir: cli.sqlite_dir,
            state_bytes: cli.state_bytes,
            verify: cli.verify,
        })
    }
}

/// One batch size on one backend.
struct Row {
    backend: Backend,
    batch: usize,
    saves: u64,
    batches: u64,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
    verified: usize,
    wrong: usize,
    /// The machine's CPU and I/O pressure when the batch size's time ended.
    pressure: Pressure,
    /// CPU time of this process over the batch size's time.
    own_cpu: Duration,
    /// CPU time of the PostgreSQL server (a server of this run's own only).
    server_cpu: Option<Duration>,
}

/// User + system CPU time of this process, all its threads.
fn own_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and has no other effect.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// User + system CPU time of a process and its direct children (PostgreSQL's postmaster
/// and its backends), from /proc/<pid>/stat.
fn server_cpu(root: u32) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The fields after the command name, which is in parentheses and may hold spaces:
        // state, ppid, ... utime and stime are the 12th and 13th.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let parent = fields.get(1).and_then(|f| f.parse::<u32>().ok());
        if pid == root || parent == Some(root) {
            let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
            ticks += field(11) + field(12);
        }
    }
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// Linux pressure stall information, "some" over the last 10 s: the share of that time in
/// which at least one task (this benchmark's own included) waited for a CPU, or for I/O. On
/// a shared machine it shows which rows were measured while something else was busy.
#[derive(Debug, Clone, Copy)]
struct Pressure {
    cpu: Option<f64>,
    io: Option<f64>,
}

impl Pressure {
    fn now() -> Pressure {
        let read = |what: &str| -> Option<f64> {
            let text = std::fs::read_to_string(format!("/proc/pressure/{what}")).ok()?;
            let some = text.lines().find(|line| line.starts_with("some "))?;
            some.split_whitespace().find_map(|field| field.strip_prefix("avg10="))?.parse().ok()
        };
        Pressure { cpu: read("cpu"), io: read("io") }
    }
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |value: Option<f64>| value.map_or("-".to_string(), |v| format!("{v:.0}"));
        write!(f, "{} / {}", show(self.cpu), show(self.io))
    }
}

/// Where one backend's store lives; dropping it stops the server or removes the file.
enum Place {
    Sqlite { dir: PathBuf, remove: bool },
    Postgres { url: String, server: Option<TempPostgres> },
}

impl Place {
    fn new(backend: Backend, config: &Config) -> anyhow::Result<Place> {
        match backend {
            Backend::Sqlite => {
                let (dir, remove) = match &config.sqlite_dir {
                    Some(dir) => (dir.join(format!("save-rate-{}", std::process::id())), false),
                    None => (
                        std::env::temp_dir()
                            .join(format!("meridian-save-rate-{}", std::process::id())),
                        true,
                    ),
                };
                let _ = std::fs::remove_dir_all(&dir);
                Ok(Place::Sqlite { dir, remove })
            }
            Backend::Postgres if config.postgres_url.is_some() => Ok(Place::Postgres {
                url: config.postgres_url.clone().unwrap_or_default(),
                server: None,
            }),
            Backend::Postgres | Backend::PostgresNoFsync => {
                let server = if backend == Backend::Postgres {
                    TempPostgres::start_durable()
                } else {
                    TempPostgres::start()
                }
                .context("starting a PostgreSQL server (Debian package `postgresql`)")?;
                Ok(Place::Postgres { url: server.url(), server: Some(server) })
            }
        }
    }

    /// The PostgreSQL server's pid, when it is one of this run's own.
    fn server_pid(&self) -> Option<u32> {
        match self {
            Place::Postgres { server: Some(server), .. } => server.server_pid(),
            _ => None,
        }
    }

    fn address(&self) -> Address {
        match self {
            Place::Sqlite { dir, .. } => Address::Sqlite(dir.join("players.db")),
            Place::Postgres { url, .. } => Address::Postgres(url.clone()),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Place::Sqlite { dir, remove: true } = self {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::from_cli(Cli::parse())?;
    eprintln!(
        "[save_rate] {} {}, batch sizes {:?}, {} s each, {} bytes of state per save, \
         {} read back per batch size",
        config.players,
        config.what,
        config.batches,
        config.phase.as_secs(),
        config.state_bytes,
        config.verify
    );
    let mut rows = Vec::new();
    let mut created = Vec::new();
    for &backend in &config.backends {
        let place = Place::new(backend, &config)?;
        let (took, mut backend_rows) = run_backend(backend, &place, &config).await?;
        created.push((backend, took));
        rows.append(&mut backend_rows);
    }
    print_table(&config, &created, &rows);
    let wrong: usize = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        bail!("{wrong} {} read back did not hold their last save (see the table)", config.what);
    }
    Ok(())
}

/// Creates the players (or entities), then measures every batch size; returns how long
/// creating took.
async fn run_backend(
    backend: Backend,
    place: &Place,
    config: &Config,
) -> anyhow::Result<(Duration, Vec<Row>)> {
    let address = place.address();
    let store = Store::open(&address).await.with_context(|| format!("opening {backend}"))?;
    // A second connection: what it reads was committed, not just sent.
    let reader = Store::open(&address).await.with_context(|| format!("opening {backend} again"))?;

    let what = config.what;
    eprintln!("[save_rate] {backend}: creating {} {what}", config.players);
    let started = Instant::now();
    let ids = match what {
        What::Players => create_players(backend, &store, config.players).await?,
        What::Entities => (0..config.players).map(|index| FIRST_ENTITY_ID + index).collect(),
    };
    let mut writer = Writer {
        backend,
        what,
        server_pid: place.server_pid(),
        store: &store,
        ids: &ids,
        last: vec![None; ids.len()],
        cursor: 0,
        sequence: 0,
        state_bytes: config.state_bytes,
    };
    if what == What::Entities {
        // Every entity's row is there before the measurement, so that the measured writes
        // overwrite rows as players' saves do.
        writer.create_entities(started).await?;
    }
    let creating = started.elapsed();
    eprintln!(
        "[save_rate] {backend}: {} {what} created in {:.1} s",
        config.players,
        creating.as_secs_f64()
    );

    let mut rows = Vec::new();
    for &batch in &config.batches {
        let first = writer.cursor;
        let mut row = writer.measure(batch, config.phase).await?;
        let touched = (row.saves as usize).min(ids.len());
        let (verified, wrong) = writer.verify(&reader, first, touched, config.verify).await?;
        row.verified = verified;
        row.wrong = wrong;
        eprintln!(
            "[save_rate] {backend}: batch {batch}: {:.0} saves/s, p50 {:.2} ms, p99 {:.2} ms; \
             {verified} read back, {wrong} wrong",
            row.saves as f64 / row.elapsed.as_secs_f64(),
            ms(row.p50),
            ms(row.p99)
        );
        rows.push(row);
    }
    Ok((creating, rows))
}

/// Creates the accounts, one `Store::player` call each; returns their players' ids.
async fn create_players(backend: Backend, store: &Store, players: u64) -> anyhow::Result<Vec<u64>> {
    let mut next_progress = Instant::now() + Duration::from_secs(1);
    let mut ids = Vec::with_capacity(players as usize);
    for index in 0..players {
        let account = format!("save-rate-{index}");
        let player = store
            .player(&account, &account, FIRST_PLAYER_ID + index)
            .await
            .with_context(|| format!("{backend}: creating {account}"))?;
        ids.push(player.player_id);
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(1);
            eprintln!("[save_rate] {backend}: {} players created", index + 1);
        }
    }
    Ok(ids)
}

/// What the writer wrote last to a player or an entity: what reading it back must give.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Written {
    Player(Saved),
    Entity(EntityRow),
}

/// One batch, as the store takes it.
enum Batch {
    Players(Vec<Save>),
    Entities(Vec<EntityWrite>),
}

/// The single writer of one backend's run, and what it wrote last to every player (or
/// entity).
struct Writer<'a> {
    backend: Backend,
    what: What,
    server_pid: Option<u32>,
    store: &'a Store,
    ids: &'a [u64],
    /// The last save written to each player or entity (by index in `ids`).
    last: Vec<Option<Written>>,
    /// The index of the next one to save; batches walk them round and round.
    cursor: usize,
    /// Counts every save of the run; each one's cell and state come from it.
    sequence: u64,
    state_bytes: usize,
}

impl Writer<'_> {
    /// Writes every entity's first row, in batches of up to [`MAX_BATCH`] (the cursor ends
    /// where it started).
    async fn create_entities(&mut self, started: Instant) -> anyhow::Result<()> {
        let mut next_progress = started + Duration::from_secs(1);
        let mut left = self.ids.len();
        while left > 0 {
            let batch = left.min(MAX_BATCH);
            self.write_batch(batch).await?;
            left -= batch;
            if Instant::now() >= next_progress {
                next_progress += Duration::from_secs(1);
                let done = self.ids.len() - left;
                eprintln!("[save_rate] {}: {done} entities created", self.backend);
            }
        }
        Ok(())
    }

    /// The next `batch` saves, each a new cell and state, and the index of each.
    fn next_batch(&mut self, batch: usize) -> (Batch, Vec<usize>) {
        let mut indices = Vec::with_capacity(batch);
        let (mut saves, mut writes) = (Vec::new(), Vec::new());
        for _ in 0..batch {
            let index = self.cursor;
            self.cursor = (self.cursor + 1) % self.ids.len();
            self.sequence += 1;
            let at =
                ((self.sequence % MAP_SIDE) as u32, ((self.sequence / MAP_SIDE) % MAP_SIDE) as u32);
            let bytes = self.sequence.to_le_bytes();
            let filled = |n: usize| -> Vec<u8> { bytes.iter().copied().cycle().take(n).collect() };
            let id = self.ids[index];
            match self.what {
                What::Players => saves.push(Save {
                    player_id: id,
                    generation: 1,
                    at,
                    state: filled(self.state_bytes),
                }),
                What::Entities => writes.push(EntityWrite::Upsert(EntityRow {
                    id,
                    kind: 2,
                    name: "flag".into(),
                    at,
                    state: filled(self.state_bytes),
                    private: filled(ENTITY_PRIVATE_BYTES),
                    generation: 1,
                    shard: 1,
                    incarnation: 1,
                })),
            }
            indices.push(index);
        }
        let rows = match self.what {
            What::Players => Batch::Players(saves),
            What::Entities => Batch::Entities(writes),
        };
        (rows, indices)
    }

    /// Writes the next batch of `batch` and remembers what it wrote; returns how long the
    /// store's call took. Every save must be written (nothing else writes these rows).
    async fn write_batch(&mut self, batch: usize) -> anyhow::Result<Duration> {
        let backend = self.backend;
        let (rows, indices) = self.next_batch(batch);
        let call = Instant::now();
        let (took, written): (Duration, Vec<Written>) = match rows {
            Batch::Players(saves) => {
                let report = self
                    .store
                    .save(&saves)
                    .await
                    .with_context(|| format!("{backend}: saving a batch of {batch}"))?;
                let took = call.elapsed();
                if report.written != saves.len() || !report.refused.is_empty() {
                    bail!(
                        "{backend}: a batch of {batch} wrote {} rows and refused {:?}",
                        report.written,
                        report.refused
                    );
                }
                let saved = saves.into_iter().map(|save| {
                    Written::Player(Saved {
                        at: save.at,
                        state: save.state,
                        generation: save.generation,
                    })
                });
                (took, saved.collect())
            }
            Batch::Entities(writes) => {
                let report =
                    self.store.save_entities(&writes).await.with_context(|| {
                        format!("{backend}: writing a batch of {batch} entities")
                    })?;
                let took = call.elapsed();
                if report.written.len() != writes.len() || !report.refused.is_empty() {
                    bail!(
                        "{backend}: a batch of {batch} entities wrote {} and refused {:?}",
                        report.written.len(),
                        report.refused
                    );
                }
                let saved = writes.into_iter().map(|write| match write {
                    EntityWrite::Upsert(row) => Written::Entity(row),
                    EntityWrite::Remove { .. } => {
                        unreachable!("invariant: the writer only upserts")
                    }
                });
                (took, saved.collect())
            }
        };
        for (index, written) in indices.into_iter().zip(written) {
            self.last[index] = Some(written);
        }
        Ok(took)
    }

    /// Saves batches of `batch` one after another for `phase`.
    async fn measure(&mut self, batch: usize, phase: Duration) -> anyhow::Result<Row> {
        let backend = self.backend;
        let mut latencies = Vec::new();
        let mut saves = 0u64;
        let (own_before, server_before) = (own_cpu(), self.server_pid.map(server_cpu));
        let started = Instant::now();
        let mut next_progress = started + Duration::from_secs(1);
        while started.elapsed() < phase {
            latencies.push(self.write_batch(batch).await?);
            saves += batch as u64;
            if Instant::now() >= next_progress {
                next_progress += Duration::from_secs(1);
                let elapsed = started.elapsed().as_secs_f64();
                eprintln!(
                    "[save_rate] {backend}: batch {batch}: {elapsed:.0} s, {saves} saves, \
                     {:.0}/s",
                    saves as f64 / elapsed
                );
            }
        }
        let elapsed = started.elapsed();
        let own = own_cpu().saturating_sub(own_before);
        let server = self
            .server_pid
            .zip(server_before)
            .map(|(pid, before)| server_cpu(pid).saturating_sub(before));
        latencies.sort_unstable();
        Ok(Row {
            backend,
            batch,
            saves,
            batches: latencies.len() as u64,
            elapsed,
            p50: quantile(&latencies, 0.50),
            p99: quantile(&latencies, 0.99),
            verified: 0,
            wrong: 0,
            pressure: Pressure::now(),
            own_cpu: own,
            server_cpu: server,
        })
    }

    /// Reads back up to `sample` of the `touched` players (or entities) saved from `first`
    /// on, spread evenly and always including the last one saved; returns (read, wrong).
    async fn verify(
        &self,
        reader: &Store,
        first: usize,
        touched: usize,
        sample: usize,
    ) -> anyhow::Result<(usize, usize)> {
        let n = self.ids.len();
        let mut indices: Vec<usize> = (0..sample.min(touched))
            .map(|k| (first + k * touched / sample.min(touched)) % n)
            .collect();
        if touched > 0 {
            // The last save of the phase was the one just before the cursor.
            indices.push((self.cursor + n - 1) % n);
        }
        indices.sort_unstable();
        indices.dedup();
        // Entities are read all at once (the store has no read of one entity).
        let entities: Option<HashMap<u64, EntityRow>> = match self.what {
            What::Players => None,
            What::Entities => {
                Some(reader.entities().await?.into_iter().map(|row| (row.id, row)).collect())
            }
        };
        let mut wrong = 0;
        for &index in &indices {
            let id = self.ids[index];
            let found = match &entities {
                Some(rows) => rows.get(&id).cloned().map(Written::Entity),
                None => reader.load(id).await?.and_then(|p| p.saved).map(Written::Player),
            };
            if found != self.last[index] {
                wrong += 1;
                eprintln!(
                    "[save_rate] {}: {} {id} holds {found:?}, last written {:?}",
                    self.backend, self.what, self.last[index]
                );
            }
        }
        Ok((indices.len(), wrong))
    }
}

/// The nearest-rank quantile of sorted values.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros_per_save(cpu: Duration, saves: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / saves.max(1) as f64
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn print_table(config: &Config, created: &[(Backend, Duration)], rows: &[Row]) {
    let (what, state) = match config.what {
        What::Players => ("players (`Store::save`)", String::new()),
        What::Entities => (
            "persistent entities (`Store::save_entities`, upserts)",
            format!(" of public state and {ENTITY_PRIVATE_BYTES} of private"),
        ),
    };
    println!(
        "Saves of {} {what}, one writer, batches one after another, {} s per batch size; \
         {} bytes{state} per save; rows read back through a second connection.",
        config.players,
        config.phase.as_secs(),
        config.state_bytes
    );
    println!();
    println!(
        "| store | batch | saves / s | batches / s | save call p50 ms | save call p99 ms | \
         CPU µs / save, this process | CPU µs / save, PostgreSQL server | read back (wrong) | \
         CPU / I/O pressure % |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in rows {
        let seconds = row.elapsed.as_secs_f64();
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.2} | {} | {} ({}) | {} |",
            row.backend,
            row.batch,
            thousands(row.saves as f64 / seconds),
            thousands(row.batches as f64 / seconds),
            ms(row.p50),
            ms(row.p99),
            micros_per_save(row.own_cpu, row.saves),
            row.server_cpu
                .map_or("-".to_string(), |cpu| format!("{:.2}", micros_per_save(cpu, row.saves))),
            row.verified,
            row.wrong,
            row.pressure
        );
    }
    println!();
    let creating = match config.what {
        What::Players => "creating the players (one `Store::player` call each)".to_string(),
        What::Entities => format!("writing the entities' first rows (batches of {MAX_BATCH})"),
    };
    for (backend, took) in created {
        println!(
            "- {backend}: {creating}: {} in {:.2} s, {} / s",
            thousands(config.players as f64),
            took.as_secs_f64(),
            thousands(config.players as f64 / took.as_secs_f64())
        );
    }
    println!(
        "- CPU / I/O pressure: the share of the 10 s before the row's end in which some task, \
         this benchmark's included (a commit waits for the disk), waited for a CPU / for I/O \
         (/proc/pressure, \"some avg10\"); rows measured while the machine was busy with \
         other work show it"
    );
    if config.batches.iter().any(|&b| b > MAX_BATCH) {
        match config.what {
            What::Players => println!(
                "- batches over {MAX_BATCH} rows are split by the store, one statement per \
                 {MAX_BATCH}"
            ),
            What::Entities => println!(
                "- a batch of entity writes is one transaction whatever its size (PostgreSQL: \
                 one statement), as a shard's writer sends all its waiting writes at once"
            ),
        }
    }
}

/// A whole number with thousands separators: 12,345.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
