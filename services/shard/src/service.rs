//! The tonic face of the shard: turns `Relay` streams into commands for the world task.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::pb::{shard_server::Shard, GatewayBatch, PeerAck, PeerBatch, ShardBatch};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::actor::{Command, LINK_QUEUE};
use crate::peer::EPOCH_HEADER;
use crate::types::LinkId;
use crate::ShardMetrics;

pub struct ShardService {
    commands: mpsc::Sender<Command>,
    next_link: Arc<AtomicU32>,
    view: Arc<EpochCell<ClusterView>>,
    changes: watch::Receiver<ClusterView>,
    metrics: Arc<ShardMetrics>,
    /// Highest batch sequence number taken from each peer (resends are dropped). Locked
    /// once per peer batch, not per message.
    peer_applied: Arc<std::sync::Mutex<std::collections::HashMap<u32, (u64, u64)>>>,
    /// Becomes true when the shard stops serving: every stream's task then ends, so the
    /// server's graceful shutdown does not wait for peers and gateways to hang up first.
    stopping: watch::Receiver<bool>,
    /// With mutual TLS: a `Relay` is taken only from the gateway its certificate names, a
    /// `Peer` only from the shard its certificate names.
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
            next_link: Arc::new(AtomicU32::new(1)),
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
    type RelayStream = ReceiverStream<Result<ShardBatch, Status>>;

