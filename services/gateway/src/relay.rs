//! The gateway's side of the relay: one task per shard holding one bidirectional gRPC
//! stream, plus the task that opens and closes links as the cluster view changes.
//!
//! Upstream, each worker hands over one batch per loop iteration; the link task merges
//! what has queued into one `GatewayBatch` (several when it is over the batch limits).
//! Downstream, each `ShardBatch` is split by the worker that owns each connection and
//! handed over as one mail per worker per batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{ClusterView, GatewayId, ShardId};
use meridian_rpc::pb::{shard_client::ShardClient, Delivery, GatewayBatch, PlayerInput};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{info, warn};

use crate::routing::{Routing, RoutingTable, ShardLink, RELAY_QUEUE};
use crate::shared::{session_worker, Mailbox};
use crate::GatewayMetrics;

/// Queued batches merged into one gRPC message at most.
const MERGE: usize = 64;

struct LinkTask {
    link: Arc<ShardLink>,
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

/// Keeps one link per region-owning shard, rebuilding the routing table on every change.
pub async fn maintain_links(
    gateway: GatewayId,
    mut changes: watch::Receiver<ClusterView>,
    routing: Routing,
    mailboxes: Arc<Vec<Mailbox>>,
    metrics: Arc<GatewayMetrics>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
) {
    let mut tasks: HashMap<ShardId, LinkTask> = HashMap::new();
    let mut dead: std::collections::HashSet<ShardId> = Default::default();
    loop {
        let view = changes.borrow_and_update().clone();
        // A link to every registered shard, region or not: a draining shard still sends
        // its players' last output and handoff markers until it leaves.
        // A shard that registered again (its lease expired: it was taken for dead and
        // dropped its players) gets a new link, as a restarted one at a new address does:
        // its players are restored on it, whether or not the watch showed it gone.
        let wanted: HashMap<ShardId, (String, u64)> = view
            .shards
            .values()
            .map(|record| (record.id, (record.grpc.clone(), record.incarnation)))
            .collect();
        // A shard back under the same id (a lapsed lease renewed, a restart) is not dead:
        // restoring its players later, when its region changes, would pull them off it.
        dead.retain(|id| !wanted.contains_key(id));
        tasks.retain(|id, task| {
            let keep = wanted.get(id) == Some(&(task.addr.clone(), task.link.incarnation));
            if !keep && !view.shards.contains_key(id) {
                dead.insert(*id);
            }
            if !keep {
                info!(shard = %id, "closing relay link");
                task.link.set_up(false);
                task.task.abort();
                // The aborted task cannot answer what its stream took: the workers do, as
                // after a stream failure (every move in flight gets UNAVAILABLE, its players
                // are restored), instead of leaving those moves unanswered for good.
                let (link, mailboxes) = (Arc::clone(&task.link), Arc::clone(&mailboxes));
                tokio::spawn(async move {
                    let confirmations =
                        mailboxes.iter().map(|mailbox| mailbox.link_down(Arc::clone(&link)));
                    let all = futures_join_all(confirmations);
                    if tokio::time::timeout(Duration::from_secs(2), all).await.is_err() {
                        warn!(shard = %link.id, "a worker did not confirm a closed link in time");
                    }
                });
            }
            keep
        });
        for (id, task) in &tasks {
            if let Some(record) = view.shards.get(id) {
                task.link.set_serving(record.state == meridian_cluster::ShardState::Serving);
                task.link.set_load(record.players);
            }
        }
        for (id, (addr, incarnation)) in &wanted {
            if tasks.contains_key(id) {
                continue;
            }
            let (sender, receiver) = mpsc::channel(RELAY_QUEUE);
            let link = Arc::new(ShardLink::registered(*id, *incarnation, sender));
            let task = tokio::spawn(run_link(
                gateway,
                addr.clone(),
                Arc::clone(&link),
                receiver,
                Arc::clone(&mailboxes),
                Arc::clone(&metrics),
                tls.clone(),
            ));
            tasks.insert(*id, LinkTask { link, addr: addr.clone(), task });
        }
        // A dead shard's players are restored once the coordinator has given its region
        // to others (restoring earlier would send them back to the dead shard's cells).
        let owners = view.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
        let reassigned: Vec<ShardId> =
            dead.iter().filter(|d| !owners.contains(d)).copied().collect();
        let mut links: Vec<Arc<ShardLink>> = tasks.values().map(|t| Arc::clone(&t.link)).collect();
        links.sort_by_key(|l| l.id);
        routing.table.store(RoutingTable { links, partition: view.partition.clone() });
        for gone in reassigned {
            dead.remove(&gone);
            info!(shard = %gone, "shard gone and its region reassigned; restoring its players");
            for mailbox in mailboxes.iter() {
                mailbox.restore(gone).await;
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn run_link(
    gateway: GatewayId,
    addr: String,
    link: Arc<ShardLink>,
    mut inputs: mpsc::Receiver<Vec<PlayerInput>>,
    mailboxes: Arc<Vec<Mailbox>>,
    metrics: Arc<GatewayMetrics>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
) {
    let mut backoff = Duration::from_millis(50);
    // With mutual TLS, the shard's certificate must name it.
    let name = format!("shard-{}", link.id.0);
    loop {
        let relayed = match meridian_tls::endpoint(&addr, tls.as_deref(), &name) {
            Ok(endpoint) => {
                relay_once(gateway, endpoint, &addr, &link, &mut inputs, &mailboxes, &metrics).await
            }
            Err(error) => Err(RelayError::Connect(error)),
        };
        match relayed {
            Ok(()) => info!(shard = %link.id, "relay stream ended"),
            Err(error) => warn!(shard = %link.id, %addr, %error, "relay stream failed"),
        }
        if link.is_up() {
            backoff = Duration::from_millis(50);
        }
        link.set_up(false);
        // Workers answer the moves the dead stream took with it; once all have confirmed,
        // nothing queued before the failure can still arrive, and the queue is emptied so
        // none of it reaches the next stream (it was answered already).
        let confirmations = mailboxes.iter().map(|mailbox| mailbox.link_down(Arc::clone(&link)));
        if tokio::time::timeout(Duration::from_secs(2), futures_join_all(confirmations))
            .await
            .is_err()
        {
            warn!(shard = %link.id, "a worker did not confirm the link failure in time");
        }
        while inputs.try_recv().is_ok() {}
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("stream: {0}")]
    Stream(#[from] tonic::Status),
}

async fn relay_once(
    gateway: GatewayId,
    endpoint: tonic::transport::Endpoint,
    addr: &str,
    link: &Arc<ShardLink>,
    inputs: &mut mpsc::Receiver<Vec<PlayerInput>>,
    mailboxes: &[Mailbox],
    metrics: &GatewayMetrics,
) -> Result<(), RelayError> {
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2));
    let channel = endpoint.connect().await?;
    let _health = HealthCheck::start(channel.clone(), Arc::clone(link));
    let mut client = ShardClient::new(channel)
        .max_decoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES);
    let (upstream, upstream_rx) = mpsc::channel::<GatewayBatch>(64);
    let hello = GatewayBatch { gateway_id: gateway.0, inputs: Vec::new() };
    // The receiver is alive (held just below), so this cannot fail.
    let _ = upstream.send(hello).await;
    let mut downstream = client.relay(ReceiverStream::new(upstream_rx)).await?.into_inner();
    link.set_healthy(true);
    link.set_up(true);
    info!(shard = %link.id, %addr, "relay stream open");
    let mut queued: Vec<Vec<PlayerInput>> = Vec::with_capacity(MERGE);
    let mut per_worker: Vec<Vec<Delivery>> = mailboxes.iter().map(|_| Vec::new()).collect();
    loop {
        tokio::select! {
            n = inputs.recv_many(&mut queued, MERGE) => {
                if n == 0 {
                    return Ok(());
                }
                for batch in merge(&mut queued) {
                    metrics.inputs_relayed.add(batch.inputs.len() as u64);
                    metrics.batches_to_shards.inc();
                    if upstream.send(batch).await.is_err() {
                        return Ok(());
                    }
                }
            }
            message = downstream.message() => {
                let Some(batch) = message? else { return Ok(()) };
                metrics.batches_from_shards.inc();
                for delivery in batch.deliveries {
                    let worker = session_worker(delivery.session);
                    if let Some(slot) = per_worker.get_mut(worker) {
                        slot.push(delivery);
                    }
                }
                for (worker, deliveries) in per_worker.iter_mut().enumerate() {
                    if !deliveries.is_empty() {
                        mailboxes[worker].deliver(link.id, std::mem::take(deliveries)).await;
                    }
                }
            }
        }
    }
}

/// The workers' queued batches as the messages to send, in order; leaves `queued` empty.
/// Merged up to the batch limits: however much has queued, no message is one the shard
/// would refuse for its size (that would end the stream and cost every player on it their
/// moves in flight). A player's inputs stay in order across the pieces: they follow each
/// other on the one stream.
fn merge(queued: &mut Vec<Vec<PlayerInput>>) -> Vec<GatewayBatch> {
    let inputs = if queued.len() == 1 {
        queued.pop().expect("invariant: one queued batch")
    } else {
        let mut inputs = Vec::with_capacity(queued.iter().map(Vec::len).sum());
        for part in queued.drain(..) {
            inputs.extend(part);
        }
        inputs
    };
    meridian_rpc::split_entries(inputs, meridian_rpc::GATEWAY_BATCH)
        .into_iter()
        .map(|inputs| GatewayBatch { gateway_id: 0, inputs })
        .collect()
}

/// Awaits every future, in any order (a few per link failure; no extra crate needed).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    for future in futures {
        future.await;
    }
}

/// Checks a shard's gRPC health service every second on the relay's own channel; the
/// gateway places nobody on a shard that fails it. Stops when dropped.
struct HealthCheck(tokio::task::JoinHandle<()>);

impl HealthCheck {
    fn start(channel: tonic::transport::Channel, link: Arc<ShardLink>) -> HealthCheck {
        HealthCheck(tokio::spawn(async move {
            let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
            loop {
                tick.tick().await;
                let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
                let answer = tokio::time::timeout(Duration::from_secs(1), client.check(request));
                let healthy = matches!(
                    answer.await,
                    Ok(Ok(response)) if response.get_ref().status == serving
                );
                match (link.set_healthy(healthy), healthy) {
                    (false, true) => info!(shard = %link.id, "shard healthy"),
                    (true, false) => warn!(shard = %link.id, "shard failed its health check"),
                    _ => {}
                }
            }
        }))
    }
}

impl Drop for HealthCheck {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use meridian_protocol::pb::{Chat, Ping};
    use meridian_rpc::pb::player_input::Kind;
    use meridian_rpc::{MAX_BATCH_BYTES, MAX_GRPC_MESSAGE_BYTES, MAX_INPUTS_PER_BATCH};
    use prost::Message;

