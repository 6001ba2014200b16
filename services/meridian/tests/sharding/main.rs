//! Cross-shard tests of the `meridian` binary: several zone shards behind two gateways must
//! behave, for every client, exactly like one world (DESIGN.md section 1, "single-world
//! equivalence"), and never lose or duplicate a player ("conservation").
//!
//! - `differential`: one seeded script of a few hundred bots near the borders, run against
//!   a one-shard world and against 2x2 (four-way corner) and three-shard (three-way corner)
//!   clusters; every stream checked as it arrives, every view equal to the truth at rest,
//!   and the runs equal to each other.
//! - `conservation`: the shards' `/players` sampled all through a random walk at the corner.
//! - `crossing`: bots walking back and forth across a border under load: no lost ack, no
//!   disconnect, observers' streams exact.
//! - `border`: deterministic walks across borders and around corners, every message of
//!   every bot checked against the single-world rules.
//! - `stale_neighbour`: issue 11's workload: a crowd moving fast across four shards while
//!   the balancer moves the borders; every view exact one second after the last move.
//!
//! Seeded tests print their seed; `MERIDIAN_TEST_SEED=<seed> cargo test -p meridian --test
//! sharding` reruns them with it. The heavy tests run on the io_uring gateway only (the
//! sharding logic does not depend on the gateway's I/O backend); the cheap border tests run
//! on both backends.

mod border;
mod conservation;
mod crossing;
mod differential;
mod stale_neighbour;

use std::path::Path;

use meridian_testkit::{Cluster, ClusterOptions};

/// The binary under test, built by Cargo for these tests.
fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}

/// Starts a cluster, runs `scenario` against it and stops it gracefully. A failure panics
/// while the cluster is still up, so its log is printed; `what` (with the seed, for seeded
/// tests) heads the failure message.
fn with_cluster(
    what: &str,
    opts: ClusterOptions,
    scenario: impl FnOnce(&Cluster) -> anyhow::Result<()>,
) {
    let cluster = Cluster::start(meridian_bin(), opts).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    if let Err(e) = scenario(&cluster) {
        panic!("{what}: {e:?}");
    }
    if let Err(e) = cluster.stop() {
        panic!("{what}: stopping the cluster: {e:?}");
    }
}

/// Map and sight as DESIGN.md fixes them by default.
const MAP: (u32, u32) = (400, 400);
const SIGHT: u32 = 20;

/// Instantiates `fn(Io)` scenarios as tests, in `mod uring` and, for those listed under
/// `both`, in `mod epoll` too.
macro_rules! tests {
    (uring: [$($u_module:ident :: $u_scenario:ident),* $(,)?], both: [$($module:ident :: $scenario:ident),* $(,)?]) => {
        mod uring {
            $(#[test]
            fn $u_scenario() {
                crate::$u_module::$u_scenario(meridian_testkit::Io::Uring)
            })*
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Io::Uring)
            })*
        }
        mod epoll {
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Io::Epoll)
            })*
        }
    };
}

tests! {
    uring: [
        differential::differential_single_world,
        differential::differential_2x2_four_way_corner,
        differential::differential_3_shards_three_way_corner,
        conservation::conservation_at_the_four_way_corner,
        crossing::crossing_under_load_single_world,
        crossing::crossing_under_load_2_shards,
        border::single_world_walks,
        stale_neighbour::stale_neighbour_workload,
    ],
    both: [
        border::sight_across_a_shard_border,
        border::four_way_corner,
        border::three_way_corner,
        border::crossing_observers_see_only_moves,
    ]
}
