//! `bare-client`: a second, minimal load client for Meridian, written apart from
//! `loadtest` so that a benchmark can be run with two clients and a result that depends
//! on the client shows up as such (issue 17).
//!
//! It does what `loadtest`'s default run does, open loop: connects `--bots` bots (one per
//! `--connect-interval`), logs each in with a spawn cell drawn uniformly from
//! `--spawn-area` (dev-mode servers honour it), moves each one cell every
//! `--move-interval` from a random phase whatever comes back, counts moves sent, own
//! `Moved` acks and every other message, measures each move's delay to its ack, counts the
//! moves never answered by the end of `--drain` as lost, logs out, and prints a JSON
//! summary with `loadtest`'s keys (and writes it to `--json`).
//!
//! How it differs, on purpose: one thread and one level-triggered epoll set for every
//! socket instead of a tokio runtime with a task (and a reader and a writer future) per
//! bot; one `read` of up to 64 KiB per readiness event instead of reads of 4 KiB until
//! `EAGAIN`; a hand-written protobuf reader that looks only at a message's kind and the
//! fields it matches answers by, instead of decoding every notification; exact delays
//! instead of a histogram; and each move goes out the first time the loop sees it due
//! (the loop runs whenever a socket has something), where tokio's timer wheel releases
//! moves on 1 ms ticks (`--send-tick 1ms` does that too). It also reports its own system
//! calls and context switches (`client_io`, `client_usage`), which is what the relay
//! comparison's explanation needs.
//!
//! Modules: `wire` (the bytes of the protocol), `tally` (answers, counts, the summary's
//! figures), `net` (epoll, non-blocking connect, rlimit, rusage), `run` (the loop).

mod net;
mod run;
mod tally;
mod wire;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use serde::Serialize;

use crate::run::{Client, IoCounts, Plan};
use crate::tally::Figures;

/// File descriptors kept for everything that is not a bot's socket.
const SPARE_FDS: u64 = 32;
/// The longest any duration flag may be.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Login names are at most this many bytes (proto/client.proto).
const MAX_NAME_BYTES: usize = 32;

/// A minimal open-loop load client: one thread, one epoll set, one read per readiness.
#[derive(Debug, Parser)]
#[command(name = "bare-client", version)]
struct Cli {
    /// Gateway (or proxy) address, HOST:PORT; must resolve to IPv4.
    #[arg(long)]
    addr: String,
    /// Number of bots.
    #[arg(long)]
    bots: u32,
    /// How long moves are sent, from the moment the first bot connects.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    duration: Duration,
    /// Interval between two moves of one bot.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    move_interval: Duration,
    /// Interval between two bots' connects.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    connect_interval: Duration,
    /// After --duration, how long to wait for the last acks before counting moves lost.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    drain: Duration,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The run's name in reports.
    #[arg(long, default_value = "bare")]
    label: String,
    /// Seed of every random choice (spawn cells, move phases, directions).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Spawn cells are drawn from this inclusive rectangle X0,Y0,X1,Y1 (the default map is
    /// 400x400).
    #[arg(long, default_value = "0,0,399,399", value_parser = parse_area)]
    spawn_area: (u32, u32, u32, u32),
    /// Bot names are PREFIX-<index>.
    #[arg(long, default_value = "bare")]
    name_prefix: String,
    /// Hold each move until the next multiple of this since the start and send every move
    /// due by then together (`1ms`: as a timer wheel of 1 ms resolution, such as tokio's,
    /// would). 0: send each move the first time the loop sees it due.
    #[arg(long, default_value = "0us", value_parser = parse_duration)]
    send_tick: Duration,
}

/// `250us`, `250ms`, `15s`, `2m`: a whole number and a unit.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| format!("{text:?}: expected e.g. 250ms"))?;
    let micros = match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        _ => return Err(format!("{text:?}: the unit must be us, ms, s or m")),
    };
    number
        .checked_mul(micros)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("{text:?} is too long"))
}

fn parse_area(text: &str) -> Result<(u32, u32, u32, u32), String> {
    let cells: Result<Vec<u32>, _> = text.split(',').map(|c| c.trim().parse::<u32>()).collect();
    match cells.map_err(|e| format!("{text:?}: {e}"))?.as_slice() {
        &[x0, y0, x1, y1] if x0 <= x1 && y0 <= y1 => Ok((x0, y0, x1, y1)),
        _ => Err(format!("{text:?}: expected X0,Y0,X1,Y1 with X0 <= X1 and Y0 <= Y1")),
    }
}

