//! End-to-end tests of the `meridian` binary: `meridian up` starts a real etcd, shard and
//! gateway processes on free ports; bots speak the public client protocol to the gateways
//! and check what they receive against DESIGN.md sections 1 (the world) and 2 (the protocol).
//!
//! Every scenario runs once per gateway I/O backend (`mod uring`, `mod epoll`), and every
//! scenario starts its own cluster with a unique name, so tests run in parallel.

mod cluster_up;
mod errors;
mod failover;
mod shard_failure;
mod stale_epoch;
mod world;

use std::path::Path;

use meridian_protocol::server;
use meridian_testkit::pb::ServerMessage;
use meridian_testkit::{Bot, Cluster, ClusterOptions};

/// The binary under test, built by Cargo for these tests.
fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}

/// Starts a cluster, runs `scenario` against it and stops it gracefully (SIGTERM, exit 0,
/// no node left). A failure panics while the cluster is still up, so its log is printed.
fn with_cluster(opts: ClusterOptions, scenario: impl FnOnce(&Cluster) -> anyhow::Result<()>) {
    let cluster = Cluster::start(meridian_bin(), opts).unwrap_or_else(|e| panic!("{e:?}"));
    if let Err(e) = scenario(&cluster) {
        panic!("{e:?}");
    }
    if let Err(e) = cluster.stop() {
        panic!("stopping the cluster: {e:?}");
    }
}

/// Where bystanders play: far from every other bot of every scenario.
const BYSTANDER_HOME: (u32, u32) = (300, 300);

/// What an observer receives when `bot` comes into sight at (x, y).
fn entered(bot: &Bot, x: u32, y: u32) -> ServerMessage {
    server::entered(bot.id(), x, y, bot.label())
}

/// What an observer receives when `bot`, in sight, moves to (x, y).
fn seen_moving(bot: &Bot, x: u32, y: u32) -> ServerMessage {
    server::moved(bot.id(), x, y, 0)
}

/// The mover's own ack.
fn ack(bot: &Bot, x: u32, y: u32, client_time: u64) -> ServerMessage {
    server::moved(bot.id(), x, y, client_time)
}

fn left(bot: &Bot) -> ServerMessage {
    server::left(bot.id())
}

fn chat_from(bot: &Bot, text: &str) -> ServerMessage {
    server::chat(bot.id(), text)
}

/// Instantiates each scenario `fn(Io)` as a test for both gateway backends.
macro_rules! for_both_backends {
    ($($module:ident :: $scenario:ident),* $(,)?) => {
        mod uring {
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

for_both_backends! {
    cluster_up::up_reports_every_node,
    world::login_ok_and_sight_both_ways,
    stale_epoch::stale_epoch_is_refused,
    failover::gateway_death_and_resume,
    world::moves_into_and_out_of_sight,
    world::clamped_moves_at_the_edge,
    world::chat_reaches_those_in_sight,
    world::logout_and_abrupt_disconnects,
    errors::errors_before_login_keep_the_connection,
    errors::errors_after_login_keep_the_connection,
    errors::rate_limit,
    errors::closing_errors,
    shard_failure::shard_kill,
}
