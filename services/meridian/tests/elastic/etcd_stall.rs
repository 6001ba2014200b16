//! etcd stalled, not dead, for 30 s under moving players: the etcd that `meridian up` started
//! is frozen with SIGSTOP (as a slow disk, a paused VM or a long leader election would
//! freeze it) and continued with SIGCONT. Unlike a killed etcd, a stalled one keeps every
//! connection open and answers nothing; when it resumes, it finds every lease past its TTL
//! and expires them all at once, so every member's key disappears together.
//!
//! 48 bots walk on a three-shard cluster, 16 in each shard's region, around the point where
//! the three regions meet (in sight of each other across the borders). Checked, against
//! the promise that players notice nothing: every move sent is acknowledged (no refusal,
//! no lost answer) and no connection is cut, during the stall and after it; every
//! gateway's and shard's `/readyz` answers 200 all through (a stalled etcd says nothing
//! about whether a node can serve players); afterwards every member is back in etcd on a
//! live lease, every shard still owns a region, views at rest equal the truth and
//! ownership is exact.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::abuse::{process_state, StoppedProcess};
use meridian_testkit::conservation::status_player_counts;
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{
    http_get, owners_at_rest, settle, test_seed, wait_for_expected_partition, Area, Cluster, Io,
    Rng, WalkOptions, WalkerStatus, Walkers, DEFAULT_LEASE_TTL, SEED_ENV,
};

use crate::etcd_outage::wait_members_back;
use crate::{options, positions, stop_unnoticed, walkers_in, with_cluster, SETTLE_WITHIN, SIGHT};

const PER_SHARD: usize = 16;
const STALL: Duration = Duration::from_secs(30);
/// A move every 200 ms: five a second per bot, 240 a second in all.
const MOVE_EVERY: Duration = Duration::from_millis(200);
/// How long the members may take to be back on live leases once etcd runs again.
const RECOVER_WITHIN: Duration = Duration::from_secs(15);
/// How often every node's `/readyz` is asked while the test runs.
const READYZ_EVERY: Duration = Duration::from_millis(250);

/// Every node's `/readyz` answers, counted by code, from a thread that asks them in turn
/// until it is stopped; the first few answers other than 200 are kept with their bodies.
struct ReadyzProbe {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<ReadyzSeen>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default, Clone)]
struct ReadyzSeen {
    ok: u64,
    not_ok: u64,
    /// `(seconds since the probe started, node, code or error, body)`.
    first_failures: Vec<(f64, String, String)>,
}

impl ReadyzProbe {
    fn start(nodes: Vec<(String, SocketAddr)>) -> ReadyzProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(ReadyzSeen::default()));
        let (stop_flag, record) = (Arc::clone(&stop), Arc::clone(&seen));
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            while !stop_flag.load(Ordering::SeqCst) {
                let round = Instant::now();
                for (name, admin) in &nodes {
                    let answer = match http_get(*admin, "/readyz") {
                        Ok((200, _)) => None,
                        Ok((code, body)) => Some(format!("{code} {}", body.trim())),
                        Err(e) => Some(format!("{e:#}")),
                    };
                    let mut seen = record.lock().expect("invariant: the lock is never poisoned");
                    match answer {
                        None => seen.ok += 1,
                        Some(what) => {
                            seen.not_ok += 1;
                            if seen.first_failures.len() < 10 {
                                let at = started.elapsed().as_secs_f64();
                                seen.first_failures.push((at, name.clone(), what));
                            }
                        }
                    }
                }
                // Paced, not a sleep that papers over a race: the probe only samples.
                std::thread::sleep(READYZ_EVERY.saturating_sub(round.elapsed()));
            }
        });
        ReadyzProbe { stop, seen, thread: Some(thread) }
    }

    fn seen(&self) -> ReadyzSeen {
        self.seen.lock().expect("invariant: the lock is never poisoned").clone()
    }

    fn finish(mut self) -> ReadyzSeen {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.seen()
    }
}

impl Drop for ReadyzProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Moves sent, acknowledged and refused by all walkers so far.
fn totals(statuses: &[WalkerStatus]) -> (u64, u64, u64) {
    let sent = statuses.iter().map(|s| s.moves).sum();
    let acked = statuses.iter().map(|s| s.acks).sum();
    let refused = statuses.iter().map(WalkerStatus::error_count).sum();
    (sent, acked, refused)
}

fn admin_nodes(cluster: &Cluster) -> Vec<(String, SocketAddr)> {
    cluster
        .shards()
        .iter()
        .map(|s| (format!("shard {}", s.id), s.admin))
        .chain(cluster.gateways().iter().map(|g| (format!("gateway {}", g.id), g.admin)))
        .collect()
}

