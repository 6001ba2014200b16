//! Builders of the peer messages the core sends: pure functions of what they carry.

use meridian_protocol::pb as client_pb;
use meridian_rpc::pb::{peer_message::Kind as Peer, GhostStep, GhostUpsert, PeerMessage};
use meridian_world::{PlayerId, Position};

use crate::history::History;

/// A cell as the wire has it.
pub(crate) fn wire(at: Position) -> Option<client_pb::Position> {
    Some(client_pb::Position { x: at.x, y: at.y })
}

/// A ghost's full state: name, cell, game kind, public state, and its last steps (see
/// `GhostUpsert.recent`).
pub(crate) fn upsert_of(
    look: &meridian_world::Look,
    at: Position,
    history: &History,
    player: PlayerId,
) -> GhostUpsert {
    GhostUpsert {
        name: look.name.to_string(),
        position: wire(at),
        kind: look.kind,
        state: look.state.to_vec(),
        recent: recent_steps(history, player),
        persistent: false,
    }
}

/// How many of an entity's last steps a `GhostUpsert` or a `Handoff` carries (a second of
/// steady walking at 16 moves/s). A copy further behind than that leaves and enters again
/// instead of walking (see the world's view diffs).
const STEPS_SENT: usize = 16;

/// The entity's last steps this shard's history holds, for a `GhostUpsert` or a `Handoff`.
pub(crate) fn recent_steps(history: &History, player: PlayerId) -> Vec<GhostStep> {
    let kept = history.steps(player).count();
    history
        .steps(player)
        .skip(kept.saturating_sub(STEPS_SENT))
        .map(|((generation, subject_seq), at)| GhostStep {
            generation,
            subject_seq,
            position: wire(at),
        })
        .collect()
}

/// A message about a player at `generation`.
pub(crate) fn peer(player: PlayerId, generation: u64, kind: Peer) -> PeerMessage {
    PeerMessage { player_id: player.0, generation, subject_seq: 0, kind: Some(kind) }
}

/// A message about a player's state at `version` (generation, position counter).
pub(crate) fn peer_at(player: PlayerId, version: (u64, u64), kind: Peer) -> PeerMessage {
    PeerMessage {
        player_id: player.0,
        generation: version.0,
        subject_seq: version.1,
        kind: Some(kind),
    }
}
