//! `meridian-sim`: runs the deterministic cluster simulator.
//!
//! `meridian-sim --seed S` replays one seed (its settings are drawn from the seed, as in
//! the sweep); `meridian-sim --seeds N` runs seeds `--first`..`--first + N` and stops at
//! the first violation, printing its seed, what broke, and the messages that led to it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
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
    /// How many of the last trace lines a violation prints.
    #[arg(long, default_value_t = 120)]
    trace_lines: usize,
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
    meridian_sim::TRACE_LINES.store(args.trace_lines, std::sync::atomic::Ordering::Relaxed);
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
        let settings = Settings::swarm(seed);
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