pub fn etcd_stall_is_invisible(io: Io) {
    let seed = test_seed("elastic::etcd_stall", 11);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), etcd stalled (SIGSTOP) for 30 s");
    with_cluster(&label.clone(), options(io, 3), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        // Three shards: 1 owns x < 200, y < 200; 2 owns x < 200, y >= 200; 3 owns x >= 200.
        // Each group walks in its own shard's region, within sight of the other two.
        let areas = [
            ("north", Area::new(176..=199, 176..=199)),
            ("south", Area::new(176..=199, 200..=223)),
            ("east", Area::new(200..=223, 188..=211)),
        ];
        let owners: Vec<Option<u32>> =
            areas.iter().map(|(_, a)| partition.owner((a.x0, a.y0))).collect();
        ensure!(
            owners == [Some(1), Some(2), Some(3)]
                && areas
                    .iter()
                    .all(|(_, a)| partition.owner((a.x1, a.y1)) == partition.owner((a.x0, a.y0))),
            "the test assumes each walking area inside one shard's region: {partition}"
        );
        let mut rng = Rng::new(seed);
        let specs: Vec<_> = areas
            .iter()
            .flat_map(|(name, area)| walkers_in(name, PER_SHARD, *area, &mut rng))
            .collect();
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let mut walk = WalkOptions::new(gateways, seed, label.clone());
        walk.move_every = MOVE_EVERY;
        // Refusals are counted and checked at the end rather than stopping the run at the
        // first one, so a failure reports how many moves were refused.
        walk.allowed_errors = vec![ErrorCode::Unavailable];
        let walkers = Walkers::start(&specs, walk)?;
        walkers.wait_logged_in(Duration::from_secs(15))?;
        walkers.wait_for_acks(3, Duration::from_secs(10))?;
        // Stall at steady state: the records in etcd count everyone, so the coordinator has
        // no reason of its own to move a border around the stall.
        let n_players = 3 * PER_SHARD;
        status_player_counts(cluster, n_players as u64, Duration::from_secs(10))
            .context("the shards' records before the stall")?;

        let probe = ReadyzProbe::start(admin_nodes(cluster));
        let pid = cluster.etcd_pid().context("the ready file names no etcd_pid")?;
        let before = totals(&walkers.status());
        let stalled = StoppedProcess::stop(pid).context("stopping etcd")?;
        let stalled_at = Instant::now();
        let walked = walkers.walk_for(STALL);
        ensure!(process_state(pid) == Some('T'), "etcd (pid {pid}) should still be stopped");
        stalled.resume().context("continuing etcd")?;
        let resumed_at = Instant::now();
        let during = totals(&walkers.status());
        println!(
            "{label}: etcd stopped {:.1} s; meanwhile {} moves sent, {} acked, {} refused",
            (resumed_at - stalled_at).as_secs_f64(),
            during.0 - before.0,
            during.1 - before.1,
            during.2 - before.2
        );
        walked.context("while etcd was stalled")?;

        // Once it runs again, etcd expires every lease that was due meanwhile: the members
        // must be listed again on live leases, then keep serving for two more TTLs.
        // etcd still holds the keys of before the stall until it has expired their leases,
        // so the members are checked once twice the TTL has passed.
        let walked_after = walkers.walk_for(2 * DEFAULT_LEASE_TTL);
        let recovered =
            walked_after.as_ref().ok().map(|_| wait_members_back(cluster, RECOVER_WITHIN));
        let after = totals(&walkers.status());
        let readyz = probe.finish();
        println!(
            "{label}: in all since the stall began: {} moves sent, {} acked, {} refused; \
             /readyz {} x 200, {} x other {:?}",
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2,
            readyz.ok,
            readyz.not_ok,
            readyz.first_failures
        );
        walked_after.context("after etcd resumed")?;
        let partition_after =
            recovered.context("checked after the walk")?.context("after etcd resumed")?;
        let members_back = resumed_at.elapsed();
        ensure!(
            readyz.not_ok == 0,
            "/readyz answered other than 200 {} times (first: {:?})",
            readyz.not_ok,
            readyz.first_failures
        );
        walkers.wait_for_acks(3, Duration::from_secs(10)).context("after etcd resumed")?;

        let (mut players, statuses) =
            stop_unnoticed(walkers, n_players, "(players must not notice a stalled etcd)")?;
        settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after the stall")?;
        owners_at_rest(cluster, &positions(&players), Duration::from_secs(10))
            .context("ownership at rest")?;
        let (sent, acked, refused) = totals(&statuses);
        println!(
            "{label}: ok: {sent} moves sent, {acked} acked, {refused} refused, 0 disconnects; \
             /readyz 200 all {} times asked; every member listed on a live lease {:.1} s \
             after the resume (checked once the leases of before had expired); partition \
             epoch {} before, {} after",
            readyz.ok,
            members_back.as_secs_f64(),
            partition.epoch,
            partition_after.epoch
        );
        Ok(())
    });
}

/// A shard started while etcd is stalled waits for it instead of exiting on its first
/// request that times out (a CI run saw a gateway give up that way at start while a slow
/// disk held etcd's fsyncs for seconds), and joins once etcd runs again.
pub fn a_node_started_while_etcd_stalls_waits_for_it(io: Io) {
    with_cluster("a shard started while etcd stalls", options(io, 1), |cluster| {
        let etcd = cluster.etcd_pid().context("meridian up's etcd")?;
        let stalled = StoppedProcess::stop(etcd)?;
        // etcd runs again after 8 s, past the 5 s an etcd request waits before it times
        // out: the stall's length is the scenario, nothing is waited for.
        let resumer = std::thread::spawn(move || {
            std::thread::sleep(START_STALL);
            stalled.resume()
        });
        let started = meridian_testkit::ExtraShard::start(
            cluster,
            2,
            crate::RESUME_KEY_HEX,
            DEFAULT_LEASE_TTL,
        );
        resumer.join().expect("the resuming thread does not panic")?;
        let shard = started.context("the shard started while etcd was stalled")?;
        meridian_testkit::wait_ready(&[("shard-2".to_string(), shard.admin())], RECOVER_WITHIN)?;
        Ok(())
    });
}

/// How long etcd stalls under a starting shard.
const START_STALL: Duration = Duration::from_secs(8);
