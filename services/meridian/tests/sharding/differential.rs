//! Single-world equivalence, differentially: one seeded script (logins near the borders and
//! the corner, random walks across them, chats, logouts, dropped connections, re-logins) runs
//! against a one-shard world and against sharded clusters. In every run, every client's
//! stream is checked as it arrives (own acks in order and where the moves lead, subjects one
//! step at a time, no Left for a player still in sight, chat only from players in view), and
//! at rest every view must equal the truth and a quiet chat round must reach exactly those in
//! sight. Then the sharded runs must end exactly as the one-shard run did: same positions,
//! same views, same hearers.
//!
//! The one-shard run is shared by the tests of this module (it runs once per test binary).

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context};
use meridian_testkit::{
    chat_round, generate, owners_at_rest, settle, test_seed, wait_for_expected_partition,
    wait_for_partition, Cluster, ClusterOptions, Fleet, FleetOptions, HotSpots, Io, Outcome,
    Partition, Rng, ScenarioConfig, Script, SEED_ENV,
};

use crate::{meridian_bin, with_cluster, MAP, SIGHT};

/// The default seed; `MERIDIAN_TEST_SEED` overrides it.
const DEFAULT_SEED: u64 = 20_240_601;

/// How long views may take to converge once every move is answered.
const SETTLE_WITHIN: Duration = Duration::from_secs(5);

/// How long a script may overrun its schedule (slow acks on a loaded machine).
const OVERRUN: Duration = Duration::from_secs(30);

fn seed() -> u64 {
    test_seed("sharding::differential", DEFAULT_SEED)
}

/// The borders and corners of both sharded layouts the script runs against (2x2 and three
/// shards): the line x = 200, the line y = 200, and the corner (200, 200).
fn hot_spots() -> HotSpots {
    let mut borders = BTreeSet::new();
    let mut corners = BTreeSet::new();
    for shards in [vec![1, 2, 3, 4], vec![1, 2, 3]] {
        let layout = Partition::expected(&shards, MAP.0, MAP.1);
        borders.extend(layout.borders());
        corners.extend(layout.corners().into_iter().map(|(point, _)| point));
    }
    HotSpots { borders: borders.into_iter().collect(), corners: corners.into_iter().collect() }
}

/// ~150 bots, half near the corner, walking for 6 s: a few thousand actions.
fn script(seed: u64) -> Script {
    let config = ScenarioConfig {
        slots: 150,
        gateways: 2,
        map: MAP,
        view_range: SIGHT,
        hot: hot_spots(),
        corner_share: 0.5,
        spread: 30,
        login_window: Duration::from_millis(1000),
        walk: Duration::from_secs(6),
        move_gap_ms: (50, 100),
        momentum: 0.6,
        chat_chance: 0.02,
        churn: 0.15,
        drop_share: 0.35,
        rejoin_share: 0.6,
    };
    generate(&config, seed)
}

