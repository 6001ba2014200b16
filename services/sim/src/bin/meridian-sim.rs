//! `meridian-sim`: runs the deterministic cluster simulator.
//!
//! `meridian-sim --seed S` replays one seed (its settings are drawn from the seed, as in
//! the sweep); `meridian-sim --seeds N` runs seeds `--first`..`--first + N` and stops at
//! the first violation, printing its seed, what broke, and the messages that led to it.
//!
//! `meridian-sim --scale` runs the scale model instead (`meridian_sim::scale`): 100,000
//! random walkers over 64 to 256 real shard cores, counting the messages between shards,
//! and prints the tables of `BENCHMARKS.md` (`--svg PATH` writes the plot). Run it in
//! release mode; `--shards`, `--players` and `--sight` run one configuration instead.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use meridian_sim::scale::{self, ScaleConfig};
use meridian_sim::{run, Settings};

#[derive(Parser)]
#[command(about = "Deterministic simulator of a Meridian cluster: replays a seed or sweeps many")]
struct Args {
    /// Replay this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// How many seeds to sweep.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed of the sweep.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Stop the sweep after this long (a humane duration: 90s, 10m).
    #[arg(long)]
    budget: Option<humantime_like::Budget>,
    /// Print each seed's settings and outcome.
    #[arg(long)]
    verbose: bool,
    /// Go on after a violation; print one line per failing seed (`seed<TAB>what`), the
    /// format of `services/sim/known-gaps.txt`.
    #[arg(long)]
    keep_going: bool,
    /// Run each seed without the pause the swarm may draw for it (a shard paused past its
    /// lease): the settings seeds had before pauses joined the swarm.
    #[arg(long)]
    no_pauses: bool,
    /// Run each seed with persistent entities and a model of the store (issue 34): every
    /// shard's game plants stones and walks them across borders; at quiescence each is
    /// owned once and saved by its owner.
    #[arg(long)]
    entities: bool,
    /// How many of the last trace lines a violation prints.
    #[arg(long, default_value_t = 120)]
    trace_lines: usize,
    /// Run the scale model (counting only) instead of seeds; `--seed` seeds its walkers.
    #[arg(long)]
    scale: bool,
    /// Scale model: one run with this many shards (other sizes default to 144 shards,
    /// 100,000 players, sight 20).
    #[arg(long, requires = "scale")]
    shards: Option<u32>,
    /// Scale model: one run with this many players.
    #[arg(long, requires = "scale")]
    players: Option<u32>,
    /// Scale model: one run with this sight range.
    #[arg(long, requires = "scale")]
    sight: Option<u32>,
    /// Scale model: simulated seconds counted per run (after 3 s of warm-up).
    #[arg(long, requires = "scale", default_value_t = 10)]
    measure: u64,
    /// Scale model: write the plot (SVG) here.
    #[arg(long, requires = "scale")]
    svg: Option<std::path::PathBuf>,
}

mod humantime_like {
    use std::str::FromStr;
    use std::time::Duration;

    #[derive(Clone, Copy)]
    pub struct Budget(pub Duration);

    impl FromStr for Budget {
        type Err = String;
        fn from_str(text: &str) -> Result<Self, Self::Err> {
            let (number, unit) =
                text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
            let n: u64 = number.parse().map_err(|_| format!("not a duration: {text}"))?;
            let seconds = match unit {
                "" | "s" => n,
                "m" => n * 60,
                "h" => n * 3600,
                _ => return Err(format!("unknown unit in {text} (use s, m or h)")),
            };
            Ok(Budget(Duration::from_secs(seconds)))
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        // The cores' own log lines (`RUST_LOG=meridian_shard_core=debug`), on stderr.
        meridian_observe::init_tracing(false);
    }
    meridian_sim::TRACE_LINES.store(args.trace_lines, std::sync::atomic::Ordering::Relaxed);
    if args.scale {
        return scale_model(&args);
    }
    let seeds = match args.seed {
        Some(seed) => seed..seed + 1,
        None => args.first..args.first + args.seeds,
    };
    let budget = args.budget.map(|b| b.0).unwrap_or(Duration::MAX);
    let started = Instant::now();
    let mut last_report = started;
    let (mut ran, mut moves, mut simulated) = (0u64, 0u64, Duration::ZERO);
    for seed in seeds.clone() {
        if started.elapsed() > budget {
            break;
        }
        let mut settings = Settings::swarm(seed);
        if args.no_pauses {
            settings.faults.pauses = 0;
        }
        settings.entities = args.entities;
        if args.verbose || args.seed.is_some() {
            println!("seed {seed}: {settings:?}");
        }
        match run(seed, &settings) {
            Ok(outcome) => {
                ran += 1;
                moves += outcome.moves;
                simulated += outcome.simulated;
                if args.verbose || args.seed.is_some() {
                    println!("seed {seed}: ok {outcome:?}");
                }
            }
            Err(violation) if args.keep_going => {
                println!("{seed}\t{}", violation.what);
            }
            Err(violation) => {
                println!("VIOLATION {violation}");
                println!("settings: {settings:?}");
                return ExitCode::FAILURE;
            }
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "{ran} seeds passed ({moves} moves, {simulated:?} simulated) in {:?}",
                started.elapsed()
            );
        }
    }
    println!(
        "{ran} seeds passed ({moves} moves, {:.0} s simulated) in {:.1} s",
        simulated.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// Runs the scale model's configurations and prints the tables.
fn scale_model(args: &Args) -> ExitCode {
    if args.measure == 0 {
        eprintln!("--measure must be at least 1 (seconds)");
        return ExitCode::FAILURE;
    }
    let single = args.shards.is_some() || args.players.is_some() || args.sight.is_some();
    let mut configs = if single {
        vec![ScaleConfig::new(
            args.shards.unwrap_or(scale::BASE_SHARDS),
            args.players.unwrap_or(scale::BASE_PLAYERS),
            args.sight.unwrap_or(scale::BASE_SIGHT),
        )]
    } else {
        ScaleConfig::standard()
    };
    for config in &mut configs {
        config.measure = Duration::from_secs(args.measure);
        config.seed = args.seed.unwrap_or(config.seed);
    }
    let mut reports = Vec::new();
    for config in &configs {
        let report = scale::run(config);
        eprintln!(
            "{} shards, {} players, sight {}: {:.1} s, {} moves, {} answered, {} placed, {} passes at most",
            config.shards,
            config.players,
            config.view_range,
            report.wall.as_secs_f64(),
            report.moves_sent,
            report.move_answers,
            report.placed,
            report.passes_max
        );
        reports.push(report);
    }
    println!("{}", scale::markdown(&reports));
    // By kind, for the run with the most shards (the base players and sight, if run).
    let widest = reports.iter().max_by_key(|r| {
        let c = &r.config;
        (c.players == scale::BASE_PLAYERS && c.view_range == scale::BASE_SIGHT, c.shards)
    });
    if let Some(report) = widest {
        let c = &report.config;
        println!(
            "By kind, {} shards, {} players, sight {}:\n\n{}",
            c.shards,
            c.players,
            c.view_range,
            scale::kinds_markdown(report)
        );
    }
    if let Some(path) = &args.svg {
        if let Err(error) = std::fs::write(path, scale::svg(&reports)) {
            eprintln!("cannot write {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
