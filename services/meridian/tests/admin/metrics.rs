//! `/metrics` of the gateway and of each shard: strict Prometheus text (see
//! `meridian_testkit::Exposition`), every family issue 6 lists, each with HELP and TYPE,
//! counters named `_total`; then under load (bots logging in on both sides of the border,
//! walking, one crossing it, a move before login and a malformed frame) the counters move
//! by at least what the load implies, no counter goes down, and the epoch gauges agree.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{Direction, ErrorCode};
use meridian_testkit::{
    deadline, http_get, msg, wait_for_expected_partition, wait_ready, wait_until, Bot, Cluster,
    Exposition,
};

use crate::{admin_ports, two_shards, with_cluster};

const BOTS: usize = 6;
const MOVES_EACH: usize = 5;

/// Families every gateway must serve.
const GATEWAY_FAMILIES: &[&str] = &[
    "meridian_gateway_connections",
    "meridian_gateway_accepted_total",
    "meridian_gateway_logins_total",
    "meridian_gateway_frames_in_total",
    "meridian_gateway_bytes_in_total",
    "meridian_gateway_bytes_out_total",
    "meridian_gateway_errors_total",
    "meridian_gateway_move_delay_seconds",
    "meridian_gateway_partition_epoch",
    "meridian_gateway_etcd_registered",
    "meridian_gateway_io_backend_info",
];

/// Families every shard must serve.
const SHARD_FAMILIES: &[&str] = &[
    "meridian_shard_players",
    "meridian_shard_logins_total",
    "meridian_shard_moves_total",
    "meridian_shard_notifications_total",
    "meridian_shard_delivery_bytes_total",
    "meridian_shard_handoffs_in_total",
    "meridian_shard_handoffs_out_total",
    "meridian_shard_ghosts",
    "meridian_shard_partition_epoch",
    "meridian_shard_etcd_registered",
    "meridian_shard_errors_total",
];

/// GETs and strictly parses a node's `/metrics`.
fn scrape(admin: SocketAddr) -> anyhow::Result<Exposition> {
    let (code, body) = http_get(admin, "/metrics")?;
    ensure!(code == 200, "GET /metrics on {admin} answered {code}");
    Exposition::parse(&body).with_context(|| format!("/metrics of {admin} is not valid"))
}

/// Every listed family is there, every family has HELP and a TYPE, counters end in
/// `_total`.
fn check_families(node: &str, metrics: &Exposition, wanted: &[&str]) -> anyhow::Result<()> {
    for name in wanted {
        ensure!(metrics.family(name).is_some(), "{node}: no metric family {name}");
    }
    for (name, family) in &metrics.families {
        ensure!(family.help.is_some(), "{node}: {name} has no HELP");
        ensure!(family.kind != "untyped", "{node}: {name} has no TYPE");
        ensure!(
            family.kind != "counter" || name.ends_with("_total"),
            "{node}: counter {name} is not named _total"
        );
    }
    Ok(())
}

/// Every counter series (counters, histogram buckets, counts and sums) by name and labels.
fn counters(metrics: &Exposition) -> BTreeMap<String, f64> {
    metrics
        .families
        .values()
        .filter(|f| f.kind == "counter" || f.kind == "histogram")
        .flat_map(|f| &f.samples)
        .map(|s| (format!("{}{:?}", s.name, s.labels), s.value))
        .collect()
}

/// The errors with `code` a node counts in its errors family `family`.
fn errors_with(metrics: &Exposition, family: &str, code: ErrorCode) -> f64 {
    metrics
        .family(family)
        .into_iter()
        .flat_map(|f| &f.samples)
        .filter(|s| s.labels.get("code").map(String::as_str) == Some(code.as_str_name()))
        .map(|s| s.value)
        .sum()
}

fn total(metrics: &Exposition, sample: &str) -> f64 {
    metrics.total(sample).unwrap_or(0.0)
}

/// Sums a sample over the shards' scrapes.
fn shards_total(shards: &[Exposition], sample: &str) -> f64 {
    shards.iter().map(|m| total(m, sample)).sum()
}