    use super::*;

    fn input(seq: u64, kind: Kind) -> PlayerInput {
        PlayerInput { session: 1, player_id: 2, seq, kind: Some(kind) }
    }

    /// Checks every batch against the limits and returns the seqs it carried, in order.
    fn sent_seqs(batches: &[GatewayBatch]) -> Vec<u64> {
        for batch in batches {
            assert!(batch.encoded_len() <= MAX_BATCH_BYTES, "a batch within the byte budget");
            assert!(batch.inputs.len() <= MAX_INPUTS_PER_BATCH, "and the count");
        }
        batches.iter().flat_map(|b| b.inputs.iter().map(|i| i.seq)).collect()
    }

    /// MERGE worker batches of the longest chats add up to more than the gRPC limit: they
    /// go as several messages, in order.
    #[test]
    fn merged_inputs_over_the_grpc_limit_go_as_several_batches_in_order() {
        let text = "x".repeat(256);
        let mut seq = 0;
        let mut queued: Vec<Vec<PlayerInput>> = (0..MERGE)
            .map(|_| {
                (0..4000)
                    .map(|_| {
                        seq += 1;
                        input(seq, Kind::Chat(Chat { text: text.clone() }))
                    })
                    .collect()
            })
            .collect();
        let total: usize = queued.iter().flatten().map(Message::encoded_len).sum();
        assert!(total > MAX_GRPC_MESSAGE_BYTES, "{total} bytes");
        let batches = merge(&mut queued);
        assert!(queued.is_empty());
        assert_eq!(sent_seqs(&batches), (1..=seq).collect::<Vec<_>>());
    }

    #[test]
    fn many_small_inputs_are_split_by_count() {
        let many: Vec<PlayerInput> =
            (1..=10_000).map(|seq| input(seq, Kind::Ping(Ping { client_time: seq }))).collect();
        let batches = merge(&mut vec![many]);
        assert_eq!(batches.len(), 3);
        assert_eq!(sent_seqs(&batches), (1..=10_000).collect::<Vec<_>>());
    }
}
