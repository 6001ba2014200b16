//! The Meridian gateway: terminates client TCP and relays each player to its shard.
//!
//! One worker thread per core, each with its own event loop (io_uring by default, epoll
//! as fallback and baseline), its own listener (SO_REUSEPORT), its own connections and
//! buffers: workers share nothing on the per-message path but a lock-free routing table.
//! Frames are checked by the sans-IO codec, answered locally where the gateway can (ping,
//! protocol errors), and otherwise batched per loop iteration onto the worker's own relay
//! link to each shard (length-prefixed frames on TCP, no gRPC). Shards answer with
//! ready-made frames that the worker appends to the client's bounded output queue without
//! re-encoding them.
//!
//! Only this crate touches io_uring. It never applies game rules: the shard does.

pub mod accounts;
mod epoll;
mod ids;
pub mod map;
mod metrics;
mod play;
mod quic;
mod quic_tls;
mod relay;
mod shared;
mod shell;
mod sockets;
mod uplink;
mod uring;
mod websocket;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{
    until_etcd_answers, ClusterError, ClusterKeys, ClusterWatch, EtcdContact, GatewayId,
    GatewayRecord, Registration, START_PATIENCE,
};
use meridian_observe::{serve_admin_with, Readiness, Registry};
use tokio::net::TcpListener;
use tracing::{info, warn};

/// The session core the event loops drive (a crate of its own, sans-IO).
use meridian_gateway_core as core;
use meridian_gateway_core::routing;
pub use meridian_gateway_core::{limits, GatewayMetrics, IoBackend, Placement};
pub use quic::QuicFront;
pub use quic_tls::{PresentedCert, QuicCert, QuicSetupError, QuicTimeouts, ALPN};
pub use sockets::bind_game_listener;
pub use sockets::raise_open_files_limit;
pub use websocket::{WsFront, SUBPROTOCOL as WS_SUBPROTOCOL};

/// File descriptors kept out of reach of client connections (gRPC links to shards, etcd,
/// the admin port, the rings and eventfds); a quarter of the limit where that is less.
pub const FD_RESERVE: usize = 512;

/// Admin pages anyone may read: the game's page (it names nobody; it is how players in a
/// browser get in). Everything else beyond probes and metrics needs the admin token.
const PUBLIC_PAGES: &[&str] = &["/play", "/play.html"];

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub placement: Placement,
    pub id: GatewayId,
    pub cluster: String,
    pub etcd: meridian_cluster::Etcd,
    pub io: IoBackend,
    pub workers: usize,
    /// Largest frame body accepted from or sent to a client.
    pub max_frame: usize,
    /// Bytes of unsent output a client may have queued before it is cut off.
    pub max_output_bytes: usize,
    /// Connection caps, rate limits and deadlines (see `limits`).
    pub limits: limits::Limits,
    pub dev_mode: bool,
    pub lease_ttl: Duration,
    /// Checks the resume tokens clients present.
    pub resume_keys: meridian_protocol::TokenKeys,
    /// Who may read the admin port's pages that name players (`/map`, `/map.json`), and
    /// the token presented to the shards' `/density`.
    pub admin: meridian_observe::Private,
    /// The admin address others reach, if not the listener's own.
    pub advertise_admin: Option<String>,
    /// The game address clients are told about, if not the listener's own.
    pub advertise: Option<String>,
    /// The JWKS file of the login service's public keys (`--jwks`); re-read when it
    /// changes. Without it, only dev mode's development key is accepted.
    pub jwks: Option<std::path::PathBuf>,
    /// The player store (`--store`): each account keeps its player id and saved cell.
    /// Without it every login is a new player.
    pub accounts: Option<accounts::Accounts>,
    /// Mutual TLS on the streams to the shards (see `meridian_tls`); plain gRPC without.
    pub tls: Option<Arc<meridian_tls::NodeTls>>,
}