/// Checks the command line as a whole; every problem is listed.
fn check(cli: &Cli) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    if cli.bots == 0 {
        problems.push("--bots must be at least 1".to_owned());
    }
    for (flag, value, may_be_zero) in [
        ("--duration", cli.duration, false),
        ("--move-interval", cli.move_interval, false),
        ("--connect-interval", cli.connect_interval, true),
        ("--drain", cli.drain, true),
        ("--send-tick", cli.send_tick, true),
    ] {
        if (value.is_zero() && !may_be_zero) || value > MAX_DURATION {
            problems.push(format!("{flag} must be between 1us and 24h, got {value:?}"));
        }
    }
    let longest = format!("{}-{}", cli.name_prefix, cli.bots.saturating_sub(1));
    if cli.name_prefix.is_empty() || longest.len() > MAX_NAME_BYTES {
        problems.push(format!("--name-prefix: names such as {longest:?} must be 1..=32 bytes"));
    }
    if !problems.is_empty() {
        bail!("invalid command line:\n  - {}", problems.join("\n  - "));
    }
    Ok(())
}

/// The summary: `loadtest`'s keys, then this client's own counts.
#[derive(Debug, Serialize)]
struct Summary {
    label: String,
    client: &'static str,
    bots_target: u32,
    bots_connected: u64,
    duration_s: f64,
    move_interval_ms: f64,
    moves_sent: u64,
    moves_acked: u64,
    moves_lost: u64,
    moves_errored: u64,
    notifications: u64,
    notifications_per_s: f64,
    #[serde(flatten)]
    figures: Figures,
    disconnects: u64,
    login_failures: u64,
    connect_failures: u64,
    acks_unmatched: u64,
    view_resets: u64,
    elapsed_s: f64,
    seed: u64,
    send_tick_ms: f64,
    read_buffer_bytes: usize,
    client_io: IoCounts,
    client_usage: net::Usage,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(error) = check(&cli) {
        eprintln!("bare-client: {error:#}");
        return ExitCode::from(2);
    }
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bare-client: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let target = cli
        .addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve --addr {}", cli.addr))?
        .find(SocketAddr::is_ipv4)
        .with_context(|| format!("--addr {} has no IPv4 address", cli.addr))?;
    let limit = net::raise_fd_limit(u64::from(cli.bots) + SPARE_FDS);
    if limit < u64::from(cli.bots) + SPARE_FDS {
        eprintln!("bare-client: the open-file limit {limit} is too low for {} bots", cli.bots);
    }
    let started = Instant::now();
    let sending_ends = started + cli.duration;
    let plan = Plan {
        target,
        bots: cli.bots,
        started,
        connect_interval: cli.connect_interval,
        move_interval: cli.move_interval,
        sending_ends,
        drain_ends: sending_ends + cli.drain,
        spawn_area: cli.spawn_area,
        name_prefix: cli.name_prefix.clone(),
        seed: cli.seed,
        send_tick: cli.send_tick,
    };
    let (tally, io) = Client::new(plan).context("creating the epoll set")?.run()?;
    let elapsed = started.elapsed();
    let duration_s = cli.duration.as_secs_f64();
    let summary = Summary {
        label: cli.label.clone(),
        client: "bare-client",
        bots_target: cli.bots,
        bots_connected: tally.bots_connected,
        duration_s,
        move_interval_ms: cli.move_interval.as_secs_f64() * 1e3,
        moves_sent: tally.moves_sent,
        moves_acked: tally.moves_acked,
        moves_lost: tally.moves_lost,
        moves_errored: tally.moves_errored,
        notifications: tally.notifications,
        notifications_per_s: (tally.notifications as f64 / duration_s * 1e3).round() / 1e3,
        figures: tally.figures(),
        disconnects: tally.disconnects,
        login_failures: tally.login_failures,
        connect_failures: tally.connect_failures,
        acks_unmatched: tally.acks_unmatched,
        view_resets: tally.view_resets,
        elapsed_s: (elapsed.as_secs_f64() * 1e3).round() / 1e3,
        seed: cli.seed,
        send_tick_ms: cli.send_tick.as_secs_f64() * 1e3,
        read_buffer_bytes: run::READ_BUFFER,
        client_io: io,
        client_usage: net::usage(),
    };
    let json = serde_json::to_string_pretty(&summary).context("serializing the summary")?;
    println!("{json}");
    if let Some(path) = &cli.json {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    if tally.bots_connected == 0 {
        bail!("no bot logged in to {} ({target})", cli.addr);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_areas_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("40us"), Ok(Duration::from_micros(40)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "ms", "10", "1.5s", "-1s", "3d", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_area("0, 0,399,399"), Ok((0, 0, 399, 399)));
        for bad in ["1,2,3", "5,0,4,0", "a,b,c,d"] {
            assert!(parse_area(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_command_line_lists_every_problem() {
        let cli = Cli::try_parse_from([
            "bare-client",
            "--addr",
            "127.0.0.1:1",
            "--bots",
            "0",
            "--move-interval",
            "0ms",
            "--name-prefix",
            "a-name-prefix-that-is-far-too-long",
        ])
        .unwrap();
        let message = check(&cli).unwrap_err().to_string();
        for flag in ["--bots", "--move-interval", "--name-prefix"] {
            assert!(message.contains(flag), "{flag} missing from {message}");
        }
    }
}
