//! What saving persistent entities costs a shard's core (issue 34), sans-IO: no store, no
//! socket, no clock of its own; simulated time, one thread.
//!
//! ```sh
//! cargo bench -p meridian-shard-core --bench entity_saves
//! cargo bench -p meridian-shard-core --bench entity_saves -- --npcs 1000,10000 --seconds 2
//! ```
//!
//! A `ShardCore` owning the whole 400 x 400 map, with a store (`save_interval` 1 s), runs a
//! small game that spawns `--npcs` NPCs on its first tick (at distinct cells spread over
//! the map) and, on every tick after, sets a new 16-byte private state on a share of them
//! (`--changed`, in percent: the same ones every tick). The driver gives the core
//! `Event::GameTick` and `Event::Tick` every 100 ms of simulated time, flushes it after
//! each, counts the entities in `Transmit::SaveEntities` and confirms each round at once
//! (`Event::EntitiesSaved`, as the shell does once the store has it). The same game runs
//! twice: spawning **persistent** NPCs (`Context::spawn_persistent`: saved at once, then
//! every save interval if changed, after a fingerprint compare per entity) and **plain**
//! ones (`Context::spawn`: no saves). The difference of their CPU time over the measured
//! window, divided by the saves counted, is the core's CPU per entity save (the fingerprint
//! of every persistent entity once a round, and a record built for each changed one), net
//! of everything else the core does per tick. With no entity changed it is the cost of the
//! compare alone, per entity and round.
//!
//! Each run warms up for `--warmup` simulated seconds after the spawning tick (whose cost
//! is reported on its own), then is measured for `--seconds` of wall time (at most
//! `MAX_SIMULATED` of simulated time: a simulated second of 1,000 NPCs takes about a
//! millisecond), plain and persistent alternating, `--repeats` times each; the figures are
//! per simulated second (a shard's real second), the table has the median of each. CPU is
//! this process's user + system time (the benchmark is one thread). The table at the end
//! is Markdown; progress goes to stderr.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_game::{Context, EntityId, Game, Position};
use meridian_protocol::TokenKey;
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::{CoreConfig, Event, LinkId, ShardMetrics, Transmit};

const ME: ShardId = ShardId(1);
const MAP_SIDE: u32 = 400;
/// The shard's game tick, and how often the driver gives it `Event::Tick`.
const TICK: Duration = Duration::from_millis(100);
const SAVE_INTERVAL: Duration = Duration::from_secs(1);
/// Entity ids handed to the core: far from the players' (none here anyway).
const FIRST_ID: u64 = 1_000_000;
/// Bytes of private state the game sets.
const PRIVATE_BYTES: usize = 16;
/// A measured window stops after this much simulated time, whatever `--seconds` allows.
const MAX_SIMULATED: Duration = Duration::from_secs(3_600);
/// Bounds on the command line.
const MAX_NPCS: usize = 20_000;
const MAX_SECONDS: u64 = 60;
const MAX_REPEATS: usize = 9;

/// Spawns `npcs` NPCs on its first tick, persistent or not, then sets a new private state
/// on the first `changed` percent of every hundred of them each tick.
struct Churn {
    npcs: usize,
    persistent: bool,
    changed_percent: usize,
    spawned: Vec<EntityId>,
    ticks: u64,
    /// Spawns the core refused (the run is void if any).
    refused: usize,
}

impl Game for Churn {
    fn tick(&mut self, ctx: &mut Context<'_>) {
        self.ticks += 1;
        if self.ticks == 1 {
            let cells = u64::from(MAP_SIDE) * u64::from(MAP_SIDE);
            for index in 0..self.npcs {
                // Distinct cells, spread evenly over the map.
                let cell = index as u64 * cells / self.npcs as u64;
                let at = Position::new((cell % 400) as u32, (cell / 400) as u32);
                let state = b"flag".to_vec();
                let spawned = if self.persistent {
                    ctx.spawn_persistent(2, "flag", at, state)
                } else {
                    ctx.spawn(2, "flag", at, state)
                };
                match spawned {
                    Ok(id) => self.spawned.push(id),
                    Err(_) => self.refused += 1,
                }
            }
            return;
        }
        let bytes = self.ticks.to_le_bytes();
        let private: Vec<u8> = bytes.iter().copied().cycle().take(PRIVATE_BYTES).collect();
        for (index, &npc) in self.spawned.iter().enumerate() {
            if index % 100 < self.changed_percent
                && ctx.set_private_state(npc, private.clone()).is_err()
            {
                self.refused += 1;
            }
        }
    }
}

