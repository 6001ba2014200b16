//! A Meridian zone shard: the world rules of `meridian-world` behind one port.
//!
//! Each gateway lane (event-loop worker) opens a relay link (`link.rs`, length-prefixed
//! protobuf frames, no gRPC) and sends batches of player inputs; a single world task
//! applies them in arrival order and answers with batches of ready-to-write client frames,
//! grouped per connection. Other shards reach it over gRPC (`Peer` streams) on the same
//! port (`port.rs` tells the two apart). The shard registers itself in etcd on a lease,
//! follows the cluster view, and may be elected coordinator of the partition map.
//!
//! The shard never talks to clients directly and never blocks its world task on I/O: all
//! sockets are behind bounded channels. The world itself is the sans-IO core, a crate of its
//! own (`meridian-shard-core`, re-exported here as `core` and `types`); this crate is its
//! tokio shell.

mod actor;
mod command;
mod entities;
mod kv;
mod link;
mod metrics;
mod peer;
mod port;
mod saver;
mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::EpochCell;
use meridian_cluster::{
    ClusterError, ClusterKeys, ClusterWatch, Coordinator, EtcdContact, Registration, ShardId,
    ShardRecord, ShardState,
};
use meridian_observe::{serve_admin_with, Readiness, Registry, Reply, ReplyFuture, Routes};
use meridian_world::WorldConfig;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// How long the gRPC server may take to close its connections once every stream was ended
/// from this side (HTTP/2 goodbyes): past it the shard exits anyway.
const SERVER_STOP_WITHIN: Duration = Duration::from_secs(2);

/// How long a stopping shard waits for the player store to take its last saves.
const FINAL_SAVES_WITHIN: Duration = Duration::from_secs(5);

pub use meridian_shard_core::{core, types};
pub use meridian_shard_core::{
    distance, CoreConfig, Event, LinkId, SaveRecord, ShardMetrics, Transmit,
};

/// Everything a shard needs, validated by the binary before `run`.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    pub id: ShardId,
    pub cluster: String,
    pub etcd: meridian_cluster::Etcd,
    pub world: WorldConfig,
    /// Dev mode (the gateways honour `Login.spawn`; the shard places a player wherever its
    /// gateway's Join says).
    pub dev_mode: bool,
    pub lease_ttl: Duration,
    /// Seeds random spawns.
    pub seed: u64,
    /// The admin address others reach, if not the listener's own.
    pub advertise_admin: Option<String>,
    /// How long a player whose connection dropped can be resumed with its token.
    pub resume_window: Duration,
    /// How long a drain may take before it is reported as incomplete.
    pub drain_timeout: Duration,
    /// Sign and check resume tokens (see `CoreConfig::resume_keys`).
    pub resume_keys: meridian_protocol::TokenKeys,
    /// Who may read `/players` and `/density` on the admin port.
    pub admin: meridian_observe::Private,
    /// The gRPC address others dial, if not the listener's own (e.g. behind 0.0.0.0).
    pub advertise: Option<String>,
    /// Mutual TLS on the gRPC port and on the streams to peers (see `meridian_tls`); plain
    /// gRPC without.
    pub tls: Option<Arc<meridian_tls::NodeTls>>,
    /// The player store its players are saved in (`--store`), and how often players that
    /// moved are saved (`--save-interval`).
    pub store: Option<meridian_store::Address>,
    pub save_interval: Duration,
    /// The game this shard runs (none: the stock world with no rules).
    pub game: GameConfig,
}

/// Which game a shard runs and how: one instance per shard from `factory`, ticked every
/// `tick`, owning at most `max_npcs` NPCs.
#[derive(Clone)]
pub struct GameConfig {
    pub name: String,
    pub factory: meridian_game::GameFactory,
    pub tick: Duration,
    pub max_npcs: usize,
}

impl GameConfig {
    /// The default game tick: 10 Hz.
    pub const TICK: Duration = Duration::from_millis(100);

    /// A game with the default tick and NPC limit.
    pub fn new(name: impl Into<String>, factory: meridian_game::GameFactory) -> GameConfig {
        GameConfig {
            name: name.into(),
            factory,
            tick: GameConfig::TICK,
            max_npcs: types::DEFAULT_MAX_NPCS,
        }
    }

    /// No game: the stock world (no ticks, no NPCs; actions are refused).
    pub fn none() -> GameConfig {
        GameConfig::new("none", meridian_game::factory::<meridian_game::NoGame>())
    }

