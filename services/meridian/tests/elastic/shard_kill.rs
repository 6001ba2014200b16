//! A shard killed with SIGKILL under load: 60 bots walk on both sides of the border of a
//! two-shard cluster (30 a side, each in its own half, so the load is even and no border
//! moves), in sight of each other across it; shard 2 is killed. Once its lease expires the
//! coordinator gives its region to shard 1 and the gateways restore its players there at
//! their last acknowledged cells. Checked: every player of shard 2 gets `ViewReset` within
//! the lease TTL + 2 s of the kill, exactly once, and gets acks again after it; every move
//! gets exactly one answer (its ack, or `UNAVAILABLE` while the player's shard is dead) and
//! no connection drops; the players of shard 1 notice nothing but their view of the others
//! (no refusal, no `ViewReset`); at rest every view equals the truth (observers see the
//! restored players again) and the survivor owns every logged-in player exactly once.
//! Kill-to-`ViewReset` and kill-to-first-ack times are printed (p50 and max).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::conservation::{fetch_players, status_player_counts};
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{
    owners_at_rest_on, settle, test_seed, wait_for_expected_partition, Io, Rng, WalkOptions,
    WalkerStatus, Walkers, DEFAULT_LEASE_TTL, DEFAULT_WAIT, SEED_ENV,
};

use crate::two_sides::TwoSides;
use crate::{options, p50_max, positions, with_cluster, SETTLE_WITHIN, SIGHT};

const PER_SIDE: usize = 30;
/// Each side's walkers stay in their shard's half, within sight of the border x = 200.
const WEST: (u32, u32) = (165, 199);
const EAST: (u32, u32) = (200, 234);
const ROWS: (u32, u32) = (150, 250);
/// How long after the kill every player of the dead shard must have its `ViewReset`, on
/// top of the lease TTL (issue 4: "within the lease TTL plus 2 s").
const RESTORE_SLACK: Duration = Duration::from_secs(2);

