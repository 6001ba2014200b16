//! The operator's side of a running cluster (issue 6): the admin endpoints and the live map.
//!
//! - `readyz`: `/readyz` of every shard and gateway stays 200 (they can serve players) when
//!   etcd is gone and their registration with it (the etcd status metric at 0), as
//!   `/healthz`; they re-register when etcd returns.
//! - `metrics`: `/metrics` of a gateway and of each shard is strict Prometheus text, has
//!   every family issue 6 asks for, and its counters move under load (logins, moves,
//!   notifications, bytes, frames, errors by code, handoffs, the move delay histogram).
//! - `map`: the gateway's `/map` in headless Chromium (Debian's `chromium`): a one-shot
//!   screenshot shows every region in its shard's colour and the players as darker
//!   squares, the dumped DOM names the epoch and the shards; then a page kept open over
//!   the DevTools protocol follows a scale-out (shard 3 joins) and a drain live: new epoch,
//!   borders moved on the canvas, and the epoch history of the same page lists each change.
//!
//! - `process`: every node's `/metrics` has the process metrics (CPU, memory, descriptors)
//!   and `meridian_build_info`; info-style gauges are named `_info`.
//! - `play`: `/play` in Chromium: pages and a Python bot in one world; the wolves game played
//!   on the page (summon, attack, bites, death and respawn in words).
//! - `token`: `meridian token` mints a dev-key token that dev mode's key set accepts.
//! - `private`: with `--admin-token`, pages that name players need the token.
//!
//! Screenshots are kept in Cargo's target tmp dir (`target/tmp/admin-map-*.png`) for a look.

mod map;
mod metrics;
mod play;
mod player;
mod private;
mod process;
mod readyz;
mod token;

use std::net::SocketAddr;
use std::path::Path;

use meridian_testkit::{Cluster, ClusterOptions, Io, DEFAULT_LEASE_TTL};

/// The binary under test, built by Cargo for these tests.
fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}

/// The resume-token key of every cluster here, so a shard started later shares it.
const RESUME_KEY_HEX: &str = "ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51ad51";

/// Two shards and one gateway, with the resume key and lease TTL given explicitly.
fn two_shards() -> ClusterOptions {
    ClusterOptions::new(Io::Uring)
        .shards(2)
        .arg("--resume-key")
        .arg(RESUME_KEY_HEX)
        .arg("--lease-ttl")
        .arg(format!("{}s", DEFAULT_LEASE_TTL.as_secs()))
}

/// Every node's name and admin address.
fn admin_ports(cluster: &Cluster) -> Vec<(String, SocketAddr)> {
    let shards = cluster.shards().iter().map(|s| (format!("shard {}", s.id), s.admin));
    let gateways = cluster.gateways().iter().map(|g| (format!("gateway {}", g.id), g.admin));
    shards.chain(gateways).collect()
}

/// Starts a cluster, runs `scenario`, stops the cluster gracefully and returns what the
/// scenario returned, dropped only after the cluster (a restarted etcd must outlive the
/// nodes). A failure panics while the cluster is up, so its log is printed.
fn with_cluster<T>(
    what: &str,
    opts: ClusterOptions,
    scenario: impl FnOnce(&Cluster) -> anyhow::Result<T>,
) -> T {
    let started = std::time::Instant::now();
    let cluster = Cluster::start(meridian_bin(), opts).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let kept = scenario(&cluster).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    cluster.stop().unwrap_or_else(|e| panic!("{what}: stopping the cluster: {e:#}"));
    println!("{what}: ok in {:.1} s", started.elapsed().as_secs_f64());
    kept
}

#[test]
fn private_pages_need_the_admin_token() {
    private::private_pages_need_the_admin_token();
}

#[test]
fn process_and_build_metrics_on_every_node() {
    process::process_and_build_metrics_on_every_node();
}

#[test]
fn readyz_outlives_etcd() {
    readyz::readyz_outlives_etcd();
}

#[test]
fn metrics_are_strict_prometheus_and_move_under_load() {
    metrics::metrics_are_strict_prometheus_and_move_under_load();
}

#[test]
fn live_map_in_headless_chromium() {
    map::live_map_in_headless_chromium();
}

#[test]
fn two_pages_and_a_python_bot_play_in_one_world() {
    play::two_pages_and_a_python_bot_play_in_one_world();
}

#[test]
fn the_page_fights_wolves_and_says_what_happened() {
    play::the_page_fights_wolves_and_says_what_happened();
}

#[test]
fn the_live_map_draws_a_games_npcs_in_their_own_colour() {
    map::the_live_map_draws_a_games_npcs_in_their_own_colour();
}
