//! The gateway's Prometheus metrics.

use std::sync::Arc;

use meridian_cluster::GatewayId;
use meridian_observe::{Counter, Gauge, Histogram, Registry};
use meridian_protocol::pb::ErrorCode;

use crate::IoBackend;

pub struct GatewayMetrics {
    pub connections: Arc<Gauge>,
    pub accepted: Arc<Counter>,
    pub logins: Arc<Counter>,
    pub frames_in: Arc<Counter>,
    pub bytes_in: Arc<Counter>,
    pub bytes_out: Arc<Counter>,
    pub inputs_relayed: Arc<Counter>,
    pub batches_to_shards: Arc<Counter>,
    pub batches_from_shards: Arc<Counter>,
    pub slow_clients_cut: Arc<Counter>,
    pub relay_queue_full: Arc<Counter>,
    pub quic_connections: Arc<Gauge>,
    pub quic_handshakes: Arc<Counter>,
    pub quic_handshake_failures: Arc<Counter>,
    pub quic_migrations: Arc<Counter>,
    pub quic_handshake_seconds: Arc<Histogram>,
    errors: Vec<(ErrorCode, Arc<Counter>)>,
}

impl GatewayMetrics {
    pub fn new(registry: &Registry, id: GatewayId, io: IoBackend) -> Self {
        let gateway = id.0.to_string();
        let io = io.to_string();
        let l: &[(&str, &str)] = &[("gateway", gateway.as_str())];
        registry
            .gauge(
                "meridian_gateway_io_backend",
                "The event loop in use (value 1).",
                &[("gateway", gateway.as_str()), ("io", io.as_str())],
            )
            .set(1);
        let codes = [
            ErrorCode::Malformed,
            ErrorCode::FrameTooLarge,
            ErrorCode::NotLoggedIn,
            ErrorCode::AlreadyLoggedIn,
            ErrorCode::RateLimited,
            ErrorCode::Unavailable,
            ErrorCode::InvalidToken,
            ErrorCode::ShuttingDown,
            ErrorCode::InvalidArgument,
        ];
        let errors = codes
            .into_iter()
            .map(|code| {
                let counter = registry.counter(
                    "meridian_gateway_errors_total",
                    "Errors sent to clients by the gateway, by code.",
                    &[("gateway", gateway.as_str()), ("code", code.as_str_name())],
                );
                (code, counter)
            })
            .collect();
        GatewayMetrics {
            connections: registry.gauge(
                "meridian_gateway_connections",
                "Open client connections.",
                l,
            ),
            accepted: registry.counter(
                "meridian_gateway_accepted_total",
                "Connections accepted.",
                l,
            ),
            logins: registry.counter(
                "meridian_gateway_logins_total",
                "Logins placed on shards.",
                l,
            ),
            frames_in: registry.counter(
                "meridian_gateway_frames_in_total",
                "Client frames read.",
                l,
            ),
            bytes_in: registry.counter(
                "meridian_gateway_bytes_in_total",
                "Bytes read from clients.",
                l,
            ),
            bytes_out: registry.counter(
                "meridian_gateway_bytes_out_total",
                "Bytes written to clients.",
                l,
            ),
            inputs_relayed: registry.counter(
                "meridian_gateway_inputs_relayed_total",
                "Player inputs sent to shards.",
                l,
            ),
            batches_to_shards: registry.counter(
                "meridian_gateway_batches_to_shards_total",
                "gRPC messages sent to shards.",
                l,
            ),
            batches_from_shards: registry.counter(
                "meridian_gateway_batches_from_shards_total",
                "gRPC messages received from shards.",
                l,
            ),
            slow_clients_cut: registry.counter(
                "meridian_gateway_slow_clients_cut_total",
                "Clients disconnected because their output queue overflowed.",
                l,
            ),
            relay_queue_full: registry.counter(
                "meridian_gateway_relay_queue_full_total",
                "Inputs refused with UNAVAILABLE because a shard's relay queue was full.",
                l,
            ),
            quic_connections: registry.gauge(
                "meridian_gateway_quic_connections",
                "Open QUIC sessions (also counted in meridian_gateway_connections).",
                l,
            ),
            quic_handshakes: registry.counter(
                "meridian_gateway_quic_handshakes_total",
                "QUIC handshakes completed with ALPN meridian/1.",
                l,
            ),
            quic_handshake_failures: registry.counter(
                "meridian_gateway_quic_handshake_failures_total",
                "QUIC connections refused: failed or timed-out handshakes, wrong ALPN.",
                l,
            ),
            quic_migrations: registry.counter(
                "meridian_gateway_quic_migrations_total",
                "QUIC sessions seen arriving from a new client address (connection migration).",
                l,
            ),
            quic_handshake_seconds: registry.histogram(
                "meridian_gateway_quic_handshake_seconds",
                "Time from a QUIC client's first packet to a completed handshake.",
                &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
            ),
            errors,
        }
    }

    pub fn error(&self, code: ErrorCode) {
        if let Some((_, counter)) = self.errors.iter().find(|(c, _)| *c == code) {
            counter.inc();
        }
    }
}
