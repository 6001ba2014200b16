//! Conservation: 100 bots walk at random around the four-way corner of a 2x2 cluster for
//! ten seconds, crossing borders all the time, while every shard's `/players` is sampled
//! over and over (all shards at once). At every sample: no player twice on one shard, no
//! (player, generation) on two shards, nobody listed who is not logged in, every logged-in
//! player listed (a gap is judged against the handoffs around it, see
//! `meridian_testkit::conservation`), and the number of distinct players listed equals the
//! number logged in. At rest: each player listed once, by the owner of its cell, at its
//! position; and `meridian status` counts them all.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::conservation::status_player_counts;
use meridian_testkit::{
    generate, owners_at_rest, settle, test_seed, wait_for_expected_partition, wait_until,
    ClusterOptions, Conservation, Fleet, FleetOptions, HotSpots, Io, Sample, ScenarioConfig,
    SEED_ENV,
};

use crate::{with_cluster, MAP, SIGHT};

const BOTS: usize = 100;
/// Between two samples: the sampler must not starve the cluster on two cores.
const SAMPLE_PAUSE: Duration = Duration::from_millis(20);
/// How long the walk may overrun its schedule (slow acks on a loaded machine).
const OVERRUN: Duration = Duration::from_secs(30);

pub fn conservation_at_the_four_way_corner(io: Io) {
    let seed = test_seed("sharding::conservation", 11);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), 4 shards, conservation");
    let opts = ClusterOptions::new(io).shards(4).gateways(2);
    with_cluster(&label.clone(), opts, |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let corner = partition
            .corners()
            .into_iter()
            .find(|(_, ways)| *ways == 4)
            .map(|(point, _)| point)
            .with_context(|| format!("no four-way corner in {partition}"))?;
        let config = ScenarioConfig {
            slots: BOTS,
            gateways: 2,
            map: MAP,
            view_range: SIGHT,
            hot: HotSpots { borders: Vec::new(), corners: vec![corner] },
            corner_share: 1.0,
            spread: 12,
            login_window: Duration::from_millis(1000),
            walk: Duration::from_secs(10),
            move_gap_ms: (50, 100),
            momentum: 0.5,
            chat_chance: 0.0,
            churn: 0.0,
            drop_share: 0.0,
            rejoin_share: 0.0,
        };
        let script = generate(&config, seed);
        eprintln!("{label}: {script}; partition {partition}");
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let fleet = Fleet::start(&script, FleetOptions::new(gateways, "fleet"))?;

        // Everyone logged in, then sample until the walk ends.
        wait_until(
            Instant::now() + Duration::from_secs(15),
            &format!("all {BOTS} bots to log in"),
            || fleet.logged_in().len() == BOTS || fleet.failure().is_some(),
        )?;
        if let Some(failure) = fleet.failure() {
            bail!("{failure}");
        }
        let logged_in: BTreeSet<u64> = fleet.logged_in().into_keys().collect();
        let shards = Sample::shards_of(cluster);
        let mut conservation = Conservation::new(logged_in.clone());
        // Distinct players listed never exceed those logged in (`add` refuses a listed id
        // that is not logged in), and fewer is judged by `add` against the handoffs around
        // the gap: together, the distinct ids add up to the players logged in.
        let walk_ends_by = Instant::now() + script.duration() + OVERRUN;
        while fleet.walking() {
            ensure!(
                Instant::now() < walk_ends_by,
                "the walk overran its {:.1} s schedule by more than {OVERRUN:?}",
                script.duration().as_secs_f64()
            );
            conservation.add(Sample::take(&shards)?)?;
            // Pacing the sampler, so that it does not starve the cluster on two cores.
            std::thread::sleep(SAMPLE_PAUSE);
        }
        let mut players = fleet.finish(OVERRUN)?;
        // The last word on gaps is a sample at rest.
        conservation.add(Sample::take(&shards)?)?;
        let stats = conservation.finish()?;
        eprintln!("{label}: {stats:?}");
        ensure!(
            stats.samples >= 20,
            "only {} samples were taken during the walk: the check saw too little",
            stats.samples
        );
        ensure!(
            stats.max_generation > 0,
            "no player ever changed owner during a walk around the corner: {stats:?}"
        );

        ensure!(players.len() == BOTS, "{} of {BOTS} bots left at the end", players.len());
        let truth = settle(&mut players, SIGHT, Duration::from_secs(5))
            .context("at rest after the walk")?;
        let positions = truth.players.iter().map(|(id, seen)| (*id, seen.position)).collect();
        let resting = Instant::now();
        let (at_rest, _) = owners_at_rest(cluster, &positions, Duration::from_secs(5))
            .context("ownership at rest")?;
        eprintln!(
            "{label}: ownership exact at rest after {:.2} s; partition {at_rest}",
            resting.elapsed().as_secs_f64()
        );
        let counts = status_player_counts(cluster, BOTS as u64, Duration::from_secs(6))?;
        eprintln!("{label}: `meridian status` players by shard: {counts:?}");
        Ok(())
    });
}
