//! Shard-to-shard streams: one outgoing `Peer` stream per other registered shard (region
//! owner or not: a draining shard still hands players off and must hear the confirmations),
//! fed once per round of the world task. The receiving side, which fences each batch by
//! epoch, is `service.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::pb::{shard_client::ShardClient, PeerBatch, PeerMessage};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use crate::ShardMetrics;

/// Metadata key carrying the receiver's epoch when it refuses a stale batch.
pub const EPOCH_HEADER: &str = "x-meridian-epoch";

/// Rounds of messages queued for one peer before the world task drops a round (counted in
/// `meridian_shard_peer_rounds_dropped_total`): a peer stuck for this long is broken.
const PEER_QUEUE: usize = 8192;
/// Queued rounds merged into one gRPC message at most.
const MERGE: usize = 64;

/// Senders to the peer tasks, swapped whole when the set of peers changes.
pub type PeerSenders = Arc<EpochCell<HashMap<ShardId, PeerHandle>>>;

/// The world task's end of one peer stream.
#[derive(Clone)]
pub struct PeerHandle {
    pub sender: mpsc::Sender<Vec<PeerMessage>>,
    /// The stream is open (set by the peer task): players are handed only to a peer that is
    /// reachable, never into a stream that is failing.
    pub up: Arc<std::sync::atomic::AtomicBool>,
}

