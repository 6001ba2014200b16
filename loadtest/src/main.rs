//! `loadtest`: Meridian's stress-test client, the source paper's "Stress Test Client"
//! grown up (DESIGN.md section 5).
//!
//! It connects bots to a gateway at a fixed rate (one per millisecond by default) up to
//! `--bots`, logs each one in, and makes each move one cell in a random direction every
//! `--move-interval` on an open-loop schedule. It measures the delay from sending a move to
//! receiving that bot's own `Moved` echo, counts notifications, errors by code, disconnects
//! and lost moves, prints one progress line per second to stderr, and prints a JSON
//! summary to stdout, or with `--json PATH` to that file (and its gist to stdout).
//!
//! With `--ramp` it adds bots step by step and reports the largest number whose p99 stays
//! under `--max-p99`; with `--html` it also writes a self-contained report with plots.
//!
//! Modules: `cli` (command line and validated config), `bot` (one bot's connection and
//! schedule), `quic` and `ws` (the two transports besides TCP), `histogram` (the delay histogram), `stats` (counters, progress, summary),
//! `ramp` (the ramp's step decisions); the HTML report is the library's `report` module,
//! shared with `loadtest-report`, which combines several runs into one page.

mod bot;
mod cli;
mod histogram;
mod quic;
mod ramp;
mod sight;
mod stats;
mod ws;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tracing::warn;
use tracing_subscriber::EnvFilter;

use crate::bot::{Carrier, Plan};
use crate::cli::{Cli, Config, Transport};
use crate::quic::QuicClients;
use crate::ramp::{Ramp, RampConfig, RampSummary, StepMeasure};
use crate::stats::{Finished, Reporter, Stats, Summary};

