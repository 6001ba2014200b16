//! A deterministic simulator of a Meridian cluster: the real shard cores
//! (`meridian_shard_core::core`) and gateway cores (through `meridian_gateway_core::fuzzing`), a model
//! of etcd (leases, the partition map with epochs, the coordinator, watches that lag) and
//! simulated clients, all in one thread, in simulated time, from one seed.
//!
//! Every stream (gateway to shard, shard to gateway, shard to shard) delivers in order;
//! streams interleave arbitrarily, with delays drawn from the seed. Faults (a shard killed,
//! a gateway stream cut, a peer stream stalled, a shard joining, borders moved) happen at
//! times drawn from the seed. Nothing depends on the clock (one `Instant` taken at the start
//! is only the origin of simulated time) or on a thread-local random source, so a seed
//! replays exactly: `meridian-sim --seed S`.
//!
//! Invariants are checked as the run goes (every Move gets exactly one answer, in order;
//! a client is never told about a player it does not know, or twice about one it does) and
//! at quiescence, once the workload and the faults have stopped and the cluster has had a
//! moment to settle: every client's view is the true set within sight, at the true cells;
//! every player is local on exactly one shard, where its client last saw itself; every
//! ghost is mirrored by its owner and is where its owner has it; nothing waits in the
//! shards' queues.
//!
//! Where things are: this file holds the simulator's state (`Sim`, the nodes, the streams
//! and the event queue) and its run loop, and only it; `settings.rs` how a run is set up;
//! `shards.rs` the shard cores and the streams' delivery; `gateways.rs` the gateway
//! harnesses and their streams; `views.rs` etcd's views reaching the nodes; `faults.rs` the
//! faults; `quiesce.rs` the checks at quiescence; `client.rs` the simulated clients;
//! `model.rs` the etcd model; `scale.rs` the many-player scale runs. `shards.rs` to
//! `quiesce.rs` and `client.rs` each add one part of `Sim`'s behaviour (an `impl Sim` of
//! their own) on the state this file declares.

mod client;
mod faults;
mod gateways;
mod keeper;
mod model;
mod quiesce;
pub mod scale;
mod settings;
mod shards;
mod store;
mod views;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use meridian_gateway_core::fuzzing::{Harness, HarnessConfig};
use meridian_rpc::pb::{PeerMessage, PlayerInput, ShardBatch};
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::{Event, LinkId, Transmit};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use client::Client;
use model::Etcd;
pub use settings::{Faults, Settings, Workload};

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub events: u64,
    pub moves: u64,
    pub acks: u64,
    pub refused: u64,
    pub handoffs: u64,
    pub epochs: u64,
    /// Of `epochs`, those the balancer made (with `Settings::balance`).
    pub balancer_epochs: u64,
    /// When the balancer last moved a border.
    pub last_balance: Option<Duration>,
    pub simulated: Duration,
    /// Killed shards a gateway proved dead by refused connects, revoking their leases.
    pub deaths_detected: u64,
    /// The longest a killed shard's copies stayed shown anywhere after its death (each
    /// either taken over by the player's restore elsewhere or removed as an orphan).
    pub death_settled: Option<Duration>,
    /// Persistent entities the store held at the end (with `Settings::entities`), and
    /// those the shards brought back from it.
    pub entities: usize,
}

/// A broken invariant, with what is needed to replay it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub at: Duration,
    pub what: String,
    /// Players involved (a replay traces their messages).
    pub players: Vec<u64>,
    /// The last messages about them, when replayed with a trace.
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} at {:?}: {}", self.seed, self.at, self.what)?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: meridian-sim --seed {}", self.seed)
    }
}

/// Runs one seed with `settings`. On a violation the seed is run again with a trace of
/// the players involved, which the violation carries.
pub fn run(seed: u64, settings: &Settings) -> Result<Outcome, Violation> {
    match Sim::new(seed, settings.clone(), None).run() {
        Ok(outcome) => Ok(outcome),
        Err(violation) => {
            let focus: BTreeSet<u64> = violation.players.iter().copied().collect();
            let mut traced = Sim::new(seed, settings.clone(), Some(focus));
            let trace = match traced.run() {
                Err(_) => traced.trace.iter().cloned().collect(),
                Ok(_) => vec!["(the traced replay did not fail: nondeterminism!)".into()],
            };
            Err(Violation { trace, ..violation })
        }
    }
}

