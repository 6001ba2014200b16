//! The shard's Prometheus metrics.

use std::sync::Arc;

use meridian_cluster::ShardId;
use meridian_observe::{Counter, CounterFamily, Gauge, Histogram, Registry};
use meridian_protocol::error_codes;

/// Why the shell refused a gateway's relay link: the `reason` labels of
/// `meridian_shard_relay_links_refused_total` (the shell's `LinkRefused::label`).
pub const RELAY_REFUSALS: [&str; 6] =
    ["wrong magic", "no hello", "frame too long", "undecodable", "certificate", "shard"];

/// The `outcome` labels of `meridian_shard_kv_requests_total`.
pub const KV_OUTCOMES: [&str; 7] =
    ["found", "written", "conflict", "failed", "busy", "too_big", "no_store"];

pub struct ShardMetrics {
    pub players: Arc<Gauge>,
    /// Player saves by outcome: written, refused (a newer owner saved already), failed.
    pub saves: CounterFamily,
    /// Saves waiting for the player store.
    pub saves_pending: Arc<Gauge>,
    /// How long one batch of saves took to write.
    pub save_seconds: Arc<Histogram>,
    pub logins: Arc<Counter>,
    pub leaves: Arc<Counter>,
    pub moves: Arc<Counter>,
    pub moves_rate_limited: Arc<Counter>,
    pub moves_shed: Arc<Counter>,
    pub overload_shed: Arc<Gauge>,
    pub chats: Arc<Counter>,
    pub notifications: Arc<Counter>,
    /// Errors the shard sent to clients (through their gateways), by code.
    pub errors: CounterFamily,
    pub delivery_bytes: Arc<Counter>,
    pub batches_in: Arc<Counter>,
    pub batches_out: Arc<Counter>,
    /// Open relay links (one per gateway lane).
    pub links: Arc<Gauge>,
    pub links_cut: Arc<Counter>,
    /// Relay links refused, by reason (`command::LinkRefused::label`).
    pub relay_links_refused: CounterFamily,
    /// Relay links closed because the gateway said nothing for `meridian_rpc::link::SILENCE`.
    pub relay_links_silent: Arc<Counter>,
    /// Plain connections to the gRPC port dropped for showing nothing in 10 s.
    pub connections_silent: Arc<Counter>,
    pub ghosts: Arc<Gauge>,
    /// Newer owners' ghost updates applied without the old owner's `Released` after 2 s.
    pub ghost_release_timeouts: Arc<Counter>,
    pub handoffs_out: Arc<Counter>,
    pub handoffs_in: Arc<Counter>,
    pub restores: Arc<Counter>,
    pub resumes: Arc<Counter>,
    /// Times the shard found it had not run for longer than its lease (see `ShardCore::handle`).
    pub pauses: Arc<Counter>,
    /// Players taken over by a new login of their account (the old connection: REPLACED).
    pub logins_replaced: Arc<Counter>,
    /// Operators' orders carried out, by kind (`meridian player kick|move`).
    pub player_orders: CounterFamily,
    /// Resume tokens refused by the shard holding their player, by reason.
    pub resume_tokens_refused: CounterFamily,
    pub inputs_forwarded: Arc<Counter>,
    pub peer_messages_in: Arc<Counter>,
    pub peer_messages_out: Arc<Counter>,
    pub peer_rounds_dropped: Arc<Counter>,
    pub stale_epoch_refused: Arc<Counter>,
    pub epoch: Arc<Gauge>,
    /// The game (see `game.rs`).
    pub npcs: Arc<Gauge>,
    pub npcs_spawned: Arc<Counter>,
    pub npcs_despawned: Arc<Counter>,
    pub npcs_restored: Arc<Counter>,
    pub game_ticks: Arc<Counter>,
    pub game_tick_seconds: Arc<Histogram>,
    pub actions: Arc<Counter>,
    pub actions_forwarded: Arc<Counter>,
    pub actions_rejected: Arc<Counter>,
    pub state_changes: Arc<Counter>,
    pub game_events: Arc<Counter>,
    pub game_panics: Arc<Counter>,
    /// The game's key-value requests by outcome (see `kv.rs`).
    pub kv_requests: CounterFamily,
    /// Key-value requests made and not yet answered.
    pub kv_in_flight: Arc<Gauge>,
    /// How long the store took to carry out one key-value request (the shell's).
    pub kv_seconds: Arc<Histogram>,
    /// Persistent entities brought back from the store (their owner was gone).
    pub entities_restored: Arc<Counter>,
    /// Persistent entities dropped here because a newer owner saved them.
    pub entities_fenced_out: Arc<Counter>,
    /// Writes of persistent entities by outcome: written, refused, failed (the shell's).
    pub entity_saves: CounterFamily,
    /// Writes of persistent entities waiting for the store (the shell's).
    pub entity_saves_pending: Arc<Gauge>,
}

