//! A deterministic simulator of a Meridian cluster: the real shard cores
//! (`meridian_shard::core`) and gateway cores (through `meridian_gateway::fuzzing`), a model
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

mod client;
mod model;
pub mod scale;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_gateway::fuzzing::{Harness, HarnessConfig};
use meridian_rpc::pb::{PeerMessage, PlayerInput, ShardBatch};
use meridian_shard::core::ShardCore;
use meridian_shard::{CoreConfig, Event, LinkId, ShardMetrics, Transmit};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use client::Workload;
use client::{Client, ClientState};
use model::Etcd;

/// How a run is set up. [`Settings::swarm`] draws one from a seed (swarm testing: each
/// seed also picks which faults and workloads it runs, so rare combinations get their
/// turn).
#[derive(Debug, Clone)]
pub struct Settings {
    pub shards: u32,
    pub gateways: u32,
    pub clients: u32,
    /// Side of the square map.
    pub map: u32,
    pub view_range: u32,
    pub workload: Workload,
    /// How long clients play and faults happen.
    pub duration: Duration,
    /// Stream delays are drawn from 0..=this.
    pub max_delay: Duration,
    /// etcd watch lag per node, drawn from 0..=this.
    pub view_lag: Duration,
    pub faults: Faults,
}

/// Faults injected during the workload.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Borders moved (one cut shifted by up to 24 cells, a new epoch each time).
    pub border_moves: u32,
    /// A shard killed (and its lease left to expire).
    pub kills: u32,
    /// A gateway's stream to a shard cut and reconnected.
    pub link_cuts: u32,
    /// A shard-to-shard stream stalled for up to a second (nothing lost).
    pub peer_stalls: u32,
    /// A shard joining.
    pub joins: u32,
    /// A shard paused past its lease (a stopped process, a frozen VM): it handles nothing
    /// for longer than the TTL, is taken for dead (its region reassigned, its players
    /// restored elsewhere), then wakes, finds its lease gone and registers again.
    pub pauses: u32,
    /// etcd stalled (frozen, not dead): no watch sees anything new and no lease expires
    /// for up to 8 s; then everything written meanwhile arrives.
    pub etcd_stalls: u32,
}

impl Faults {
    fn destructive(&self) -> bool {
        self.kills > 0 || self.link_cuts > 0 || self.pauses > 0
    }
}

