//! What the shard's shell passes between its tasks: the world task's [`Command`]s (from
//! the relay links, the tonic `Peer` service, the saver and the admin routes) and why a
//! relay link was refused ([`LinkRefused`], also the labels of its metric).
//!
//! It imports none of the tasks that use it, so they, the metrics and the core can all
//! depend on it without a circle.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Instant;

use meridian_cluster::ShardId;
use meridian_rpc::link::FrameTooLong;
use meridian_rpc::pb::{PeerMessage, PlayerInput, ShardBatch};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::types::LinkId;

/// Batches a gateway link may have queued before it counts as not keeping up and is cut.
pub const LINK_QUEUE: usize = 1024;

/// A gateway link's output queue, the world task's end: the batches, and the frame bytes
/// in those its writer has not taken yet (what the core's overload rule weighs, with the
/// count). The world task adds a batch's bytes before it queues the batch, and takes them
/// back if the queue refuses it; the writer takes them away as it takes the batch.
#[derive(Clone)]
pub struct LinkOut {
    pub batches: mpsc::Sender<Result<ShardBatch, Status>>,
    pub queued_bytes: Arc<AtomicUsize>,
}

/// What a batch counts for in [`LinkOut::queued_bytes`]: its connections' frame bytes.
pub fn frame_bytes(batch: &ShardBatch) -> usize {
    batch.deliveries.iter().map(|delivery| delivery.frames.len()).sum()
}
pub enum Command {
    /// A gateway lane's link is open; its output goes to `out`.
    Open {
        link: LinkId,
        gateway: u32,
        lane: u32,
        out: LinkOut,
    },
    Inputs {
        link: LinkId,
        inputs: Vec<PlayerInput>,
    },
    Closed {
        link: LinkId,
    },
    Peer {
        from: ShardId,
        messages: Vec<PeerMessage>,
    },
    /// The `/players` report: JSON of the players this shard owns.
    Report {
        reply: oneshot::Sender<String>,
    },
    /// Where this shard's players stand (for the coordinator's load-aware borders), and
    /// its incarnation, for its etcd record.
    Load {
        reply: oneshot::Sender<(meridian_cluster::LoadProfile, u64)>,
    },
    /// Where this shard's players stand on the coarse grid of the live map.
    Density {
        reply: oneshot::Sender<meridian_cluster::DensityReport>,
    },
    /// etcd let this shard's lease expire: the cluster took it for dead (with the partition
    /// read from etcd then, see [`Event::LeaseExpired`]).
    LeaseExpired {
        partition: Option<meridian_cluster::PartitionMap>,
    },
    /// etcd answered a keep-alive sent at `asked` with the lease alive.
    LeaseConfirmed {
        asked: Instant,
    },
    /// The player store has these players' latest saves.
    Saved {
        players: Vec<u64>,
    },
    /// The store's answers to the game's key-value requests.
    KvAnswers {
        replies: Vec<meridian_shard_core::kv::KvReply>,
    },
    /// The persistent entities in the store.
    EntitiesFound {
        records: Vec<meridian_shard_core::EntityRecord>,
    },
    /// The claims the store took.
    EntitiesClaimed {
        records: Vec<meridian_shard_core::EntityRecord>,
    },
    /// The store has every persistent entity write of the rounds up to `through`, but
    /// for `refused` (a newer owner has those).
    EntitiesSaved {
        through: u64,
        refused: Vec<u64>,
    },
    /// The shard is about to exit: save every local player now. Answered once the saves
    /// are queued for the writer.
    SaveAll {
        reply: oneshot::Sender<()>,
    },
    /// How far a drain has got: (local players, handoffs not yet confirmed, whether inputs
    /// for handed-off players have stopped arriving).
    DrainStatus {
        reply: oneshot::Sender<(usize, usize, bool)>,
    },
}

/// Why a link was refused. Each is a label of `meridian_shard_relay_links_refused_total`
/// ([`LinkRefused::label`]); the message is what the gateway is told.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkRefused {
    #[error("not a relay link: it does not start with the relay magic")]
    WrongMagic,
    #[error("no hello in time")]
    NoHello,
    #[error("the link ended before its hello")]
    EndedBeforeHello,
    #[error("{0}")]
    TooLong(#[from] FrameTooLong),
    #[error("a frame that is not a GatewayBatch: {0}")]
    Undecodable(#[from] prost::DecodeError),
    #[error("the client certificate does not name gateway-{0}")]
    NotThatGateway(u32),
    /// The world task ended the link with a reason.
    #[error("{0}")]
    ByShard(String),
}

impl LinkRefused {
    /// Its `reason` label on `meridian_shard_relay_links_refused_total` (one of
    /// [`meridian_shard_core::RELAY_REFUSALS`], where the metric is declared).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            LinkRefused::WrongMagic => "wrong magic",
            LinkRefused::NoHello | LinkRefused::EndedBeforeHello => "no hello",
            LinkRefused::TooLong(_) => "frame too long",
            LinkRefused::Undecodable(_) => "undecodable",
            LinkRefused::NotThatGateway(_) => "certificate",
            LinkRefused::ByShard(_) => "shard",
        }
    }
}

#[cfg(test)]
mod tests {
    use meridian_rpc::pb::GatewayBatch;

    use super::*;

    #[test]
    fn every_refusal_has_a_label_of_its_metric() {
        let refusals = [
            LinkRefused::WrongMagic,
            LinkRefused::NoHello,
            LinkRefused::EndedBeforeHello,
            LinkRefused::TooLong(FrameTooLong(1)),
            LinkRefused::Undecodable(
                <GatewayBatch as prost::Message>::decode(&[0xff_u8][..]).expect_err("garbage"),
            ),
            LinkRefused::NotThatGateway(1),
            LinkRefused::ByShard("x".into()),
        ];
        let labels: std::collections::BTreeSet<_> = refusals.iter().map(|r| r.label()).collect();
        let declared: std::collections::BTreeSet<_> =
            meridian_shard_core::RELAY_REFUSALS.into_iter().collect();
        assert_eq!(labels, declared);
    }
}
