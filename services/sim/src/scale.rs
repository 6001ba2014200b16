//! The scale model: many players on many real shard cores, counting what shards send each
//! other. No sockets, no gateways, no delays: the model is the traffic, not the timing.
//!
//! Every shard is a real [`ShardCore`], laid out by the coordinator's own partition
//! (through the etcd model, as in the simulator). One gateway has a stream to every shard;
//! it routes each player's inputs to the shard that owns the player and follows the
//! `released_to` marker of a handoff at once, so no input is ever forwarded here (a real
//! gateway reads the marker a little later; the moves sent meanwhile are forwarded). Players
//! spawn uniformly and walk at random: each moves one cell every `move_every` (one second
//! in the published runs), in one of four directions drawn uniformly, at its own phase of
//! the period. Time goes in steps of the shard's tick (100 ms): the step's moves go to their
//! shards, every shard ticks, and every peer message is delivered, in order per pair of
//! shards, until none is left; then the next step. Every message one shard hands another
//! (`Transmit::Peer`) is counted by kind and by encoded size, as the field it is in a
//! `PeerBatch`; batch headers and transport framing are not counted (the number of batches
//! depends on how the real shell groups rounds, which this model does not imitate).
//!
//! Alongside each run, [`predict`] gives what border length, sight and density alone say
//! the counts should be, so the measurement can be checked against something.
//!
//! This file is longer than most (about 930 lines): the model, the prediction it is checked
//! against and the renderings of its output (the Markdown tables, and an SVG plot written
//! by hand, because a plotting crate would add to every cold build) change together.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{Region, ShardId};
use meridian_protocol::pb as client_pb;
use meridian_rpc::pb::peer_message::Kind as Peer;
use meridian_rpc::pb::player_input::Kind as Input;
use meridian_rpc::pb::{Join, PeerMessage, PlayerInput};
use meridian_shard_core::core::{ShardCore, TICK};
use meridian_shard_core::{CoreConfig, Event, LinkId, ShardMetrics, Transmit};
use meridian_world::WorldConfig;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::model::Etcd;

/// The sizes the published table is built around; each series varies one of them.
pub const BASE_SHARDS: u32 = 144;
pub const BASE_PLAYERS: u32 = 100_000;
pub const BASE_SIGHT: u32 = 20;

/// One gateway, with the same link id on every shard.
const GATEWAY: u32 = 1;
const LINK: LinkId = LinkId(1);
/// Delivery passes per step at most (a message loop between shards would otherwise hang
/// the model; the report says how many passes were needed, two in every published run).
const MAX_PASSES: usize = 64;

/// One run of the scale model.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    pub shards: u32,
    pub players: u32,
    /// Side of the square map, in cells.
    pub map: u32,
    pub view_range: u32,
    /// Each player moves one cell this often.
    pub move_every: Duration,
    /// Simulated time before counting starts (the logins' burst of ghosts settles).
    pub warmup: Duration,
    /// Simulated time counted.
    pub measure: Duration,
    /// Seeds spawns, phases and directions.
    pub seed: u64,
}

impl Default for ScaleConfig {
    fn default() -> ScaleConfig {
        ScaleConfig::new(BASE_SHARDS, BASE_PLAYERS, BASE_SIGHT)
    }
}

impl ScaleConfig {
    /// A run on the issue's 4,000 x 4,000 map, one move per second, 3 s of warm-up and
    /// 10 s counted.
    pub fn new(shards: u32, players: u32, view_range: u32) -> ScaleConfig {
        ScaleConfig {
            shards,
            players,
            map: 4_000,
            view_range,
            move_every: Duration::from_secs(1),
            warmup: Duration::from_secs(3),
            measure: Duration::from_secs(10),
            seed: 1,
        }
    }

    /// The published set: shards 64 to 256 at 100k players, players 25k to 100k at 144
    /// shards, sight 10 to 40 at 144 shards and 100k players.
    pub fn standard() -> Vec<ScaleConfig> {
        let mut set = Vec::new();
        for shards in [64, 100, 144, 196, 256] {
            set.push(ScaleConfig::new(shards, BASE_PLAYERS, BASE_SIGHT));
        }
        for players in [25_000, 50_000] {
            set.push(ScaleConfig::new(BASE_SHARDS, players, BASE_SIGHT));
        }
        for sight in [10, 40] {
            set.push(ScaleConfig::new(BASE_SHARDS, BASE_PLAYERS, sight));
        }
        set
    }

