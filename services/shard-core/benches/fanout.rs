//! What a battle's fan-out costs a shard's core (issue 29), sans-IO: no socket, no clock of
//! its own, simulated time, one thread.
//!
//! ```sh
//! cargo bench -p meridian-shard-core --bench fanout
//! cargo bench -p meridian-shard-core --bench fanout -- --players 1000,2000 --seconds 3
//! ```
//!
//! A `ShardCore` owning the whole 400 x 400 map, one gateway link, `--players` players
//! joined in the 20 x 20 box at the map's centre (every one in sight of every other, as in
//! `loadtest --battle`). Each simulated second every player moves once, right or left so
//! that it stays in the box: the driver gives the core a batch of moves every 20 ms (a
//! fiftieth of the players each), flushes it, and counts the frames the round sent: each
//! move's ack and a `Moved` to every other player. The figure is the core's time per
//! notification (wall time of `handle` and `flush`, the benchmark is one thread and does
//! nothing else meanwhile), and notifications per second of a core. The frames are counted
//! after the timed part. Each run warms up for `--warmup` simulated seconds, then is
//! measured for `--seconds` of wall time; `--repeats` runs, the table has the median and
//! every run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_protocol::pb as client_pb;
use meridian_protocol::{next_frame, TokenKey};
use meridian_rpc::pb::{player_input::Kind as Input, Join, PlayerInput};
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::{CoreConfig, Event, LinkId, ShardMetrics, Transmit};

const ME: ShardId = ShardId(1);
const LINK: LinkId = LinkId(1);
const MAP_SIDE: u32 = 400;
/// The battle's box: `BOX` cells a side from `BOX_AT`, as `loadtest --battle` uses.
const BOX_AT: u32 = 190;
const BOX: u32 = 20;
/// How often the driver hands the core a batch of moves.
const ROUND: Duration = Duration::from_millis(20);
const ROUNDS_PER_SECOND: usize = 50;
const MAX_PLAYERS: usize = 5_000;
const MAX_SECONDS: u64 = 60;
const MAX_REPEATS: usize = 9;