/// Runs `script` against a cluster of `shards` shards and two gateways; returns how it
/// ended. Everything checked on the way fails the run.
fn run(cluster: &Cluster, shards: usize, script: &Script, label: &str) -> anyhow::Result<Outcome> {
    let partition = if shards > 1 {
        wait_for_expected_partition(cluster, Duration::from_secs(10))?
    } else {
        wait_for_partition(cluster, Duration::from_secs(10))?
    };
    let gateways = cluster.gateways().iter().map(|g| g.game).collect();
    eprintln!("{label}: {script}; partition {partition}");
    let fleet = Fleet::start(script, FleetOptions::new(gateways, "fleet"))?;
    let mut players = fleet.finish(OVERRUN)?;

    // Where everyone ends is known from the script alone.
    let expected = script.final_positions();
    let actual: std::collections::BTreeMap<String, (u32, u32)> =
        players.iter().map(|p| (p.name.clone(), p.position())).collect();
    if actual != expected {
        let wrong: Vec<String> = expected
            .iter()
            .filter(|(name, at)| actual.get(*name) != Some(at))
            .map(|(name, at)| {
                format!("{name}: script says {at:?}, acks say {:?}", actual.get(name))
            })
            .take(20)
            .collect();
        bail!("{label}: the players left at the end are not where the script puts them: {wrong:?}");
    }

    let truth = settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after the walk")?;
    let mut outcome = Outcome::at_rest(&players);

    // A quarter of the players speak, chosen by slot so every run picks the same ones.
    let chooser = Rng::new(script.seed).fork(0xC4A7);
    let speakers: Vec<usize> = players
        .iter()
        .enumerate()
        .filter(|(_, p)| chooser.fork(p.slot as u64).chance(0.25))
        .map(|(i, _)| i)
        .collect();
    outcome.heard = chat_round(&mut players, &speakers, "quiet", &truth, SETTLE_WITHIN)
        .context("the quiet chat round")?;

    if shards > 1 {
        let positions = truth.players.iter().map(|(id, seen)| (*id, seen.position)).collect();
        let (at_rest, _) =
            owners_at_rest(cluster, &positions, SETTLE_WITHIN).context("ownership at rest")?;
        if at_rest.epoch != partition.epoch {
            eprintln!("{label}: borders moved for load during the run: {at_rest}");
        }
    }
    let moves: u64 =
        players.iter().filter_map(|p| p.bot.stream_check().map(|s| s.stats().acks)).sum();
    eprintln!(
        "{label}: ok, {} players at rest, {} acks for the players still on",
        players.len(),
        moves
    );
    Ok(outcome)
}

/// The one-shard run, shared by the tests of this module: `Err` holds the failure text.
fn baseline(seed: u64) -> &'static Result<Outcome, String> {
    static BASELINE: OnceLock<(u64, Result<Outcome, String>)> = OnceLock::new();
    let (ran_with, outcome) = BASELINE.get_or_init(|| {
        let label = format!("seed {seed} ({SEED_ENV}={seed}), 1 shard");
        let opts = ClusterOptions::new(Io::Uring).gateways(2);
        let result = match Cluster::start(meridian_bin(), opts) {
            Err(e) => Err(format!("{label}: {e:?}")),
            Ok(mut cluster) => match run(&cluster, 1, &script(seed), &label) {
                Ok(outcome) => cluster
                    .stop()
                    .map(|()| outcome)
                    .map_err(|e| format!("{label}: stopping the cluster: {e:?}")),
                Err(e) => {
                    // Its log is printed when it is dropped, right here.
                    cluster.mark_failed();
                    Err(format!("{label}: {e:?}"))
                }
            },
        };
        (seed, result)
    });
    assert_eq!(*ran_with, seed, "the seed does not change within a test run");
    outcome
}

/// The script against one shard: exercises every check on a world known to work.
pub fn differential_single_world(_io: Io) {
    let seed = seed();
    if let Err(e) = baseline(seed) {
        panic!("the one-shard baseline failed (a bug in the checks, or in the world): {e}");
    }
}

fn differential(io: Io, shards: usize, corner: &str) {
    let seed = seed();
    let label = format!("seed {seed} ({SEED_ENV}={seed}), {shards} shards ({corner})");
    let opts = ClusterOptions::new(io).shards(shards).gateways(2);
    with_cluster(&label.clone(), opts, |cluster| {
        let outcome = run(cluster, shards, &script(seed), &label)?;
        let single = match baseline(seed) {
            Ok(single) => single,
            Err(e) => bail!(
                "the sharded run passed its own checks, but the one-shard baseline failed: {e}"
            ),
        };
        let differences = outcome.diff(single);
        if !differences.is_empty() {
            bail!(
                "{} differences from the one-shard run (here = {shards} shards, there = 1 shard):\n  {}",
                differences.len(),
                differences.iter().take(40).cloned().collect::<Vec<_>>().join("\n  ")
            );
        }
        Ok(())
    });
}

/// 2x2 shards: the four-way corner at (200, 200) and both border lines.
pub fn differential_2x2_four_way_corner(io: Io) {
    differential(io, 4, "2x2, four-way corner");
}

/// Three shards: two on the left, one on the right, a three-way corner at (200, 200).
pub fn differential_3_shards_three_way_corner(io: Io) {
    differential(io, 3, "three-way corner");
}