/// One configuration: `npcs` NPCs, `changed_percent` of them changed every tick.
#[derive(Debug, Clone, Copy)]
struct Setup {
    npcs: usize,
    changed_percent: usize,
}

/// What one run of one variant did.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    /// CPU and wall time of the spawning tick (and its flush: the first save of every
    /// persistent NPC).
    spawn_cpu: Duration,
    /// Entity saves counted in the spawning round.
    spawn_saves: u64,
    /// Simulated time measured.
    simulated: Duration,
    cpu: Duration,
    wall: Duration,
    /// Entity saves counted in the measured window.
    saves: u64,
    rounds: u64,
    /// The wall time of the round in which the save interval falls (the slowest of the
    /// ten rounds of an interval, by their median): how long that tick holds the core.
    save_round: Duration,
}

impl Run {
    fn cpu_per_simulated_second(&self) -> f64 {
        self.cpu.as_secs_f64() / self.simulated.as_secs_f64().max(1e-9)
    }

    fn saves_per_simulated_second(&self) -> f64 {
        self.saves as f64 / self.simulated.as_secs_f64().max(1e-9)
    }
}

/// The command line: `--npcs`, `--changed`, `--seconds`, `--warmup`, `--repeats`
/// (cargo's own `--bench` is ignored).
struct Options {
    npcs: Vec<usize>,
    changed: Vec<usize>,
    seconds: u64,
    warmup: u64,
    repeats: usize,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut options = Options {
            npcs: vec![1_000, 10_000, 20_000],
            changed: vec![100, 10, 0],
            seconds: 1,
            warmup: 5,
            repeats: 3,
        };
        let mut problems = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().unwrap_or_default();
            let list = |text: String| -> Result<Vec<usize>, String> {
                text.split(',').map(|v| v.trim().parse().map_err(|_| text.clone())).collect()
            };
            match arg.as_str() {
                "--bench" => {}
                "--npcs" => match list(value()) {
                    Ok(npcs) => options.npcs = npcs,
                    Err(bad) => problems.push(format!("--npcs {bad:?}: numbers, comma-separated")),
                },
                "--changed" => match list(value()) {
                    Ok(changed) => options.changed = changed,
                    Err(bad) => {
                        problems.push(format!("--changed {bad:?}: percents, comma-separated"))
                    }
                },
                "--seconds" => match value().parse() {
                    Ok(seconds) => options.seconds = seconds,
                    Err(_) => problems.push("--seconds: a whole number".into()),
                },
                "--warmup" => match value().parse() {
                    Ok(seconds) => options.warmup = seconds,
                    Err(_) => problems.push("--warmup: a whole number".into()),
                },
                "--repeats" => match value().parse() {
                    Ok(repeats) => options.repeats = repeats,
                    Err(_) => problems.push("--repeats: a whole number".into()),
                },
                other => problems.push(format!("unknown argument {other:?}")),
            }
        }
        if options.npcs.is_empty() || options.npcs.iter().any(|&n| n == 0 || n > MAX_NPCS) {
            problems.push(format!("--npcs: each 1 to {MAX_NPCS}"));
        }
        if options.changed.is_empty() || options.changed.iter().any(|&c| c > 100) {
            problems.push("--changed: each 0 to 100".into());
        }
        if options.seconds == 0 || options.seconds > MAX_SECONDS {
            problems.push(format!("--seconds: 1 to {MAX_SECONDS}"));
        }
        if options.warmup > MAX_SECONDS {
            problems.push(format!("--warmup: at most {MAX_SECONDS}"));
        }
        if options.repeats == 0 || options.repeats > MAX_REPEATS {
            problems.push(format!("--repeats: 1 to {MAX_REPEATS}"));
        }
        if problems.is_empty() {
            Ok(options)
        } else {
            Err(problems.join("\n  "))
        }
    }
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
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

