//! End-to-end tests of the gateway's QUIC front (issue 7): the world and protocol scenarios
//! of the `e2e` target run unchanged over QUIC, TCP and QUIC players share one world,
//! connection migration keeps a session, a dead client leaves by the idle timeout, and bad
//! handshakes are refused without disturbing anyone.
//!
//! Every test starts its own `meridian up` (its gateways always run a QUIC front, with a
//! self-signed dev certificate the bots trust from the ready file).

#[path = "../e2e/common.rs"]
mod common;
#[path = "../e2e/errors.rs"]
mod errors;
#[path = "../e2e/world.rs"]
mod world;

mod idle;
mod migration;
mod mixed;
mod refusal;
mod slow;

pub use common::*;

/// Instantiates each e2e scenario `fn(Front)` as a test over QUIC.
macro_rules! over_quic {
    ($($module:ident :: $scenario:ident),* $(,)?) => {
        mod suite {
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Front::quic(meridian_testkit::Io::Uring))
            })*
        }
    };
}

over_quic! {
    world::login_ok_and_sight_both_ways,
    world::moves_into_and_out_of_sight,
    world::clamped_moves_at_the_edge,
    world::chat_reaches_those_in_sight,
    world::logout_and_abrupt_disconnects,
    errors::errors_before_login_keep_the_connection,
    errors::errors_after_login_keep_the_connection,
    errors::rate_limit,
    errors::closing_errors,
}
