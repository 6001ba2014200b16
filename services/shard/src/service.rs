//! The tonic face of the shard: turns `Peer` streams from other shards into commands for
//! the world task. (Gateways reach the shard on relay links, `link.rs`, on the same port.)

use std::sync::Arc;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::pb::{shard_server::Shard, PeerAck, PeerBatch};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::command::Command;
use crate::peer::EPOCH_HEADER;
use crate::ShardMetrics;

pub struct ShardService {
    commands: mpsc::Sender<Command>,
    view: Arc<EpochCell<ClusterView>>,
    changes: watch::Receiver<ClusterView>,
    metrics: Arc<ShardMetrics>,
    /// Highest batch sequence number taken from each peer (resends are dropped). Locked
    /// once per peer batch, not per message.
    peer_applied: Arc<std::sync::Mutex<std::collections::HashMap<u32, (u64, u64)>>>,
    /// Becomes true when the shard stops serving: every stream's task then ends, so the
    /// server's graceful shutdown does not wait for peers to hang up first.
    stopping: watch::Receiver<bool>,
    /// With mutual TLS: a `Peer` is taken only from the shard its certificate names.
    tls: Option<Arc<meridian_tls::NodeTls>>,
}

/// With mutual TLS, whether the client certificate of `request` names `name`; the stream
/// is refused `PERMISSION_DENIED` otherwise (and counted). Without TLS, anyone is.
fn check_identity(
    tls: Option<&meridian_tls::NodeTls>,
    certs: Option<&[tonic::transport::CertificateDer<'static>]>,
    name: &str,
) -> Result<(), Status> {
    let Some(tls) = tls else { return Ok(()) };
    if meridian_tls::presented_as(certs, name) {
        return Ok(());
    }
    tls.refused();
    warn!(claimed = name, "stream refused: the client's certificate does not name it");
    Err(Status::permission_denied(format!("this connection's certificate does not name {name}")))
}

/// The next message of an inbound stream, or `None` once it ended, failed, or the shard
/// is stopping.
async fn next_or_stop<T>(
    inbound: &mut Streaming<T>,
    stopping: &mut watch::Receiver<bool>,
) -> Option<Result<T, Status>> {
    tokio::select! {
        message = inbound.message() => message.transpose(),
        _ = stopping.wait_for(|stop| *stop) => None,
    }
}

/// How long a peer batch from a newer epoch waits for this shard to see that epoch.
const NEWER_EPOCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl ShardService {
    pub fn new(
        commands: mpsc::Sender<Command>,
        view: Arc<EpochCell<ClusterView>>,
        changes: watch::Receiver<ClusterView>,
        metrics: Arc<ShardMetrics>,
        stopping: watch::Receiver<bool>,
        tls: Option<Arc<meridian_tls::NodeTls>>,
    ) -> Self {
        ShardService {
            commands,
            view,
            changes,
            metrics,
            peer_applied: Default::default(),
            stopping,
            tls,
        }
    }
}

#[tonic::async_trait]
impl Shard for ShardService {
    type PeerStream = ReceiverStream<Result<PeerAck, Status>>;

    async fn peer(
        &self,
        request: Request<Streaming<PeerBatch>>,
    ) -> Result<Response<Self::PeerStream>, Status> {
        let certs = request.peer_certs();
        let tls = self.tls.clone();
        let mut sender: Option<u32> = None;
        let mut inbound = request.into_inner();
        let (acks, acks_rx) = mpsc::channel(64);
        let commands = self.commands.clone();
        let view = Arc::clone(&self.view);
        let mut changes = self.changes.clone();
        let metrics = Arc::clone(&self.metrics);
        let applied = Arc::clone(&self.peer_applied);
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            loop {
                let batch = match next_or_stop(&mut inbound, &mut stopping).await {
                    Some(Ok(batch)) => batch,
                    None | Some(Err(_)) => return,
                };
                // The stream's sender is the shard its certificate names, and every batch
                // on it says so.
                let claimed = match sender {
                    Some(first) if first == batch.from_shard => Ok(()),
                    Some(first) => Err(Status::permission_denied(format!(
                        "a batch from shard {} on shard {first}'s stream",
                        batch.from_shard
                    ))),
                    None => {
                        let name = format!("shard-{}", batch.from_shard);
                        check_identity(tls.as_deref(), certs.as_deref().map(Vec::as_slice), &name)
                    }
                };
                if let Err(status) = claimed {
                    let _ = acks.send(Err(status)).await;
                    return;
                }
                sender = Some(batch.from_shard);
                let mine = view.read(|v| v.partition.as_ref().map(|p| p.epoch).unwrap_or(0));
                if batch.epoch < mine {
                    metrics.stale_epoch_refused.inc();
                    warn!(
                        from = batch.from_shard,
                        epoch = batch.epoch,
                        mine,
                        "peer batch from an older epoch refused"
                    );
                    let mut status = Status::failed_precondition(format!(
                        "stale partition epoch {} (this shard is at {mine})",
                        batch.epoch
                    ));
                    if let Ok(value) = mine.to_string().parse() {
                        status.metadata_mut().insert(EPOCH_HEADER, value);
                    }
                    let _ = acks.send(Err(status)).await;
                    return;
                }
                if batch.epoch > mine {
                    // The peer acts on borders this shard has not seen yet: a player it hands
                    // over would be handed straight back under the old ones. Catch up first.
                    let epoch = |v: &ClusterView| v.partition.as_ref().map_or(0, |p| p.epoch);
                    let caught_up = changes.wait_for(|v| epoch(v) >= batch.epoch);
                    match tokio::time::timeout(NEWER_EPOCH_WAIT, caught_up).await {
                        Ok(Ok(_)) => debug!(
                            from = batch.from_shard,
                            epoch = batch.epoch,
                            mine,
                            "caught up with a peer's epoch"
                        ),
                        Ok(Err(_)) => return,
                        Err(_) => warn!(
                            from = batch.from_shard,
                            epoch = batch.epoch,
                            mine,
                            "peer's newer epoch not seen in time; applying its batch anyway"
                        ),
                    }
                }
                // A batch resent after a reconnect may have been taken already.
                let fresh = {
                    let mut applied = applied.lock().expect("invariant: not poisoned");
                    let last = applied.entry(batch.from_shard).or_insert((batch.incarnation, 0));
                    if last.0 != batch.incarnation {
                        // A new sending task: its sequence starts over.
                        *last = (batch.incarnation, 0);
                    }
                    let fresh = batch.seq > last.1;
                    last.1 = last.1.max(batch.seq);
                    fresh
                };
                if fresh {
                    let command =
                        Command::Peer { from: ShardId(batch.from_shard), messages: batch.messages };
                    if commands.send(command).await.is_err() {
                        return;
                    }
                }
                if acks.send(Ok(PeerAck { applied_seq: batch.seq })).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(acks_rx)))
    }
}
