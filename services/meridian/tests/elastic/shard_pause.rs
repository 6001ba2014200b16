//! A shard paused past its lease under load, and woken (issue 33, fencing): 60 bots walk on
//! both sides of the border of a two-shard cluster, as in `shard_kill`; shard 2 gets SIGSTOP
//! for 8 s (a long GC pause, a VM migration: longer than the 3 s lease) and SIGCONT. While
//! it is stopped it is taken for dead: its lease expires, its region goes to shard 1 and
//! the gateways restore its players there. When it wakes it must not act on them: it finds
//! its lease expired, drops what it held, starts a new life and registers again, and is
//! given a region like a new shard.
//!
//! Checked: every move gets exactly one answer (its ack, or `UNAVAILABLE` while its player
//! is being restored), no connection drops, and the players of shard 1 notice nothing; the
//! woken shard counts the pause (`meridian_shard_pauses_total`); at rest every view equals the truth, and no player is on two
//! shards: every shard's `/players` is read and each logged-in player is owned by exactly
//! one of them, the one the partition names for its cell (`owners_at_rest`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::abuse::StoppedProcess;
use meridian_testkit::conservation::{fetch_players, status_player_counts};
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{
    http_get, owners_at_rest, settle, test_seed, wait_for_expected_partition, Io, Rng, WalkOptions,
    WalkerStatus, Walkers, DEFAULT_LEASE_TTL, SEED_ENV,
};

use crate::two_sides::TwoSides;
use crate::{options, positions, with_cluster, SETTLE_WITHIN, SIGHT};

const PER_SIDE: usize = 30;
const WEST: (u32, u32) = (165, 199);
const EAST: (u32, u32) = (200, 234);
const ROWS: (u32, u32) = (150, 250);
/// As issue 33 asks: SIGSTOP at 8 s, SIGCONT at 16 s.
const PAUSE: Duration = Duration::from_secs(8);

/// The sum of a counter's lines (`name{...} value`) on a `/metrics` page.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

pub fn shard_pause_is_fenced(io: Io) {
    let seed = test_seed("elastic::shard_pause", 13);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), SIGSTOP a shard for 8 s under load");
    with_cluster(&label.clone(), options(io, 2), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let sides = TwoSides::new(WEST, EAST, ROWS);
        let (_, victim) = sides.owners(cluster, &partition)?;
        let specs = sides.walkers(PER_SIDE, &mut Rng::new(seed));
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let mut walk = WalkOptions::new(gateways, seed, label.clone());
        walk.allowed_errors = vec![ErrorCode::Unavailable];
        let walkers = Walkers::start(&specs, walk)?;
        walkers.wait_logged_in(Duration::from_secs(15))?;
        walkers.wait_for_acks(3, Duration::from_secs(10))?;
        let ids: BTreeMap<String, u64> =
            walkers.status().iter().filter_map(|s| Some((s.name.clone(), s.id?))).collect();
        let east: BTreeSet<u64> =
            ids.iter().filter(|(name, _)| name.starts_with("east")).map(|(_, id)| *id).collect();
        let on_victim: BTreeSet<u64> =
            fetch_players(victim.admin)?.players.iter().map(|p| p.id).collect();
        ensure!(on_victim == east, "shard {} should own the east walkers first", victim.id);
        // At steady state, as in `shard_kill`: the records count everyone.
        status_player_counts(cluster, 2 * PER_SIDE as u64, Duration::from_secs(5))
            .context("the shards' records before the pause")?;
        let pauses_before =
            counter(&http_get(victim.admin, "/metrics")?.1, "meridian_shard_pauses_total");

        let stopped = StoppedProcess::stop(victim.pid).context("stopping shard 2")?;
        let stopped_at = Instant::now();
        let walked = walkers.walk_for(PAUSE);
        stopped.resume().context("continuing shard 2")?;
        let stopped_for = stopped_at.elapsed();
        walked.context("while shard 2 was stopped")?;
        // Long enough for the woken shard to find its lease gone, register again as a new
        // life and take a region (the balancer hands it players back).
        walkers.walk_for(3 * DEFAULT_LEASE_TTL).context("after shard 2 woke")?;
        walkers.wait_for_acks(3, Duration::from_secs(10)).context("everyone plays on")?;

        let (mut players, statuses) = walkers.stop(Duration::from_secs(10))?;
        ensure!(players.len() == 2 * PER_SIDE, "{} walkers left at the end", players.len());
        let is_east = |s: &WalkerStatus| s.id.is_some_and(|id| east.contains(&id));
        for s in statuses.iter().filter(|s| !is_east(s)) {
            ensure!(
                s.error_count() == 0 && s.view_resets.is_empty(),
                "{} (on the shard that kept running) got {} ViewResets and refusals {:?}",
                s.name,
                s.view_resets.len(),
                s.errors
            );
        }
        let metrics = http_get(victim.admin, "/metrics")?.1;
        let pauses = counter(&metrics, "meridian_shard_pauses_total") - pauses_before;
        ensure!(pauses == 1, "shard 2 should count one pause past its lease, counted {pauses}");

        settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after the pause")?;
        let (at_rest, _) = owners_at_rest(cluster, &positions(&players), Duration::from_secs(10))
            .context("no player on two shards at rest")?;
        let refused: u64 = statuses.iter().map(WalkerStatus::error_count).sum();
        let acks: u64 = statuses.iter().map(|s| s.acks).sum();
        let resets: usize = statuses.iter().map(|s| s.view_resets.len()).sum();
        println!(
            "{label}: ok: stopped {:.1} s; {acks} acks, {refused} moves refused UNAVAILABLE, \
             {resets} ViewResets; views equal the truth, every player owned once; partition \
             {at_rest}",
            stopped_for.as_secs_f64()
        );
        Ok(())
    });
}