    /// The ghost margin: how far outside its region a shard keeps copies (the shard's
    /// `geometry::ghost_margin`, sight plus one).
    pub fn margin(&self) -> u32 {
        self.view_range + 1
    }

    fn regions(&self) -> Vec<Region> {
        let etcd = Etcd::new(self.map, (1..=self.shards).collect());
        etcd.current().partition.as_ref().map(|p| p.regions.clone()).unwrap_or_default()
    }

    fn moves_per_second(&self) -> f64 {
        1.0 / self.move_every.as_secs_f64()
    }
}

/// The kinds of `PeerMessage`, in the order tables list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    Released,
    Moved,
    Upsert,
    Remove,
    Handoff,
    HandoffAck,
    Forwarded,
    Needed,
    Chat,
    Game,
}

impl PeerKind {
    pub const ALL: [PeerKind; 10] = [
        PeerKind::Released,
        PeerKind::Moved,
        PeerKind::Upsert,
        PeerKind::Remove,
        PeerKind::Handoff,
        PeerKind::HandoffAck,
        PeerKind::Forwarded,
        PeerKind::Needed,
        PeerKind::Chat,
        PeerKind::Game,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Released => "Released",
            PeerKind::Moved => "Moved",
            PeerKind::Upsert => "Upsert",
            PeerKind::Remove => "Remove",
            PeerKind::Handoff => "Handoff",
            PeerKind::HandoffAck => "HandoffAck",
            PeerKind::Forwarded => "Forwarded",
            PeerKind::Needed => "Needed",
            PeerKind::Chat => "Chat",
            PeerKind::Game => "Game",
        }
    }

    fn of(message: &PeerMessage) -> Option<PeerKind> {
        Some(match message.kind.as_ref()? {
            Peer::Released(_) => PeerKind::Released,
            Peer::Moved(_) => PeerKind::Moved,
            Peer::Upsert(_) => PeerKind::Upsert,
            Peer::Remove(_) => PeerKind::Remove,
            Peer::Handoff(_) => PeerKind::Handoff,
            Peer::HandoffAck(_) => PeerKind::HandoffAck,
            Peer::Forwarded(_) => PeerKind::Forwarded,
            Peer::Needed(_) => PeerKind::Needed,
            Peer::Chat(_) => PeerKind::Chat,
            Peer::State(_)
            | Peer::Action(_)
            | Peer::Answer(_)
            | Peer::EntityMessage(_)
            | Peer::Event(_)
            // Rare (one per login, to every other shard): counted with the game's.
            | Peer::Claim(_) => PeerKind::Game,
        })
    }

    fn index(self) -> usize {
        PeerKind::ALL.iter().position(|k| *k == self).expect("invariant: ALL lists every kind")
    }
}

/// Messages and bytes of one kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count {
    pub messages: u64,
    pub bytes: u64,
}

/// What one run counted, over the measured window only.
#[derive(Debug, Clone, Default)]
pub struct ScaleReport {
    pub config: ScaleConfig,
    /// Indexed like [`PeerKind::ALL`].
    pub by_kind: [Count; PeerKind::ALL.len()],
    /// `Released` messages that went to a shard whose region is within the ghost margin of
    /// the player's cell (one that holds, or may hold, a copy of it).
    pub released_near: u64,
    /// Messages, bytes and handoffs sent by each shard (index: shard id - 1).
    pub sent_by_shard: Vec<Count>,
    pub handoffs_by_shard: Vec<u64>,
    /// Ghosts per shard, averaged over one sample per simulated second, and the largest
    /// single sample.
    pub ghosts_mean: f64,
    pub ghosts_max: usize,
    /// Ghost tracks per shard at the end (copies, plus the generations of players not
    /// held here remembered to drop their late messages), mean and largest.
    pub tracks_mean: f64,
    pub tracks_max: usize,
    /// `Transmit::Peer` rounds (one `PeerBatch` each), with every shard's output flushed
    /// once per step and once per delivery pass.
    pub peer_batches: u64,
    /// Of those, rounds that carry nothing but `Released`.
    pub released_only_batches: u64,
    pub moves_sent: u64,
    pub move_answers: u64,
    /// Bytes of the batches shards sent the gateway (client frames and their envelopes).
    pub gateway_bytes: u64,
    /// Players local on some shard at the end (must be every player).
    pub placed: u64,
    /// The most delivery passes one step needed.
    pub passes_max: usize,
    pub wall: Duration,
}

