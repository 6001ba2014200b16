//! End-to-end tests of the `meridian` binary: `meridian up` starts a real etcd, shard and
//! gateway processes on free ports; bots speak the public client protocol to the gateways
//! and check what they receive against DESIGN.md sections 1 (the world) and 2 (the protocol).
//!
//! Every scenario runs once per gateway I/O backend (`mod uring`, `mod epoll`), and every
//! scenario starts its own cluster with a unique name, so tests run in parallel.

mod accounts;
mod cluster_up;
mod errors;
mod etcd_secure;
mod failover;
mod flags;
mod game;
mod joining;
mod mismatch;
mod mtls;
mod resume_close;
mod rotation;
mod saved;
mod shard_failure;
mod stale_epoch;
mod tokens;
mod world;

#[macro_use]
mod common;

pub use common::*;

#[test]
fn a_shard_joins_with_the_data_dir_serves_and_leaves_on_sigterm() {
    joining::a_shard_joins_with_the_data_dir_serves_and_leaves_on_sigterm();
}

#[test]
fn the_coordinator_gives_no_cells_to_a_shard_of_another_transport() {
    mismatch::the_coordinator_gives_no_cells_to_a_shard_of_another_transport();
}

#[test]
fn a_node_of_another_transport_is_refused_and_given_no_cells() {
    mismatch::a_node_of_another_transport_is_refused_and_given_no_cells();
}

#[test]
fn a_shard_takes_streams_only_from_the_node_its_certificate_names() {
    mtls::a_shard_takes_streams_only_from_the_node_its_certificate_names(
        meridian_testkit::Io::Uring.into(),
    );
}

#[test]
fn resume_tokens_of_the_previous_key_work_during_a_rotation_only() {
    rotation::resume_tokens_of_the_previous_key_work_during_a_rotation_only(
        meridian_testkit::Io::Uring.into(),
    );
}

transport_scenarios!(
    for_both_backends,
    cluster_up::up_reports_every_node,
    resume_close::resume_on_a_connection_that_closes_at_once,
    tokens::login_tokens_are_checked_and_keys_rotate,
);