    pub fn is_none(&self) -> bool {
        self.name == "none"
    }
}

impl std::fmt::Debug for GameConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GameConfig")
            .field("name", &self.name)
            .field("tick", &self.tick)
            .field("max_npcs", &self.max_npcs)
            .finish()
    }
}

impl ShardConfig {
    /// What the shard's core is given: its identity and rules, nothing about I/O.
    /// The core's configuration, for the shard's life `incarnation`.
    pub fn core(&self, incarnation: u64) -> types::CoreConfig {
        types::CoreConfig {
            id: self.id,
            incarnation,
            world: self.world.clone(),
            seed: self.seed,
            resume_window: self.resume_window,
            resume_keys: self.resume_keys.clone(),
            save_interval: self.store.as_ref().map(|_| self.save_interval),
            lease_ttl: self.lease_ttl,
            max_npcs: self.game.max_npcs,
        }
    }
}

/// Why a shard stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("cannot register in etcd: {0}")]
    Cluster(ClusterError),
    /// Its transport does not match the cluster's: it did not join (the message says what
    /// to start it with instead).
    #[error("{0}")]
    Incompatible(Box<meridian_cluster::Incompatible>),
    #[error("cannot read a listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The drain deadline passed with players still here: they were not handed off.
    #[error("drain incomplete after {waited:?}: {players} players still here, {unconfirmed} handoffs unconfirmed")]
    DrainIncomplete { waited: Duration, players: usize, unconfirmed: usize },
    #[error("player store: {0}")]
    Store(#[from] meridian_store::StoreError),
}

impl From<ClusterError> for ShardError {
    fn from(error: ClusterError) -> Self {
        match error {
            ClusterError::Incompatible(refused) => ShardError::Incompatible(refused),
            other => ShardError::Cluster(other),
        }
    }
}