impl ScaleReport {
    fn seconds(&self) -> f64 {
        self.config.measure.as_secs_f64()
    }

    pub fn count(&self, kind: PeerKind) -> Count {
        self.by_kind[kind.index()]
    }

    pub fn total(&self) -> Count {
        self.by_kind.iter().fold(Count::default(), |sum, c| Count {
            messages: sum.messages + c.messages,
            bytes: sum.bytes + c.bytes,
        })
    }

    /// Messages per player per second.
    pub fn per_player(&self, messages: u64) -> f64 {
        messages as f64 / f64::from(self.config.players) / self.seconds()
    }

    pub fn handoffs_per_shard(&self) -> f64 {
        let handoffs: u64 = self.handoffs_by_shard.iter().sum();
        handoffs as f64 / f64::from(self.config.shards) / self.seconds()
    }

    /// Peer bytes each shard sends per second: (mean, largest).
    pub fn peer_bytes_per_shard(&self) -> (f64, f64) {
        let max = self.sent_by_shard.iter().map(|c| c.bytes).max().unwrap_or(0);
        let mean = self.total().bytes as f64 / f64::from(self.config.shards);
        (mean / self.seconds(), max as f64 / self.seconds())
    }
}

/// What border length, sight and density say the counts should be.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    pub ghosts_per_shard: f64,
    pub handoffs_per_shard: f64,
    /// Per player per second, indexed like [`PeerKind::ALL`].
    pub per_player: [f64; PeerKind::ALL.len()],
    pub total_per_player: f64,
}

/// The prediction for a layout: density `ρ = players / map²`, move rate `r`, ghost margin
/// `m = sight + 1`, and from the coordinator's regions the interior border length `B` (the
/// shared edges, counted once) and the area `A_m` of cells within `m` of another shard's
/// region (a strip `m` wide along each side of each border, plus an `m x m` square at
/// each corner where four regions meet; counted once per shard that must hold the copy).
///
/// - ghosts: `G = ρ · A_m` (about `2 · B · m · ρ`);
/// - handoffs: a walker next to a border crosses it with probability 1/4 per move, so
///   `H = 2 · B · ρ · r / 4`;
/// - `Moved`: every move of a mirrored player, to each holder: `G · r`;
/// - `Upsert`: walkers entering a margin strip (`H` in all) plus the new owner's first
///   copy on the old one after a handoff (`H`); `Remove`: walkers leaving a strip (`H`);
/// - `Handoff` and `HandoffAck`: `H` each; `Released`: `H · (S - 2)`, because the old
///   owner tells every other shard (`handover.rs`, `hand_off`).
pub fn predict(config: &ScaleConfig) -> Prediction {
    let regions = config.regions();
    let area = f64::from(config.map) * f64::from(config.map);
    let density = f64::from(config.players) / area;
    let r = config.moves_per_second();
    let m = i64::from(config.margin());
    let (mut border, mut within_margin) = (0i64, 0i64);
    for a in &regions {
        for b in &regions {
            if a.shard == b.shard {
                continue;
            }
            let overlap = |lo0: u32, hi0: u32, lo1: u32, hi1: u32| {
                (i64::from(hi0.min(hi1)) - i64::from(lo0.max(lo1))).max(0)
            };
            if a.x1 == b.x0 {
                border += overlap(a.y0, a.y1, b.y0, b.y1);
            }
            if a.y1 == b.y0 {
                border += overlap(a.x0, a.x1, b.x0, b.x1);
            }
            // Cells of `a` within m of `b`: `a` cut by `b` grown by m on every side.
            let grow = |lo: u32, hi: u32, v0: u32, v1: u32| {
                (i64::from(hi).min(i64::from(v1) + m) - i64::from(lo).max(i64::from(v0) - m)).max(0)
            };
            within_margin += grow(a.x0, a.x1, b.x0, b.x1) * grow(a.y0, a.y1, b.y0, b.y1);
        }
    }
    let shards = f64::from(config.shards);
    let ghosts = density * within_margin as f64;
    let handoffs = 2.0 * border as f64 * density * r / 4.0;
    let players = f64::from(config.players);
    let mut per_player = [0.0; PeerKind::ALL.len()];
    for kind in PeerKind::ALL {
        per_player[kind.index()] = match kind {
            PeerKind::Released => handoffs * (shards - 2.0).max(0.0),
            PeerKind::Moved => ghosts * r,
            PeerKind::Upsert => 2.0 * handoffs,
            PeerKind::Remove | PeerKind::Handoff | PeerKind::HandoffAck => handoffs,
            PeerKind::Forwarded | PeerKind::Needed | PeerKind::Chat | PeerKind::Game => 0.0,
        } / players;
    }
    Prediction {
        ghosts_per_shard: ghosts / shards,
        handoffs_per_shard: handoffs / shards,
        per_player,
        total_per_player: per_player.iter().sum(),
    }
}

