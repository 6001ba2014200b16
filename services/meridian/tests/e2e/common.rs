//! What the end-to-end scenarios share: the binary under test, a cluster per scenario, and
//! the messages observers expect. Used by the `e2e` and `quic` test targets.

use std::path::Path;

use meridian_protocol::server;
use meridian_testkit::pb::ServerMessage;
use meridian_testkit::{Bot, Cluster, ClusterOptions};

/// The binary under test, built by Cargo for these tests.
pub fn meridian_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meridian"))
}

/// Starts a cluster, runs `scenario` against it and stops it gracefully (SIGTERM, exit 0,
/// no node left). A failure panics while the cluster is still up, so its log is printed.
pub fn with_cluster(opts: ClusterOptions, scenario: impl FnOnce(&Cluster) -> anyhow::Result<()>) {
    let cluster = Cluster::start(meridian_bin(), opts).unwrap_or_else(|e| panic!("{e:?}"));
    if let Err(e) = scenario(&cluster) {
        panic!("{e:?}");
    }
    if let Err(e) = cluster.stop() {
        panic!("stopping the cluster: {e:?}");
    }
}

/// Where bystanders play: far from every other bot of every scenario.
pub const BYSTANDER_HOME: (u32, u32) = (300, 300);

/// What an observer receives when `bot` comes into sight at (x, y).
pub fn entered(bot: &Bot, x: u32, y: u32) -> ServerMessage {
    server::entered(bot.id(), x, y, bot.label())
}

/// What an observer receives when `bot`, in sight, moves to (x, y).
pub fn seen_moving(bot: &Bot, x: u32, y: u32) -> ServerMessage {
    server::moved(bot.id(), x, y, 0)
}

/// The mover's own ack.
pub fn ack(bot: &Bot, x: u32, y: u32, client_time: u64) -> ServerMessage {
    server::moved(bot.id(), x, y, client_time)
}

pub fn left(bot: &Bot) -> ServerMessage {
    server::left(bot.id())
}

pub fn chat_from(bot: &Bot, text: &str) -> ServerMessage {
    server::chat(bot.id(), text)
}

/// Hands `$instantiate` (a macro taking `module::scenario, ...`) every scenario that runs
/// the same over any transport, after the `$extra` ones: the `e2e` target runs them over TCP
/// with both I/O backends, the `quic` target over QUIC, so a new scenario listed here runs
/// over both.
#[allow(unused_macros)]
macro_rules! transport_scenarios {
    ($instantiate:ident $(, $extra_module:ident :: $extra:ident)* $(,)?) => {
        $instantiate! {
            $($extra_module::$extra,)*
            world::login_ok_and_sight_both_ways,
            world::moves_into_and_out_of_sight,
            world::clamped_moves_at_the_edge,
            world::chat_reaches_those_in_sight,
            world::logout_and_abrupt_disconnects,
            errors::errors_before_login_keep_the_connection,
            errors::errors_after_login_keep_the_connection,
            errors::rate_limit,
            errors::closing_errors,
            stale_epoch::stale_epoch_is_refused,
            failover::gateway_death_and_resume,
            shard_failure::shard_kill,
        }
    };
}

/// Instantiates each scenario `fn(Front)` as a test for both gateway backends (the `e2e`
/// and `abuse` targets; the `quic` target has its own).
#[allow(unused_macros)]
macro_rules! for_both_backends {
    ($($module:ident :: $scenario:ident),* $(,)?) => {
        mod uring {
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Io::Uring.into())
            })*
        }
        mod epoll {
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Io::Epoll.into())
            })*
        }
    };
}
