//! Abuse tests of the gateway's limits (DESIGN.md section 2b, issue 10) against real
//! processes: `meridian up` starts etcd, shards and gateways; attackers flood chats and
//! pings (and, over WebSocket, empty fragments and ping frames), zig-zag across a shard
//! border, open connections past the caps, stall before logging in or go silent, never
//! read, send garbage and forbidden characters, and a stopped gateway makes the shard cut
//! its link. Every scenario checks what the attacker
//! is told and that the players around it (and a `Bystander` far away) are not disturbed;
//! some also check the gateway's memory and idle CPU.
//!
//! Short deadlines and small bounds are set per cluster through `MERIDIAN_*` variables in
//! the environment of `meridian up`, which its gateways inherit. Each scenario starts its
//! own cluster; the floods and the timed deadlines run one at a time (`with_cluster_alone`)
//! so that neither slows the other on a small machine.

#[path = "../e2e/common.rs"]
#[macro_use]
mod shared;

mod chat_flood;
mod common;
mod connections;
mod deadlines;
mod garbage;
mod link_cut;
mod ping_flood;
mod resume_hop;
mod slow_reader;
mod strangers;
mod text;
mod ws_floods;
mod zigzag;

pub use shared::*;

for_both_backends!(
    chat_flood::chat_flood,
    ping_flood::ping_flood,
    zigzag::border_zigzag,
    connections::connections_per_address,
    connections::connection_rate_per_address,
    connections::gateway_connection_cap,
    deadlines::deadlines,
    slow_reader::never_reading_client,
    slow_reader::many_never_reading_clients,
    garbage::garbage_frames,
    text::control_characters,
    text::impersonating_names,
    ws_floods::ws_fragment_flood,
    ws_floods::ws_ping_flood,
);

/// The gateway-shard link is the same whatever the client backend: io_uring only.
#[test]
fn a_broken_gateway_link_restores_its_players() {
    link_cut::a_broken_gateway_link_restores_its_players();
}

/// The budgets a reconnect brings back are the cores' (the same whatever the client
/// backend): io_uring only.
#[test]
fn reconnecting_buys_no_chats() {
    resume_hop::reconnecting_buys_no_chats();
}

/// The doors before trust are the same whatever the client backend: io_uring only.
#[test]
fn silent_connections_keep_no_relay_out() {
    strangers::silent_connections_keep_no_relay_out();
}

#[test]
fn slow_admin_clients_keep_no_probe_out() {
    strangers::slow_admin_clients_keep_no_probe_out();
}

#[test]
fn quic_connections_without_a_stream_keep_no_client_out() {
    strangers::quic_connections_without_a_stream_keep_no_client_out();
}