/// Runs the model (deterministic for a config: same seed, same counts).
pub fn run(config: &ScaleConfig) -> ScaleReport {
    let started = Instant::now();
    let mut model = Model::new(config);
    let steps_per_move = (config.move_every.as_millis() / TICK.as_millis()).max(1) as u64;
    let steps_per_second = (1000 / TICK.as_millis()) as u64;
    let warmup = (config.warmup.as_millis() / TICK.as_millis()) as u64;
    let total = warmup + (config.measure.as_millis() / TICK.as_millis()) as u64;
    let mut rng = SmallRng::seed_from_u64(config.seed ^ 0x5ca1e);
    let mut phase_of: Vec<Vec<u32>> = vec![Vec::new(); steps_per_move as usize];
    for player in 0..config.players {
        phase_of[rng.random_range(0..steps_per_move) as usize].push(player);
    }
    let mut ghost_samples: Vec<usize> = Vec::new();
    for step in 0..=total {
        let now = model.base + TICK * step as u32;
        model.measuring = step > warmup;
        let mut inputs: Vec<Vec<PlayerInput>> = vec![Vec::new(); config.shards as usize];
        if step == 0 {
            model.joins(&mut rng, &mut inputs);
        } else {
            for &player in &phase_of[(step % steps_per_move) as usize] {
                let direction = rng.random_range(1..=4);
                let input = model.next_input(
                    player,
                    Input::Move(client_pb::Move { direction, client_time: step }),
                );
                inputs[model.route[player as usize] as usize - 1].push(input);
                if model.measuring {
                    model.report.moves_sent += 1;
                }
            }
        }
        for (i, batch) in inputs.into_iter().enumerate() {
            if !batch.is_empty() {
                model.cores[i].handle(now, Event::Inputs { link: LINK, inputs: batch });
            }
        }
        for core in model.cores.iter_mut() {
            core.handle(now, Event::Tick);
        }
        model.deliver_all(now);
        if model.measuring && step % steps_per_second == 0 {
            ghost_samples.extend(model.cores.iter().map(|core| core.ghost_positions().len()));
        }
    }
    let mut report = model.report;
    report.placed = model.cores.iter().map(|core| core.local_players().count() as u64).sum();
    report.ghosts_mean =
        ghost_samples.iter().sum::<usize>() as f64 / ghost_samples.len().max(1) as f64;
    report.ghosts_max = ghost_samples.iter().copied().max().unwrap_or(0);
    let tracks: Vec<usize> = model.cores.iter().map(|core| core.sizes().ghost_tracks).collect();
    report.tracks_mean = tracks.iter().sum::<usize>() as f64 / tracks.len().max(1) as f64;
    report.tracks_max = tracks.iter().copied().max().unwrap_or(0);
    report.wall = started.elapsed();
    report
}

struct Model {
    config: ScaleConfig,
    base: Instant,
    cores: Vec<ShardCore>,
    /// Regions by shard id - 1 (the coordinator gives each shard one).
    regions: Vec<Region>,
    /// The shard each player's inputs go to (the gateway's routing table), by player.
    route: Vec<u32>,
    next_seq: Vec<u64>,
    measuring: bool,
    report: ScaleReport,
}

