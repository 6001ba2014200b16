//! The shard's Prometheus metrics.

use std::sync::Arc;

use meridian_cluster::ShardId;
use meridian_observe::{Counter, Gauge, Registry};

pub struct ShardMetrics {
    pub players: Arc<Gauge>,
    pub logins: Arc<Counter>,
    pub leaves: Arc<Counter>,
    pub moves: Arc<Counter>,
    pub moves_rate_limited: Arc<Counter>,
    pub chats: Arc<Counter>,
    pub notifications: Arc<Counter>,
    pub delivery_bytes: Arc<Counter>,
    pub batches_in: Arc<Counter>,
    pub batches_out: Arc<Counter>,
    pub links: Arc<Gauge>,
    pub links_cut: Arc<Counter>,
}

impl ShardMetrics {
    pub fn new(registry: &Registry, id: ShardId) -> Self {
        let shard = id.0.to_string();
        let l: &[(&str, &str)] = &[("shard", shard.as_str())];
        ShardMetrics {
            players: registry.gauge("meridian_shard_players", "Players owned by this shard.", l),
            logins: registry.counter("meridian_shard_logins_total", "Players joined.", l),
            leaves: registry.counter("meridian_shard_leaves_total", "Players left.", l),
            moves: registry.counter("meridian_shard_moves_total", "Moves applied.", l),
            moves_rate_limited: registry.counter(
                "meridian_shard_moves_rate_limited_total",
                "Moves refused by the rate limit.",
                l,
            ),
            chats: registry.counter("meridian_shard_chats_total", "Chats spoken.", l),
            notifications: registry.counter(
                "meridian_shard_notifications_total",
                "Server messages produced for clients.",
                l,
            ),
            delivery_bytes: registry.counter(
                "meridian_shard_delivery_bytes_total",
                "Bytes of client frames sent to gateways.",
                l,
            ),
            batches_in: registry.counter("meridian_shard_batches_in_total", "Gateway batches.", l),
            batches_out: registry.counter("meridian_shard_batches_out_total", "Shard batches.", l),
            links: registry.gauge("meridian_shard_gateway_links", "Open gateway streams.", l),
            links_cut: registry.counter(
                "meridian_shard_gateway_links_cut_total",
                "Gateway streams cut because they did not keep up.",
                l,
            ),
        }
    }
}