/// Runs a shard on already-bound listeners. When `shutdown` resolves (SIGTERM, as
/// Kubernetes sends on scale-in) or an operator asks for a drain in etcd, the shard drains:
/// it marks itself draining, the coordinator repartitions without it, it hands every player
/// off, then deregisters and returns. A drain that misses `config.drain_timeout` returns
/// [`ShardError::DrainIncomplete`].
pub async fn run(
    config: ShardConfig,
    grpc: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ShardError> {
    let grpc_addr: SocketAddr = grpc.local_addr().map_err(ShardError::Listener)?;
    let admin_addr: SocketAddr = admin.local_addr().map_err(ShardError::Listener)?;
    let keys = ClusterKeys::new(&config.cluster);
    let client = meridian_cluster::connect(&config.etcd).await?;
    // Shared by the watch and the registration: records that lapse while etcd stalls are
    // kept for a grace period instead of being taken for deaths.
    let contact = EtcdContact::new(meridian_cluster::lapse_grace(config.lease_ttl));
    let reading = format!("reading the cluster ({})", config.etcd.running_at());
    let watch =
        meridian_cluster::until_etcd_answers(&reading, meridian_cluster::START_PATIENCE, || {
            ClusterWatch::start_with(client.clone(), keys.clone(), contact.clone())
        })
        .await?;
    // A shard whose gRPC links the others cannot speak (TLS or not, another CA, another
    // protocol) is refused before it registers: given cells, it would break its region.
    let transport = meridian_cluster::Transport::of(config.tls.as_ref().map(|t| t.ca_sha256()));
    let my_key = keys.shard(config.id);
    meridian_cluster::until_etcd_answers(
        "comparing this shard's transport with the cluster's",
        meridian_cluster::START_PATIENCE,
        || meridian_cluster::admit(client.clone(), &keys, &my_key, "shard", &transport, false),
    )
    .await?;
    // This process's life: a restart under the same id is a later one (see
    // `ShardRecord::incarnation`).
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |since| since.as_nanos() as u64)
        .max(1);
    let record = ShardRecord {
        id: config.id,
        grpc: config.advertise.clone().unwrap_or_else(|| grpc_addr.to_string()),
        admin: config.advertise_admin.clone().unwrap_or_else(|| admin_addr.to_string()),
        state: ShardState::Serving,
        players: 0,
        load: Default::default(),
        incarnation,
        transport: Some(transport.clone()),
    };
    // A lease expiry is judged (what this shard still owns, which life it is) before its
    // record goes back on a new lease: see `publish_record`.
    let (judge, expiries) = tokio::sync::mpsc::channel(1);
    let registration = meridian_cluster::until_etcd_answers(
        "registering",
        meridian_cluster::START_PATIENCE,
        || {
            let (key, value) = (keys.shard(config.id), record.to_json());
            let (ttl, contact, judge) = (config.lease_ttl, contact.clone(), Some(judge.clone()));
            Registration::start_judged(client.clone(), key, value, ttl, contact, judge)
        },
    )
    .await?;
    // Once more now that it is registered: of two mismatched nodes that started at the same
    // moment, the younger leaves (the coordinator gives it no cells meanwhile).
    if let Err(error) =
        meridian_cluster::admit(client.clone(), &keys, &my_key, "shard", &transport, true).await
    {
        if matches!(error, ClusterError::Incompatible(_)) {
            registration.revoke().await;
            return Err(error.into());
        }
        warn!(%error, "could not compare this shard's transport with the cluster's again");
    }
    info!(shard = %config.id, %grpc_addr, %admin_addr, "shard registered");

    let registry = Registry::default();
    let metrics = Arc::new(ShardMetrics::new(&registry, config.id));
    if let Some(tls) = &config.tls {
        let shard = config.id.0.to_string();
        tls.register_metrics(&registry, &[("node", &format!("shard-{shard}"))]);
    }
    let view = watch.view();
    let peer_senders: peer::PeerSenders = Arc::new(EpochCell::new(Default::default()));
    tokio::spawn(peer::maintain_peers(
        config.id,
        watch.changes(),
        Arc::clone(&peer_senders),
        Arc::clone(&metrics),
        config.tls.clone(),
    ));
    let saves = saver::Saves::new(Arc::clone(&metrics));
    let store = match &config.store {
        Some(address) => {
            let store = Arc::new(meridian_store::Store::open(address).await?);
            info!(shard = %config.id, store = store.kind(), "players are saved in the player store");
            tokio::spawn(saves.clone().write(Arc::clone(&store)));
            Some(store)
        }
        None => None,
    };
    let (kv_requests, kv_queue) = kv::queue();
    let entities = store
        .as_ref()
        .map(|s| entities::Entities::start(Arc::clone(s), Arc::clone(&metrics), config.id.0));
    let game = (config.game.factory)(config.id.0);
    let game_tick = (!config.game.is_none()).then_some(config.game.tick);
    if let Some(tick) = game_tick {
        info!(shard = %config.id, game = %config.game.name, ?tick, "running a game");
    }
    let ids = actor::EntityIds::start(client.clone(), &keys);
    let (commands, actor) = actor::WorldActor::new(
        &config.core(incarnation),
        watch.changes(),
        peer_senders,
        Arc::clone(&metrics),
        saves.clone(),
        actor::GameShell {
            game,
            tick: game_tick,
            ids,
            kv: kv_requests,
            entities: entities.clone(),
        },
    );
    saves.report_to(commands.clone());
    if let Some(entities) = &entities {
        entities.report_to(commands.clone());
    }
    if let Some(store) = store {
        tokio::spawn(kv::serve(store, kv_queue, commands.clone(), Arc::clone(&metrics)));
    }
    tokio::spawn(actor.run());

    let lease = registration.lease_source();
    let election_client = meridian_cluster::connect_with(&config.etcd, None).await?;
    let coordinator = Coordinator::new(
        election_client,
        keys.clone(),
        config.id,
        meridian_cluster::Bounds {
            width: config.world.width,
            height: config.world.height,
            sight: config.world.view_range,
        },
    )
    .with_transport(transport);
    tokio::spawn(coordinator.run(lease, watch.changes()));

    let status = registration.status();
    metrics::watch_registration(&registry, config.id, status.clone());
    tokio::spawn(watch_confirmations(status.clone(), commands.clone()));
    let me = config.id;
    // Ready means able to serve players: a region in the newest partition this shard knows.
    // Not whether etcd answered lately: a shard whose lease lapsed only because etcd stalled
    // keeps serving what it owns until the coordinator gives it away (epochs fence that
    // change), and taking it out of its Service meanwhile would cut players for nothing.
    // Whether it is registered is the `etcd_registered` gauge.
    let readiness: Readiness = Arc::new(move || {
        let holds_region =
            view.read(|v| v.partition.as_ref().is_some_and(|p| p.regions_of(me).next().is_some()));
        if holds_region {
            Ok(())
        } else {
            Err("holds no region".into())
        }
    });
    let routes = admin_routes(commands.clone(), Arc::clone(&readiness));
    let access = meridian_observe::Access::new(config.admin.clone(), &[], &registry);
    let gate = meridian_observe::Gate::new("grpc", meridian_tls::UNTRUSTED, &registry);
    tokio::spawn(serve_admin_with(admin, registry, readiness, routes, access));
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(publish_record(
        record.clone(),
        commands.clone(),
        Arc::clone(&draining),
        registration.updater(),
        Expiries { judgements: expiries, client: client.clone(), keys: keys.clone() },
    ));

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<meridian_rpc::pb::shard_server::ShardServer<service::ShardService>>()
        .await;
    let (stop_streams, streams_stopping) = tokio::sync::watch::channel(false);
    let links = Arc::new(link::Links::new(
        commands.clone(),
        Arc::clone(&metrics),
        streams_stopping.clone(),
        config.tls.clone(),
    ));
    let service = service::ShardService::new(
        commands.clone(),
        watch.view(),
        watch.changes(),
        Arc::clone(&metrics),
        streams_stopping,
        config.tls.clone(),
    );
    let server = meridian_rpc::pb::shard_server::ShardServer::new(service)
        .max_decoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(meridian_rpc::MAX_GRPC_MESSAGE_BYTES);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let router =
        tonic::transport::Server::builder().add_service(health_service).add_service(server);
    let stopped = async {
        let _ = server_stopped.await;
    };
    // `Server::tcp_nodelay` applies only to listeners tonic binds itself: `port` sets it on
    // every connection it accepts.
    let server = port::serve(grpc, router, links, config.tls.clone(), gate, stopped);

    let mut changes = watch.changes();
    let me = config.id;
    tokio::select! {
        _ = shutdown => info!(shard = %me, "stop signal: draining"),
        _ = changes.wait_for(|v| v.drains.contains(&me)) => info!(shard = %me, "drain requested"),
    }
    draining.store(true, std::sync::atomic::Ordering::SeqCst);
    registration.update(ShardRecord { state: ShardState::Draining, ..record.clone() }.to_json());
    let outcome = drain(&commands, config.drain_timeout, me).await;
    if config.store.is_some() {
        // Whatever the drain could not hand off (the last shard, or a whole cluster
        // stopping at once) is saved where it stands before the shard goes.
        let (reply, queued) = tokio::sync::oneshot::channel();
        if commands.send(command::Command::SaveAll { reply }).await.is_ok() {
            let _ = queued.await;
        }
        match saves.settle(FINAL_SAVES_WITHIN).await {
            0 => info!(shard = %me, "every player's save is in the player store"),
            left => warn!(
                shard = %me,
                saves = left,
                "the player store did not take the last saves in {FINAL_SAVES_WITHIN:?}; \
                 those players lose what they did since their previous save"
            ),
        }
        if let Some(entities) = &entities {
            match entities.settle(FINAL_SAVES_WITHIN).await {
                0 => info!(shard = %me, "every persistent entity's save is in the store"),
                left => warn!(
                    shard = %me,
                    saves = left,
                    "the store did not take the last persistent entity saves in \
                     {FINAL_SAVES_WITHIN:?}; those entities come back as last saved"
                ),
            }
        }
    }
    let _ = client.clone().delete(keys.drain(me), None).await;
    info!(shard = %me, "shard stopping; deregistering");
    registration.revoke().await;
    // Every stream and link ends from this side: peers and gateways that have not noticed
    // this shard leave yet (a lagging etcd watch, say) must not hold its exit.
    let _ = stop_streams.send(true);
    let _ = stop_server.send(());
    match tokio::time::timeout(SERVER_STOP_WITHIN, server).await {
        Ok(Ok(result)) => result?,
        Ok(Err(_)) => {}
        Err(_) => {
            warn!(shard = %me, "gRPC connections still open after {SERVER_STOP_WITHIN:?}; exiting anyway")
        }
    }
    outcome
}

