//! The stale-neighbour workload of issue 11, as a new user tried it: four shards from
//! `meridian up --shards 4` with the load balancer on, a crowd logged in at uniformly random
//! cells of the box 150..=250 x 150..=250 (so it straddles the borders, and the balancer
//! moves them under it), each bot making moves in random directions at about 16 a second,
//! one in flight at a time; then nothing is sent, and one second later every bot's view must
//! equal the truth. With the old 2 s "borders settling" window, one bot in about six runs
//! still showed a neighbour that had left its sight 1.0 to 1.9 s after everything went quiet.
//!
//! The suite runs a smaller crowd twice; the figures are one environment variable
//! away (`MERIDIAN_STALE_BOTS=300 MERIDIAN_STALE_RUNS=50`, best in a release build: `cargo
//! test --release -p meridian --test sharding stale_neighbour -- --nocapture`). Every run
//! uses a fresh crowd on the same cluster, whose borders keep whatever the runs before
//! made of them.
//!
//! Issue 30: the runs go with busy loops beside the cluster (`MERIDIAN_STALE_BUSY`, default
//! 2, one per core here), as the stale neighbour showed only on contended cores, and no
//! shard may have given up waiting for a `Released` (its
//! `meridian_shard_ghost_release_timeouts_total` stays 0): without a fault, every handoff's
//! old owner releases its ghosts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use meridian_testkit::{
    metric_total, settle, test_seed, Area, ClusterOptions, Io, Rng, WalkOptions, WalkerSpec,
    Walkers, SEED_ENV,
};

use crate::{with_cluster, SIGHT};

/// The box of the issue: it straddles the borders of a 2x2 split of the 400x400 map.
const BOX: (std::ops::RangeInclusive<u32>, std::ops::RangeInclusive<u32>) = (150..=250, 150..=250);
/// About 16 moves a second per bot.
const MOVE_EVERY: Duration = Duration::from_millis(62);
/// Moves each bot makes per run.
const MOVES: u64 = 30;
/// What the issue allows after the last move: one second of quiet.
const QUIET: Duration = Duration::from_secs(1);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Threads that spin until dropped: contended cores for the cluster beside them.
struct BusyLoops {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyLoops {
    fn start(count: usize) -> BusyLoops {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyLoops { stop, threads }
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

pub fn stale_neighbour_workload(io: Io) {
    let seed = test_seed("sharding::stale_neighbour", 11);
    let bots = env_or("MERIDIAN_STALE_BOTS", 100);
    let runs = env_or("MERIDIAN_STALE_RUNS", 2);
    let busy = env_or("MERIDIAN_STALE_BUSY", 2);
    let label =
        format!("seed {seed} ({SEED_ENV}={seed}), {bots} bots, {runs} runs, {busy} busy loops");
    let options = ClusterOptions::new(io).shards(4).gateways(2);
    with_cluster(&label.clone(), options, |cluster| {
        let gateways: Vec<_> = cluster.gateways().iter().map(|g| g.game).collect();
        let area = Area::new(BOX.0, BOX.1);
        let mut rng = Rng::new(seed);
        let _busy = BusyLoops::start(busy);
        for run in 1..=runs {
            let started = Instant::now();
            let run_label = format!("{label}, run {run}");
            let specs: Vec<WalkerSpec> = (0..bots)
                .map(|i| WalkerSpec {
                    name: format!("r{run:02}b{i:03}"),
                    spawn: area.random_cell(&mut rng),
                    area,
                    gateway: i % gateways.len(),
                })
                .collect();
            let mut walk = WalkOptions::new(gateways.clone(), seed ^ run as u64, run_label.clone());
            walk.move_every = MOVE_EVERY;
            walk.momentum = 0.0;
            let walkers = Walkers::start(&specs, walk)?;
            walkers.wait_logged_in(Duration::from_secs(30)).context(run_label.clone())?;
            walkers.wait_for_acks(MOVES, Duration::from_secs(60)).context(run_label.clone())?;
            let (mut players, statuses) = walkers.stop(Duration::from_secs(10))?;
            let moves: u64 = statuses.iter().map(|s| s.acks).sum();
            settle(&mut players, SIGHT, QUIET)
                .with_context(|| format!("{run_label}: views one second after the last move"))?;
            let epoch = cluster.status_json()?["partition"]["epoch"].as_u64().unwrap_or(0);
            println!(
                "{run_label}: {} bots, {moves} moves acknowledged, views exact within {:.1} s \
                 of the last move ({:.1} s in all), partition epoch {epoch}",
                players.len(),
                QUIET.as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            // Logged out, not parked: the next run's crowd starts from an empty box.
            for player in &mut players {
                player.bot.send(&meridian_testkit::msg::logout()).context("logout")?;
            }
            for player in &mut players {
                let by = Instant::now() + Duration::from_secs(10);
                player.bot.expect_closed(by).context("closed after its logout")?;
            }
        }
        for shard in cluster.shards() {
            let name = "meridian_shard_ghost_release_timeouts_total";
            let timeouts = metric_total(shard.admin, name)?;
            anyhow::ensure!(
                timeouts == 0.0,
                "{label}: shard {} gave up waiting for {timeouts} Released (its log names the \
                 handoffs)",
                shard.id
            );
        }
        Ok(())
    });
}
