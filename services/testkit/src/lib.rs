//! The test kit for Meridian's cross-service tests: start a whole cluster (`meridian up`, with
//! its own etcd) on free ports, drive it with blocking bot clients, and check what the bots see
//! against the rules of DESIGN.md sections 1 and 2.
//!
//! Everything here waits on a condition with a deadline and says what it expected when the
//! deadline passes; nothing sleeps and hopes. Nothing here picks a fixed port: the cluster is
//! started with `--port 0` and its addresses are read from the ready file it writes.
//!
//! This crate is for tests only (`publish = false`). It must never be a dependency of a
//! service crate, and it must never leave a process running after the `Cluster` that started
//! it is dropped.

mod bot;
mod bystander;
mod cluster;
mod http;
pub mod msg;
mod process;
mod view;
mod wait;

pub use bot::{Answer, Bot, LoggedIn, MoveAnswer};
pub use bystander::Bystander;
pub use cluster::{Cluster, ClusterOptions, GatewayInfo, Io, ShardInfo, DEFAULT_LEASE_TTL};
pub use http::http_get;
pub use meridian_protocol::pb;
pub use process::process_alive;
pub use view::{Seen, View};
pub use wait::{deadline, wait_until, DEFAULT_WAIT};