/// The shard's own admin pages: `/players` (who it owns, for conservation checks) and
/// `/density` (where they stand, for the gateways' live map).
fn admin_routes(
    commands: tokio::sync::mpsc::Sender<command::Command>,
    readiness: Readiness,
) -> Routes {
    Arc::new(move |path: &str| {
        let commands = commands.clone();
        let reply: ReplyFuture = match path {
            "/players" => Box::pin(async move {
                let (reply, answer) = tokio::sync::oneshot::channel();
                if commands.send(command::Command::Report { reply }).await.is_err() {
                    return Reply::json("{}".to_string());
                }
                Reply::json(answer.await.unwrap_or_else(|_| "{}".to_string()))
            }),
            "/density" => {
                let ready = readiness().is_ok();
                Box::pin(async move {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    let mut density = Default::default();
                    if commands.send(command::Command::Density { reply }).await.is_ok() {
                        density = answer.await.unwrap_or_default();
                    }
                    let density = meridian_cluster::DensityReport { ready, ..density };
                    Reply::json(serde_json::to_string(&density).unwrap_or_default())
                })
            }
            _ => return None,
        };
        Some(reply)
    })
}

/// Waits until every local player has been handed off, every handoff confirmed, and the
/// gateways have stopped sending inputs for them here.
async fn drain(
    commands: &tokio::sync::mpsc::Sender<command::Command>,
    deadline: Duration,
    me: ShardId,
) -> Result<(), ShardError> {
    let started = std::time::Instant::now();
    let mut last_report = started;
    loop {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if commands.send(command::Command::DrainStatus { reply }).await.is_err() {
            return Ok(());
        }
        let (players, unconfirmed, quiet) = answer.await.unwrap_or((0, 0, true));
        if players == 0 && unconfirmed == 0 && quiet {
            info!(shard = %me, took = ?started.elapsed(), "drained");
            return Ok(());
        }
        if started.elapsed() > deadline {
            let waited = started.elapsed();
            tracing::error!(shard = %me, players, unconfirmed, ?waited, "drain incomplete");
            return Err(ShardError::DrainIncomplete { waited, players, unconfirmed });
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = std::time::Instant::now();
            info!(shard = %me, players, unconfirmed, "draining");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lease expiries, each waiting for its judgement before the record goes on a new lease,
/// and how to read the partition map for it.
struct Expiries {
    judgements: tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
    client: meridian_cluster::EtcdClient,
    keys: ClusterKeys,
}

/// Keeps the shard's etcd record fresh: its player count and load (placement and `status`)
/// every 500 ms, and which life it is. When etcd let the lease expire, the world task judges
/// first (what it still owns; a new life if it was taken for dead) and the record goes back
/// on a new lease only then, saying so: a record back under the old life would let the
/// cluster hand players to a life that is about to end.
async fn publish_record(
    mut record: ShardRecord,
    commands: tokio::sync::mpsc::Sender<command::Command>,
    draining: Arc<std::sync::atomic::AtomicBool>,
    update: impl Fn(String) + Send + 'static,
    mut expiries: Expiries,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        let judged = tokio::select! {
            _ = tick.tick() => None,
            Some(judged) = expiries.judgements.recv() => Some(judged),
        };
        if judged.is_some() {
            // Read now, not the watch's copy, which may lag behind the reassignment.
            let partition = match meridian_cluster::read_partition(
                &mut expiries.client,
                &expiries.keys,
            )
            .await
            {
                Ok(partition) => partition,
                Err(error) => {
                    warn!(%error, "could not read the partition after the lease expired");
                    None
                }
            };
            if commands.send(command::Command::LeaseExpired { partition }).await.is_err() {
                return;
            }
        }
        // Asked after the expiry (commands are taken in order): the load and life it left.
        let (reply, answer) = tokio::sync::oneshot::channel();
        if commands.send(command::Command::Load { reply }).await.is_err() {
            return;
        }
        let Ok((load, incarnation)) = answer.await else { return };
        let players = load.x.iter().map(|&n| u64::from(n)).sum();
        let state = if draining.load(std::sync::atomic::Ordering::SeqCst) {
            ShardState::Draining
        } else {
            ShardState::Serving
        };
        if players != record.players
            || state != record.state
            || load != record.load
            || incarnation != record.incarnation
        {
            record.players = players;
            record.state = state;
            record.load = load;
            // A new life after being taken for dead (see `ShardRecord::incarnation`).
            record.incarnation = incarnation;
            update(record.to_json());
        }
        if let Some(judged) = judged {
            let _ = judged.send(());
        }
    }
}

/// Tells the world task each keep-alive etcd answered with the lease alive: what a shard
/// that did not run for longer than its lease waits for before it acts again.
async fn watch_confirmations(
    status: meridian_cluster::RegistrationStatus,
    commands: tokio::sync::mpsc::Sender<command::Command>,
) {
    let mut confirmed = status.confirmed();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let latest = status.confirmed();
        if latest != confirmed {
            confirmed = latest;
            if let Some(asked) = latest {
                if commands.send(command::Command::LeaseConfirmed { asked }).await.is_err() {
                    return;
                }
            }
        }
    }
}
