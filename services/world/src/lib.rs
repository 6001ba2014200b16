//! The game rules of Meridian (DESIGN.md section 1): a map of cells, players who log in,
//! step, chat and leave, square sight, and exactly the notifications that keep every
//! player's view of the world correct. A zone shard wraps one [`World`] per region; ghosts
//! (players owned by a neighbouring shard, seen but never told anything) let a player near a
//! border see across it as if one server ran the whole map.
//!
//! This crate must never do I/O, spawn threads, read a clock or draw random numbers: time is
//! the `now` its caller passes, and the same calls always produce the same notifications. It
//! is the hot path of a shard, so an event allocates nothing beyond pushing onto the
//! caller's reused `Vec<Envelope>`, names and chat texts are shared `Arc<str>`, and a sight
//! query reads only the 3x3 sectors (of side `view_range`) around a cell.

mod config;
mod diff;
mod ghost;
mod grid;
mod rate;
mod types;
mod world;

pub use config::{ConfigError, ConfigProblem, WorldConfig, MAX_SECTORS};
pub use rate::MoveBudget;
pub use types::{
    Direction, EntityKind, Envelope, Look, Notification, PlayerId, Position, WorldError,
};
pub use world::World;
