//! The gateway's Prometheus metrics.

use std::sync::Arc;

use meridian_cluster::GatewayId;
use meridian_observe::{Counter, CounterFamily, Gauge, Histogram, Registry};
use meridian_protocol::{error_codes, pb::ErrorCode};

use crate::IoBackend;

/// Upper bounds of the move delay histogram, in seconds.
const MOVE_DELAY_BUCKETS: [f64; 12] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0];

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
    pub relay_links_opened: Arc<Counter>,
    pub relay_links_failed: Arc<Counter>,
    pub relay_connect_failures: Arc<Counter>,
    pub shard_deaths_detected: Arc<Counter>,
    /// From reading a Move to queueing its answer (ack or refusal from the shard) for the
    /// client: the gateway-shard-gateway round trip as the gateway sees it.
    pub move_delay: Arc<Histogram>,
    pub quic_connections: Arc<Gauge>,
    pub ws_connections: Arc<Gauge>,
    pub ws_handshakes: Arc<Counter>,
    pub ws_handshake_failures: Arc<Counter>,
    /// WebSocket frames read that are no whole message by themselves, by kind (`fragment`,
    /// `ping`, `pong`): each paid for from the input budget like a message.
    pub ws_frames_in: CounterFamily,
    pub quic_handshakes: Arc<Counter>,
    pub quic_handshake_failures: Arc<Counter>,
    pub quic_migrations: Arc<Counter>,
    pub quic_handshake_seconds: Arc<Histogram>,
    /// Connections refused before they were served, by reason (`Refusal::reason`).
    pub connections_refused: CounterFamily,
    /// Inputs refused by a per-player rate limit, by kind (`move`, `chat`).
    pub rate_limited: CounterFamily,
    /// Connections closed at a deadline, by which (`login`, `idle`).
    pub deadlines: CounterFamily,
    /// Login token checks, by outcome.
    pub login_tokens: CounterFamily,
    /// JWKS file reloads, by outcome (`loaded`, `failed`).
    pub key_reloads: CounterFamily,
    /// Logins' questions to the player store, by outcome.
    pub store_lookups: CounterFamily,
    pub reads_paused: Arc<Counter>,
    pub input_floods_cut: Arc<Counter>,
    pub output_bytes: Arc<Gauge>,
    pub overload_cuts: Arc<Counter>,
    pub restores: Arc<Counter>,
    pub accept_backoffs: Arc<Counter>,
    pub worker_failures: Arc<Counter>,
    errors: CounterFamily,
}