/// The machine's 1-minute load average, from /proc/loadavg.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A core owning the whole map with a store, running `game`, at `now`.
fn core_with(game: Churn, now: Instant) -> ShardCore {
    let config = CoreConfig {
        id: ME,
        incarnation: 1,
        world: Default::default(),
        seed: 1,
        resume_window: Duration::from_secs(30),
        resume_keys: TokenKey::new(vec![7; 32]).expect("invariant: a 32-byte key").into(),
        save_interval: Some(SAVE_INTERVAL),
        lease_ttl: Duration::from_secs(3600),
        max_npcs: game.npcs,
    };
    let ids = FIRST_ID..FIRST_ID + game.npcs as u64 + 1_024;
    let whole = Region { shard: ME, x0: 0, y0: 0, x1: MAP_SIDE, y1: MAP_SIDE };
    let partition =
        PartitionMap { epoch: 1, width: MAP_SIDE, height: MAP_SIDE, regions: vec![whole] };
    let view = ClusterView { partition: Some(partition), ..Default::default() };
    let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
    let mut core = ShardCore::with_game(&config, metrics, now, Box::new(game));
    core.handle(now, Event::View(view));
    core.handle(now, Event::LinkOpened { link: LinkId(1), gateway: 1, lane: 0 });
    core.handle(now, Event::Ids(ids));
    core
}

/// The driver: the shell's part, with simulated time.
struct Driver {
    core: ShardCore,
    now: Instant,
    out: Vec<Transmit>,
    next_id: u64,
}

impl Driver {
    /// One round: a game tick and a tick 100 ms on, each flushed; the store's part answered
    /// at once. Returns the entity saves it flushed.
    fn round(&mut self) -> u64 {
        self.now += TICK;
        self.core.handle(self.now, Event::GameTick);
        let mut saves = self.flush();
        self.core.handle(self.now, Event::Tick);
        saves += self.flush();
        saves
    }

    fn flush(&mut self) -> u64 {
        self.core.flush(&mut self.out);
        let mut saves = 0;
        let mut answers = Vec::new();
        for transmit in self.out.drain(..) {
            match transmit {
                Transmit::SaveEntities { round, saves: writes } => {
                    saves += writes.len() as u64;
                    answers.push(Event::EntitiesSaved { through: round, refused: Vec::new() });
                }
                Transmit::LoadEntities { .. } => answers.push(Event::EntitiesFound(Vec::new())),
                Transmit::WantIds => {
                    answers.push(Event::Ids(self.next_id..self.next_id + 1_024));
                    self.next_id += 1_024;
                }
                _ => {}
            }
        }
        for answer in answers {
            self.core.handle(self.now, answer);
        }
        saves
    }
}

