//! The gateway's side of the relay, beside the workers: the task that keeps one relay link
//! per worker and shard as the cluster view changes, the tasks that connect them, and the
//! shards' health checks.
//!
//! A connecting task dials the shard's gRPC port, does the TLS handshake (with the
//! cluster's mutual TLS), writes the link's magic and hello, and hands the socket to its
//! worker. From then on every batch each way is the worker's alone (`uplink.rs`, driven
//! on the worker's ring or epoll set); the task waits until the worker lets the link go,
//! then connects again, with backoff.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterKeys, ClusterView, EtcdClient, GatewayId, Refusals, ShardId};
use meridian_rpc::backoff::Backoff;
use meridian_rpc::link::{put_frame, MAGIC};
use meridian_rpc::pb::GatewayBatch;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::routing::{Routing, RoutingTable, ShardLink, ShardStatus};
use crate::shared::Mailbox;
use crate::uplink::LinkUp;
use crate::GatewayMetrics;

/// How long connecting a link may take, TLS handshake and hello included.
const CONNECT_WITHIN: Duration = Duration::from_secs(2);

/// One shard's links (one per worker), their connecting tasks and its health check.
/// (A new life of the shard, or a new address, gets a new one.)
struct ShardLinks {
    addr: String,
    incarnation: u64,
    status: Arc<ShardStatus>,
    links: Vec<Arc<ShardLink>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ShardLinks {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What every connecting task needs.
#[derive(Clone)]
pub struct Dialer {
    pub gateway: GatewayId,
    pub metrics: Arc<GatewayMetrics>,
    pub tls: Option<Arc<meridian_tls::NodeTls>>,
    /// Where a shard proven dead is taken out of the cluster (its lease revoked).
    pub etcd: EtcdClient,
    pub keys: ClusterKeys,
}

/// One life of one shard as this gateway's connecting tasks know it: which one, and what
/// their connects met (shared by the workers' tasks, taken only when a connect ends).
struct Target {
    shard: ShardId,
    incarnation: u64,
    addr: String,
    refusals: Mutex<Refusals>,
}

/// Keeps one link per worker to every registered shard, rebuilding the workers' routing
/// tables on every change.
pub async fn maintain_links(
    mut changes: watch::Receiver<ClusterView>,
    routing: Routing,
    mailboxes: Arc<Vec<Mailbox>>,
    dialer: Dialer,
) {
    let mut shards: HashMap<ShardId, ShardLinks> = HashMap::new();
    let mut dead: HashSet<ShardId> = Default::default();
    let mut version = 0;
    loop {
        let view = changes.borrow_and_update().clone();
        // A link to every registered shard, region or not: a draining shard still sends
        // its players' last output and handoff markers until it leaves.
        // A shard that registered again (its lease expired: it was taken for dead and
        // dropped its players) gets new links, as a restarted one at a new address does:
        // its players are restored on it, whether or not the watch showed it gone.
        let wanted: HashMap<ShardId, (String, u64)> = view
            .shards
            .values()
            .map(|record| (record.id, (record.grpc.clone(), record.incarnation)))
            .collect();
        // A shard back under the same id (a lapsed lease renewed, a restart) is not dead:
        // restoring its players later, when its region changes, would pull them off it.
        dead.retain(|id| !wanted.contains_key(id));
        shards.retain(|id, shard| {
            let keep = wanted.get(id) == Some(&(shard.addr.clone(), shard.incarnation));
            if !keep {
                if !view.shards.contains_key(id) {
                    dead.insert(*id);
                }
                // The workers let the links go when they see the new tables (every move
                // in flight answered, the players let go); the tasks end with `shard`.
                info!(shard = %id, "closing relay links");
            }
            keep
        });
        for (id, shard) in &shards {
            if let Some(record) = view.shards.get(id) {
                shard.status.set_serving(record.state == meridian_cluster::ShardState::Serving);
                shard.status.set_load(record.players);
            }
        }
        for (id, (addr, incarnation)) in &wanted {
            if shards.contains_key(id) {
                continue;
            }
            let status = Arc::new(ShardStatus::default());
            let links: Vec<Arc<ShardLink>> = mailboxes
                .iter()
                .map(|_| Arc::new(ShardLink::registered(*id, *incarnation, Arc::clone(&status))))
                .collect();
            let target = Arc::new(Target {
                shard: *id,
                incarnation: *incarnation,
                addr: addr.clone(),
                refusals: Mutex::new(Refusals::default()),
            });
            let mut tasks: Vec<_> = links
                .iter()
                .enumerate()
                .map(|(lane, link)| {
                    tokio::spawn(keep_connected(
                        dialer.clone(),
                        Arc::clone(&target),
                        lane as u32,
                        Arc::clone(link),
                        Arc::clone(&mailboxes),
                    ))
                })
                .collect();
            tasks.push(tokio::spawn(check_health(
                addr.clone(),
                *id,
                Arc::clone(&status),
                dialer.tls.clone(),
            )));
            shards.insert(
                *id,
                ShardLinks { addr: addr.clone(), incarnation: *incarnation, status, links, tasks },
            );
        }
        // A dead shard's players are restored once the coordinator has given its region
        // to others (restoring earlier would send them back to the dead shard's cells).
        let owners = view.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
        let reassigned: Vec<ShardId> =
            dead.iter().filter(|d| !owners.contains(d)).copied().collect();
        version += 1;
        for (worker, table) in routing.iter().enumerate() {
            let mut links: Vec<Arc<ShardLink>> =
                shards.values().filter_map(|s| s.links.get(worker).cloned()).collect();
            links.sort_by_key(|l| l.id);
            table.store(RoutingTable { links, partition: view.partition.clone(), version });
        }
        for mailbox in mailboxes.iter() {
            // The workers let go of links no longer routed when they next look.
            mailbox.wake();
        }
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

/// Connects the link of worker `lane` to a shard, hands it to the worker, waits for the
/// worker to let it go, and connects again, with backoff from 50 ms to 1 s. What each
/// connect met goes into the shard's evidence: refused ones after a link was up prove it
/// dead (`meridian_cluster::Refusals`), and then its lease is revoked.
async fn keep_connected(
    dialer: Dialer,
    target: Arc<Target>,
    lane: u32,
    link: Arc<ShardLink>,
    mailboxes: Arc<Vec<Mailbox>>,
) {
    let addr = &target.addr;
    let mut backoff = Backoff::RECONNECT;
    loop {
        let connected = tokio::time::timeout(CONNECT_WITHIN, connect(&dialer, addr, lane, &link));
        let connected = connected.await;
        let dead = {
            let mut refusals = target.refusals.lock().unwrap_or_else(|e| e.into_inner());
            match &connected {
                Ok(Err(ConnectError::Tcp(error)))
                    if error.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    refusals.refused(Instant::now())
                }
                // The handshake got through: someone listens there.
                Ok(Ok(_)) | Ok(Err(ConnectError::Io(_))) => {
                    refusals.reached();
                    false
                }
                _ => {
                    refusals.inconclusive();
                    false
                }
            }
        };
        if dead {
            tokio::spawn(take_out_dead(dialer.clone(), Arc::clone(&target)));
        }
        match connected {
            Ok(Ok(up)) => {
                let (gone, released) = tokio::sync::oneshot::channel();
                debug!(shard = %link.id, lane, %addr, "relay link connected");
                mailboxes[lane as usize].link_up(LinkUp { gone, ..up }).await;
                // The worker drops its end when it lets the link go (or refuses it).
                let _ = released.await;
                backoff.reset();
            }
            Ok(Err(error)) => {
                dialer.metrics.relay_connect_failures.inc();
                warn!(shard = %link.id, lane, %addr, %error, "relay link did not connect");
            }
            Err(_) => {
                dialer.metrics.relay_connect_failures.inc();
                warn!(shard = %link.id, lane, %addr, "relay link did not connect in time");
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Revokes the lease of a shard this gateway proved dead, so the cluster gives its region
/// away and its players are restored now rather than when the lease's TTL runs out.
async fn take_out_dead(dialer: Dialer, target: Arc<Target>) {
    let (shard, incarnation) = (target.shard, target.incarnation);
    let mut etcd = dialer.etcd.clone();
    let revoked = tokio::time::timeout(
        Duration::from_secs(2),
        meridian_cluster::revoke_dead_shard(&mut etcd, &dialer.keys, shard, incarnation),
    );
    match revoked.await {
        Ok(Ok(true)) => {
            dialer.metrics.shard_deaths_detected.inc();
            warn!(
                %shard,
                incarnation,
                addr = %target.addr,
                "shard's port refuses connections: its process is gone; lease revoked, its \
                 region and players go to the others now"
            );
        }
        Ok(Ok(false)) => debug!(%shard, "shard proven dead had left the cluster already"),
        Ok(Err(error)) => {
            warn!(%shard, %error, "could not revoke a dead shard's lease; it expires with its TTL")
        }
        Err(_) => {
            warn!(%shard, "etcd did not answer the revoke of a dead shard's lease in 2 s; it expires with its TTL")
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("no address for {0}")]
    Resolve(String),
    /// The TCP connect itself failed (refused, unreachable, ...).
    #[error("{0}")]
    Tcp(std::io::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the shard's name is not a TLS server name: {0}")]
    Name(#[from] rustls::pki_types::InvalidDnsNameError),
}

/// Dials the shard, does the TLS handshake if there is TLS, and writes the magic and the
/// hello: a link ready for its worker.
async fn connect(
    dialer: &Dialer,
    addr: &str,
    lane: u32,
    link: &Arc<ShardLink>,
) -> Result<LinkUp, ConnectError> {
    let target: SocketAddr = tokio::net::lookup_host(addr)
        .await
        .map_err(|error| ConnectError::Resolve(format!("{addr}: {error}")))?
        .next()
        .ok_or_else(|| ConnectError::Resolve(addr.to_string()))?;
    let tcp = tokio::net::TcpStream::connect(target).await.map_err(ConnectError::Tcp)?;
    tcp.set_nodelay(true)?;
    let mut hello = MAGIC.to_vec();
    put_frame(&mut hello, &GatewayBatch { gateway_id: dialer.gateway.0, lane, inputs: Vec::new() });
    let (tcp, tls) = match &dialer.tls {
        None => {
            let mut tcp = tcp;
            tcp.write_all(&hello).await?;
            (tcp, None)
        }
        Some(tls) => {
            // With mutual TLS, the shard's certificate must name it.
            let name = rustls::pki_types::ServerName::try_from(format!("shard-{}", link.id.0))?;
            let connector = tokio_rustls::TlsConnector::from(tls.relay_client_config());
            let mut stream = connector.connect(name, tcp).await?;
            stream.write_all(&hello).await?;
            stream.flush().await?;
            let (tcp, session) = stream.into_inner();
            (tcp, Some(Box::new(session)))
        }
    };
    let stream = tcp.into_std()?;
    let (gone, _) = tokio::sync::oneshot::channel();
    Ok(LinkUp { link: Arc::clone(link), stream, tls, gone })
}

/// Checks a shard's gRPC health service every second; the gateway places nobody on a
/// shard that fails it. Ends when aborted (with the shard's links).
async fn check_health(
    addr: String,
    shard: ShardId,
    status: Arc<ShardStatus>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
) {
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut client = None;
    loop {
        tick.tick().await;
        if client.is_none() {
            let name = format!("shard-{}", shard.0);
            if let Ok(endpoint) = meridian_tls::endpoint(&addr, tls.as_deref(), &name) {
                let channel = endpoint
                    .connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy();
                client = Some(tonic_health::pb::health_client::HealthClient::new(channel));
            }
        }
        let Some(health) = client.as_mut() else { continue };
        let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
        let answer = tokio::time::timeout(Duration::from_secs(1), health.check(request));
        let healthy =
            matches!(answer.await, Ok(Ok(response)) if response.get_ref().status == serving);
        match (status.set_healthy(healthy), healthy) {
            (false, true) => info!(%shard, "shard healthy"),
            (true, false) => warn!(%shard, "shard failed its health check"),
            _ => {}
        }
    }
}