pub fn shard_kill_restores_players(io: Io) {
    let seed = test_seed("elastic::shard_kill", 9);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), kill -9 a shard under load");
    with_cluster(&label.clone(), options(io, 2), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let sides = TwoSides::new(WEST, EAST, ROWS);
        let (survivor, victim) = sides.owners(cluster, &partition)?;
        let specs = sides.walkers(PER_SIDE, &mut Rng::new(seed));
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let mut walk = WalkOptions::new(gateways, seed, label.clone());
        walk.allowed_errors = vec![ErrorCode::Unavailable];
        let walkers = Walkers::start(&specs, walk)?;
        walkers.wait_logged_in(Duration::from_secs(15))?;
        walkers.wait_for_acks(3, Duration::from_secs(10))?;

        // Who is on the shard about to die: exactly the east walkers.
        let ids: BTreeMap<String, u64> =
            walkers.status().iter().filter_map(|s| Some((s.name.clone(), s.id?))).collect();
        let east: BTreeSet<u64> =
            ids.iter().filter(|(name, _)| name.starts_with("east")).map(|(_, id)| *id).collect();
        let on_victim: BTreeSet<u64> =
            fetch_players(victim.admin)?.players.iter().map(|p| p.id).collect();
        ensure!(
            on_victim == east,
            "shard {} should own exactly the {PER_SIDE} east walkers before the kill; it owns \
             {on_victim:?}, the east walkers are {east:?}",
            victim.id
        );

        // Kill at steady state: the shards' records in etcd (which the coordinator balances
        // borders by) must count everyone first. A record older than the last logins can
        // make the coordinator move a border toward the shard that has just died, before
        // its lease expires, and hand live players to it: a separate flaw, not what this
        // test is about.
        let counts = status_player_counts(cluster, 2 * PER_SIDE as u64, Duration::from_secs(5))
            .context("the shards' records before the kill")?;
        ensure!(
            counts.values().all(|n| *n == PER_SIDE as u64),
            "`meridian status` should count {PER_SIDE} players on each shard: {counts:?}"
        );

        let killed_at = Instant::now();
        cluster.kill_shard(1)?;
        let restore_by = killed_at + DEFAULT_LEASE_TTL + RESTORE_SLACK;
        let is_east = |s: &WalkerStatus| s.id.is_some_and(|id| east.contains(&id));
        walkers
            .wait_for(
                restore_by.saturating_duration_since(Instant::now()),
                &format!(
                    "every player of shard {} to get ViewReset within {:?} of the kill",
                    victim.id,
                    DEFAULT_LEASE_TTL + RESTORE_SLACK
                ),
                |all| all.iter().filter(|s| is_east(s)).all(|s| !s.view_resets.is_empty()),
                |all| {
                    let waiting: Vec<String> = all
                        .iter()
                        .filter(|s| is_east(s) && s.view_resets.is_empty())
                        .map(|s| format!("{} (refused {:?})", s.name, s.errors))
                        .collect();
                    format!("{} still without ViewReset: {waiting:?}", waiting.len())
                },
            )
            .context("restore after the kill")?;
        walkers.wait_for(
            DEFAULT_WAIT,
            "every restored player to get an ack after its ViewReset",
            |all| all.iter().filter(|s| is_east(s)).all(|s| s.first_ack_after_reset.is_some()),
            |all| {
                let waiting: Vec<&str> = all
                    .iter()
                    .filter(|s| is_east(s) && s.first_ack_after_reset.is_none())
                    .map(|s| s.name.as_str())
                    .collect();
                format!("no ack since the ViewReset: {waiting:?}")
            },
        )?;
        walkers.wait_for_acks(3, Duration::from_secs(10)).context("everyone plays on")?;

        let (mut players, statuses) = walkers.stop(Duration::from_secs(10))?;
        ensure!(players.len() == 2 * PER_SIDE, "{} walkers left at the end", players.len());
        let mut restored = Vec::new();
        let mut playable = Vec::new();
        for s in &statuses {
            if is_east(s) {
                ensure!(
                    s.view_resets.len() == 1,
                    "{} got {} ViewResets, expected exactly one",
                    s.name,
                    s.view_resets.len()
                );
                let reset = s.view_resets[0];
                ensure!(
                    reset >= killed_at && reset <= restore_by,
                    "{}: ViewReset {:.2} s after the kill, expected within {:?}",
                    s.name,
                    reset.saturating_duration_since(killed_at).as_secs_f64(),
                    DEFAULT_LEASE_TTL + RESTORE_SLACK
                );
                // Refusals only while the shard was dead: from the kill to the ViewReset,
                // or for the one move that may cross the ViewReset on the wire.
                if let (Some(first), Some(last)) = (s.first_error, s.last_error) {
                    ensure!(
                        first >= killed_at && (last <= reset || s.refused_across_reset > 0),
                        "{}: refused from {:.2} s to {:.2} s after the kill, its ViewReset came \
                         at {:.2} s",
                        s.name,
                        first.saturating_duration_since(killed_at).as_secs_f64(),
                        last.saturating_duration_since(killed_at).as_secs_f64(),
                        reset.saturating_duration_since(killed_at).as_secs_f64()
                    );
                }
                let ack = s.first_ack_after_reset.context("checked while walking")?;
                restored.push(reset - killed_at);
                playable.push(ack - killed_at);
            } else {
                ensure!(
                    s.view_resets.is_empty() && s.error_count() == 0,
                    "{} (on the surviving shard) got {} ViewResets and refusals {:?}",
                    s.name,
                    s.view_resets.len(),
                    s.errors
                );
            }
        }

        settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after the restore")?;
        let (at_rest, _) = owners_at_rest_on(
            cluster,
            &[(survivor.id, survivor.admin)],
            &positions(&players),
            Duration::from_secs(10),
        )
        .context("ownership at rest on the survivor")?;

        let refused: u64 = statuses.iter().map(WalkerStatus::error_count).sum();
        let acked_across: u64 = statuses.iter().map(|s| s.acked_across_reset).sum();
        let refused_across: u64 = statuses.iter().map(|s| s.refused_across_reset).sum();
        let acks: u64 = statuses.iter().map(|s| s.acks).sum();
        let (reset_p50, reset_max) = p50_max(restored);
        let (ack_p50, ack_max) = p50_max(playable);
        println!(
            "{label}: ok: {} players of shard {} restored; kill to ViewReset p50 {reset_p50:.2} s, \
             max {reset_max:.2} s; kill to first ack after it p50 {ack_p50:.2} s, max \
             {ack_max:.2} s (lease TTL {:?}); {acks} acks, {refused} moves refused UNAVAILABLE, \
             moves in flight at a ViewReset then acked: {acked_across}, refused: \
             {refused_across}; views equal the truth, every player owned once; partition \
             {at_rest}",
            east.len(),
            victim.id,
            DEFAULT_LEASE_TTL
        );
        Ok(())
    });
}