    async fn relay(
        &self,
        request: Request<Streaming<GatewayBatch>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        let certs = request.peer_certs();
        let mut inbound = request.into_inner();
        // The first message says which gateway this is (handoffs name the gateway).
        let hello = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("relay stream ended before its hello"))?;
        let (gateway, lane) = (hello.gateway_id, hello.lane);
        let name = format!("gateway-{gateway}");
        check_identity(self.tls.as_deref(), certs.as_deref().map(Vec::as_slice), &name)?;
        let link = LinkId(self.next_link.fetch_add(1, Ordering::Relaxed));
        let (out, out_rx) = mpsc::channel(LINK_QUEUE);
        self.commands
            .send(Command::Open { link, gateway, lane, out })
            .await
            .map_err(|_| Status::unavailable("shard is stopping"))?;
        info!(link = link.0, gateway, "gateway relay opened");
        let commands = self.commands.clone();
        let first = hello.inputs;
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            if !first.is_empty()
                && commands.send(Command::Inputs { link, inputs: first }).await.is_err()
            {
                return;
            }
            loop {
                match next_or_stop(&mut inbound, &mut stopping).await {
                    Some(Ok(batch)) => {
                        // Awaiting here is the backpressure policy: a full world queue slows
                        // the gateway's stream through HTTP/2 flow control; nothing is dropped.
                        let inputs = batch.inputs;
                        if commands.send(Command::Inputs { link, inputs }).await.is_err() {
                            return;
                        }
                    }
                    None => break,
                    Some(Err(status)) => {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use meridian_cluster::{ClusterView, EpochCell, ShardId};
    use meridian_rpc::pb::{
        shard_client::ShardClient, shard_server::ShardServer, GatewayBatch, PeerBatch,
    };
    use meridian_rpc::{MAX_BATCH_BYTES, MAX_DELIVERIES_PER_BATCH, MAX_GRPC_MESSAGE_BYTES};
    use prost::Message;
    use tokio::sync::{mpsc, watch};

    use super::ShardService;
    use crate::actor::Command;
    use crate::outbox::tests::{big_round, drained};
    use crate::outbox::Outbox;

    /// A round's output for one gateway bigger than the gRPC message limit both ends
    /// configure (and than a batch's byte budget per connection) goes through a real
    /// `Relay` stream whole and in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_bigger_than_the_grpc_limit_reaches_the_gateway() {
        const SESSIONS: u64 = 64;
        const CHATS: u64 = 4200;
        let mut outbox = Outbox::default();
        let mut expected = Vec::new();
        for session in 1..=SESSIONS {
            expected.push(big_round(&mut outbox, session, CHATS));
        }
        let total: usize = expected.iter().map(Vec::len).sum();
        assert!(total > MAX_GRPC_MESSAGE_BYTES, "the round is over the limit: {total} bytes");
        assert!(expected[0].len() > MAX_BATCH_BYTES, "so is one connection's part of it");
        let batches = drained(&mut outbox);

        // The shard's real service; this test plays the world task.
        let (commands, mut world) = mpsc::channel(16);
        let (_view_sender, changes) = watch::channel(ClusterView::default());
        let view = Arc::new(EpochCell::new(ClusterView::default()));
        let metrics = Arc::new(crate::ShardMetrics::new(&Default::default(), ShardId(1)));
        let (_stop, stopping) = watch::channel(false);
        let service = ShardService::new(commands, view, changes, metrics, stopping, None);
        let server = ShardServer::new(service)
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("a bound address");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let serve = tonic::transport::Server::builder().add_service(server);
        tokio::spawn(serve.serve_with_incoming(incoming));
        tokio::spawn(async move {
            let mut batches = Some(batches);
            while let Some(command) = world.recv().await {
                if let (Command::Open { out, .. }, Some(batches)) = (command, batches.take()) {
                    for batch in batches {
                        let _ = out.send(Ok(batch)).await;
                    }
                }
            }
        });

        // The gateway's side, configured as the gateway configures it.
        let mut client = ShardClient::connect(format!("http://{addr}"))
            .await
            .expect("connect")
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
        let (upstream, upstream_rx) = mpsc::channel(1);
        upstream
            .send(GatewayBatch { gateway_id: 1, lane: 0, inputs: Vec::new() })
            .await
            .expect("hello");
        let stream = tokio_stream::wrappers::ReceiverStream::new(upstream_rx);
        let mut downstream = client.relay(stream).await.expect("relay").into_inner();
        let mut received: Vec<Vec<u8>> = vec![Vec::new(); SESSIONS as usize];
        let mut move_answers = vec![0u32; SESSIONS as usize];
        let mut positions = vec![None; SESSIONS as usize];
        let mut got = 0;
        while got < total {
            let batch = tokio::time::timeout(Duration::from_secs(60), downstream.message())
                .await
                .expect("the next batch within a minute")
                .expect("the stream carries the whole round")
                .expect("the stream stays open");
            assert!(batch.encoded_len() <= MAX_BATCH_BYTES, "a batch within the byte budget");
            assert!(batch.deliveries.len() <= MAX_DELIVERIES_PER_BATCH, "and the count");
            for delivery in batch.deliveries {
                let index = delivery.session as usize - 1;
                got += delivery.frames.len();
                received[index].extend_from_slice(&delivery.frames);
                move_answers[index] += delivery.move_answers;
                if delivery.position.is_some() {
                    positions[index] = delivery.position;
                }
            }
        }
        for (index, frames) in received.iter().enumerate() {
            assert!(*frames == expected[index], "session {}: every frame, in order", index + 1);
            assert_eq!(move_answers[index], (CHATS / 16) as u32, "every move answer counted");
            let last = (CHATS / 16 * 16) as u32;
            assert_eq!(positions[index], Some(meridian_protocol::pb::Position { x: last, y: 0 }));
        }
        drop(upstream);
    }

    /// A peer (and a gateway) that keep their streams open and never hang up do not hold
    /// the shard's exit: once it stops, it ends every stream itself and the server's
    /// graceful shutdown completes (found by the etcd-stall test: a shard whose peers'
    /// etcd watch lagged waited for them until `meridian up` killed it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_streams_do_not_hold_a_stopping_shard() {
        let (commands, mut world) = mpsc::channel(16);
        let (_view_sender, changes) = watch::channel(ClusterView::default());
        let view = Arc::new(EpochCell::new(ClusterView::default()));
        let metrics = Arc::new(crate::ShardMetrics::new(&Default::default(), ShardId(1)));
        let (stop, stopping) = watch::channel(false);
        let service = ShardService::new(commands, view, changes, metrics, stopping, None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("a bound address");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ShardServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = server_stopped.await;
                }),
        );
        // The world task keeps every link's output sender until the link is closed, as the
        // real one does.
        let (opened, mut links) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut outs = std::collections::HashMap::new();
            while let Some(command) = world.recv().await {
                match command {
                    Command::Open { link, out, .. } => {
                        outs.insert(link, out);
                        let _ = opened.send(()).await;
                    }
                    Command::Closed { link } => {
                        outs.remove(&link);
                    }
                    Command::Peer { .. } => {
                        let _ = opened.send(()).await;
                    }
                    _ => {}
                }
            }
        });

        let mut client = ShardClient::connect(format!("http://{addr}")).await.expect("connect");
        let (gateway, gateway_rx) = mpsc::channel(1);
        gateway
            .send(GatewayBatch { gateway_id: 1, lane: 0, inputs: Vec::new() })
            .await
            .expect("hello");
        let relay = client.relay(tokio_stream::wrappers::ReceiverStream::new(gateway_rx));
        let mut relay = relay.await.expect("relay").into_inner();
        let (peer, peer_rx) = mpsc::channel(1);
        let batch =
            PeerBatch { from_shard: 2, epoch: 0, seq: 1, incarnation: 1, messages: Vec::new() };
        peer.send(batch).await.expect("a batch");
        let acks = client.peer(tokio_stream::wrappers::ReceiverStream::new(peer_rx));
        let mut acks = acks.await.expect("peer").into_inner();
        for _ in 0..2 {
            links.recv().await.expect("the relay opened and the peer batch arrived");
        }
        assert!(acks.message().await.expect("an ack").is_some());

        let _ = stop.send(true);
        let _ = stop_server.send(());
        let stopped = tokio::time::timeout(Duration::from_secs(20), server).await;
        assert!(stopped.is_ok(), "the server stopped with both streams still open at the far end");
        // The shard ended both streams while their far ends still had them open.
        assert!(!matches!(relay.message().await, Ok(Some(_))), "the relay stream ended");
        assert!(!matches!(acks.message().await, Ok(Some(_))), "the peer stream ended");
        drop((peer, gateway));
    }
}