impl Settings {
    /// A small cluster with varied settings drawn from `seed`.
    pub fn swarm(seed: u64) -> Settings {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_5eed);
        let shards = rng.random_range(2..=4);
        let workload = match rng.random_range(0..4) {
            0 => Workload::RandomWalk,
            1 => Workload::Corners,
            2 => Workload::ZigZag,
            _ => Workload::Churn,
        };
        let mut faults = Faults::default();
        if rng.random_bool(0.7) {
            faults.border_moves = rng.random_range(1..=6);
        }
        if rng.random_bool(0.25) {
            faults.kills = 1;
        }
        if rng.random_bool(0.25) {
            faults.link_cuts = rng.random_range(1..=2);
        }
        if rng.random_bool(0.3) {
            faults.peer_stalls = rng.random_range(1..=3);
        }
        if rng.random_bool(0.15) {
            faults.joins = 1;
        }
        // Drawn from a generator of their own, so adding them left every earlier seed's
        // settings (and the regressions named by seed) as they were.
        let mut later = SmallRng::seed_from_u64(seed ^ 0xfa17_5eed);
        let pause = later.random_bool(0.12);
        if later.random_bool(0.12) {
            faults.etcd_stalls = 1;
        }
        if pause {
            faults.pauses = 1;
        }
        Settings {
            shards,
            gateways: rng.random_range(1..=2),
            clients: rng.random_range(6..=24),
            map: 120,
            view_range: rng.random_range(4..=10),
            workload,
            duration: Duration::from_millis(rng.random_range(1_500..=4_000)),
            max_delay: Duration::from_millis(rng.random_range(0..=20)),
            view_lag: Duration::from_millis(rng.random_range(0..=200)),
            faults,
        }
    }

    /// The stale-neighbour workload, scaled: a crowd on the corners of four
    /// shards, borders moving under it.
    pub fn corners(clients: u32) -> Settings {
        Settings {
            shards: 4,
            gateways: 1,
            clients,
            map: 400,
            view_range: 20,
            workload: Workload::Corners,
            duration: Duration::from_secs(3),
            max_delay: Duration::from_millis(5),
            view_lag: Duration::from_millis(100),
            faults: Faults { border_moves: 4, ..Faults::default() },
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub events: u64,
    pub moves: u64,
    pub acks: u64,
    pub refused: u64,
    pub handoffs: u64,
    pub epochs: u64,
    pub simulated: Duration,
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

/// Lease time-to-live of the etcd model.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How long after the workload the cluster gets before views are compared, without and
/// with destructive faults (those wait for the restore paths' own timers).
const SETTLE: Duration = Duration::from_secs(1);
const SETTLE_AFTER_FAULTS: Duration = Duration::from_secs(12);
/// A run that has not quiesced this long after the workload is a violation (a loop).
const QUIESCE_LIMIT: Duration = Duration::from_secs(60);
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
        while let Some(Reverse(next)) = self.queue.pop() {
            self.t = next.at;
            self.outcome.events += 1;
            if self.playing && self.t >= end {
                self.playing = false;
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
                && self.clients.iter().all(|c| !c.busy());
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
                self.after(meridian_shard::core::TICK, Ev::ShardTick(s));
            }
            Ev::GatewayTick(g) => {
                let now = self.now();
                if let Some(node) = self.gateways.get_mut(&g) {
                    node.harness.set_now(now);
                    node.harness.tick();
                }
                self.pump_gateway(g);
                self.after(Duration::from_millis(100), Ev::GatewayTick(g));
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
            Ev::Fault => {
                if !self.faults_left.is_empty() {
                    let i = self.rng.random_range(0..self.faults_left.len());
                    let kind = self.faults_left.swap_remove(i);
                    self.fault(kind);
                }
            }
        }
    }

    // ---- shards -------------------------------------------------------------------

    fn start_shard(&mut self, id: u32) {
        let config = CoreConfig {
            id: ShardId(id),
            incarnation: 1,
            world: meridian_world::WorldConfig {
                width: self.settings.map,
                height: self.settings.map,
                view_range: self.settings.view_range,
                ..Default::default()
            },
            seed: self.seed,
            resume_window: Duration::from_secs(30),
            resume_keys: meridian_gateway::fuzzing::resume_key().into(),
            save_interval: None,
            lease_ttl: LEASE_TTL,
            max_npcs: meridian_shard::types::DEFAULT_MAX_NPCS,
        };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ShardId(id)));
        let core = ShardCore::new(&config, metrics, self.now());
        self.shards.insert(
            id,
            ShardNode {
                core: Some(core),
                links: BTreeMap::new(),
                link_of: BTreeMap::new(),
                seen: 0,
                peers_up: BTreeSet::new(),
                paused_until: Duration::ZERO,
                deferred: Vec::new(),
                lease: 0,
            },
        );
        let version = self.etcd.version();
        self.after(Duration::ZERO, Ev::View { node: Node::Shard(id), version });
        let first_tick = Duration::from_millis(self.rng.random_range(0..100));
        self.after(first_tick, Ev::ShardTick(id));
    }

    fn shard_alive(&self, s: u32) -> bool {
        self.shards.get(&s).is_some_and(|n| n.core.is_some())
    }

    /// Hands a shard's core an event, or keeps it for when the shard wakes if it is paused
    /// (what reaches a stopped process waits in its sockets and its watch).
    fn hand_shard(&mut self, s: u32, now: Instant, event: Event) {
        let t = self.t;
        let Some(node) = self.shards.get_mut(&s) else { return };
        if node.paused_until > t {
            node.deferred.push(event);
            return;
        }
        if let Some(core) = node.core.as_mut() {
            core.handle(now, event);
        }
    }

    /// A paused shard wakes: it takes what waited for it, in order; then its lease
    /// keep-alive fails if the lease expired meanwhile, and it registers again.
    fn wake(&mut self, s: u32) {
        let now = self.now();
        let t = self.t;
        if self.shards.get(&s).is_none_or(|n| n.paused_until > t || n.core.is_none()) {
            return;
        }
        self.note_all(|| format!("shard {s} wakes"));
        let node = self.shards.get_mut(&s).expect("checked");
        let deferred = std::mem::take(&mut node.deferred);
        let core = node.core.as_mut().expect("checked");
        for event in deferred {
            core.handle(now, event);
        }
        self.pump_shard(s);
        if self.etcd_stalled_until > t {
            // Its keep-alive waits in the stalled etcd.
            let race = Duration::from_millis(self.rng.random_range(0..20));
            self.at(self.etcd_stalled_until + race, Ev::KeepAlive(s));
        } else {
            self.keep_alive_answered(s);
        }
    }

    /// A shard's keep-alive is answered: its lease is alive (and renewed), or gone, and
    /// then it registers again.
    fn keep_alive_answered(&mut self, s: u32) {
        if !self.shard_alive(s) {
            return;
        }
        if self.etcd_stalled_until > self.t {
            self.at(self.etcd_stalled_until, Ev::KeepAlive(s));
            return;
        }
        let now = self.now();
        let lease_gone = !self.etcd.has(s);
        // The shell reads the partition from etcd when it finds the lease gone.
        let partition = self.etcd.current().partition.clone();
        if lease_gone {
            self.note_all(|| format!("shard {s} finds its lease gone"));
        }
        let node = self.shards.get_mut(&s).expect("checked");
        let core = node.core.as_mut().expect("checked");
        if lease_gone {
            core.handle(now, Event::LeaseExpired { partition });
        } else {
            node.lease += 1;
            core.handle(now, Event::LeaseConfirmed { asked: now });
        }
        self.pump_shard(s);
        if lease_gone {
            // Registers again, its record saying which life it is now.
            let incarnation = self.shards[&s].core.as_ref().map_or(1, |c| c.incarnation());
            self.etcd.add(s, incarnation);
            self.outcome.epochs += 1;
            self.publish();
        }
    }

    /// Hands a shard's round of output to its streams.
    fn pump_shard(&mut self, s: u32) {
        let Some(node) = self.shards.get_mut(&s) else { return };
        if node.paused_until > self.t {
            return;
        }
        let Some(core) = node.core.as_mut() else { return };
        let mut out = std::mem::take(&mut self.out);
        core.flush(&mut out);
        let epoch = core.epoch();
        let mut closed = Vec::new();
        for transmit in out.drain(..) {
            match transmit {
                Transmit::Gateway { link, batch } => {
                    let Some(&g) = self.shards[&s].links.get(&link) else { continue };
                    if self.shards[&s].link_of.get(&g) != Some(&link) {
                        continue;
                    }
                    for delivery in &batch.deliveries {
                        if delivery.released_to != 0 {
                            self.outcome.handoffs += 1;
                        }
                    }
                    self.send(Key::Down(s, g), Payload::Batch(batch));
                }
                Transmit::Peer { to, messages } => {
                    if self.focus.is_some() {
                        for m in &messages {
                            let line = format!(
                                "shard {s} -> shard {to} (epoch {epoch}): {}",
                                model::describe(m)
                            );
                            self.note(&[m.player_id], || line);
                        }
                    }
                    self.send(Key::Peer(s, to.0), Payload::Peer { epoch, messages });
                }
                // The simulated cluster has no player store.
                Transmit::CloseLink { link } => {
                    if let Some(&g) = self.shards[&s].links.get(&link) {
                        closed.push(g);
                    }
                }
                Transmit::Save(_) | Transmit::WantIds => {}
            }
        }
        self.out = out;
        for g in closed {
            self.cut_link(g, s, true);
        }
    }

    fn send(&mut self, key: Key, payload: Payload) {
        let delay = self.delay();
        let ready = self.t + delay;
        if let Key::Peer(_, to) = key {
            if !self.etcd.has(to) {
                // Not (or no longer) a member: the shell has no stream to it.
                return;
            }
        }
        let stream = self.streams.entry(key).or_default();
        if !stream.open && !matches!(key, Key::Peer(..)) {
            return;
        }
        let ready = stream.queue.back().map_or(ready, |(last, _)| ready.max(*last));
        stream.queue.push_back((ready, payload));
        self.schedule(key);
    }

    fn schedule(&mut self, key: Key) {
        let Some(stream) = self.streams.get_mut(&key) else { return };
        if stream.scheduled || !stream.open {
            return;
        }
        let Some((ready, _)) = stream.queue.front() else { return };
        let at = (*ready).max(stream.stalled_until).max(self.t);
        stream.scheduled = true;
        self.at(at, Ev::Deliver(key));
    }

    fn deliver(&mut self, key: Key) {
        let Some(stream) = self.streams.get_mut(&key) else { return };
        stream.scheduled = false;
        if !stream.open || stream.stalled_until > self.t {
            self.schedule(key);
            return;
        }
        let Some((_, payload)) = stream.queue.pop_front() else { return };
        let now = self.now();
        match (key, payload) {
            (Key::Up(g, s), Payload::Inputs(inputs)) => {
                if self.focus.is_some() {
                    for input in &inputs {
                        let line =
                            format!("gateway {g} -> shard {s}: {}", model::describe_input(input));
                        self.note(&[input.player_id], || line);
                    }
                }
                let Some(node) = self.shards.get_mut(&s) else { return };
                let Some(&link) = node.link_of.get(&g) else { return };
                if node.core.is_some() {
                    self.hand_shard(s, now, Event::Inputs { link, inputs });
                    self.pump_shard(s);
                }
            }
            (Key::Down(s, g), Payload::Batch(batch)) => {
                if self.focus.is_some() {
                    for delivery in &batch.deliveries {
                        let Some(client) = self
                            .clients
                            .iter()
                            .find(|c| c.gateway == g && c.session == delivery.session)
                        else {
                            continue;
                        };
                        let id = client.id;
                        let line = format!(
                            "shard {s} -> gateway {g} for client {id}: {}",
                            model::describe_delivery(delivery)
                        );
                        self.note(&[id], || line);
                    }
                }
                let Some(node) = self.gateways.get_mut(&g) else { return };
                node.harness.set_now(now);
                node.harness.deliver_batch(s, batch.deliveries);
                self.pump_gateway(g);
            }
            (Key::Peer(a, b), Payload::Peer { epoch, messages }) => {
                if !self.shard_alive(b) {
                    // Held until the peer is back or gone for good (see `lease_gone`).
                    let stream = self.streams.get_mut(&key).expect("delivering from it");
                    stream.queue.push_front((self.t, Payload::Peer { epoch, messages }));
                    stream.open = false;
                    return;
                }
                let theirs = self.shards[&b].core.as_ref().map_or(0, |c| c.epoch());
                if epoch > theirs {
                    // The receiver waits for its watch to catch up with the sender's epoch.
                    self.catch_up(b);
                } else if epoch < theirs && self.shard_alive(a) {
                    // Refused as stale: the sender catches up and sends again, in order.
                    self.catch_up(a);
                    let mine = self.shards[&a].core.as_ref().map_or(epoch, |c| c.epoch());
                    let stream = self.streams.get_mut(&key).expect("delivering from it");
                    stream.queue.push_front((self.t, Payload::Peer { epoch: mine, messages }));
                    for (_, queued) in stream.queue.iter_mut() {
                        if let Payload::Peer { epoch, .. } = queued {
                            *epoch = (*epoch).max(mine);
                        }
                    }
                    let again = self.t + Duration::from_millis(1) + self.delay();
                    self.streams.get_mut(&key).expect("exists").stalled_until = again;
                    self.schedule(key);
                    return;
                }
                self.hand_shard(b, now, Event::Peer { from: ShardId(a), messages });
                self.pump_shard(b);
            }
            _ => unreachable!("each stream carries its own payload"),
        }
        self.schedule(key);
    }

    /// The node's watch delivers the newest view now (it was on its way).
    fn catch_up(&mut self, s: u32) {
        let version = self.etcd.version();
        self.view_to(Node::Shard(s), version);
    }

    // ---- gateways -----------------------------------------------------------------

    /// Takes a gateway's relayed inputs to its streams and its clients' output to them.
    fn pump_gateway(&mut self, g: u32) {
        let Some(node) = self.gateways.get_mut(&g) else { return };
        node.harness.flush();
        let known: Vec<u32> = node.known.iter().copied().collect();
        for s in known {
            let node = self.gateways.get_mut(&g).expect("exists");
            let Some(inputs) = node.harness.relayed_inputs(s) else { continue };
            if inputs.is_empty() {
                continue;
            }
            let open = self.streams.get(&Key::Up(g, s)).is_some_and(|st| st.open);
            if open {
                self.send(Key::Up(g, s), Payload::Inputs(inputs));
            } else {
                self.gateways
                    .get_mut(&g)
                    .expect("exists")
                    .waiting
                    .entry(s)
                    .or_default()
                    .extend(inputs);
            }
        }
        for i in 0..self.clients.len() {
            if self.clients[i].gateway == g {
                self.client_read(i);
            }
        }
    }

    fn connect(&mut self, g: u32, s: u32) {
        let Some(node) = self.gateways.get(&g) else { return };
        if !node.known.contains(&s) || node.harness.link_is_up(s) {
            return;
        }
        if !self.shard_alive(s) {
            self.after(Duration::from_millis(200), Ev::Connect(g, s));
            return;
        }
        let link = LinkId(self.next_link);
        self.next_link += 1;
        self.note_all(|| format!("gateway {g} <-> shard {s}: stream open"));
        for key in [Key::Up(g, s), Key::Down(s, g)] {
            let stream = self.streams.entry(key).or_default();
            stream.open = true;
            stream.queue.clear();
        }
        let now = self.now();
        let shard = self.shards.get_mut(&s).expect("alive");
        shard.links.insert(link, g);
        shard.link_of.insert(g, link);
        // The harness's gateway core is its worker 0: every session id it hands out is in
        // lane 0 (`meridian_rpc::link::session_lane`), so one link per gateway is its
        // lane 0's.
        self.hand_shard(s, now, Event::LinkOpened { link, gateway: g, lane: 0 });
        self.pump_shard(s);
        let node = self.gateways.get_mut(&g).expect("exists");
        node.harness.link_up(s);
        let waiting = node.waiting.remove(&s).unwrap_or_default();
        if !waiting.is_empty() {
            self.send(Key::Up(g, s), Payload::Inputs(waiting));
        }
        self.pump_gateway(g);
    }

    /// The stream between a gateway and a shard failed: both ends see it at once.
    fn cut_link(&mut self, g: u32, s: u32, reconnect: bool) {
        self.note_all(|| format!("gateway {g} <-> shard {s}: stream broken"));
        for key in [Key::Up(g, s), Key::Down(s, g)] {
            if let Some(stream) = self.streams.get_mut(&key) {
                stream.open = false;
                stream.queue.clear();
            }
        }
        let now = self.now();
        if let Some(node) = self.shards.get_mut(&s) {
            if let Some(link) = node.link_of.remove(&g) {
                node.links.remove(&link);
                if node.core.is_some() {
                    self.hand_shard(s, now, Event::LinkClosed { link });
                    self.pump_shard(s);
                }
            }
        }
        if let Some(node) = self.gateways.get_mut(&g) {
            node.harness.set_now(now);
            node.harness.link_down(s);
            node.waiting.remove(&s);
            self.pump_gateway(g);
        }
        if reconnect {
            let backoff = Duration::from_millis(self.rng.random_range(50..400));
            self.after(backoff, Ev::Connect(g, s));
        }
    }

    // ---- etcd and views -----------------------------------------------------------

    /// Tells every node about the newest view, each after its own watch lag.
    fn publish(&mut self) {
        let version = self.etcd.version();
        let lag = self.settings.view_lag.as_millis() as u64;
        let nodes: Vec<Node> = self
            .shards
            .iter()
            .filter(|(_, n)| n.core.is_some())
            .map(|(id, _)| Node::Shard(*id))
            .chain(self.gateways.keys().map(|g| Node::Gateway(*g)))
            .collect();
        // A stalled etcd's watches deliver nothing until it runs again.
        let from = self.etcd_stalled_until.max(self.t);
        for node in nodes {
            let lag = Duration::from_millis(self.rng.random_range(0..=lag));
            self.at(from + lag, Ev::View { node, version });
        }
    }

    fn view_to(&mut self, node: Node, version: usize) {
        let view = self.etcd.view(version).clone();
        let epoch = view.partition.as_ref().map_or(0, |p| p.epoch);
        self.note_all(|| format!("{node:?} sees view {version} (epoch {epoch})"));
        let now = self.now();
        match node {
            Node::Shard(s) => {
                let Some(shard) = self.shards.get_mut(&s) else { return };
                if shard.seen >= version {
                    return;
                }
                shard.seen = version;
                if shard.core.is_none() {
                    return;
                }
                self.hand_shard(s, now, Event::View(view.clone()));
                let members: BTreeSet<u32> = view.shards.keys().map(|id| id.0).collect();
                for &other in &members {
                    if other != s
                        && !self.streams.get(&Key::Peer(s, other)).is_some_and(|st| st.open)
                    {
                        let delay = Duration::from_millis(self.rng.random_range(1..30));
                        self.after(delay, Ev::PeerConnect(s, other));
                    }
                }
                let shard = self.shards.get_mut(&s).expect("exists");
                let gone: Vec<u32> =
                    shard.peers_up.iter().filter(|p| !members.contains(p)).copied().collect();
                for p in gone {
                    shard.peers_up.remove(&p);
                    if let Some(stream) = self.streams.get_mut(&Key::Peer(s, p)) {
                        stream.open = false;
                        stream.queue.clear();
                    }
                }
                self.peers_changed(s);
                self.pump_shard(s);
            }
            Node::Gateway(g) => {
                let Some(gateway) = self.gateways.get_mut(&g) else { return };
                if gateway.seen >= version {
                    return;
                }
                gateway.seen = version;
                let members: Vec<u32> = view.shards.keys().map(|id| id.0).collect();
                let registrations: Vec<(u32, u64)> =
                    view.shards.values().map(|r| (r.id.0, r.incarnation)).collect();
                gateway.harness.set_now(now);
                let closed = gateway.harness.set_cluster(view.partition.clone(), &registrations);
                let new: Vec<u32> =
                    members.iter().filter(|m| !gateway.known.contains(m)).copied().collect();
                gateway.known = members.iter().copied().collect();
                for s in &closed {
                    // One registered again is not dead: its link is new.
                    if !members.contains(s) {
                        gateway.dead.insert(*s);
                    }
                    gateway.waiting.remove(s);
                }
                for s in closed {
                    self.cut_link(g, s, members.contains(&s));
                }
                for s in new {
                    let delay = Duration::from_millis(self.rng.random_range(1..30));
                    self.after(delay, Ev::Connect(g, s));
                }
                let owners = view.partition.as_ref().map(|p| p.owners()).unwrap_or_default();
                let gateway = self.gateways.get_mut(&g).expect("exists");
                let reassigned: Vec<u32> = gateway
                    .dead
                    .iter()
                    .filter(|d| !owners.contains(&ShardId(**d)))
                    .copied()
                    .collect();
                for dead in reassigned {
                    gateway.dead.remove(&dead);
                    gateway.harness.restore_from(dead);
                }
                self.pump_gateway(g);
            }
        }
    }

    fn peer_connect(&mut self, a: u32, b: u32) {
        if !self.shard_alive(a) || !self.etcd.has(b) {
            return;
        }
        if !self.shard_alive(b) {
            self.after(Duration::from_millis(200), Ev::PeerConnect(a, b));
            return;
        }
        let stream = self.streams.entry(Key::Peer(a, b)).or_default();
        stream.open = true;
        self.shards.get_mut(&a).expect("alive").peers_up.insert(b);
        self.peers_changed(a);
        self.schedule(Key::Peer(a, b));
        self.pump_shard(a);
    }

    fn peers_changed(&mut self, s: u32) {
        let now = self.now();
        let Some(node) = self.shards.get_mut(&s) else { return };
        let up: Vec<ShardId> = node.peers_up.iter().map(|p| ShardId(*p)).collect();
        if node.core.is_some() {
            self.hand_shard(s, now, Event::PeersUp(up));
        }
    }

    // ---- faults -------------------------------------------------------------------

    fn fault(&mut self, kind: FaultKind) {
        let alive: Vec<u32> =
            self.shards.iter().filter(|(_, n)| n.core.is_some()).map(|(id, _)| *id).collect();
        // Alive and running: a kill or a pause leaves at least one of these, as the model
        // of etcd never drops its last member (a whole cluster down is not modelled; a
        // shard killed while the only other one was paused stayed registered for good,
        // and its players waited for it: seed 26 with its pause).
        let t = self.t;
        let running =
            self.shards.iter().filter(|(_, n)| n.core.is_some() && n.paused_until <= t).count();
        match kind {
            FaultKind::BorderMove => {
                let shift = self.rng.random_range(-24i32..=24);
                let pick = self.rng.random::<u64>();
                if self.etcd.move_border(pick, shift) {
                    self.outcome.epochs += 1;
                    self.publish();
                }
            }
            FaultKind::Kill => {
                if alive.len() < 2 || running < 2 {
                    return;
                }
                let s = alive[self.rng.random_range(0..alive.len())];
                self.kill(s);
            }
            FaultKind::LinkCut => {
                let g = self.rng.random_range(1..=self.settings.gateways);
                if alive.is_empty() {
                    return;
                }
                let s = alive[self.rng.random_range(0..alive.len())];
                self.cut_link(g, s, true);
            }
            FaultKind::PeerStall => {
                if alive.len() < 2 {
                    return;
                }
                let a = alive[self.rng.random_range(0..alive.len())];
                let b = alive[self.rng.random_range(0..alive.len())];
                if a == b {
                    return;
                }
                let until = self.t + Duration::from_millis(self.rng.random_range(100..1_000));
                let stream = self.streams.entry(Key::Peer(a, b)).or_default();
                stream.stalled_until = until;
            }
            FaultKind::Pause => {
                if alive.len() < 2 || running < 2 {
                    return;
                }
                let s = alive[self.rng.random_range(0..alive.len())];
                let pause = LEASE_TTL + Duration::from_millis(self.rng.random_range(200..2_000));
                self.note_all(|| format!("shard {s} paused for {:.1} s", pause.as_secs_f64()));
                let until = self.t + pause;
                if let Some(node) = self.shards.get_mut(&s) {
                    node.paused_until = until;
                }
                // What it sends while paused: nothing (its output waits in its sockets).
                for (key, stream) in self.streams.iter_mut() {
                    if matches!(key, Key::Down(a, _) | Key::Peer(a, _) if *a == s) {
                        stream.stalled_until = stream.stalled_until.max(until);
                    }
                }
                let lease = self.shards.get(&s).map_or(0, |n| n.lease);
                self.after(LEASE_TTL, Ev::LeaseExpiry(s, lease));
                self.at(until, Ev::Wake(s));
            }
            FaultKind::EtcdStall => {
                let stall = Duration::from_millis(self.rng.random_range(1_000..8_000));
                self.note_all(|| format!("etcd stalled for {:.1} s", stall.as_secs_f64()));
                self.etcd_stalled_until = self.t + stall;
            }
            FaultKind::Join => {
                let id = self.shards.keys().max().copied().unwrap_or(0) + 1;
                self.start_shard(id);
                self.etcd.add(id, 1);
                self.outcome.epochs += 1;
                self.publish();
            }
        }
    }

    /// A shard dies: its streams fail (gateways see it at once), in-flight output it
    /// sent may or may not arrive, and its lease expires after the TTL.
    fn kill(&mut self, s: u32) {
        self.note_all(|| format!("shard {s} killed"));
        if let Some(node) = self.shards.get_mut(&s) {
            node.core = None;
            node.links.clear();
            node.link_of.clear();
            node.peers_up.clear();
        }
        let keys: Vec<Key> = self.streams.keys().copied().collect();
        for key in keys {
            match key {
                Key::Peer(a, _) if a == s => {
                    // Whatever had not reached the peer's socket is lost.
                    let keep = self.rng.random_range(0..=self.streams[&key].queue.len());
                    self.streams.get_mut(&key).expect("exists").queue.truncate(keep);
                }
                Key::Peer(_, b) if b == s => {
                    let stream = self.streams.get_mut(&key).expect("exists");
                    stream.open = false;
                }
                _ => {}
            }
        }
        let gateways: Vec<u32> = self.gateways.keys().copied().collect();
        for g in gateways {
            self.cut_link(g, s, true);
        }
        self.after(LEASE_TTL, Ev::LeaseExpiry(s, 0));
        let peers: Vec<u32> = self.shards.keys().copied().filter(|p| *p != s).collect();
        for p in peers {
            if let Some(node) = self.shards.get_mut(&p) {
                node.peers_up.remove(&s);
            }
            self.peers_changed(p);
        }
    }

    // ---- quiescence ---------------------------------------------------------------

    fn check_quiescent(&mut self) {
        // Truth: who is local where.
        let mut owner: BTreeMap<u64, (u32, (u32, u32))> = BTreeMap::new();
        let mut broken = None;
        'shards: for (&s, node) in &self.shards {
            let Some(core) = &node.core else { continue };
            for (id, at) in core.local_players() {
                if let Some((other, _)) = owner.insert(id.0, (s, (at.x, at.y))) {
                    let what = format!("player {} is local on shards {other} and {s}", id.0);
                    broken = Some((what, vec![id.0]));
                    break 'shards;
                }
            }
            let sizes = core.sizes();
            if sizes.early > 0 || sizes.awaiting_gateway > 0 {
                let what = format!("shard {s} still holds inputs or handoffs at rest: {sizes:?}");
                let players = core.players_waited_for().into_iter().map(|p| p.0).collect();
                broken = Some((what, players));
                break;
            }
        }
        if let Some((what, players)) = broken {
            return self.fail(what, players);
        }
        // Every ghost is mirrored by its owner, where the owner has it.
        for (&s, node) in &self.shards {
            let Some(core) = &node.core else { continue };
            for (id, at) in core.ghost_positions() {
                let Some(&(o, truth)) = owner.get(&id.0) else {
                    let what =
                        format!("shard {s} shows a ghost of player {} who is in no shard", id.0);
                    return self.fail(what, vec![id.0]);
                };
                let mirrored = self.shards[&o]
                    .core
                    .as_ref()
                    .and_then(|c| c.ghosted_at(id))
                    .is_some_and(|holders| holders.contains(&ShardId(s)));
                if !mirrored {
                    let what = format!(
                        "shard {s} keeps a ghost of player {} that its owner {o} does not mirror there",
                        id.0
                    );
                    return self.fail(what, vec![id.0]);
                }
                if (at.x, at.y) != truth {
                    let what = format!(
                        "shard {s}'s ghost of player {} is at {:?}, the player at {truth:?}",
                        id.0,
                        (at.x, at.y)
                    );
                    return self.fail(what, vec![id.0]);
                }
            }
        }
        let range = self.settings.view_range;
        for i in 0..self.clients.len() {
            let client = &self.clients[i];
            let ClientState::Playing = client.state else { continue };
            let me = client.id;
            let Some(&(_, at)) = owner.get(&me) else {
                return self.fail(format!("player {me} is connected but in no shard"), vec![me]);
            };
            if client.at != at {
                let what =
                    format!("player {me} believes it is at {:?}, but is at {at:?}", client.at);
                return self.fail(what, vec![me]);
            }
            let truth: BTreeMap<u64, (u32, u32)> = owner
                .iter()
                .filter(|(id, (_, p))| {
                    **id != me && p.0.abs_diff(at.0) <= range && p.1.abs_diff(at.1) <= range
                })
                .map(|(id, (_, p))| (*id, *p))
                .collect();
            if client.view != truth {
                let extra: Vec<u64> =
                    client.view.keys().filter(|id| !truth.contains_key(id)).copied().collect();
                let missing: Vec<u64> =
                    truth.keys().filter(|id| !client.view.contains_key(id)).copied().collect();
                let wrong: Vec<u64> = client
                    .view
                    .iter()
                    .filter(|(id, p)| truth.get(id).is_some_and(|t| t != *p))
                    .map(|(id, _)| *id)
                    .collect();
                let what = format!(
                    "player {me} at {at:?} sees wrongly: shows {extra:?} who are out of sight, misses {missing:?}, has {wrong:?} at stale cells"
                );
                let mut players = vec![me];
                players.extend(extra.iter().chain(&missing).chain(&wrong));
                return self.fail(what, players);
            }
        }
    }
}
