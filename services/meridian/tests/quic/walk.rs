//! A seeded random walk of TCP and QUIC players together (every other slot on each
//! transport) across the borders and the four-way corner of a 4-shard map, with chat,
//! logouts, dropped connections and rejoins; at rest every view must equal the truth.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_testkit::{
    generate, settle, test_seed, wait_for_expected_partition, ClusterOptions, Fleet, FleetOptions,
    GameAddr, HotSpots, Io, ScenarioConfig, SEED_ENV,
};

use crate::with_cluster;

const SLOTS: usize = 24;

#[test]
fn tcp_and_quic_players_walk_one_world() {
    let seed = test_seed("quic::walk", 7);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), 4 shards, TCP and QUIC");
    with_cluster(ClusterOptions::new(Io::Uring).shards(4), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let corners: Vec<(u32, u32)> = partition
            .corners()
            .into_iter()
            .filter(|(_, ways)| *ways == 4)
            .map(|(point, _)| point)
            .collect();
        let config = ScenarioConfig {
            slots: SLOTS,
            gateways: 2,
            map: (400, 400),
            view_range: 20,
            hot: HotSpots { borders: partition.borders(), corners },
            corner_share: 0.5,
            spread: 10,
            login_window: Duration::from_millis(800),
            walk: Duration::from_secs(5),
            move_gap_ms: (50, 120),
            momentum: 0.6,
            chat_chance: 0.1,
            churn: 0.3,
            drop_share: 0.5,
            rejoin_share: 0.5,
        };
        let script = generate(&config, seed);
        eprintln!("{label}: {script}; partition {partition}");
        // Slot scripts pick gateway `slot % 2`: TCP for even slots, QUIC for odd ones.
        let fronts: Vec<GameAddr> =
            vec![cluster.game_addr(0).into(), cluster.quic_target(0).into()];
        let fleet = Fleet::start(&script, FleetOptions::new(fronts, label.clone()))?;
        let mut players = fleet.finish(Duration::from_secs(10)).context(label.clone())?;
        let quic = players.iter().filter(|p| p.bot.is_quic()).count();
        ensure!(
            quic > 0 && quic < players.len(),
            "{label}: both transports must be left at the end ({quic} QUIC of {})",
            players.len()
        );
        let truth = settle(&mut players, 20, Duration::from_secs(5)).context(label.clone())?;
        if truth.players.len() != players.len() {
            bail!("{label}: truth has {} players, {} bots", truth.players.len(), players.len());
        }
        eprintln!("{label}: {} players at rest ({quic} over QUIC), views exact", players.len());
        Ok(())
    });
}