impl Model {
    fn new(config: &ScaleConfig) -> Model {
        let base = Instant::now();
        let etcd = Etcd::new(config.map, (1..=config.shards).collect());
        let view = etcd.current().clone();
        let mut regions = config.regions();
        regions.sort_by_key(|r| r.shard);
        assert!(
            regions.iter().enumerate().all(|(i, r)| r.shard.0 as usize == i + 1),
            "the scale model expects one region per shard"
        );
        let world = WorldConfig {
            width: config.map,
            height: config.map,
            view_range: config.view_range,
            ..Default::default()
        };
        let all: Vec<ShardId> = (1..=config.shards).map(ShardId).collect();
        let cores = all
            .iter()
            .map(|&id| {
                let core_config = CoreConfig {
                    id,
                    incarnation: 1,
                    world: world.clone(),
                    seed: config.seed,
                    resume_window: Duration::from_secs(30),
                    resume_keys: meridian_gateway_core::fuzzing::resume_key().into(),
                    save_interval: None,
                    lease_ttl: Duration::from_secs(3),
                    max_npcs: 0,
                };
                let metrics = Arc::new(ShardMetrics::new(&Default::default(), id));
                let mut core = ShardCore::new(&core_config, metrics, base);
                core.handle(base, Event::View(view.clone()));
                core.handle(
                    base,
                    Event::PeersUp(all.iter().copied().filter(|p| *p != id).collect()),
                );
                // Sessions here are player ids, all in lane 0.
                core.handle(base, Event::LinkOpened { link: LINK, gateway: GATEWAY, lane: 0 });
                core
            })
            .collect();
        let shards = config.shards as usize;
        Model {
            config: config.clone(),
            base,
            cores,
            regions,
            route: vec![0; config.players as usize],
            next_seq: vec![1; config.players as usize],
            measuring: false,
            report: ScaleReport {
                config: config.clone(),
                sent_by_shard: vec![Count::default(); shards],
                handoffs_by_shard: vec![0; shards],
                ..ScaleReport::default()
            },
        }
    }

    /// Every player logs in at a uniformly random cell, on the shard that owns it.
    fn joins(&mut self, rng: &mut SmallRng, inputs: &mut [Vec<PlayerInput>]) {
        for player in 0..self.config.players {
            let (x, y) =
                (rng.random_range(0..self.config.map), rng.random_range(0..self.config.map));
            let owner = self
                .regions
                .iter()
                .find(|r| r.contains(x, y))
                .expect("regions cover the map")
                .shard;
            self.route[player as usize] = owner.0;
            let join = Join {
                name: format!("p{player}"),
                spawn: Some(client_pb::Position { x, y }),
                ..Default::default()
            };
            let input = self.next_input(player, Input::Join(join));
            inputs[owner.0 as usize - 1].push(input);
        }
    }

    fn next_input(&mut self, player: u32, kind: Input) -> PlayerInput {
        let seq = self.next_seq[player as usize];
        self.next_seq[player as usize] += 1;
        let id = u64::from(player) + 1;
        PlayerInput { session: id, player_id: id, seq, kind: Some(kind) }
    }

    /// Flushes every shard and delivers peer messages, pass after pass, until none is left
    /// (or [`MAX_PASSES`]).
    fn deliver_all(&mut self, now: Instant) {
        let mut pending: Vec<(ShardId, ShardId, Vec<PeerMessage>)> = Vec::new();
        let mut out = Vec::new();
        for i in 0..self.cores.len() {
            self.cores[i].flush(&mut out);
            self.take(ShardId(i as u32 + 1), &mut out, &mut pending);
        }
        let mut passes = 0;
        while !pending.is_empty() && passes < MAX_PASSES {
            passes += 1;
            let mut touched = vec![false; self.cores.len()];
            for (from, to, messages) in pending.drain(..) {
                let i = to.0 as usize - 1;
                self.cores[i].handle(now, Event::Peer { from, messages });
                touched[i] = true;
            }
            for (i, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
                self.cores[i].flush(&mut out);
                self.take(ShardId(i as u32 + 1), &mut out, &mut pending);
            }
        }
        self.report.passes_max = self.report.passes_max.max(passes);
        if !pending.is_empty() {
            // Left after MAX_PASSES (a loop between shards): handed to their receivers now,
            // in order; what they cause goes out with the next step's output.
            for (from, to, messages) in pending {
                self.cores[to.0 as usize - 1].handle(now, Event::Peer { from, messages });
            }
        }
    }

