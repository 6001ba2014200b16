//! The tonic face of the shard: turns `Relay` streams into commands for the world task.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::pb::{shard_server::Shard, GatewayBatch, PeerAck, PeerBatch, ShardBatch};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::actor::{Command, LinkId, LINK_QUEUE};
use crate::ShardMetrics;

pub struct ShardService {
    commands: mpsc::Sender<Command>,
    next_link: Arc<AtomicU32>,
    view: Arc<EpochCell<ClusterView>>,
    metrics: Arc<ShardMetrics>,
}

impl ShardService {
    pub fn new(
        commands: mpsc::Sender<Command>,
        view: Arc<EpochCell<ClusterView>>,
        metrics: Arc<ShardMetrics>,
    ) -> Self {
        ShardService {
            commands,
            next_link: Arc::new(AtomicU32::new(1)),
            view,
            metrics,
        }
    }
}

#[tonic::async_trait]
impl Shard for ShardService {
    type RelayStream = ReceiverStream<Result<ShardBatch, Status>>;

    async fn relay(
        &self,
        request: Request<Streaming<GatewayBatch>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        let link = LinkId(self.next_link.fetch_add(1, Ordering::Relaxed));
        let mut inbound = request.into_inner();
        // The first message says which gateway this is (handoffs name the gateway).
        let hello = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("relay stream ended before its hello"))?;
        let gateway = hello.gateway_id;
        let (out, out_rx) = mpsc::channel(LINK_QUEUE);
        self.commands
            .send(Command::Open { link, gateway, out })
            .await
            .map_err(|_| Status::unavailable("shard is stopping"))?;
        info!(link = link.0, gateway, "gateway relay opened");
        let commands = self.commands.clone();
        let first = hello.inputs;
        tokio::spawn(async move {
            if !first.is_empty()
                && commands
                    .send(Command::Inputs {
                        link,
                        inputs: first,
                    })
                    .await
                    .is_err()
            {
                return;
            }
            loop {
                match inbound.message().await {
                    Ok(Some(batch)) => {
                        // Awaiting here is the backpressure policy: a full world queue slows
                        // the gateway's stream through HTTP/2 flow control; nothing is dropped.
                        let inputs = batch.inputs;
                        if commands
                            .send(Command::Inputs { link, inputs })
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(link = link.0, %status, "gateway relay failed");
                        break;
                    }
                }
            }
            info!(link = link.0, gateway, "gateway relay closed");
            let _ = commands.send(Command::Closed { link }).await;
        });
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }

    async fn peer(
        &self,
        request: Request<Streaming<PeerBatch>>,
    ) -> Result<Response<PeerAck>, Status> {
        let mut inbound = request.into_inner();
        while let Some(batch) = inbound.message().await? {
            let mine = self
                .view
                .read(|v| v.partition.as_ref().map(|p| p.epoch).unwrap_or(0));
            if batch.epoch < mine {
                self.metrics.stale_epoch_refused.inc();
                warn!(
                    from = batch.from_shard,
                    epoch = batch.epoch,
                    mine,
                    "peer batch from an older epoch refused"
                );
                return Err(Status::failed_precondition(format!(
                    "stale partition epoch {} (this shard is at {mine})",
                    batch.epoch
                )));
            }
            let command = Command::Peer {
                from: ShardId(batch.from_shard),
                messages: batch.messages,
            };
            self.commands
                .send(command)
                .await
                .map_err(|_| Status::unavailable("shard is stopping"))?;
        }
        Ok(Response::new(PeerAck {}))
    }
}
