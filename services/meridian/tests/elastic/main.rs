//! Elasticity and failures (ARCHITECTURE.md, "Elasticity and failures"; issue 4): the cluster
//! changes under bots that keep playing, and no player notices more than the protocol says.
//!
//! - `scale`: 2 -> 3 -> 4 -> 3 -> 2 shards (shards joining with `meridian shard`, leaving
//!   with `meridian drain --wait`) under 80 walking bots: no disconnect, every move
//!   acknowledged, streams exact, views equal to the truth and ownership exact at rest.
//! - `shard_kill`: kill -9 a shard under 60 bots: each of its players gets `ViewReset`
//!   within the lease TTL + 2 s and plays on; every move answered (ack or `UNAVAILABLE`);
//!   nobody lost or duplicated.
//! - `shard_pause`: SIGSTOP a shard for 8 s (past its lease) under 60 bots and SIGCONT:
//!   its players are restored on the other shard, and the woken shard acts on none of
//!   them; every move answered, nobody lost, no player on two shards at rest.
//! - `etcd_outage`: etcd killed for 10 s under 60 bots and started again: nobody notices,
//!   every member comes back in `meridian status` and ready.
//! - `etcd_stall`: etcd frozen (SIGSTOP) for 30 s under 48 bots and continued: nobody
//!   notices, no move is refused, every node stays ready, every member is back on a lease;
//!   and a shard started while etcd is frozen waits for it and joins.
//! - `hotspot`: 120 bots crowd one quadrant of a 2x2 cluster: the borders move until the
//!   busiest shard carries at most 1.3x the mean, and stay there.
//!
//! Gateway death and resume are tested in `tests/e2e/failover.rs`.
//!
//! The bots are [`meridian_testkit::Walkers`]: one thread each, one move in flight, every
//! stream checked as it arrives. Seeded tests print their seed; `MERIDIAN_TEST_SEED=<seed>
//! cargo test -p meridian --test elastic` reruns them with it. All run on the io_uring
//! gateway (what is tested here does not depend on the gateway's I/O backend). Figures
//! (time and handoffs per scale step, kill-to-restore times, load ratios) are printed; run
//! with `--nocapture` to see them.

mod etcd_outage;
mod etcd_stall;
mod hotspot;
mod scale;
mod shard_kill;
mod shard_pause;
mod two_sides;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::ensure;
use meridian_testkit::{
    Area, Cluster, ClusterOptions, Io, Player, Rng, WalkerSpec, WalkerStatus, Walkers,
    DEFAULT_LEASE_TTL,
};

/// The binary under test, built by Cargo for these tests.
fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}

/// Sight as DESIGN.md fixes it by default.
const SIGHT: u32 = 20;

/// The resume-token key of every cluster here, so shards started later share it.
const RESUME_KEY_HEX: &str = "e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5e1a5";

/// How long views may take to converge once every walker has stopped.
const SETTLE_WITHIN: Duration = Duration::from_secs(5);

/// A cluster of `shards` shards and two gateways, with the fixed resume key and the
/// default lease TTL given explicitly (the tests' deadlines are computed from it).
fn options(io: Io, shards: usize) -> ClusterOptions {
    ClusterOptions::new(io)
        .shards(shards)
        .gateways(2)
        .arg("--resume-key")
        .arg(RESUME_KEY_HEX)
        .arg("--lease-ttl")
        .arg(format!("{}s", DEFAULT_LEASE_TTL.as_secs()))
}

/// Starts a cluster, runs `scenario` against it and stops it gracefully (SIGTERM, exit 0,
/// no node left); returns what the scenario returned, dropped only after the cluster has
/// stopped (a restarted etcd must outlive the nodes). A failure panics while the cluster is
/// still up, so its log is printed; `what` (with the seed) heads the failure message.
fn with_cluster<T>(
    what: &str,
    opts: ClusterOptions,
    scenario: impl FnOnce(&Cluster) -> anyhow::Result<T>,
) -> T {
    let cluster = Cluster::start(meridian_bin(), opts).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let kept = match scenario(&cluster) {
        Ok(kept) => kept,
        Err(e) => panic!("{what}: {e:?}"),
    };
    if let Err(e) = cluster.stop() {
        panic!("{what}: stopping the cluster: {e:?}");
    }
    kept
}

/// `n` walkers named `{prefix}{i:03}`, spawned at random cells of `area` and walking in it,
/// alternating between the two gateways.
fn walkers_in(prefix: &str, n: usize, area: Area, rng: &mut Rng) -> Vec<WalkerSpec> {
    (0..n)
        .map(|i| WalkerSpec {
            name: format!("{prefix}{i:03}"),
            spawn: area.random_cell(rng),
            area,
            gateway: i % 2,
        })
        .collect()
}

/// Stops the walkers of a run in which no player may notice anything: all `expected` of
/// them still there, none with a ViewReset or an error answer (`why` says why not).
fn stop_unnoticed(
    walkers: Walkers,
    expected: usize,
    why: &str,
) -> anyhow::Result<(Vec<Player>, Vec<WalkerStatus>)> {
    let (players, statuses) = walkers.stop(Duration::from_secs(10))?;
    ensure!(players.len() == expected, "{} of {expected} walkers at the end", players.len());
    for status in &statuses {
        ensure!(
            status.view_resets.is_empty() && status.error_count() == 0,
            "{}: {} ViewResets and errors {:?} {why}",
            status.name,
            status.view_resets.len(),
            status.errors
        );
    }
    Ok((players, statuses))
}

/// Every player's id and acknowledged position, for the ownership check at rest.
fn positions(players: &[Player]) -> BTreeMap<u64, (u32, u32)> {
    players.iter().map(|p| (p.id(), p.position())).collect()
}

/// The median and the largest of some durations, in seconds.
fn p50_max(mut durations: Vec<Duration>) -> (f64, f64) {
    durations.sort();
    match (durations.get(durations.len() / 2), durations.last()) {
        (Some(p50), Some(max)) => (p50.as_secs_f64(), max.as_secs_f64()),
        _ => (0.0, 0.0),
    }
}

#[test]
fn scale_2_4_2_under_load() {
    scale::scale_2_4_2_under_load(Io::Uring);
}

#[test]
fn shard_kill_restores_players() {
    shard_kill::shard_kill_restores_players(Io::Uring);
}

#[test]
fn shard_pause_is_fenced() {
    shard_pause::shard_pause_is_fenced(Io::Uring);
}

#[test]
fn etcd_outage_is_invisible() {
    etcd_outage::etcd_outage_is_invisible(Io::Uring);
}

#[test]
fn etcd_stall_is_invisible() {
    etcd_stall::etcd_stall_is_invisible(Io::Uring);
}

#[test]
fn a_node_started_while_etcd_stalls_waits_for_it() {
    etcd_stall::a_node_started_while_etcd_stalls_waits_for_it(Io::Uring);
}

#[test]
fn hotspot_borders_converge() {
    hotspot::hotspot_borders_converge(Io::Uring);
}