impl GatewayMetrics {
    pub fn new(registry: &Registry, id: GatewayId, io: IoBackend) -> Self {
        let gateway = id.0.to_string();
        let io = io.to_string();
        let l: &[(&str, &str)] = &[("gateway", gateway.as_str())];
        registry
            .gauge(
                "meridian_gateway_io_backend_info",
                "The event loop in use (value 1).",
                &[("gateway", gateway.as_str()), ("io", io.as_str())],
            )
            .set(1);
        let errors = registry.counter_family(
            "meridian_gateway_errors_total",
            "Errors sent to clients by the gateway, by code.",
            l,
            "code",
            error_codes().map(|code| code.as_str_name()),
        );
        GatewayMetrics {
            connections_refused: registry.counter_family(
                "meridian_gateway_connections_refused_total",
                "Connections refused with UNAVAILABLE before being served, by reason: full (--max-connections or the descriptor limit), overloaded (output budget spent), per_address (--max-connections-per-address), address_rate (--connect-rate).",
                l,
                "reason",
                crate::limits::Refusal::REASONS,
            ),
            rate_limited: registry.counter_family(
                "meridian_gateway_rate_limited_total",
                "Inputs refused with RATE_LIMITED by a per-player limit, by kind.",
                l,
                "kind",
                ["move", "chat", "action"],
            ),
            login_tokens: registry.counter_family(
                "meridian_gateway_login_tokens_total",
                "Login tokens checked, by outcome: ok, missing (none outside dev mode), invalid (malformed, unknown key, bad signature, no sub), expired (exp or nbf).",
                l,
                "result",
                ["ok", "missing", "invalid", "expired"],
            ),
            key_reloads: registry.counter_family(
                "meridian_gateway_key_reloads_total",
                "Re-reads of the login keys' JWKS file after it changed: loaded, or failed (the keys in use were kept).",
                l,
                "result",
                ["loaded", "failed"],
            ),
            store_lookups: registry.counter_family(
                "meridian_gateway_store_lookups_total",
                "Logins' lookups of their account's player in the player store: ok, unavailable (the store failed or no id was free: the client got UNAVAILABLE), busy (too many waiting: UNAVAILABLE at once).",
                l,
                "result",
                ["ok", "unavailable", "busy"],
            ),
            deadlines: registry.counter_family(
                "meridian_gateway_deadline_closes_total",
                "Connections closed at a deadline: login (no Login or Resume in time), idle (nothing received from a logged-in client).",
                l,
                "deadline",
                ["login", "idle"],
            ),
            ws_frames_in: registry.counter_family(
                "meridian_gateway_ws_frames_in_total",
                "WebSocket frames read that are no whole message by themselves, by kind: fragment (a piece of a fragmented message; the message it completes counts in frames_in_total), ping, pong. Each is paid for from the connection's input budget (--input-frame-rate, --input-byte-rate) before it is read.",
                l,
                "kind",
                ["fragment", "ping", "pong"],
            ),
            reads_paused: registry.counter(
                "meridian_gateway_reads_paused_total",
                "Times a connection spent its input budget (frames or bytes per second) and the gateway stopped reading it until the budget refilled.",
                l,
            ),
            input_floods_cut: registry.counter(
                "meridian_gateway_input_floods_cut_total",
                "Connections cut off because input kept arriving while their reading was paused.",
                l,
            ),
            output_bytes: registry.gauge(
                "meridian_gateway_output_bytes",
                "Output queued for all clients of the gateway (as of the last check, every 250 ms).",
                l,
            ),
            overload_cuts: registry.counter(
                "meridian_gateway_overload_cuts_total",
                "Clients cut off because the gateway's total output passed --max-output-total (largest queues first).",
                l,
            ),
            restores: registry.counter(
                "meridian_gateway_restores_total",
                "Players re-joined on a shard after their shard died or their link to it broke.",
                l,
            ),
            accept_backoffs: registry.counter(
                "meridian_gateway_accept_backoffs_total",
                "Times accepting stopped for a moment because the process was out of file descriptors or memory.",
                l,
            ),
            worker_failures: registry.counter(
                "meridian_gateway_worker_failures_total",
                "Event loops that stopped on an error (the gateway then stops and exits non-zero).",
                l,
            ),
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
                "Batches sent to shards on the relay links.",
                l,
            ),
            batches_from_shards: registry.counter(
                "meridian_gateway_batches_from_shards_total",
                "Batches received from shards on the relay links.",
                l,
            ),
            slow_clients_cut: registry.counter(
                "meridian_gateway_slow_clients_cut_total",
                "Clients disconnected because their output queue overflowed.",
                l,
            ),
            relay_queue_full: registry.counter(
                "meridian_gateway_relay_queue_full_total",
                "Inputs that found a shard's relay link full (4 MiB unsent) and waited in the \
                 worker for room.",
                l,
            ),
            relay_links_opened: registry.counter(
                "meridian_gateway_relay_links_opened_total",
                "Relay links to shards connected and taken over by a worker (one per worker \
                 and shard).",
                l,
            ),
            relay_links_failed: registry.counter(
                "meridian_gateway_relay_links_failed_total",
                "Relay links let go: closed or refused by the shard, silent for 3 s, a socket \
                 or TLS error, a bad frame, or the shard left the cluster.",
                l,
            ),
            relay_connect_failures: registry.counter(
                "meridian_gateway_relay_connect_failures_total",
                "Attempts to connect a relay link that failed (connect, TLS handshake, or \
                 its hello); retried with backoff from 50 ms to 1 s.",
                l,
            ),
            shard_deaths_detected: registry.counter(
                "meridian_gateway_shard_deaths_detected_total",
                "Shards this gateway proved dead (their port refused 3 connects in a row over \
                 100 ms after a link to them broke) and took out of the cluster by revoking \
                 their etcd lease, instead of waiting out its TTL.",
                l,
            ),
            move_delay: registry.histogram(
                "meridian_gateway_move_delay_seconds",
                "From reading a client's Move to queueing the shard's answer to it.",
                l,
                &MOVE_DELAY_BUCKETS,
            ),
            quic_connections: registry.gauge(
                "meridian_gateway_quic_connections",
                "Open QUIC sessions (also counted in meridian_gateway_connections).",
                l,
            ),
            ws_connections: registry.gauge(
                "meridian_gateway_ws_connections",
                "Open WebSocket connections, upgraded or not (admitted ones are also counted in \
                 meridian_gateway_connections).",
                l,
            ),
            ws_handshakes: registry.counter(
                "meridian_gateway_ws_handshakes_total",
                "WebSocket upgrades completed.",
                l,
            ),
            ws_handshake_failures: registry.counter(
                "meridian_gateway_ws_handshake_failures_total",
                "WebSocket upgrades refused (an HTTP error), and refused connections closed without a \
                 word past the 64 per worker kept to be told why.",
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
                l,
                &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
            ),
            errors,
        }
    }

    pub fn error(&self, code: ErrorCode) {
        self.errors.inc(code.as_str_name());
    }
}