impl ShardMetrics {
    pub fn new(registry: &Registry, id: ShardId) -> Self {
        let shard = id.0.to_string();
        let l: &[(&str, &str)] = &[("shard", shard.as_str())];
        ShardMetrics {
            players: registry.gauge("meridian_shard_players", "Players owned by this shard.", l),
            saves: registry.counter_family(
                "meridian_shard_saves_total",
                "Player saves: written, refused (the store holds a save of a newer owner), failed (the write failed; tried again).",
                l,
                "result",
                ["written", "refused", "failed"],
            ),
            saves_pending: registry.gauge(
                "meridian_shard_saves_pending",
                "Player saves waiting for the player store (the newest per player).",
                l,
            ),
            save_seconds: registry.histogram(
                "meridian_shard_save_seconds",
                "How long one batch of player saves took to write.",
                l,
                &[0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0],
            ),
            logins: registry.counter("meridian_shard_logins_total", "Players joined.", l),
            leaves: registry.counter("meridian_shard_leaves_total", "Players left.", l),
            moves: registry.counter("meridian_shard_moves_total", "Moves applied.", l),
            moves_rate_limited: registry.counter(
                "meridian_shard_moves_rate_limited_total",
                "Moves refused by the rate limit.",
                l,
            ),
            moves_shed: registry.counter(
                "meridian_shard_moves_shed_total",
                "Moves refused RATE_LIMITED because the gateways could not take the output as fast as it was made (see overload.rs).",
                l,
            ),
            overload_shed: registry.gauge(
                "meridian_shard_overload_shed_permille",
                "Thousandths of moves the shard refuses right now for overload (0: none).",
                l,
            ),
            chats: registry.counter("meridian_shard_chats_total", "Chats spoken.", l),
            notifications: registry.counter(
                "meridian_shard_notifications_total",
                "Server messages produced for clients.",
                l,
            ),
            errors: registry.counter_family(
                "meridian_shard_errors_total",
                "Errors sent to clients by the shard (through their gateway), by code.",
                l,
                "code",
                error_codes().map(|code| code.as_str_name()),
            ),
            delivery_bytes: registry.counter(
                "meridian_shard_delivery_bytes_total",
                "Bytes of client frames sent to gateways.",
                l,
            ),
            batches_in: registry.counter("meridian_shard_batches_in_total", "Gateway batches.", l),
            batches_out: registry.counter("meridian_shard_batches_out_total", "Shard batches.", l),
            links: registry.gauge(
                "meridian_shard_gateway_links",
                "Open gateway relay links (one per gateway lane, i.e. event-loop worker).",
                l,
            ),
            links_cut: registry.counter(
                "meridian_shard_gateway_links_cut_total",
                "Gateway relay links cut because they did not keep up.",
                l,
            ),
            relay_links_refused: registry.counter_family(
                "meridian_shard_relay_links_refused_total",
                "Gateway relay links refused (told why, then closed), by reason: wrong magic, no \
                 hello in time, frame too long, undecodable frame, a client certificate naming \
                 another gateway, or the shard itself.",
                l,
                "reason",
                RELAY_REFUSALS,
            ),
            relay_links_silent: registry.counter(
                "meridian_shard_relay_links_silent_total",
                "Gateway relay links closed because the gateway sent nothing, not even a \
                 heartbeat, for 3 s (or took nothing written for as long).",
                l,
            ),
            connections_silent: registry.counter(
                "meridian_shard_connections_silent_total",
                "Plain connections to the gRPC port dropped because they sent nothing that says \
                 what they are (an HTTP/2 preface or a relay link's magic) within 10 s.",
                l,
            ),
            ghosts: registry.gauge("meridian_shard_ghosts", "Ghosts of other shards' players.", l),
            ghost_release_timeouts: registry.counter(
                "meridian_shard_ghost_release_timeouts_total",
                "Ghosts whose newer owner's updates were applied without the old owner's Released, after waiting 2 s: the old owner died, or a handoff lost its Released.",
                l,
            ),
            handoffs_out: registry.counter(
                "meridian_shard_handoffs_out_total",
                "Players handed to another shard.",
                l,
            ),
            handoffs_in: registry.counter(
                "meridian_shard_handoffs_in_total",
                "Players taken over from another shard.",
                l,
            ),
            resumes: registry.counter(
                "meridian_shard_resumes_total",
                "Players taken back by a resume token after their connection dropped.",
                l,
            ),
            resume_tokens_refused: registry.counter_family(
                "meridian_shard_resume_tokens_refused_total",
                "Resume tokens refused by the shard holding their player, by reason (spent: \
                 used already, or an older one; other player; unknown key; forged).",
                l,
                "reason",
                ["spent", "other player", "unknown key", "forged"],
            ),
            player_orders: registry.counter_family(
                "meridian_shard_player_orders_total",
                "Operators' orders for players carried out here (meridian player kick|move).",
                l,
                "kind",
                ["kick", "move"],
            ),
            pauses: registry.counter(
                "meridian_shard_pauses_total",
                "Times the shard had not run for longer than its lease and held everything until etcd said whether the lease was alive.",
                l,
            ),
            logins_replaced: registry.counter(
                "meridian_shard_logins_replaced_total",
                "Players taken over by a new login of their account; the old connection got REPLACED.",
                l,
            ),
            restores: registry.counter(
                "meridian_shard_restores_total",
                "Players restored here after their shard died.",
                l,
            ),
            inputs_forwarded: registry.counter(
                "meridian_shard_inputs_forwarded_total",
                "Inputs forwarded to a player's new owner after a handoff.",
                l,
            ),
            peer_messages_in: registry.counter(
                "meridian_shard_peer_messages_in_total",
                "Messages received from other shards.",
                l,
            ),
            peer_messages_out: registry.counter(
                "meridian_shard_peer_messages_out_total",
                "Messages sent to other shards.",
                l,
            ),
            peer_rounds_dropped: registry.counter(
                "meridian_shard_peer_rounds_dropped_total",
                "Rounds of peer messages dropped because a peer stream was full or missing.",
                l,
            ),
            stale_epoch_refused: registry.counter(
                "meridian_shard_stale_epoch_refused_total",
                "Peer batches refused for carrying an older partition epoch.",
                l,
            ),
            epoch: registry.gauge("meridian_shard_partition_epoch", "Partition epoch in use.", l),
            npcs: registry.gauge("meridian_shard_npcs", "NPCs owned by this shard.", l),
            npcs_spawned: registry.counter(
                "meridian_shard_npcs_spawned_total",
                "NPCs the game spawned here.",
                l,
            ),
            npcs_despawned: registry.counter(
                "meridian_shard_npcs_despawned_total",
                "NPCs the game despawned here.",
                l,
            ),
            npcs_restored: registry.counter(
                "meridian_shard_npcs_restored_total",
                "NPCs whose shard died brought back here from a ghost of them.",
                l,
            ),
            game_ticks: registry.counter("meridian_shard_game_ticks_total", "Game ticks run.", l),
            game_tick_seconds: registry.histogram(
                "meridian_shard_game_tick_seconds",
                "How long one game tick took (the game's hook and the state changes it made).",
                l,
                &[0.0001, 0.0005, 0.002, 0.01, 0.05, 0.2, 1.0],
            ),
            actions: registry.counter(
                "meridian_shard_actions_total",
                "Player actions taken in their turn here.",
                l,
            ),
            actions_forwarded: registry.counter(
                "meridian_shard_actions_forwarded_total",
                "Player actions sent to the shard that owns their target.",
                l,
            ),
            actions_rejected: registry.counter(
                "meridian_shard_actions_rejected_total",
                "Player actions answered REJECTED.",
                l,
            ),
            state_changes: registry.counter(
                "meridian_shard_state_changes_total",
                "Public state changes told to observers (at most one per entity per tick).",
                l,
            ),
            game_panics: registry.counter(
                "meridian_shard_game_panics_total",
                "Game hooks that panicked (the shard went on; an action is answered REJECTED).",
                l,
            ),
            game_events: registry.counter(
                "meridian_shard_game_events_total",
                "Game events sent (to one player, or to everyone in sight of an entity).",
                l,
            ),
            kv_requests: registry.counter_family(
                "meridian_shard_kv_requests_total",
                "The game's key-value requests: found, written, conflict (a compare-and-set \
                 lost), failed (the store failed), refused at once: busy (1,024 waiting), \
                 too_big, no_store.",
                l,
                "outcome",
                KV_OUTCOMES,
            ),
            kv_in_flight: registry.gauge(
                "meridian_shard_kv_in_flight",
                "The game's key-value requests waiting for the store (at most 1,024).",
                l,
            ),
            kv_seconds: registry.histogram(
                "meridian_shard_kv_seconds",
                "How long the store took to carry out one of the game's key-value requests.",
                l,
                &[0.0005, 0.002, 0.01, 0.05, 0.2, 1.0, 5.0],
            ),
            entities_restored: registry.counter(
                "meridian_shard_entities_restored_total",
                "Persistent entities brought back from the store here (their owner was gone).",
                l,
            ),
            entities_fenced_out: registry.counter(
                "meridian_shard_entities_fenced_out_total",
                "Persistent entities dropped here: the store had a save of a newer owner.",
                l,
            ),
            entity_saves: registry.counter_family(
                "meridian_shard_entity_saves_total",
                "Writes of persistent entities: written, refused (a newer owner saved it), \
                 failed (the write failed; tried again).",
                l,
                "result",
                ["written", "refused", "failed"],
            ),
            entity_saves_pending: registry.gauge(
                "meridian_shard_entity_saves_pending",
                "Writes of persistent entities waiting for the store (the newest per entity).",
                l,
            ),
        }
    }
}