/// Where a stream runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// Gateway to shard.
    Up(u32, u32),
    /// Shard to gateway.
    Down(u32, u32),
    /// Shard to shard.
    Peer(u32, u32),
}

enum Payload {
    Inputs(Vec<PlayerInput>),
    Batch(ShardBatch),
    Peer { epoch: u64, messages: Vec<PeerMessage> },
}

#[derive(Default)]
struct Stream {
    open: bool,
    /// Messages with the time they may arrive, in order.
    queue: VecDeque<(Duration, Payload)>,
    scheduled: bool,
    /// A stalled stream delivers nothing before this.
    stalled_until: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Deliver(Key),
    ShardTick(u32),
    GatewayTick(u32),
    Client(usize),
    View {
        node: Node,
        version: usize,
    },
    Connect(u32, u32),
    PeerConnect(u32, u32),
    /// The lease of that incarnation ([`ShardNode::lease`]) runs out.
    LeaseExpiry(u32, u64),
    /// A woken shard's first keep-alive is answered.
    KeepAlive(u32),
    Wake(u32),
    Fault,
    /// The coordinator's balancer runs (with `Settings::balance`).
    Balance,
    /// The store carries out a request (see `store.rs`).
    Store(u64),
    /// A shard's game ticks (with `Settings::entities`).
    GameTick(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Shard(u32),
    Gateway(u32),
}

struct Scheduled {
    at: Duration,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct ShardNode {
    core: Option<ShardCore>,
    /// Gateway links by the core's id for them: (gateway, stream incarnation).
    links: BTreeMap<LinkId, u32>,
    /// The link id of each gateway's current stream.
    link_of: BTreeMap<u32, LinkId>,
    seen: usize,
    peers_up: BTreeSet<u32>,
    /// Paused (see [`Faults::pauses`]) until then: what reaches it meanwhile waits.
    paused_until: Duration,
    deferred: Vec<Event>,
    /// Bumped each time a keep-alive renews its lease: an expiry scheduled before that is void.
    lease: u64,
}

struct GatewayNode {
    harness: Harness,
    /// Inputs for shards whose stream is not open yet (the relay queue).
    waiting: BTreeMap<u32, Vec<PlayerInput>>,
    /// Shards this gateway's view has (links kept).
    known: BTreeSet<u32>,
    /// Shards gone from its view whose region has not been reassigned yet.
    dead: BTreeSet<u32>,
    seen: usize,
}

pub(crate) struct Sim {
    seed: u64,
    settings: Settings,
    rng: SmallRng,
    base: Instant,
    t: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    streams: BTreeMap<Key, Stream>,
    shards: BTreeMap<u32, ShardNode>,
    gateways: BTreeMap<u32, GatewayNode>,
    clients: Vec<Client>,
    etcd: Etcd,
    next_link: u32,
    out: Vec<Transmit>,
    outcome: Outcome,
    faults_left: Vec<FaultKind>,
    playing: bool,
    destructive: bool,
    focus: Option<BTreeSet<u64>>,
    trace: VecDeque<String>,
    violation: Option<Violation>,
    /// etcd is stalled until then (see [`Faults::etcd_stalls`]).
    etcd_stalled_until: Duration,
    /// What each gateway's connects to each shard met: refused connects to a killed shard's
    /// port prove it dead, and the gateway revokes its lease at once (issue 33).
    refusals: BTreeMap<(u32, u32), meridian_cluster::Refusals>,
    /// Killed shards whose copies some live shard still shows: the shard and when it died.
    dying: Vec<(u32, Duration)>,
    /// The store (with `Settings::entities`), and whether the shards' games still play.
    store: store::StoreModel,
    games_playing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug, Clone, Copy)]
enum FaultKind {
    BorderMove,
    Kill,
    LinkCut,
    PeerStall,
    Join,
    Pause,
    EtcdStall,
}

/// How often the coordinator's balancer runs (its `BALANCE_PERIOD`).
const BALANCE_PERIOD: Duration = Duration::from_secs(2);
/// Lease time-to-live of the etcd model.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How long after the workload the cluster gets before views are compared, without and
/// with destructive faults (those wait for the restore paths' own timers).
const SETTLE: Duration = Duration::from_secs(1);
const SETTLE_AFTER_FAULTS: Duration = Duration::from_secs(12);
/// How long after a shard's death its copies may still be shown elsewhere: its lease runs
/// out (or a gateway proves it dead sooner), then each copy is taken over by the player's
/// restore or removed as an orphan (`ORPHAN_LIMIT`, 5 s), checked every 100 ms. Runs with
/// an etcd stall or a pause are not held to it (the death is known only when etcd is back).
const DEATH_SETTLES_WITHIN: Duration = Duration::from_millis(3_000 + 5_000 + 500);
/// A run that has not quiesced this long after the workload is a violation (a loop).
const QUIESCE_LIMIT: Duration = Duration::from_secs(60);
/// Events at one simulated instant beyond which a run is a violation: messages going round
/// without time passing (with a stream delay of 0, a forwarding loop never lets it pass).
const EVENTS_AT_ONE_INSTANT: u64 = 100_000;
/// How many trace lines a failing seed's replay keeps (its last ones); `--trace-lines`.
pub static TRACE_LINES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(120);

impl Sim {
    fn new(seed: u64, settings: Settings, focus: Option<BTreeSet<u64>>) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let etcd = Etcd::new(settings.map, (1..=settings.shards).collect());
        let mut faults_left = Vec::new();
        let f = &settings.faults;
        for (n, kind) in [
            (f.border_moves, FaultKind::BorderMove),
            (f.kills, FaultKind::Kill),
            (f.link_cuts, FaultKind::LinkCut),
            (f.peer_stalls, FaultKind::PeerStall),
            (f.joins, FaultKind::Join),
            (f.pauses, FaultKind::Pause),
            (f.etcd_stalls, FaultKind::EtcdStall),
        ] {
            for _ in 0..n {
                faults_left.push(kind);
            }
        }
        let mut sim = Sim {
            seed,
            destructive: settings.faults.destructive(),
            clients: Vec::new(),
            rng: SmallRng::seed_from_u64(rng.random()),
            settings,
            base: Instant::now(),
            t: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            streams: BTreeMap::new(),
            shards: BTreeMap::new(),
            gateways: BTreeMap::new(),
            etcd,
            next_link: 1,
            out: Vec::new(),
            outcome: Outcome::default(),
            faults_left,
            playing: true,
            focus,
            trace: VecDeque::new(),
            violation: None,
            etcd_stalled_until: Duration::ZERO,
            refusals: BTreeMap::new(),
            dying: Vec::new(),
            store: store::StoreModel::default(),
            games_playing: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        for id in 1..=sim.settings.shards {
            sim.start_shard(id);
        }
        for g in 1..=sim.settings.gateways {
            let config = HarnessConfig {
                shards: 1,
                gateway: g,
                player_ids: u64::from(g) * 1_000_000..u64::from(g) * 1_000_000 + 900_000,
                ..HarnessConfig::default()
            };
            let mut harness = Harness::new(config);
            harness.set_now(sim.base);
            harness.set_cluster(None, &[]);
            sim.gateways.insert(
                g,
                GatewayNode {
                    harness,
                    waiting: BTreeMap::new(),
                    known: BTreeSet::new(),
                    dead: BTreeSet::new(),
                    seen: 0,
                },
            );
            sim.at(Duration::from_millis(u64::from(g)), Ev::GatewayTick(g));
            sim.at(Duration::ZERO, Ev::View { node: Node::Gateway(g), version: 1 });
        }
        for i in 0..sim.settings.clients {
            let gateway = 1 + i % sim.settings.gateways;
            let client = Client::new(i, gateway, &sim.settings, &mut sim.rng);
            sim.clients.push(client);
            let start = Duration::from_millis(sim.rng.random_range(300..600));
            sim.at(start, Ev::Client(i as usize));
        }
        let faults = std::mem::take(&mut sim.faults_left);
        for _ in &faults {
            let when = sim.rng.random_range(400..sim.settings.duration.as_millis().max(401) as u64);
            sim.at(Duration::from_millis(when), Ev::Fault);
        }
        sim.faults_left = faults;
        if sim.settings.balance {
            sim.at(BALANCE_PERIOD, Ev::Balance);
        }
        sim
    }