/// File descriptors kept for everything that is not a bot socket.
const SPARE_FDS: u64 = 64;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match Config::from_cli(Cli::parse()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("loadtest: {error:#}");
            return ExitCode::from(2);
        }
    };
    match run_and_report(&config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the cause chain on one line, without a backtrace.
            eprintln!("loadtest: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the test and prints (and writes) its JSON summary, and its HTML report if asked.
async fn run_and_report(config: &Config) -> anyhow::Result<()> {
    let summary = run(config).await?;
    let json = serde_json::to_string_pretty(&summary).context("serializing the summary")?;
    // With `--json PATH` the summary (a thousand lines with its per-second figures) goes
    // to the file and stdout gets its gist; without, stdout is the summary.
    match &config.json {
        Some(path) => {
            std::fs::write(path, format!("{json}\n"))
                .with_context(|| format!("writing the summary to {}", path.display()))?;
            println!("{}", gist(&summary, path));
        }
        None => println!("{json}"),
    }
    if let Some(path) = &config.html {
        let value: serde_json::Value = serde_json::from_str(&json)?;
        let run = loadtest::report::Run::from_summary(&config.label, &value)?;
        let report = loadtest::report::Report {
            title: format!("loadtest: {} ({} bots)", config.label, config.bots),
            notes: vec![format!("target {}", config.addr)],
            sections: vec![loadtest::report::Section {
                name: config.label.clone(),
                runs: vec![run],
            }],
            tables: Vec::new(),
        };
        std::fs::write(path, report.to_html()?)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}

/// The three lines a person reads after a run whose summary went to `path` (README and
/// the tests hold it to three).
fn gist(summary: &Summary, path: &std::path::Path) -> String {
    let ms = |value: Option<f64>| value.map_or("-".to_string(), |ms| format!("{ms:.1}"));
    let delay = &summary.delay_ms;
    format!(
        "loadtest {label}: {connected} of {target} bots connected; moves: {sent} sent, {acked} \
         acked, {lost} lost, {errored} errored; {disconnects} disconnects\n  \
         delay ms: p50 {p50}  p99 {p99}  max {max}; longest ack gap per bot ms: p50 {gap50}  \
         p99 {gap99}  max {gapmax}\n  \
         the whole summary: {path}",
        label = summary.label,
        connected = summary.bots_connected,
        target = summary.bots_target,
        sent = summary.moves_sent,
        acked = summary.moves_acked,
        lost = summary.moves_lost,
        errored = summary.moves_errored,
        disconnects = summary.disconnects,
        p50 = ms(delay.p50),
        p99 = ms(delay.p99),
        max = ms(delay.max),
        gap50 = ms(summary.ack_gap_ms.p50),
        gap99 = ms(summary.ack_gap_ms.p99),
        gapmax = ms(summary.ack_gap_ms.max),
        path = path.display(),
    )
}

/// Runs the whole test; fails only when the target cannot be reached at all.
async fn run(config: &Config) -> anyhow::Result<Summary> {
    let target = resolve(&config.addr, config.source_ips).await?;
    let mut resume_targets = Vec::with_capacity(config.resume_addr.len());
    for addr in &config.resume_addr {
        resume_targets.push(resolve(addr, config.source_ips).await?);
    }
    raise_fd_limit(u64::from(config.bots) + SPARE_FDS);

    let carrier = match &config.transport {
        Transport::Tcp => Carrier::Tcp,
        Transport::WebSocket => Carrier::WebSocket,
        Transport::Quic { trust, server_name } => {
            let source_ips = config.source_ips;
            let any: std::net::IpAddr = if target.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            let source_ip = move |i: u32| bot::source_ip(source_ips, i).unwrap_or(any);
            let bots = config.bots;
            Carrier::Quic(QuicClients::new(
                trust,
                server_name.clone(),
                bots,
                source_ip,
                source_ips,
            )?)
        }
    };
    let started = Instant::now();
    let plan = Arc::new(Plan {
        target,
        resume_targets,
        carrier,
        source_ips: config.source_ips,
        name_prefix: config.name_prefix.clone(),
        spawn_area: config.spawn_area,
        battle: config.battle,
        disperse: config.disperse,
        border_x: config.border_x.clone(),
        border_y: config.border_y.clone(),
        move_interval: config.move_interval,
        action_interval: config.action_interval,
        seed: config.seed,
        started,
        sending_ends_us: AtomicU64::new(config.duration.as_micros() as u64),
        drain: config.drain,
    });
    let stats = Arc::new(Stats::default());

    // The first bot connects here, so an unreachable address fails at once and clearly
    // instead of producing a run full of connect failures.
    let first = bot::connect(&plan, 0)
        .await
        .with_context(|| format!("cannot connect to --addr {} ({target})", config.addr))?;

    let (stop_reporter, stopped) = tokio::sync::oneshot::channel::<()>();
    let reporter = Reporter::new(started, config.bots)
        .with_actions(config.action_interval.is_some())
        .with_warmup(config.warmup);
    let reporter = tokio::spawn(report_every_second(Arc::clone(&stats), reporter, stopped));

    let mut bots = JoinSet::new();
    bots.spawn(bot::run(Arc::clone(&plan), Arc::clone(&stats), 0, Some(first)));
    let ramp = match &config.ramp {
        None => {
            let first_due = started + config.connect_interval;
            spawn_bots(&plan, &stats, &mut bots, 1..config.bots, first_due, config).await;
            None
        }
        Some(ramp) => Some(run_ramp(&plan, &stats, &mut bots, ramp.clone(), config).await),
    };
    while let Some(done) = bots.join_next().await {
        report_panic(done);
    }
    let elapsed = started.elapsed();

    // The reporter only stops when told to; if it is gone, it panicked.
    let _ = stop_reporter.send(());
    let finished = reporter.await.context("the progress reporter panicked")?;
    let summary = Summary::build(config, &stats, finished, elapsed, ramp);
    if let Some(actions) = &summary.actions {
        let ms = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.2}"));
        eprintln!(
            "actions: {} sent, {} done, {} rejected, {} other errors, {} lost, {} unmatched; \
             delay p50 {} p99 {} ms",
            actions.sent,
            actions.answered,
            actions.rejected,
            actions.errored,
            actions.lost,
            actions.unmatched,
            ms(actions.delay_ms.p50),
            ms(actions.delay_ms.p99),
        );
    }
    Ok(summary)
}

/// Starts bots `indices`, one per `--connect-interval` from `first_due`, on an absolute
/// schedule (a slow connect does not push the next one back); stops early if sending ends.
async fn spawn_bots(
    plan: &Arc<Plan>,
    stats: &Arc<Stats>,
    bots: &mut JoinSet<()>,
    indices: std::ops::Range<u32>,
    first_due: Instant,
    config: &Config,
) {
    for index in indices.clone() {
        let due = config
            .connect_interval
            .checked_mul(index - indices.start)
            .and_then(|d| first_due.checked_add(d));
        let Some(at) = due.filter(|&at| at < plan.sending_ends()) else {
            warn!(
                started = index,
                target = indices.end,
                "sending ended before every bot connected"
            );
            break;
        };
        sleep_until(at).await;
        bots.spawn(bot::run(Arc::clone(plan), Arc::clone(stats), index, None));
        // Reap finished bots as we go so the set holds only live ones.
        while let Some(done) = bots.try_join_next() {
            report_panic(done);
        }
    }
}

/// The counters a ramp step differentiates.
#[derive(Debug, Clone, Copy)]
struct StepCounters {
    sent: u64,
    acked: u64,
    notifications: u64,
    failures: u64,
}

impl StepCounters {
    fn read(stats: &Stats) -> StepCounters {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StepCounters {
            sent: load(&stats.moves_sent),
            acked: load(&stats.moves_acked),
            notifications: load(&stats.notifications),
            failures: load(&stats.connect_failures)
                + load(&stats.login_failures)
                + load(&stats.disconnects)
                + stats.failure_errors(),
        }
    }
}

/// Ramp mode: grows the bot count step by step, measures each step's window, and ends
/// sending when the ramp is over. Bots keep their open-loop schedules throughout; the
/// ramp only adds bots and reads counters.
async fn run_ramp(
    plan: &Arc<Plan>,
    stats: &Arc<Stats>,
    bots: &mut JoinSet<()>,
    ramp_config: RampConfig,
    config: &Config,
) -> RampSummary {
    let step_duration = ramp_config.step_duration;
    // New bots log in and send their first move within one move interval; the window
    // starts after that so every bot of the step is measured for the whole window.
    let settle = config.move_interval.min(Duration::from_secs(2));
    let mut ramp = Ramp::new(ramp_config);
    let mut spawned = 1u32;
    let mut out_of_time = false;
    while let Some(target) = ramp.next_target() {
        if spawned < target {
            let first_due = Instant::now();
            spawn_bots(plan, stats, bots, spawned..target, first_due, config).await;
            spawned = target;
        }
        let window_starts = Instant::now() + settle;
        let window_ends = window_starts + step_duration;
        if window_ends > plan.sending_ends() {
            out_of_time = true;
            break;
        }
        sleep_until(window_starts).await;
        stats.step_delays.sweep();
        let before = StepCounters::read(stats);
        sleep_until(window_ends).await;
        let delays = stats.step_delays.sweep();
        let after = StepCounters::read(stats);
        let result = ramp.record(StepMeasure {
            bots_target: target,
            bots_online: stats.bots_online.load(Ordering::Relaxed),
            sent: after.sent - before.sent,
            acked: after.acked - before.acked,
            failures: after.failures - before.failures,
            p50_ms: delays.quantile(0.5).map(|us| us / 1e3),
            p99_ms: delays.quantile(0.99).map(|us| us / 1e3),
            notifications_per_s: (after.notifications - before.notifications) as f64
                / step_duration.as_secs_f64(),
        });
        eprintln!(
            "ramp: {} bots: p50 {} p99 {} ms, {} / {} acked: {}",
            result.measure.bots_target,
            result.measure.p50_ms.map_or("-".to_owned(), |v| format!("{v:.2}")),
            result.measure.p99_ms.map_or("-".to_owned(), |v| format!("{v:.2}")),
            result.measure.acked,
            result.measure.sent,
            if result.passed { "pass".to_owned() } else { result.reasons.join("; ") },
        );
    }
    plan.stop_sending_at(Instant::now());
    let summary = ramp.summary(out_of_time);
    eprintln!(
        "ramp: largest passing step {} bots ({})",
        summary.largest_passing.map_or("none".to_owned(), |n| n.to_string()),
        summary.stopped_because
    );
    summary
}

fn report_panic(done: Result<(), tokio::task::JoinError>) {
    if let Err(error) = done {
        warn!(%error, "a bot task panicked");
    }
}

/// Prints a progress line every second, and once more for the last partial second.
async fn report_every_second(
    stats: Arc<Stats>,
    mut reporter: Reporter,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Finished {
    let started = reporter.started();
    let second = Duration::from_secs(1);
    let mut ticker = tokio::time::interval_at(started + second, second);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => reporter.tick(&stats, Instant::now()),
            _ = &mut stop => break,
        }
    }
    reporter.finish(&stats, Instant::now())
}

/// Resolves `--addr`, preferring IPv4 (servers commonly bind 0.0.0.0 or 127.0.0.1).
async fn resolve(addr: &str, source_ips: u32) -> anyhow::Result<SocketAddr> {
    let candidates: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("cannot resolve --addr {addr}"))?
        .collect();
    let Some(target) = candidates.iter().find(|a| a.is_ipv4()).or(candidates.first()).copied()
    else {
        bail!("--addr {addr} resolves to no address");
    };
    let loopback_v4 = matches!(target, SocketAddr::V4(v4) if v4.ip().is_loopback());
    if source_ips > 1 && !loopback_v4 {
        bail!(
            "--source-ips {source_ips} binds bots to 127.0.0.x, which can only reach an IPv4 \
             loopback --addr; {addr} is {target}"
        );
    }
    Ok(target)
}

/// Raises the open-file soft limit towards `needed` (up to the hard limit), so thousands
/// of bots do not fail with "too many open files"; warns if that is not enough.
fn raise_fd_limit(needed: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur >= needed {
        return;
    }
    let wanted = libc::rlimit { rlim_cur: needed.min(limit.rlim_max), rlim_max: limit.rlim_max };
    // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
    let raised = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0;
    let have = if raised { wanted.rlim_cur } else { limit.rlim_cur };
    if have < needed {
        warn!(have, needed, "open-file limit too low: bots beyond it will fail to connect");
    }
}