impl GatewayConfig {
    /// What the session core decides with, for workers running `io`.
    pub fn core(&self, io: IoBackend) -> meridian_gateway_core::CoreConfig {
        meridian_gateway_core::CoreConfig {
            placement: self.placement,
            gateway: self.id,
            io,
            max_frame: self.max_frame,
            max_output_bytes: self.max_output_bytes,
            limits: self.limits.clone(),
            dev_mode: self.dev_mode,
            resume_keys: self.resume_keys.clone(),
            store: self.accounts.is_some(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("etcd: {0}")]
    Cluster(ClusterError),
    /// Its transport does not match the cluster's: it did not join (the message says what
    /// to start it with instead).
    #[error("{0}")]
    Incompatible(Box<meridian_cluster::Incompatible>),
    #[error("cannot set up the game listener on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start worker {index}: {source}")]
    Worker { index: usize, source: std::io::Error },
    #[error("cannot read a listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("an event loop failed (see the log); the gateway stopped")]
    WorkerFailed,
    #[error("login keys: {0}")]
    Keys(String),
}

impl From<ClusterError> for GatewayError {
    fn from(error: ClusterError) -> Self {
        match error {
            ClusterError::Incompatible(refused) => GatewayError::Incompatible(refused),
            other => GatewayError::Cluster(other),
        }
    }
}

/// Runs a gateway until `shutdown` resolves. `game` is the client listener (its address is
/// reused by every worker with SO_REUSEPORT); `quic`, if given, is the QUIC front (one more
/// worker, after the TCP ones); `ws`, if given, is the WebSocket front (one more);
/// `admin` serves the admin endpoints.
pub async fn run(
    config: GatewayConfig,
    game: std::net::TcpListener,
    quic: Option<QuicFront>,
    ws: Option<WsFront>,
    admin: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), GatewayError> {
    let game_addr = game.local_addr().map_err(GatewayError::Listener)?;
    let mut config = config;
    // Client connections may use every descriptor but a reserve, so that gRPC to the
    // shards, etcd and the admin port keep working when clients take all they can.
    match sockets::raise_open_files_limit() {
        Ok(open_files) => {
            let open_files = usize::try_from(open_files).unwrap_or(usize::MAX);
            // A small limit (a tight container) keeps a quarter for the reserve instead.
            let reserve = FD_RESERVE.min(open_files / 4);
            let room = open_files - reserve;
            if room < config.limits.max_connections {
                info!(
                    open_files,
                    reserve,
                    max_connections = room,
                    "client connections capped by the open-files limit"
                );
                config.limits.max_connections = room;
            }
        }
        Err(error) => warn!(%error, "cannot read or raise the open-files limit"),
    }
    let admin_addr = admin.local_addr().map_err(GatewayError::Listener)?;
    let keys = ClusterKeys::new(&config.cluster);
    let client = meridian_cluster::connect(&config.etcd).await?;
    // Shared by the watch and the registration: records that lapse while etcd stalls are
    // kept for a grace period instead of being taken for deaths (which would close the
    // relay links to every shard).
    let contact = EtcdContact::new(meridian_cluster::lapse_grace(config.lease_ttl));
    let reading = format!("reading the cluster ({})", config.etcd.running_at());
    let watch = until_etcd_answers(&reading, START_PATIENCE, || {
        ClusterWatch::start_with(client.clone(), keys.clone(), contact.clone())
    })
    .await?;
    // A gateway whose links the shards cannot speak (TLS or not, another CA, another
    // protocol) is refused before it takes a client or registers.
    let transport = meridian_cluster::Transport::of(config.tls.as_ref().map(|t| t.ca_sha256()));
    let my_key = keys.gateway(config.id);
    until_etcd_answers(
        "comparing this gateway's transport with the cluster's",
        START_PATIENCE,
        || meridian_cluster::admit(client.clone(), &keys, &my_key, "gateway", &transport, false),
    )
    .await?;

    let registry = Registry::default();
    let io = select_backend(config.io);
    let metrics = Arc::new(GatewayMetrics::new(&registry, config.id, io));
    let failed = Arc::new(shared::WorkerFailed::new(Arc::clone(&metrics)));
    if let Some(tls) = &config.tls {
        tls.register_metrics(&registry, &[("node", &format!("gateway-{}", config.id.0))]);
    }
    // Every event loop takes id blocks: the TCP workers and the QUIC front.
    let loops = config.workers.max(1) + usize::from(quic.is_some());
    let ids = ids::start(client.clone(), &keys, loops).await?;
    let routing = routing::routing(loops);
    let listeners = worker::reuseport_listeners(game, config.workers)
        .map_err(|source| GatewayError::Listen { addr: game_addr, source })?;
    let ws_addr = match &ws {
        Some(front) => Some(front.local_addr().map_err(GatewayError::Listener)?),
        None => None,
    };
    let ws_listeners = match ws {
        Some(front) => worker::reuseport_listeners(front.listener, config.workers)
            .map_err(|source| GatewayError::Listen { addr: ws_addr.expect("bound"), source })?
            .into_iter()
            .map(Some)
            .collect(),
        None => Vec::new(),
    };
    let stopping = Arc::new(AtomicBool::new(false));
    let key_file = match &config.jwks {
        Some(path) => {
            Some(accounts::KeyFile::open(path, config.dev_mode).map_err(GatewayError::Keys)?)
        }
        None => None,
    };
    let store = config.accounts.clone();
    let (accounts, account_requests) = tokio::sync::mpsc::channel(ACCOUNT_QUEUE);
    let login_keys = match &key_file {
        Some(file) => accounts::LoginKeys::with(file.keys()),
        None => accounts::LoginKeys::new(config.dev_mode),
    };
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let shared = Arc::new(shared::Shared {
        config: config.core(io),
        routing: Arc::clone(&routing),
        ids,
        metrics: Arc::clone(&metrics),
        stopping: Arc::clone(&stopping),
        round_robin: Default::default(),
        admission: limits::Admission::new(config.limits.clone()),
        output_by_worker: (0..loops).map(|_| Default::default()).collect(),
        login_keys,
        clock: accounts::UnixClock::with_millis(std::time::Instant::now(), unix_ms),
    });
    if let Some(file) = key_file {
        tokio::spawn(reload_login_keys(file, Arc::clone(&shared)));
    }
    let accounts = store.is_some().then_some(accounts);
    let mut workers = worker::Workers::new(Arc::clone(&shared), accounts, Arc::clone(&failed));
    workers.spawn_loops(io, listeners, ws_listeners)?;
    let quic_addr = match quic {
        Some(front) => {
            let addr = front.local_addr().map_err(GatewayError::Listener)?;
            let waiting = meridian_observe::Gate::new("quic", quic::WAITING_FOR_STREAM, &registry);
            workers.spawn_quic(front, waiting)?;
            Some(addr)
        }
        None => None,
    };
    let mailboxes = Arc::new(workers.mailboxes());
    if let Some(store) = store {
        info!(store = store.0.kind(), "accounts keep their players in the player store");
        tokio::spawn(answer_logins(store, account_requests, Arc::clone(&mailboxes)));
    }
    let dialer = relay::Dialer {
        gateway: config.id,
        metrics: Arc::clone(&metrics),
        tls: config.tls.clone(),
        etcd: client.clone(),
        keys: keys.clone(),
    };
    tokio::spawn(relay::maintain_links(watch.changes(), routing, Arc::clone(&mailboxes), dialer));

    let record = GatewayRecord {
        id: config.id,
        game: config.advertise.clone().unwrap_or_else(|| game_addr.to_string()),
        admin: config.advertise_admin.clone().unwrap_or_else(|| admin_addr.to_string()),
        quic: quic_addr.map(|addr| advertised_quic(config.advertise.as_deref(), addr)),
        ws: ws_addr.map(|addr| advertised_quic(config.advertise.as_deref(), addr)),
        transport: Some(transport),
    };
    let registration = until_etcd_answers("registering", START_PATIENCE, || {
        let key = keys.gateway(config.id);
        Registration::start(
            client.clone(),
            key,
            record.to_json(),
            config.lease_ttl,
            contact.clone(),
        )
    })
    .await?;
    let status = registration.status();
    metrics::watch_cluster(&registry, config.id, status.clone(), watch.view());
    let tables = Arc::clone(&shared.routing);
    // Ready means able to serve players: able to route them. Not whether etcd answered
    // lately: the gateway relays from its last view while etcd is away or stalled, and a
    // 503 then would take every gateway out of its Service at once. Whether it is
    // registered is the `etcd_registered` gauge.
    let readiness: Readiness = Arc::new(move || {
        // Able to route: a partition is known and every worker has a link up to every
        // shard owning a region.
        tables.iter().try_for_each(|table| {
            table.read(|t| {
                let owners = t.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
                if owners.is_empty() {
                    return Err("no partition map yet".to_string());
                }
                match owners.iter().find(|id| !t.link(**id).is_some_and(|l| l.is_up())) {
                    Some(id) => Err(format!("{id} not reachable")),
                    None => Ok(()),
                }
            })
        })
    });
    let links = Arc::clone(&shared.routing);
    let live_map = map::LiveMap::new(
        config.cluster.clone(),
        Some(config.id),
        watch.view(),
        Arc::new(move |id| {
            Some(links.iter().all(|table| table.read(|t| t.link(id).is_some_and(|l| l.is_up()))))
        }),
        config.admin.token().map(str::to_string),
    );
    let map_routes = live_map.routes();
    let page = Arc::new(play::page(ws_addr.map(|a| a.port())));
    let routes: meridian_observe::Routes = Arc::new(move |path: &str| match path {
        "/play" | "/play.html" => {
            let page = Arc::clone(&page);
            Some(Box::pin(async move { meridian_observe::Reply::html(page.to_string()) }))
        }
        _ => map_routes(path),
    });
    let access = meridian_observe::Access::new(config.admin.clone(), PUBLIC_PAGES, &registry);
    tokio::spawn(serve_admin_with(admin, registry, readiness, routes, access));
    info!(gateway = %config.id, %game_addr, ?quic_addr, ?ws_addr, %admin_addr, %io, workers = config.workers, "gateway serving");

    let failed = tokio::select! {
        () = shutdown => false,
        () = failed.wait() => true,
    };
    info!(gateway = %config.id, "gateway stopping: telling clients, deregistering");
    stopping.store(true, Ordering::SeqCst);
    for mailbox in mailboxes.iter() {
        mailbox.wake();
    }
    let joined = tokio::task::spawn_blocking(move || workers.join()).await;
    if joined.is_err() {
        warn!("a worker thread panicked while stopping");
    }
    registration.revoke().await;
    if failed {
        return Err(GatewayError::WorkerFailed);
    }
    Ok(())
}

/// Logins waiting for the player store at most; past it a login is answered UNAVAILABLE
/// at once (`meridian_gateway_store_lookups_total{result="busy"}`).
const ACCOUNT_QUEUE: usize = 4_096;

/// Lookups of the player store a gateway runs at once; the others wait in the queue.
const LOOKUPS_IN_FLIGHT: usize = 16;

/// Looks up each login's account in the player store, [`LOOKUPS_IN_FLIGHT`] at a time
/// (a burst of logins after a restart is not served one round trip after another), and
/// hands each answer to the login's worker.
async fn answer_logins(
    store: accounts::Accounts,
    mut requests: tokio::sync::mpsc::Receiver<shared::AccountRequest>,
    mailboxes: Arc<Vec<shared::Mailbox>>,
) {
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            request = requests.recv(), if running.len() < LOOKUPS_IN_FLIGHT => {
                let Some(request) = request else { break };
                let (store, mailboxes) = (store.clone(), Arc::clone(&mailboxes));
                running.spawn(async move { answer_login(store, request, mailboxes).await });
            }
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    while running.join_next().await.is_some() {}
}

async fn answer_login(
    store: accounts::Accounts,
    request: shared::AccountRequest,
    mailboxes: Arc<Vec<shared::Mailbox>>,
) {
    use accounts::LookupError;
    let answer = match store.0.player(&request.account, &request.name, request.new_id).await {
        Ok(player) => shared::AccountAnswer::Player(player),
        Err(LookupError::IdTaken) => shared::AccountAnswer::IdTaken,
        Err(LookupError::Unavailable(error)) => {
            warn!(%error, account = %request.account, "player store lookup failed");
            shared::AccountAnswer::Unavailable(error.to_string())
        }
    };
    if let Some(mailbox) = mailboxes.get(request.worker) {
        mailbox.account(request.session, answer).await;
    }
}

/// Re-reads the JWKS file every second if it changed (key rotation without a restart).
async fn reload_login_keys(file: accounts::KeyFile, shared: Arc<shared::Shared>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        match file.refresh() {
            Ok(false) => {}
            Ok(true) => {
                shared.login_keys.set(file.keys());
                shared.metrics.key_reloads.inc("loaded");
                let keys = shared.login_keys.keys().len();
                info!(keys, "login keys reloaded");
            }
            Err(error) => {
                shared.metrics.key_reloads.inc("failed");
                warn!(%error, "login keys not reloaded; the keys in use stay");
            }
        }
    }
}

/// The QUIC address to publish: the advertised game host (if any) with the QUIC port, so a
/// gateway listening on 0.0.0.0 publishes an address clients can use.
fn advertised_quic(advertise: Option<&str>, quic: SocketAddr) -> String {
    match advertise.and_then(|a| a.rsplit_once(':')) {
        Some((host, _port)) => format!("{host}:{}", quic.port()),
        None => quic.to_string(),
    }
}

/// io_uring unless asked otherwise, falling back to epoll (with a warning) where the
/// kernel or a seccomp profile refuses io_uring.
fn select_backend(wanted: IoBackend) -> IoBackend {
    match wanted {
        IoBackend::Epoll => IoBackend::Epoll,
        IoBackend::Uring => match uring::probe() {
            Ok(()) => IoBackend::Uring,
            Err(error) => {
                warn!(%error, "io_uring is unavailable here; falling back to epoll");
                IoBackend::Epoll
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_quic_address_takes_the_advertised_host() {
        let quic: SocketAddr = "0.0.0.0:7778".parse().unwrap();
        assert_eq!(advertised_quic(Some("10.1.2.3:7777"), quic), "10.1.2.3:7778");
        assert_eq!(advertised_quic(Some("[fd00::1]:7777"), quic), "[fd00::1]:7778");
        assert_eq!(advertised_quic(None, quic), "0.0.0.0:7778");
    }
}