    fn now(&self) -> Instant {
        self.base + self.t
    }

    fn at(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled { at, seq: self.seq, ev }));
    }

    fn after(&mut self, delay: Duration, ev: Ev) {
        self.at(self.t + delay, ev);
    }

    fn delay(&mut self) -> Duration {
        let max = self.settings.max_delay.as_micros() as u64;
        Duration::from_micros(self.rng.random_range(0..=max))
    }

    pub(crate) fn fail(&mut self, what: String, players: Vec<u64>) {
        if self.violation.is_none() {
            self.violation =
                Some(Violation { seed: self.seed, at: self.t, what, players, trace: Vec::new() });
        }
    }

    /// A trace line about the cluster itself (streams, views, faults), in every trace.
    fn note_all(&mut self, what: impl FnOnce() -> String) {
        let Some(focus) = &self.focus else { return };
        let players: Vec<u64> = focus.iter().copied().collect();
        self.note(&players, what);
    }

    pub(crate) fn note(&mut self, players: &[u64], what: impl FnOnce() -> String) {
        let Some(focus) = &self.focus else { return };
        if players.iter().any(|p| focus.contains(p)) {
            let keep = TRACE_LINES.load(std::sync::atomic::Ordering::Relaxed).max(1);
            while self.trace.len() >= keep {
                self.trace.pop_front();
            }
            let line = format!("{:>9.3}s {}", self.t.as_secs_f64(), what());
            self.trace.push_back(line);
        }
    }

    fn run(&mut self) -> Result<Outcome, Violation> {
        let end = self.settings.duration;
        let mut settled_since: Option<Duration> = None;
        let mut events_at_t = 0u64;
        while let Some(Reverse(next)) = self.queue.pop() {
            if next.at == self.t {
                events_at_t += 1;
            } else {
                events_at_t = 0;
            }
            self.t = next.at;
            self.outcome.events += 1;
            if events_at_t > EVENTS_AT_ONE_INSTANT {
                // Messages going round with no delay (two shards forwarding an input to
                // each other, say: seed 67713 hung the sweep so).
                let what =
                    format!("more than {EVENTS_AT_ONE_INSTANT} events at one instant: a loop");
                self.fail(what, Vec::new());
                return Err(self.violation.take().expect("just set"));
            }
            if self.playing && self.t >= end {
                self.playing = false;
                self.games_playing.store(false, std::sync::atomic::Ordering::Relaxed);
            }
            self.step(next.ev);
            if let Some(violation) = self.violation.take() {
                return Err(violation);
            }
            if self.playing {
                continue;
            }
            // Quiescence: nothing in flight on any stream, nothing a client waits for.
            let quiet = self.streams.values().all(|s| s.queue.is_empty())
                && self.clients.iter().all(|c| !c.busy())
                && self.store.idle();
            if !quiet {
                settled_since = None;
            } else if settled_since.is_none() {
                settled_since = Some(self.t);
            }
            let settle = if self.destructive { SETTLE_AFTER_FAULTS } else { SETTLE };
            if settled_since.is_some_and(|since| self.t >= since + settle) {
                self.check_quiescent();
                self.outcome.simulated = self.t;
                return match self.violation.take() {
                    Some(violation) => Err(violation),
                    None => Ok(self.outcome.clone()),
                };
            }
            if self.t > end + QUIESCE_LIMIT {
                let busy: Vec<u64> =
                    self.clients.iter().filter(|c| c.busy()).map(|c| c.id).take(8).collect();
                let streams: Vec<String> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| !s.queue.is_empty())
                    .map(|(key, s)| format!("{key:?} ({} queued, open {})", s.queue.len(), s.open))
                    .collect();
                let what = format!(
                    "the cluster never quiesced after the workload: clients waiting for answers {busy:?}, streams with messages {streams:?}"
                );
                self.fail(what, busy);
                return Err(self.violation.take().expect("just set"));
            }
        }
        unreachable!("ticks keep the queue from ever running dry")
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver(key) => self.deliver(key),
            Ev::ShardTick(s) => {
                let now = self.now();
                if !self.shard_alive(s) {
                    return;
                }
                self.hand_shard(s, now, Event::Tick);
                self.pump_shard(s);
                self.after(meridian_shard_core::core::TICK, Ev::ShardTick(s));
            }
            Ev::GatewayTick(g) => {
                let now = self.now();
                if let Some(node) = self.gateways.get_mut(&g) {
                    node.harness.set_now(now);
                    node.harness.tick();
                }
                self.pump_gateway(g);
                self.after(Duration::from_millis(100), Ev::GatewayTick(g));
                if g == 1 {
                    self.check_deaths_settle();
                }
            }
            Ev::Client(i) => self.client_step(i),
            Ev::View { node, version } => self.view_to(node, version),
            Ev::Connect(g, s) => self.connect(g, s),
            Ev::PeerConnect(a, b) => self.peer_connect(a, b),
            Ev::Wake(s) => self.wake(s),
            Ev::LeaseExpiry(s, lease)
                if self.shards.get(&s).is_some_and(|n| n.core.is_some() && n.lease != lease) =>
            {
                // A keep-alive renewed it meanwhile.
            }
            Ev::LeaseExpiry(s, lease) if self.etcd_stalled_until > self.t => {
                // A stalled etcd expires nothing until it runs again; then the expiry and
                // the keep-alives that waited for it race.
                let race = Duration::from_millis(self.rng.random_range(0..20));
                self.at(self.etcd_stalled_until + race, Ev::LeaseExpiry(s, lease));
            }
            Ev::LeaseExpiry(s, _) => {
                // Gone for good: every peer drops its stream to it, and what it had sent
                // but nobody took is lost with it.
                for (key, stream) in self.streams.iter_mut() {
                    if matches!(key, Key::Peer(a, b) if *a == s || *b == s) {
                        stream.queue.clear();
                        stream.open = false;
                    }
                }
                if self.etcd.remove(s) {
                    self.outcome.epochs += 1;
                    self.publish();
                }
            }
            Ev::KeepAlive(s) => self.keep_alive_answered(s),
            Ev::Balance => {
                if !self.playing {
                    return;
                }
                let loads: BTreeMap<u32, meridian_cluster::LoadProfile> = self
                    .shards
                    .iter()
                    .filter_map(|(id, n)| n.core.as_ref().map(|c| (*id, c.load_profile())))
                    .collect();
                if self.etcd.rebalance(&loads, self.settings.view_range) {
                    self.outcome.epochs += 1;
                    self.outcome.balancer_epochs += 1;
                    self.outcome.last_balance = Some(self.t);
                    self.note_all(|| "the balancer moved a border".to_string());
                    self.publish();
                }
                self.after(BALANCE_PERIOD, Ev::Balance);
            }
            Ev::Store(number) => self.store_step(number),
            Ev::GameTick(s) => {
                if !self.shard_alive(s) {
                    return;
                }
                let now = self.now();
                self.hand_shard(s, now, Event::GameTick);
                self.pump_shard(s);
                self.after(Duration::from_millis(100), Ev::GameTick(s));
            }
            Ev::Fault => {
                if !self.faults_left.is_empty() {
                    let i = self.rng.random_range(0..self.faults_left.len());
                    let kind = self.faults_left.swap_remove(i);
                    self.fault(kind);
                }
            }
        }
    }
}