/// Runs one variant of `setup`: the spawning tick, the warm-up, the measured window.
fn run(setup: Setup, persistent: bool, options: &Options) -> Result<Run, String> {
    let game = Churn {
        npcs: setup.npcs,
        persistent,
        changed_percent: setup.changed_percent,
        spawned: Vec::with_capacity(setup.npcs),
        ticks: 0,
        refused: 0,
    };
    let start = Instant::now();
    let core = core_with(game, start);
    let next_id = FIRST_ID + setup.npcs as u64 + 1_024;
    let mut driver = Driver { core, now: start, out: Vec::new(), next_id };
    driver.flush();
    let mut result = Run::default();

    let cpu = cpu_time();
    result.spawn_saves = driver.round();
    result.spawn_cpu = cpu_time().saturating_sub(cpu);
    let owned = driver.core.owned_npcs();
    let persistent_now = owned.iter().filter(|(_, _, p)| *p).count();
    let expected_persistent = if persistent { setup.npcs } else { 0 };
    if owned.len() != setup.npcs || persistent_now != expected_persistent {
        return Err(format!(
            "{setup:?}, persistent {persistent}: {} NPCs owned ({persistent_now} persistent)",
            owned.len()
        ));
    }

    let ticks_per_second = (Duration::from_secs(1).as_nanos() / TICK.as_nanos()) as u64;
    for _ in 0..options.warmup * ticks_per_second {
        driver.round();
    }

    // Whole save intervals only, so that every window holds as many save rounds as seconds.
    let budget = Duration::from_secs(options.seconds);
    let max_rounds = MAX_SIMULATED.as_secs() * ticks_per_second;
    let mut phases: Vec<Vec<f64>> = vec![Vec::new(); ticks_per_second as usize];
    let (cpu, wall) = (cpu_time(), Instant::now());
    while (wall.elapsed() < budget || result.rounds % ticks_per_second != 0)
        && result.rounds < max_rounds
    {
        let round = Instant::now();
        result.saves += driver.round();
        phases[(result.rounds % ticks_per_second) as usize].push(round.elapsed().as_secs_f64());
        result.rounds += 1;
    }
    result.cpu = cpu_time().saturating_sub(cpu);
    result.wall = wall.elapsed();
    result.simulated = TICK * result.rounds as u32;
    let slowest = phases.into_iter().map(median).fold(0.0, f64::max);
    result.save_round = Duration::from_secs_f64(slowest);
    Ok(result)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The medians of one configuration's runs, plain and persistent.
struct Row {
    setup: Setup,
    /// CPU ms per simulated second: plain, persistent.
    cpu_per_second: (f64, f64),
    saves_per_second: f64,
    /// Wall ms of the round the save interval falls in: plain, persistent.
    save_round: (f64, f64),
    /// CPU ms of the spawning tick: plain, persistent; and the saves it flushed.
    spawn_cpu: (f64, f64),
    spawn_saves: u64,
    rounds: u64,
    /// CPU ms per simulated second of every run, plain then persistent (the spread).
    spread: (Vec<f64>, Vec<f64>),
    load: Option<f64>,
}

fn measure(setup: Setup, options: &Options) -> Result<Row, String> {
    let (mut plain, mut persistent) = (Vec::new(), Vec::new());
    for repeat in 1..=options.repeats {
        for variant in [false, true] {
            let run = run(setup, variant, options)?;
            eprintln!(
                "[entity_saves] {} NPCs, {}% changed, {} run {repeat}: {:.1} ms CPU per \
                 simulated s ({} rounds, {:.2} s wall), {:.0} saves per simulated s; save round \
                 {:.2} ms; spawning tick {:.1} ms, {} saves",
                setup.npcs,
                setup.changed_percent,
                if variant { "persistent" } else { "plain" },
                run.cpu_per_simulated_second() * 1e3,
                run.rounds,
                run.wall.as_secs_f64(),
                run.saves_per_simulated_second(),
                run.save_round.as_secs_f64() * 1e3,
                run.spawn_cpu.as_secs_f64() * 1e3,
                run.spawn_saves
            );
            let runs = if variant { &mut persistent } else { &mut plain };
            runs.push(run);
        }
    }
    let per_second = |runs: &[Run]| -> Vec<f64> {
        runs.iter().map(|r| r.cpu_per_simulated_second() * 1e3).collect()
    };
    let save_round =
        |runs: &[Run]| median(runs.iter().map(|r| r.save_round.as_secs_f64() * 1e3).collect());
    let spawn =
        |runs: &[Run]| median(runs.iter().map(|r| r.spawn_cpu.as_secs_f64() * 1e3).collect());
    Ok(Row {
        setup,
        cpu_per_second: (median(per_second(&plain)), median(per_second(&persistent))),
        saves_per_second: median(persistent.iter().map(Run::saves_per_simulated_second).collect()),
        save_round: (save_round(&plain), save_round(&persistent)),
        spawn_cpu: (spawn(&plain), spawn(&persistent)),
        spawn_saves: persistent.iter().map(|r| r.spawn_saves).max().unwrap_or(0),
        rounds: persistent.iter().chain(&plain).map(|r| r.rounds).min().unwrap_or(0),
        spread: (per_second(&plain), per_second(&persistent)),
        load: load_average(),
    })
}

fn main() {
    // A test runner lists every target's tests (`--list --format terse`, as cargo-nextest
    // does): this bench has none, and runs only when run as itself.
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let options = match Options::parse() {
        Ok(options) => options,
        Err(problems) => {
            eprintln!("entity_saves: bad command line:\n  {problems}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "[entity_saves] NPCs {:?}, changed {:?}%, {} simulated s of warm-up and {} s (wall) \
         measured per run, {} repeats; load average {}",
        options.npcs,
        options.changed,
        options.warmup,
        options.seconds,
        options.repeats,
        load_average().map_or("-".into(), |l| format!("{l:.2}"))
    );
    let mut rows = Vec::new();
    for &npcs in &options.npcs {
        for &changed_percent in &options.changed {
            match measure(Setup { npcs, changed_percent }, &options) {
                Ok(row) => rows.push(row),
                Err(why) => {
                    eprintln!("entity_saves: {why}");
                    std::process::exit(1);
                }
            }
        }
    }
    print_table(&options, &rows);
}

fn print_table(options: &Options, rows: &[Row]) {
    println!(
        "The core's CPU per entity save: {} s of wall time per run after {} simulated s of \
         warm-up, game tick and core tick every 100 ms of simulated time, save interval 1 s, \
         median of {} runs per variant. \"/ s\": per second of simulated time (a shard's \
         second).",
        options.seconds, options.warmup, options.repeats
    );
    println!();
    println!(
        "| NPCs | changed each tick | entity saves / s | CPU ms / s, plain | CPU ms / s, \
         persistent | difference, % of a core | CPU µs / entity save | CPU µs / entity save \
         over the compare | CPU ns / entity / save round | save round ms (wall), plain / \
         persistent | spawning tick CPU ms, plain / persistent (saves) | every run, CPU ms / s: \
         plain; persistent | load average |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |"
    );
    // One save round per interval.
    let rounds_per_second = 1.0 / SAVE_INTERVAL.as_secs_f64();
    let difference = |row: &Row| row.cpu_per_second.1 - row.cpu_per_second.0;
    for row in rows {
        let (plain, persistent) = row.cpu_per_second;
        let per_save = |extra: f64| {
            if row.saves_per_second > 0.0 {
                format!("{:.2}", extra * 1e3 / row.saves_per_second)
            } else {
                "-".into()
            }
        };
        // The same NPCs with none changed: the compare alone.
        let compare = rows
            .iter()
            .find(|other| other.setup.npcs == row.setup.npcs && other.setup.changed_percent == 0)
            .map(difference);
        let over_compare = compare.map_or("-".into(), |c| per_save(difference(row) - c));
        let per_entity_round = difference(row) * 1e6 / (row.setup.npcs as f64 * rounds_per_second);
        let list = |values: &[f64]| {
            values.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(", ")
        };
        println!(
            "| {} | {}% | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {:.0} | {:.2} / {:.2} | \
             {:.1} / {:.1} ({}) | {}; {} | {} |",
            row.setup.npcs,
            row.setup.changed_percent,
            row.saves_per_second,
            plain,
            persistent,
            difference(row) / 10.0,
            per_save(difference(row)),
            over_compare,
            per_entity_round,
            row.save_round.0,
            row.save_round.1,
            row.spawn_cpu.0,
            row.spawn_cpu.1,
            row.spawn_saves,
            list(&row.spread.0),
            list(&row.spread.1),
            row.load.map_or("-".into(), |l| format!("{l:.2}"))
        );
    }
    println!();
    println!(
        "- difference: persistent minus plain, CPU per second (ms / s; / 10 is % of a core); \
         per entity save: all of it over the saves counted, and over the compare: less the \
         difference with none changed (same NPCs); per entity and save round: over every \
         persistent NPC once a round (with none changed, what the fingerprint compare costs); \
         save round: the wall time of the round the save interval falls in (median over the \
         run); measured windows were at least {} rounds of 100 ms",
        rows.iter().map(|r| r.rounds).min().unwrap_or(0)
    );
}