struct Options {
    players: Vec<usize>,
    seconds: u64,
    warmup: u64,
    repeats: usize,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut options =
            Options { players: vec![500, 1_000, 2_000], seconds: 2, warmup: 2, repeats: 3 };
        let mut problems = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().unwrap_or_default();
            match arg.as_str() {
                "--bench" => {}
                "--players" => {
                    let text = value();
                    match text.split(',').map(|v| v.trim().parse()).collect() {
                        Ok(players) => options.players = players,
                        Err(_) => problems.push(format!("--players {text:?}: comma-separated")),
                    }
                }
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
        if options.players.is_empty()
            || options.players.iter().any(|n| !(2..=MAX_PLAYERS).contains(n))
        {
            problems.push(format!("--players: each 2 to {MAX_PLAYERS}"));
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

/// A player's session: lane 0 (the one link), one per player.
fn session(player: usize) -> u64 {
    player as u64 + 1
}

fn player_id(player: usize) -> u64 {
    player as u64 + 1
}

/// The driver: the gateway's and the shell's part, with simulated time.
struct Battle {
    core: ShardCore,
    now: Instant,
    players: usize,
    /// The next input seq of each player, and which way it goes next.
    seq: Vec<u64>,
    right: Vec<bool>,
    out: Vec<Transmit>,
    round: usize,
}

impl Battle {
    fn new(players: usize) -> Battle {
        let config = CoreConfig {
            id: ME,
            incarnation: 1,
            world: Default::default(),
            seed: 1,
            resume_window: Duration::from_secs(30),
            resume_keys: TokenKey::new(vec![7; 32]).expect("invariant: a 32-byte key").into(),
            save_interval: None,
            lease_ttl: Duration::from_secs(3600),
            max_npcs: 0,
        };
        let whole = Region { shard: ME, x0: 0, y0: 0, x1: MAP_SIDE, y1: MAP_SIDE };
        let partition =
            PartitionMap { epoch: 1, width: MAP_SIDE, height: MAP_SIDE, regions: vec![whole] };
        let view = ClusterView { partition: Some(partition), ..Default::default() };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
        let now = Instant::now();
        let mut core = ShardCore::new(&config, metrics, now);
        core.handle(now, Event::View(view));
        core.handle(now, Event::LinkOpened { link: LINK, gateway: 1, lane: 0 });
        let mut battle = Battle {
            core,
            now,
            players,
            seq: vec![1; players],
            right: (0..players).map(|p| p % 2 == 0).collect(),
            out: Vec::new(),
            round: 0,
        };
        // Everyone joins in the box, a fiftieth per round (the logins are not measured).
        for chunk in (0..players).collect::<Vec<_>>().chunks(players.div_ceil(50)) {
            let inputs = chunk.iter().map(|&player| battle.join(player)).collect();
            battle.core.handle(battle.now, Event::Inputs { link: LINK, inputs });
            battle.flush();
            battle.now += ROUND;
        }
        battle
    }

    fn join(&mut self, player: usize) -> PlayerInput {
        let cell = player as u32 % (BOX * BOX);
        let spawn = client_pb::Position { x: BOX_AT + cell % BOX, y: BOX_AT + cell / BOX };
        let join = Join { name: format!("p{player}"), spawn: Some(spawn), ..Default::default() };
        self.input(player, Input::Join(join))
    }

    fn input(&mut self, player: usize, kind: Input) -> PlayerInput {
        let seq = self.seq[player];
        self.seq[player] += 1;
        PlayerInput {
            session: session(player),
            player_id: player_id(player),
            seq,
            kind: Some(kind),
        }
    }

    /// One round: this round's share of the players move. Returns the time the core took.
    fn round(&mut self) -> Duration {
        let share = self.players.div_ceil(ROUNDS_PER_SECOND);
        let from = (self.round % ROUNDS_PER_SECOND) * share;
        let movers = from.min(self.players)..(from + share).min(self.players);
        let mut inputs = Vec::with_capacity(movers.len());
        for player in movers {
            let right = self.right[player];
            self.right[player] = !right;
            let direction =
                if right { client_pb::Direction::Right } else { client_pb::Direction::Left };
            let client_time = self.round as u64 + 1;
            let kind = Input::Move(client_pb::Move { direction: direction as i32, client_time });
            inputs.push(self.input(player, kind));
        }
        self.round += 1;
        self.now += ROUND;
        let started = Instant::now();
        self.core.handle(self.now, Event::Inputs { link: LINK, inputs });
        self.core.handle(self.now, Event::Tick);
        self.core.flush(&mut self.out);
        started.elapsed()
    }

    /// Frames this round sent, and the round's output dropped.
    fn flush(&mut self) -> u64 {
        self.core.flush(&mut self.out);
        let mut frames_sent = 0;
        for transmit in self.out.drain(..) {
            let Transmit::Gateway { batch, .. } = transmit else { continue };
            for delivery in &batch.deliveries {
                let mut frames = &delivery.frames[..];
                while let Ok(Some(header)) = next_frame(frames, usize::MAX) {
                    frames_sent += 1;
                    frames = &frames[header.total_len()..];
                }
            }
        }
        frames_sent
    }
}

/// One measured run: core time and frames sent.
struct Run {
    busy: Duration,
    frames: u64,
    simulated: Duration,
}

fn run(players: usize, options: &Options) -> Run {
    let mut battle = Battle::new(players);
    for _ in 0..options.warmup as usize * ROUNDS_PER_SECOND {
        battle.round();
        battle.flush();
    }
    let budget = Duration::from_secs(options.seconds);
    let wall = Instant::now();
    let mut result = Run { busy: Duration::ZERO, frames: 0, simulated: Duration::ZERO };
    // Whole simulated seconds: every player moved as often.
    let mut rounds = 0;
    while wall.elapsed() < budget || rounds % ROUNDS_PER_SECOND != 0 {
        result.busy += battle.round();
        result.frames += battle.flush();
        rounds += 1;
    }
    result.simulated = ROUND * rounds as u32;
    result
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
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
            eprintln!("fanout: bad command line:\n  {problems}");
            std::process::exit(2);
        }
    };
    println!(
        "A battle's fan-out in one shard core: every player moves once a simulated second, \
         a batch every 20 ms; {} s of wall time per run after {} simulated s of warm-up, \
         median of {} runs.",
        options.seconds, options.warmup, options.repeats
    );
    println!();
    println!(
        "| players | notifications / simulated s | core ns / notification | notifications / s \
         of a core | core ms / simulated s | every run, ns / notification |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | --- |");
    for &players in &options.players {
        let mut per_note = Vec::new();
        let mut rates = Vec::new();
        let mut busy_per_second = Vec::new();
        for repeat in 1..=options.repeats {
            let run = run(players, &options);
            let ns = run.busy.as_nanos() as f64 / run.frames.max(1) as f64;
            let rate = run.frames as f64 / run.simulated.as_secs_f64();
            eprintln!(
                "[fanout] {players} players, run {repeat}: {ns:.1} ns per notification, \
                 {rate:.0} notifications per simulated s, {:.2} s simulated",
                run.simulated.as_secs_f64()
            );
            per_note.push(ns);
            rates.push(rate);
            busy_per_second.push(run.busy.as_secs_f64() * 1e3 / run.simulated.as_secs_f64());
        }
        let ns = median(per_note.clone());
        let list = per_note.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(", ");
        println!(
            "| {players} | {:.0} | {ns:.1} | {:.0} | {:.1} | {list} |",
            median(rates),
            1e9 / ns,
            median(busy_per_second)
        );
    }
}
