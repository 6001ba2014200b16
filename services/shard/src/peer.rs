//! Shard-to-shard streams: one outgoing `Peer` stream per other region owner, fed once per
//! round of the world task, and the receiving side that fences each batch by epoch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::pb::{shard_client::ShardClient, PeerBatch, PeerMessage};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use crate::ShardMetrics;

/// Rounds of messages queued for one peer before the world task drops a round (counted in
/// `meridian_shard_peer_rounds_dropped_total`): a peer stuck for this long is broken.
const PEER_QUEUE: usize = 8192;
/// Queued rounds merged into one gRPC message at most.
const MERGE: usize = 64;

/// Senders to the peer tasks, swapped whole when the set of peers changes.
pub type PeerSenders = Arc<EpochCell<HashMap<ShardId, mpsc::Sender<Vec<PeerMessage>>>>>;

/// Keeps one outgoing stream per other shard that owns a region.
pub async fn maintain_peers(
    me: ShardId,
    mut changes: watch::Receiver<ClusterView>,
    senders: PeerSenders,
    metrics: Arc<ShardMetrics>,
) {
    let mut tasks: HashMap<ShardId, (String, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut current: HashMap<ShardId, mpsc::Sender<Vec<PeerMessage>>> = HashMap::new();
    loop {
        let view = changes.borrow_and_update().clone();
        let owners = view
            .partition
            .as_ref()
            .map(|p| p.owners())
            .unwrap_or_default();
        let wanted: HashMap<ShardId, String> = owners
            .into_iter()
            .filter(|id| *id != me)
            .filter_map(|id| view.shards.get(&id).map(|s| (id, s.grpc.clone())))
            .collect();
        let before = current.len();
        tasks.retain(|id, (addr, task)| {
            let keep = wanted.get(id) == Some(addr);
            if !keep {
                task.abort();
                current.remove(id);
            }
            keep
        });
        for (id, addr) in &wanted {
            if tasks.contains_key(id) {
                continue;
            }
            let (sender, receiver) = mpsc::channel(PEER_QUEUE);
            let epoch_view = changes.clone();
            let task = tokio::spawn(run_peer(
                me,
                *id,
                addr.clone(),
                receiver,
                epoch_view,
                Arc::clone(&metrics),
            ));
            tasks.insert(*id, (addr.clone(), task));
            current.insert(*id, sender);
        }
        if current.len() != before || !wanted.is_empty() {
            senders.store(current.clone());
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn run_peer(
    me: ShardId,
    peer: ShardId,
    addr: String,
    mut queue: mpsc::Receiver<Vec<PeerMessage>>,
    view: watch::Receiver<ClusterView>,
    metrics: Arc<ShardMetrics>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match stream_once(me, &addr, &mut queue, &view, &metrics).await {
            Ok(()) => return,
            Err(error) => warn!(%peer, %addr, %error, "peer stream failed; reconnecting"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("stream: {0}")]
    Stream(#[from] tonic::Status),
}

async fn stream_once(
    me: ShardId,
    addr: &str,
    queue: &mut mpsc::Receiver<Vec<PeerMessage>>,
    view: &watch::Receiver<ClusterView>,
    metrics: &ShardMetrics,
) -> Result<(), PeerError> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    let mut client = ShardClient::new(channel)
        .max_decoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES);
    let (upstream, upstream_rx) = mpsc::channel::<PeerBatch>(64);
    let mut call = Box::pin(client.peer(ReceiverStream::new(upstream_rx)));
    info!(%addr, "peer stream open");
    let mut rounds = Vec::with_capacity(MERGE);
    loop {
        tokio::select! {
            result = &mut call => {
                result?;
                return Err(PeerError::Stream(tonic::Status::unavailable("peer closed the stream")));
            }
            n = queue.recv_many(&mut rounds, MERGE) => {
                if n == 0 {
                    return Ok(());
                }
                let epoch = view.borrow().partition.as_ref().map(|p| p.epoch).unwrap_or(0);
                let messages: Vec<PeerMessage> = rounds.drain(..).flatten().collect();
                metrics.peer_messages_out.add(messages.len() as u64);
                let batch = PeerBatch { from_shard: me.0, epoch, messages };
                if upstream.send(batch).await.is_err() {
                    debug!(%addr, "peer stream closed while sending");
                    return Err(PeerError::Stream(tonic::Status::unavailable("stream closed")));
                }
            }
        }
    }
}

/// Per-round messages for peers, sent when the round ends.
#[derive(Default)]
pub struct PeerOutbox {
    rounds: HashMap<ShardId, Vec<PeerMessage>>,
}

impl PeerOutbox {
    pub fn push(&mut self, to: ShardId, message: PeerMessage) {
        self.rounds.entry(to).or_default().push(message);
    }

    pub fn flush(&mut self, senders: &PeerSenders, metrics: &ShardMetrics) {
        if self.rounds.values().all(Vec::is_empty) {
            return;
        }
        senders.read(|senders| {
            for (to, messages) in self.rounds.iter_mut() {
                if messages.is_empty() {
                    continue;
                }
                let round = std::mem::take(messages);
                match senders.get(to) {
                    Some(sender) => {
                        if sender.try_send(round).is_err() {
                            metrics.peer_rounds_dropped.inc();
                            warn!(peer = %to, "peer queue full or closed; round dropped");
                        }
                    }
                    None => {
                        metrics.peer_rounds_dropped.inc();
                        warn!(peer = %to, "no stream to peer; round dropped");
                    }
                }
            }
        });
    }
}
