//! End-to-end tests of the gateway's QUIC front (issue 7): the world, protocol and failure
//! scenarios of the `e2e` target (shard kill and restore, gateway death and Resume, stale
//! epochs) run unchanged over QUIC, TCP and QUIC players share one world,
//! connection migration keeps a session, a dead client leaves by the idle timeout, and bad
//! handshakes are refused without disturbing anyone.
//!
//! Every test starts its own `meridian up` (its gateways always run a QUIC front, with a
//! self-signed dev certificate the bots trust from the ready file).

#[path = "../e2e/common.rs"]
#[macro_use]
mod common;
#[path = "../e2e/errors.rs"]
mod errors;
#[path = "../e2e/failover.rs"]
mod failover;
#[path = "../e2e/shard_failure.rs"]
mod shard_failure;
#[path = "../e2e/stale_epoch.rs"]
mod stale_epoch;
#[path = "../e2e/world.rs"]
mod world;

mod idle;
mod migration;
mod mixed;
mod refusal;
mod slow;
mod walk;

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

transport_scenarios!(over_quic);
