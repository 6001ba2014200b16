//! The test kit for Meridian's cross-service tests: start a whole cluster (`meridian up`, with
//! its own etcd) on free ports, drive it with blocking bot clients, and check what the bots see
//! against the rules of DESIGN.md sections 1 and 2.
//!
//! Everything here waits on a condition with a deadline and says what it expected when the
//! deadline passes; nothing sleeps and hopes. Nothing here picks a fixed port: the cluster is
//! started with `--port 0` and its addresses are read from the ready file it writes.
//!
//! For sharded clusters it also has the machinery of the cross-shard suite: seeded scripts
//! of bot actions aimed at shard borders ([`scenario`], [`Rng`]), a fleet that runs one with
//! a thread per bot ([`Fleet`]), a stricter per-client stream checker ([`StreamCheck`]), the
//! truth every view must equal at rest ([`Truth`], [`settle`]), the partition map's borders
//! and corners ([`Partition`]), the conservation check on the shards' `/players`
//! ([`Conservation`]), and deterministic single-world expectations step by step ([`Scene`]).
//!
//! For the elasticity and failure tests: bots that keep walking until told to stop while
//! the cluster changes under them ([`Walkers`]), and the operator's and the failures' moves
//! on a running cluster: shards that join ([`ExtraShard`]), drains ([`drain_shard`]), etcd
//! stopped and started again ([`stop_etcd`], [`RestartedEtcd`]), with the nodes' counters,
//! readiness and per-shard loads to watch them by ([`metric_total`], [`wait_ready`],
//! [`loads`]).
//!
//! For the operator's view: headless Chromium driving the gateways' live map ([`browser`]:
//! one-shot screenshots and DOM dumps, and a page kept open over the DevTools protocol),
//! and a strict parser of the Prometheus text the admin ports serve ([`Exposition`]).
//!
//! For the abuse tests: a raw client that misbehaves on purpose, what a process costs
//! (`/proc`), labelled counters, and a node stopped with SIGSTOP ([`abuse`]).
//!
//! This crate is for tests only (`publish = false`). It must never be a dependency of a
//! service crate, and it must never leave a process running after the `Cluster` that started
//! it is dropped.

pub mod abuse;
mod bot;
pub mod browser;
mod bystander;
mod cluster;
mod code;
pub mod conservation;
mod elastic;
mod failures;
mod fleet;
mod http;
pub mod msg;
mod outcome;
mod partition;
mod postgres;
mod process;
mod prometheus;
pub mod quic;
mod rest;
mod rng;
pub mod scenario;
mod scene;
mod secure_etcd;
pub mod strangers;
mod stream;
mod truth;
mod view;
mod wait;
mod walk;
pub mod ws;

pub use bot::{Answer, Bot, GameAddr, LoggedIn, MoveAnswer};
pub use bystander::Bystander;
pub use cluster::{
    Cluster, ClusterOptions, CommandRun, Front, GatewayInfo, Io, ShardInfo, Transport,
    DEFAULT_CLUSTER, DEFAULT_LEASE_TTL,
};
pub use conservation::{
    owners_at_rest, owners_at_rest_on, Conservation, ConservationStats, PlayersReport, Sample,
};
pub use elastic::{
    drain_shard, load_ratio, loads, metric_total, stop_etcd, wait_ready, Drained, ExtraShard,
    RestartedEtcd,
};
pub use fleet::{Fleet, FleetOptions, Player};
pub use http::{http_get, http_get_within};
pub use meridian_protocol::pb;
pub use outcome::{chat_round, Outcome};
pub use partition::{wait_for_expected_partition, wait_for_partition, Border, Partition, Region};
pub use postgres::TempPostgres;
pub use process::process_alive;
pub use prometheus::{Exposition, PromFamily, PromSample};
pub use quic::{QuicClient, QuicOptions, QuicTarget};
pub use rest::{ping_all, settle, truth_of};
pub use rng::{test_seed, Rng, SEED_ENV};
pub use scenario::{generate, Action, HotSpots, ScenarioConfig, Script, SlotScript};
pub use scene::Scene;
pub use secure_etcd::{SecureEtcd, ETCD_PASSWORD, ETCD_USER};
pub use stream::{chebyshev, manhattan, step_clamped, HeardChat, StreamCheck, StreamStats};
pub use truth::Truth;
pub use view::{Seen, View};
pub use wait::{deadline, wait_until, DEFAULT_WAIT};
pub use walk::{Area, WalkOptions, WalkerSpec, WalkerStatus, Walkers};
