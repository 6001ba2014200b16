//! The Meridian shard's sans-IO core: the one place a shard's world is mutated, as a
//! state machine driven by `(now, event)` ([`core::ShardCore`]), with its parts (see
//! `core.rs`). It is a crate of its own so that the compiler keeps it sans-IO: no tokio,
//! tonic, hyper or etcd-client is below it (`.ci/rooms` checks with `cargo tree`), so it
//! cannot open a socket, spawn a task, sleep or wait on a channel. The shard's shell
//! (`meridian-shard`: the world task, relay links, peer streams, the saver, etcd) drives it;
//! so does the simulator (`meridian-sim`), many cores in one thread from one seed.

mod claims;
pub mod core;
mod fanout;
mod game;
mod game_slot;
mod gateway_links;
mod geometry;
mod ghosts;
mod handoffs;
mod handover;
mod history;
mod inputs;
pub mod kv;
mod messages;
mod metrics;
mod outbox;
mod overload;
mod pause;
mod peers_seen;
mod persistent;
mod persistent_slot;
mod players;
mod reports;
mod resume;
mod roster;
mod routes;
mod saves;
mod sequence;
pub mod types;
mod views;

/// Helpers for the shell's tests (feature `testing`): rounds of output as the core makes
/// them.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use crate::outbox::testing::{big_round, drained};
    pub use crate::outbox::Outbox;
}

pub use geometry::distance;
pub use metrics::{ShardMetrics, KV_OUTCOMES, RELAY_REFUSALS};
pub use types::{
    Backlog, CoreConfig, EntityRecord, EntitySave, Event, LinkId, SaveRecord, Transmit,
};