/// Keeps one outgoing stream per other shard that owns a region.
pub async fn maintain_peers(
    me: ShardId,
    mut changes: watch::Receiver<ClusterView>,
    senders: PeerSenders,
    metrics: Arc<ShardMetrics>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
) {
    let mut tasks: HashMap<ShardId, (String, tokio::task::JoinHandle<()>)> = HashMap::new();
    let mut current: HashMap<ShardId, PeerHandle> = HashMap::new();
    loop {
        let view = changes.borrow_and_update().clone();
        // Every registered shard, region or not: a draining shard still hands players off
        // and must hear their new owners confirm.
        let wanted: HashMap<ShardId, String> =
            view.shards.values().filter(|s| s.id != me).map(|s| (s.id, s.grpc.clone())).collect();
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
            let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let epoch_view = changes.clone();
            let task = tokio::spawn(run_peer(
                me,
                *id,
                addr.clone(),
                receiver,
                epoch_view,
                Arc::clone(&metrics),
                Arc::clone(&up),
                tls.clone(),
            ));
            tasks.insert(*id, (addr.clone(), task));
            current.insert(*id, PeerHandle { sender, up });
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
    mut view: watch::Receiver<ClusterView>,
    metrics: Arc<ShardMetrics>,
    up_flag: Arc<std::sync::atomic::AtomicBool>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
) {
    // With mutual TLS, the peer's certificate must name it.
    let name = format!("shard-{}", peer.0);
    let incarnation = rand::random::<u64>();
    let mut sender = PeerSender { me, unconfirmed: VecDeque::new(), next_seq: 1, incarnation };
    // Not reset after a stream that was up: a peer whose streams keep failing is tried
    // again once a second at most, however long each lasted.
    let mut backoff = meridian_rpc::backoff::Backoff::RECONNECT;
    loop {
        let endpoint = meridian_tls::endpoint(&addr, tls.as_deref(), &name);
        let result = match endpoint {
            Ok(endpoint) => {
                sender.stream_once(endpoint, &addr, &mut queue, &view, &metrics, &up_flag).await
            }
            Err(error) => Err(PeerError::Connect(error)),
        };
        up_flag.store(false, std::sync::atomic::Ordering::Release);
        match result {
            Ok(()) => return,
            Err(PeerError::StaleEpoch(theirs)) => {
                // Catch up with the partition the peer already has, then send again.
                info!(%peer, theirs, "peer is at a newer epoch; catching up before resending");
                let caught_up =
                    view.wait_for(|v| v.partition.as_ref().map(|p| p.epoch).unwrap_or(0) >= theirs);
                if tokio::time::timeout(Duration::from_secs(5), caught_up).await.is_err() {
                    warn!(%peer, theirs, "did not see the peer's epoch within 5 s; retrying anyway");
                }
                continue;
            }
            Err(error) => warn!(%peer, %addr, %error, "peer stream failed; reconnecting"),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error("connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("stream: {0}")]
    Stream(#[from] tonic::Status),
    #[error("refused: the peer is at epoch {0}")]
    StaleEpoch(u64),
}

/// The sending half of one ordered pair: batches keep their sequence numbers and stay
/// here until acknowledged, so a refused or broken stream loses nothing that can be sent
/// again.
struct PeerSender {
    me: ShardId,
    unconfirmed: VecDeque<PeerBatch>,
    next_seq: u64,
    incarnation: u64,
}

impl PeerSender {
    /// Numbers new messages as the next batches, kept until acknowledged; returns what to
    /// send, in order.
    ///
    /// Messages are cut into batches within the batch limits, each with its own sequence
    /// number, so none is ever refused for its size: a refused batch would stay first in
    /// line, resent first after every reconnect, and no batch after it would get through.
    /// The receiver takes each batch whole or not at all and acknowledges by number, so
    /// pieces of a round follow the same exactly-once rules as whole rounds. A message
    /// over the gRPC limit on its own cannot be sent at all: it is dropped (and counted
    /// with the dropped rounds) rather than allowed to block the pair for ever.
    fn enqueue(
        &mut self,
        messages: Vec<PeerMessage>,
        epoch: u64,
        metrics: &ShardMetrics,
    ) -> Vec<PeerBatch> {
        let mut batches = Vec::new();
        for messages in meridian_rpc::split_entries(messages, meridian_rpc::PEER_BATCH) {
            if let [only] = messages.as_slice() {
                // (A batch's other fields take far less than this margin.)
                let bytes = meridian_rpc::entry_len(meridian_rpc::PEER_BATCH.tag, only);
                if bytes > meridian_rpc::MAX_GRPC_MESSAGE_BYTES - meridian_rpc::MAX_BATCH_BYTES {
                    metrics.peer_rounds_dropped.inc();
                    warn!(
                        player = only.player_id,
                        bytes, "peer message over the gRPC limit; dropped"
                    );
                    continue;
                }
            }
            let batch = PeerBatch {
                from_shard: self.me.0,
                epoch,
                messages,
                seq: self.next_seq,
                incarnation: self.incarnation,
            };
            self.next_seq += 1;
            if self.unconfirmed.len() >= PEER_QUEUE {
                metrics.peer_rounds_dropped.inc();
                warn!("peer has not acknowledged for too long; dropping its oldest batch");
                self.unconfirmed.pop_front();
            }
            self.unconfirmed.push_back(batch.clone());
            batches.push(batch);
        }
        batches
    }

    /// The peer has taken every batch up to `applied_seq`.
    fn acknowledged(&mut self, applied_seq: u64) {
        while self.unconfirmed.front().is_some_and(|b| b.seq <= applied_seq) {
            self.unconfirmed.pop_front();
        }
    }

    async fn stream_once(
        &mut self,
        endpoint: tonic::transport::Endpoint,
        addr: &str,
        queue: &mut mpsc::Receiver<Vec<PeerMessage>>,
        view: &watch::Receiver<ClusterView>,
        metrics: &ShardMetrics,
        up: &std::sync::atomic::AtomicBool,
    ) -> Result<(), PeerError> {
        let channel = endpoint
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .connect()
            .await?;
        let mut client = ShardClient::new(channel)
            .max_decoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES);
        let (upstream, upstream_rx) = mpsc::channel::<PeerBatch>(PEER_QUEUE);
        let epoch = || view.borrow().partition.as_ref().map(|p| p.epoch).unwrap_or(0);
        // Whatever was not acknowledged goes first, under the epoch we have now.
        for batch in self.unconfirmed.iter_mut() {
            batch.epoch = epoch();
            let _ = upstream.try_send(batch.clone());
        }
        let mut acks = client.peer(ReceiverStream::new(upstream_rx)).await?.into_inner();
        up.store(true, std::sync::atomic::Ordering::Release);
        info!(%addr, resent = self.unconfirmed.len(), "peer stream open");
        let mut rounds = Vec::with_capacity(MERGE);
        loop {
            tokio::select! {
                ack = acks.message() => match ack {
                    Ok(Some(ack)) => self.acknowledged(ack.applied_seq),
                    Ok(None) => {
                        return Err(PeerError::Stream(tonic::Status::unavailable("peer ended the stream")));
                    }
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        let theirs = status
                            .metadata()
                            .get(EPOCH_HEADER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(epoch() + 1);
                        return Err(PeerError::StaleEpoch(theirs));
                    }
                    Err(status) => return Err(PeerError::Stream(status)),
                },
                n = queue.recv_many(&mut rounds, MERGE) => {
                    if n == 0 {
                        return Ok(());
                    }
                    let messages: Vec<PeerMessage> = rounds.drain(..).flatten().collect();
                    metrics.peer_messages_out.add(messages.len() as u64);
                    for batch in self.enqueue(messages, epoch(), metrics) {
                        if upstream.send(batch).await.is_err() {
                            debug!(%addr, "peer stream closed while sending");
                            return Err(PeerError::Stream(tonic::Status::unavailable("stream closed")));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use meridian_protocol::pb::Chat;
    use meridian_rpc::pb::peer_message::Kind;
    use meridian_rpc::{MAX_BATCH_BYTES, MAX_PEER_MESSAGES_PER_BATCH};
    use prost::Message;

    use super::*;

    fn sender() -> PeerSender {
        PeerSender { me: ShardId(1), unconfirmed: VecDeque::new(), next_seq: 1, incarnation: 9 }
    }

    fn metrics() -> ShardMetrics {
        ShardMetrics::new(&Default::default(), ShardId(1))
    }

    fn chat(player_id: u64, len: usize) -> PeerMessage {
        let text = "c".repeat(len);
        PeerMessage {
            player_id,
            generation: 0,
            subject_seq: 0,
            kind: Some(Kind::Chat(Chat { text })),
        }
    }

    /// Rounds merged past the gRPC limit (64 MiB) go as several batches, each within the
    /// budget, numbered one after another, in order; acknowledging one releases exactly
    /// the batches up to it, and the rest are what a reconnect resends.
    #[test]
    fn merged_rounds_over_the_limit_go_as_several_numbered_batches() {
        let mut sender = sender();
        let metrics = metrics();
        let messages: Vec<PeerMessage> = (0..70_000).map(|i| chat(i, 1000)).collect();
        let total: usize = messages.iter().map(Message::encoded_len).sum();
        assert!(total > meridian_rpc::MAX_GRPC_MESSAGE_BYTES, "{total} bytes");
        let batches = sender.enqueue(messages, 5, &metrics);
        assert!(batches.len() > 1, "split");
        let mut next_player = 0;
        for (index, batch) in batches.iter().enumerate() {
            assert!(batch.encoded_len() <= MAX_BATCH_BYTES, "batch {index} within the budget");
            assert!(batch.messages.len() <= MAX_PEER_MESSAGES_PER_BATCH);
            assert_eq!(batch.seq, index as u64 + 1, "consecutive sequence numbers");
            assert_eq!((batch.epoch, batch.incarnation, batch.from_shard), (5, 9, 1));
            for message in &batch.messages {
                assert_eq!(message.player_id, next_player, "in order");
                next_player += 1;
            }
        }
        assert_eq!(next_player, 70_000, "nothing lost");
        assert_eq!(sender.unconfirmed.len(), batches.len(), "all kept until acknowledged");
        sender.acknowledged(2);
        assert_eq!(sender.unconfirmed.front().map(|b| b.seq), Some(3));
        let later = sender.enqueue(vec![chat(1, 10)], 5, &metrics);
        assert_eq!(later[0].seq, batches.len() as u64 + 1, "the numbering goes on");
    }

    /// A message bigger than the batch budget goes alone; one the gRPC limit would refuse
    /// is dropped and takes no sequence number, so the batches around it still go.
    #[test]
    fn a_message_too_big_to_send_is_dropped_and_the_rest_still_goes() {
        let mut sender = sender();
        let metrics = metrics();
        let big = chat(2, 2 * MAX_BATCH_BYTES);
        let huge = chat(4, meridian_rpc::MAX_GRPC_MESSAGE_BYTES);
        let batches =
            sender.enqueue(vec![chat(1, 10), big, chat(3, 10), huge, chat(5, 10)], 1, &metrics);
        let players: Vec<Vec<u64>> =
            batches.iter().map(|b| b.messages.iter().map(|m| m.player_id).collect()).collect();
        assert_eq!(players, vec![vec![1], vec![2], vec![3], vec![5]]);
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4], "no hole in the numbering where the message was");
        assert!(batches.iter().all(|b| b.encoded_len() <= meridian_rpc::MAX_GRPC_MESSAGE_BYTES));
        assert_eq!(metrics.peer_rounds_dropped.get(), 1);
    }
}
