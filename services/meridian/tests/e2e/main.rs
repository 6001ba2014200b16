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

mod common;

pub use common::*;

/// Instantiates each scenario `fn(Io)` as a test for both gateway backends.
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