    /// Counts a shard's round of output and queues its peer messages; the gateway follows
    /// handoffs at once.
    fn take(
        &mut self,
        from: ShardId,
        out: &mut Vec<Transmit>,
        pending: &mut Vec<(ShardId, ShardId, Vec<PeerMessage>)>,
    ) {
        let measuring = self.measuring;
        // Where this round's handoffs put their players, to tell which `Released` went to
        // a shard near the player.
        let mut handed: Vec<(u64, u32, u32)> = Vec::new();
        for transmit in out.iter() {
            if let Transmit::Peer { messages, .. } = transmit {
                for m in messages {
                    if let Some(Peer::Handoff(h)) = &m.kind {
                        let at = h.position.unwrap_or_default();
                        handed.push((m.player_id, at.x, at.y));
                    }
                }
            }
        }
        let margin = self.config.margin();
        for transmit in out.drain(..) {
            match transmit {
                Transmit::Gateway { batch, .. } => {
                    for delivery in &batch.deliveries {
                        if delivery.released_to != 0 {
                            self.route[delivery.session as usize - 1] = delivery.released_to;
                        }
                        if measuring {
                            self.report.move_answers += u64::from(delivery.move_answers);
                        }
                    }
                    if measuring {
                        self.report.gateway_bytes += batch.encoded_len() as u64;
                    }
                }
                Transmit::Peer { to, messages } => {
                    if measuring {
                        self.report.peer_batches += 1;
                        let only_released =
                            messages.iter().all(|m| matches!(m.kind, Some(Peer::Released(_))));
                        self.report.released_only_batches += u64::from(only_released);
                        let region = &self.regions[to.0 as usize - 1];
                        for m in &messages {
                            let Some(kind) = PeerKind::of(m) else { continue };
                            let len = m.encoded_len();
                            // As a field of a PeerBatch: tag, length, body.
                            let bytes = (1 + prost::length_delimiter_len(len) + len) as u64;
                            let count = &mut self.report.by_kind[kind.index()];
                            count.messages += 1;
                            count.bytes += bytes;
                            let sent = &mut self.report.sent_by_shard[from.0 as usize - 1];
                            sent.messages += 1;
                            sent.bytes += bytes;
                            match kind {
                                PeerKind::Handoff => {
                                    self.report.handoffs_by_shard[from.0 as usize - 1] += 1
                                }
                                PeerKind::Released => {
                                    let near = handed
                                        .iter()
                                        .find(|h| h.0 == m.player_id)
                                        .is_some_and(|&(_, x, y)| distance(region, x, y) <= margin);
                                    self.report.released_near += u64::from(near);
                                }
                                _ => {}
                            }
                        }
                    }
                    pending.push((from, to, messages));
                }
                // The scale model pauses no shard; it has no player store.
                Transmit::CloseLink { .. }
                | Transmit::Save(_)
                | Transmit::WantIds
                | Transmit::Kv(_)
                | Transmit::SaveEntities { .. }
                | Transmit::LoadEntities { .. }
                | Transmit::ClaimEntities(_) => {}
            }
        }
    }
}

/// Chebyshev distance from a cell to the nearest cell of a region (0 inside): the shard's
/// geometry's own measure.
fn distance(region: &Region, x: u32, y: u32) -> u32 {
    meridian_shard_core::distance(region, meridian_world::Position { x, y })
}

