//! The tonic face of the shard: turns `Relay` streams into commands for the world task.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use meridian_rpc::pb::{shard_server::Shard, GatewayBatch, ShardBatch};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

use crate::actor::{Command, LinkId, LINK_QUEUE};

pub struct ShardService {
    commands: mpsc::Sender<Command>,
    next_link: Arc<AtomicU32>,
}

impl ShardService {
    pub fn new(commands: mpsc::Sender<Command>) -> Self {
        ShardService {
            commands,
            next_link: Arc::new(AtomicU32::new(1)),
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
        let (out, out_rx) = mpsc::channel(LINK_QUEUE);
        self.commands
            .send(Command::Open { link, out })
            .await
            .map_err(|_| Status::unavailable("shard is stopping"))?;
        let commands = self.commands.clone();
        tokio::spawn(async move {
            let mut gateway = 0;
            loop {
                match inbound.message().await {
                    Ok(Some(batch)) => {
                        if batch.gateway_id != 0 && gateway == 0 {
                            gateway = batch.gateway_id;
                            info!(link = link.0, gateway, "gateway relay opened");
                        }
                        // Awaiting here is the backpressure policy: a full world queue slows
                        // the gateway's stream through HTTP/2 flow control; nothing is dropped.
                        if commands
                            .send(Command::Inputs {
                                link,
                                inputs: batch.inputs,
                            })
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
}