fn scrape_all(cluster: &Cluster) -> anyhow::Result<(Exposition, Vec<Exposition>)> {
    let gateway = scrape(cluster.gateway(0).admin).context("gateway")?;
    let shards = cluster
        .shards()
        .iter()
        .map(|s| scrape(s.admin).with_context(|| format!("shard {}", s.id)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((gateway, shards))
}

/// Bots on both sides of the border x = 200 (in sight of each other), each walking; the
/// first crosses the border and so is handed off.
fn play(cluster: &Cluster) -> anyhow::Result<Vec<Bot>> {
    let game = cluster.game_addr(0);
    let mut bots = Vec::new();
    for i in 0..BOTS {
        let mut bot = Bot::connect(game)?;
        let x = if i % 2 == 0 { 198 } else { 202 };
        bot.login(&format!("metrics{i}"), Some((x, 100 + 3 * i as u32)))?;
        bots.push(bot);
    }
    for step in 0..MOVES_EACH {
        for (i, bot) in bots.iter_mut().enumerate() {
            let direction = match (i, step % 2) {
                (0, _) => Direction::Right,
                (_, 0) => Direction::Down,
                _ => Direction::Up,
            };
            bot.move_ok(direction, 1 + (i * MOVES_EACH + step) as u64)?;
        }
    }
    // A move with no direction, refused by the shard (INVALID_ARGUMENT); a move before login
    // (NOT_LOGGED_IN, connection kept) and a frame that is no protobuf (MALFORMED, connection
    // closed), refused by the gateway.
    let client_time = 1_000;
    bots[1].send(&msg::move_raw(0, client_time))?;
    let answer = bots[1].recv_answer(deadline(Duration::from_secs(5)), client_time)?;
    ensure!(answer.error()? == ErrorCode::InvalidArgument, "a move without direction: {answer:?}");
    let mut early = Bot::connect(game)?;
    let answer = early.move_(Direction::Up, 77)?;
    ensure!(answer.error()? == ErrorCode::NotLoggedIn, "a move before login: {answer:?}");
    let mut garbage = Bot::connect(game)?;
    garbage.send_raw(&msg::raw_frame(&[0xff, 0xff, 0xff]))?;
    Ok(bots)
}

pub fn metrics_are_strict_prometheus_and_move_under_load() {
    with_cluster("metrics under load", two_shards(), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(15))?;
        // Logins need the gateway's streams to the shards: wait until it says it can route.
        wait_ready(&admin_ports(cluster), Duration::from_secs(15))?;
        let (gateway, shards) = scrape_all(cluster)?;
        check_families("gateway 1", &gateway, GATEWAY_FAMILIES)?;
        for (shard, metrics) in cluster.shards().iter().zip(&shards) {
            check_families(&format!("shard {}", shard.id), metrics, SHARD_FAMILIES)?;
        }
        let io = gateway.family("meridian_gateway_io_backend_info").context("io backend")?;
        ensure!(
            io.samples
                .iter()
                .any(|s| s.labels.get("io").is_some_and(|io| io == "uring" || io == "epoll")),
            "the io backend family names no backend: {io:?}"
        );
        // Every error code has its series from the start, on every node.
        let families = std::iter::once((&gateway, "meridian_gateway_errors_total"))
            .chain(shards.iter().map(|m| (m, "meridian_shard_errors_total")));
        for (metrics, name) in families {
            let family = metrics.family(name).with_context(|| format!("no {name}"))?;
            let codes: Vec<&str> = family
                .samples
                .iter()
                .filter_map(|s| s.labels.get("code"))
                .map(String::as_str)
                .collect();
            for code in meridian_protocol::error_codes() {
                ensure!(codes.contains(&code.as_str_name()), "no {name} series for {code:?}");
            }
        }

        let bots = play(cluster)?;
        let moves = (BOTS * MOVES_EACH) as f64;
        let mut last = String::new();
        let mut after = None;
        // Shards publish what they did asynchronously: poll until the load shows.
        wait_until(deadline(Duration::from_secs(10)), "the counters to show the load", || {
            let Ok((g, s)) = scrape_all(cluster) else { return false };
            let gw = |name: &str| total(&g, name) - total(&gateway, name);
            let sh = |name: &str| shards_total(&s, name) - shards_total(&shards, name);
            let family = "meridian_gateway_errors_total";
            let error = |code| errors_with(&g, family, code) - errors_with(&gateway, family, code);
            let family = "meridian_shard_errors_total";
            let shard_errors = |code| {
                let now: f64 = s.iter().map(|m| errors_with(m, family, code)).sum();
                now - shards.iter().map(|m| errors_with(m, family, code)).sum::<f64>()
            };
            let n = BOTS as f64;
            let checks = [
                ("gateway logins", gw("meridian_gateway_logins_total"), n),
                ("gateway frames in", gw("meridian_gateway_frames_in_total"), n + moves),
                ("gateway bytes in", gw("meridian_gateway_bytes_in_total"), 1.0),
                ("gateway bytes out", gw("meridian_gateway_bytes_out_total"), 1.0),
                ("gateway move delays", gw("meridian_gateway_move_delay_seconds_count"), moves),
                ("MALFORMED errors", error(ErrorCode::Malformed), 1.0),
                ("NOT_LOGGED_IN errors", error(ErrorCode::NotLoggedIn), 1.0),
                ("shard INVALID_ARGUMENT errors", shard_errors(ErrorCode::InvalidArgument), 1.0),
                ("gateway connections", total(&g, "meridian_gateway_connections"), n),
                ("shard logins", sh("meridian_shard_logins_total"), n),
                ("shard moves", sh("meridian_shard_moves_total"), moves),
                ("shard notifications", sh("meridian_shard_notifications_total"), moves),
                ("shard delivery bytes", sh("meridian_shard_delivery_bytes_total"), 1.0),
                ("handoffs out", sh("meridian_shard_handoffs_out_total"), 1.0),
                ("handoffs in", sh("meridian_shard_handoffs_in_total"), 1.0),
                ("ghosts", shards_total(&s, "meridian_shard_ghosts"), 1.0),
                ("players", shards_total(&s, "meridian_shard_players"), n),
            ];
            let short: Vec<String> = checks
                .iter()
                .filter(|(_, got, want)| got < want)
                .map(|(what, got, want)| format!("{what}: {got} < {want}"))
                .collect();
            last = short.join("; ");
            let done = short.is_empty();
            after = Some((g, s));
            done
        })
        .with_context(|| format!("still short: {last}"))?;
        let (g, s) = after.context("set in the wait")?;

        // No counter went down, on any node.
        for (node, before, now) in std::iter::once(("gateway", &gateway, &g))
            .chain(shards.iter().zip(&s).map(|(b, n)| ("shard", b, n)))
        {
            let now = counters(now);
            for (series, value) in counters(before) {
                match now.get(&series) {
                    Some(v) if *v >= value => {}
                    Some(v) => bail!("{node}: {series} went down from {value} to {v}"),
                    None => bail!("{node}: {series} disappeared"),
                }
            }
        }
        // Everyone routes by the partition published.
        let epoch = partition.epoch as f64;
        ensure!(total(&g, "meridian_gateway_partition_epoch") >= epoch, "gateway epoch behind");
        for m in &s {
            ensure!(
                total(m, "meridian_shard_partition_epoch") >= epoch,
                "a shard's epoch is behind"
            );
        }
        let delay_sum = total(&g, "meridian_gateway_move_delay_seconds_sum");
        let delay_count = total(&g, "meridian_gateway_move_delay_seconds_count");
        println!(
            "metrics under load: {BOTS} bots, {} moves; mean move delay through the gateway \
             {:.2} ms; {} notifications",
            moves,
            1000.0 * delay_sum / delay_count.max(1.0),
            shards_total(&s, "meridian_shard_notifications_total")
        );
        drop(bots);
        Ok(())
    });
}