/// The two Markdown tables of `BENCHMARKS.md`: peer messages per player per second by kind
/// against the prediction, and the per-shard figures.
pub fn markdown(reports: &[ScaleReport]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| shards | players | sight | peer msgs / player / s | Released | Moved | Upsert | Remove | Handoff + Ack | other | predicted | measured / predicted |"
    );
    let _ = writeln!(text, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for report in reports {
        let c = &report.config;
        let p = predict(c);
        let rate = |kinds: &[PeerKind]| {
            report.per_player(kinds.iter().map(|k| report.count(*k).messages).sum())
        };
        let total = report.per_player(report.total().messages);
        let _ = writeln!(
            text,
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.4} | {:.4} | {:.4} | {:.4} | {:.3} | {:.2} |",
            c.shards,
            c.players,
            c.view_range,
            total,
            rate(&[PeerKind::Released]),
            rate(&[PeerKind::Moved]),
            rate(&[PeerKind::Upsert]),
            rate(&[PeerKind::Remove]),
            rate(&[PeerKind::Handoff, PeerKind::HandoffAck]),
            rate(&[PeerKind::Forwarded, PeerKind::Needed, PeerKind::Chat]),
            p.total_per_player,
            total / p.total_per_player,
        );
    }
    let _ = writeln!(text);
    let _ = writeln!(
        text,
        "| shards | players | sight | handoffs / shard / s (predicted) | ghosts / shard, mean (predicted) | ghosts, largest shard | ghost tracks / shard at the end of the run | peer KB/s sent per shard, mean / largest | peer batches / shard / s (only Released) | Released bytes, share | Released to shards near the player | gateway KB/s per shard |"
    );
    let _ = writeln!(text, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for report in reports {
        let c = &report.config;
        let p = predict(c);
        let (mean, max) = report.peer_bytes_per_shard();
        let released = report.count(PeerKind::Released);
        let total = report.total();
        let gateway = report.gateway_bytes as f64 / f64::from(c.shards) / c.measure.as_secs_f64();
        let _ = writeln!(
            text,
            "| {} | {} | {} | {:.2} ({:.2}) | {:.0} ({:.0}) | {} | {:.0} | {:.1} / {:.1} | {:.0} ({:.0}) | {:.0}% | {:.1}% | {:.0} |",
            c.shards,
            c.players,
            c.view_range,
            report.handoffs_per_shard(),
            p.handoffs_per_shard,
            report.ghosts_mean,
            p.ghosts_per_shard,
            report.ghosts_max,
            report.tracks_mean,
            mean / 1000.0,
            max / 1000.0,
            report.peer_batches as f64 / f64::from(c.shards) / c.measure.as_secs_f64(),
            report.released_only_batches as f64 / f64::from(c.shards) / c.measure.as_secs_f64(),
            100.0 * released.bytes as f64 / total.bytes.max(1) as f64,
            100.0 * report.released_near as f64 / released.messages.max(1) as f64,
            gateway / 1000.0,
        );
    }
    text
}

/// One run's peer traffic by kind: messages and bytes each shard sends per second, the
/// mean size of a message, the share of all peer bytes.
pub fn kinds_markdown(report: &ScaleReport) -> String {
    let c = &report.config;
    let per_shard = f64::from(c.shards) * c.measure.as_secs_f64();
    let total = report.total();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| kind | msgs / shard / s | bytes / msg | bytes / shard / s | share of peer bytes |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|");
    for kind in PeerKind::ALL {
        let count = report.count(kind);
        if count.messages == 0 {
            continue;
        }
        let _ = writeln!(
            text,
            "| {} | {:.1} | {:.1} | {:.0} | {:.1}% |",
            kind.name(),
            count.messages as f64 / per_shard,
            count.bytes as f64 / count.messages as f64,
            count.bytes as f64 / per_shard,
            100.0 * count.bytes as f64 / total.bytes.max(1) as f64
        );
    }
    text
}

/// One column of the plot: which runs it shows (the value on its x axis for a run that
/// varies its quantity only), and how a tick is written.
struct Axis {
    label: &'static str,
    pick: fn(&ScaleConfig) -> Option<f64>,
    tick: fn(f64) -> String,
}

/// One line of a plot.
struct Series {
    label: &'static str,
    color: &'static str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// The plot of `docs/bench/scale-model.svg`: peer messages per player per second (top)
/// and ghosts per shard (bottom), against shards, players and sight, each measured and
/// predicted. Hand-written SVG: no plotting crate in the build.
pub fn svg(reports: &[ScaleReport]) -> String {
    let (width, height) = (960.0, 600.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Scale model: real shard cores, 4,000 x 4,000 map, random walkers at 1 move/s</text>"#,
        width / 2.0
    );
    let axes = [
        Axis {
            label: "shards (100k players, sight 20)",
            pick: |c| {
                (c.players == BASE_PLAYERS && c.view_range == BASE_SIGHT)
                    .then_some(f64::from(c.shards))
            },
            tick: |v| format!("{v}"),
        },
        Axis {
            label: "players (144 shards, sight 20)",
            pick: |c| {
                (c.shards == BASE_SHARDS && c.view_range == BASE_SIGHT)
                    .then_some(f64::from(c.players))
            },
            tick: |v| format!("{}k", v / 1000.0),
        },
        Axis {
            label: "sight (144 shards, 100k players)",
            pick: |c| {
                (c.shards == BASE_SHARDS && c.players == BASE_PLAYERS)
                    .then_some(f64::from(c.view_range))
            },
            tick: |v| format!("{v}"),
        },
    ];
    for (column, Axis { label: x_label, pick, tick }) in axes.iter().enumerate() {
        let mut chosen: Vec<(f64, &ScaleReport)> =
            reports.iter().filter_map(|r| Some((pick(&r.config)?, r))).collect();
        chosen.sort_by(|a, b| a.0.total_cmp(&b.0));
        let series = |label: &'static str, color, dashed, f: &dyn Fn(&ScaleReport) -> f64| Series {
            label,
            color,
            dashed,
            points: chosen.iter().map(|(x, r)| (*x, f(r))).collect(),
        };
        let (black, orange, green, purple) = ("#222222", "#d95f02", "#1b9e77", "#7570b3");
        let messages = [
            series("all peer messages", black, false, &|r| r.per_player(r.total().messages)),
            series("predicted", black, true, &|r| predict(&r.config).total_per_player),
            series("Released", orange, false, &|r| {
                r.per_player(r.count(PeerKind::Released).messages)
            }),
            series("Moved", green, false, &|r| r.per_player(r.count(PeerKind::Moved).messages)),
        ];
        let ghosts = [
            series("ghosts per shard", purple, false, &|r| r.ghosts_mean),
            series("predicted", purple, true, &|r| predict(&r.config).ghosts_per_shard),
        ];
        let x = 70.0 + column as f64 * 300.0;
        let ticks: Vec<(f64, String)> = chosen.iter().map(|(v, _)| (*v, tick(*v))).collect();
        let y_label = if column == 0 { "peer msgs / player / s" } else { "" };
        panel(&mut out, (x, 70.0, 240.0, 180.0), &ticks, x_label, y_label, &messages);
        let y_label = if column == 0 { "ghosts per shard" } else { "" };
        panel(&mut out, (x, 350.0, 240.0, 180.0), &ticks, x_label, y_label, &ghosts);
        if column == 2 {
            legend(&mut out, 70.0, 48.0, &messages);
            legend(&mut out, 70.0, 328.0, &ghosts);
        }
    }
    let _ = writeln!(out, "</svg>");
    out
}

fn legend(out: &mut String, x: f64, y: f64, series: &[Series]) {
    let mut at = x;
    for s in series {
        let dash = if s.dashed { r#" stroke-dasharray="5,4""# } else { "" };
        let _ = writeln!(
            out,
            r#"<line x1="{at}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            at + 24.0,
            s.color,
            at + 30.0,
            y + 4.0,
            s.label
        );
        at += 40.0 + 7.0 * s.label.len() as f64;
    }
}

/// One chart: axes from zero, a tick per measured x, lines with dots.
fn panel(
    out: &mut String,
    (x, y, w, h): (f64, f64, f64, f64),
    ticks: &[(f64, String)],
    x_label: &str,
    y_label: &str,
    series: &[Series],
) {
    let (Some(first), Some(last)) = (ticks.first(), ticks.last()) else { return };
    let (x_min, x_max) = (0.0, last.0.max(first.0 + 1.0) * 1.05);
    let y_top = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    let step = nice_step(y_top / 4.0);
    let y_max = (y_top / step).ceil().max(1.0) * step;
    let px = |v: f64| x + (v - x_min) / (x_max - x_min) * w;
    let py = |v: f64| y + h - v / y_max * h;
    let _ = writeln!(
        out,
        r##"<path d="M{x},{y} V{} H{}" fill="none" stroke="#444444"/>"##,
        y + h,
        x + w
    );
    let mut v = 0.0;
    while v <= y_max + step / 2.0 {
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{0}" x2="{1}" y2="{0}" stroke="#dddddd"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
            py(v),
            x + w,
            x - 6.0,
            py(v) + 4.0,
            trim(v)
        );
        v += step;
    }
    for (value, label) in ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#444444"/><text x="{0}" y="{3}" text-anchor="middle">{label}</text>"##,
            px(*value),
            y + h,
            y + h + 5.0,
            y + h + 19.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        x + w / 2.0,
        y + h + 38.0
    );
    if !y_label.is_empty() {
        let (lx, ly) = (x - 48.0, y + h / 2.0);
        let _ = writeln!(
            out,
            r#"<text x="{lx}" y="{ly}" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{y_label}</text>"#
        );
    }
    for s in series {
        let points: Vec<String> =
            s.points.iter().map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b))).collect();
        let dash = if s.dashed { r#" stroke-dasharray="5,4""# } else { "" };
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            points.join(" "),
            s.color
        );
        if !s.dashed {
            for (a, b) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                    px(*a),
                    py(*b),
                    s.color
                );
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * power).find(|s| *s >= raw).unwrap_or(10.0 * power)
}

fn trim(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
