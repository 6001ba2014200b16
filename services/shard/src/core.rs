//! The shard's core: the one place the shard's world is mutated, with no I/O of its own.
//!
//! The core is a state machine driven by `(now, event)` ([`ShardCore::handle`]): inputs
//! from gateway streams, messages from peer shards, cluster-view changes, timer ticks. It
//! answers with what to send ([`ShardCore::flush`]): one round's output grouped per
//! gateway link (`ShardBatch`es) and per peer (a round of messages each). It reads no
//! clock, owns no channel, socket or task, and draws randomness only from a generator
//! seeded by its configuration, so the same events at the same times give the same
//! output: that is what lets `meridian-sim` run many shards in one thread from one seed.
//! The tokio shell around it (`actor.rs`) only moves bytes and timers.
//!
//! Local players' inputs are applied in their sequence order; players near a border are
//! mirrored to neighbours as ghosts; players who step out of the region are handed off
//! (see `players.rs`).

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, ShardId};
use meridian_protocol::pb::ErrorCode;
use meridian_protocol::{server, TokenKeys};
use meridian_rpc::pb::player_input::Kind as Input;
use meridian_rpc::pb::{peer_message::Kind as Peer, PeerMessage, PlayerInput};
use meridian_world::{Envelope, Notification, PlayerId, World};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tracing::{debug, warn};

use crate::geometry::Geometry;
use crate::ghosts::Ghosts;
use crate::history::{Divergent, History};
use crate::metrics::ShardMetrics;
use crate::outbox::{Outbox, PeerRounds};
use crate::sequence::{Offered, Refused};
use crate::types::{
    CoreConfig, EarlyInputs, Event, GatewayLane, HandedOff, Link, LinkId, Parked, SaveRecord, Seat,
    Transmit, FORWARDED_KEPT,
};

/// Housekeeping period: expiries, retries of waiting handoffs. The shell (or the
/// simulator) hands the core [`Event::Tick`] this often.
pub const TICK: Duration = Duration::from_millis(100);
/// Inputs held for a player not (yet) here, waiting for its handoff to arrive; beyond
/// that, new ones are refused (a `Leave` is always held).
const EARLY_LIMIT: usize = 256;
/// How long inputs from a gateway wait for their player before they are refused. Forwarded
/// inputs, which cannot be answered here without their gateway's link, wait `FORWARD_FOR`:
/// the shard that forwarded them handed their player here.
const EARLY_WAIT: Duration = Duration::from_secs(2);
/// A handed-off player stays listed by the old owner this long after the new owner
/// confirmed (so a sequential sample of all shards always finds it somewhere), and its
/// late inputs are forwarded this long.
const LISTED_AFTER_ACK: Duration = Duration::from_secs(1);
const FORWARD_FOR: Duration = Duration::from_secs(30);
/// How long a logout waits for its save before its connection is closed anyway.
const CLOSE_AFTER_SAVE_WITHIN: Duration = Duration::from_secs(5);
/// A draining shard stops only once no input for a handed-off player has arrived (and no
/// handoff happened) for this long: the gateways have all switched.
const FORWARD_QUIET: Duration = Duration::from_secs(1);
/// Handoffs waiting for their player's gateway to open a stream here, at most; and how
/// long one waits. Past either, the handoff is given up with a warning, and its player is
/// in no shard: nothing tells its gateway (a gateway that cannot reach a region owner
/// for 10 s has lost that region's players already).
const AWAITING_GATEWAY_LIMIT: usize = 65_536;
const AWAITING_GATEWAY_FOR: Duration = Duration::from_secs(10);

/// A handoff waiting for its gateway's stream: from whom, which player, its generation,
/// the handoff, and since when.
type AwaitingHandoff = (ShardId, PlayerId, u64, meridian_rpc::pb::Handoff, Instant);

pub struct ShardCore {
    pub(crate) id: ShardId,
    pub(crate) world: World,
    pub(crate) geometry: Geometry,
    /// Registered shards (alive as far as etcd knows), from the last view.
    live: FxHashSet<ShardId>,
    /// Each live shard's registration as of the last view (see
    /// `ShardRecord::incarnation`): a change means it was replaced.
    pub(crate) incarnations: FxHashMap<ShardId, u64>,
    /// This shard's own incarnation: its record in etcd says it (see [`ShardCore::incarnation`]).
    incarnation: u64,
    /// Peers whose stream from here is open, as the shell last reported.
    peers_up: FxHashSet<ShardId>,
    pub(crate) metrics: Arc<ShardMetrics>,
    /// The time of the event being handled.
    pub(crate) now: Instant,
    /// See [`ShardCore::handle`]: the lease TTL, since when the lease is in doubt, and what
    /// arrived meanwhile.
    pub(crate) lease_ttl: Duration,
    suspect_since: Option<Instant>,
    held_while_suspect: VecDeque<Event>,
    /// Gateway links the shell is to end ([`Transmit::CloseLink`]).
    closing_links: Vec<LinkId>,
    pub(crate) links: FxHashMap<LinkId, Link>,
    /// The open link of each gateway lane (a session's output goes on its lane's link).
    pub(crate) gateway_links: FxHashMap<GatewayLane, LinkId>,
    pub(crate) seats: FxHashMap<PlayerId, Seat>,
    pub(crate) handed_off: FxHashMap<PlayerId, HandedOff>,
    /// Sessions whose player left the world here (a Leave or a logout), with when, kept
    /// `FORWARD_FOR`: that session's inputs still arriving (forwarded copies coming back
    /// from a shard the player was handed to) were all applied before its Leave, and are
    /// dropped rather than held for a player that will not come back on that session.
    pub(crate) ended: FxHashMap<PlayerId, (u64, Instant)>,
    /// With a player store: how often changed players are saved, when they last were, the
    /// cell and generation each was last saved at, and this round's saves.
    pub(crate) save_interval: Option<Duration>,
    /// Logged-out sessions whose connection closes once their player's save is in the
    /// store (at most [`CLOSE_AFTER_SAVE_WITHIN`] later).
    pub(crate) closing_after_save: Vec<(PlayerId, LinkId, u64, Instant)>,
    last_save_round: Instant,
    saved: FxHashMap<PlayerId, (meridian_world::Position, u64, u64)>,
    /// Operators' orders seen (carried out if the player was here), of those still in etcd.
    pub(crate) orders_seen: FxHashSet<u64>,
    pub(crate) saves: Vec<SaveRecord>,
    pub(crate) early: FxHashMap<PlayerId, EarlyInputs>,
    /// Inputs refused while their player was not here, by player and session, with when
    /// the last was: kept `FORWARD_FOR`, so a player that arrives late steps over them.
    pub(crate) refused: FxHashMap<(PlayerId, u64), (Instant, Refused)>,
    pub(crate) ghosts: Ghosts,
    pub(crate) outbox: Outbox,
    pub(crate) peer_out: PeerRounds,
    pub(crate) envelopes: Vec<Envelope>,
    pub(crate) holders: Vec<ShardId>,
    pub(crate) rng: SmallRng,
    pub(crate) started: Instant,
    pub(crate) resume_keys: TokenKeys,
    /// The nonce of the token the resume being answered came with (see
    /// `Seat::resume_previous`).
    pub(crate) resumed_with: Option<u64>,
    pub(crate) parked: FxHashMap<PlayerId, Parked>,
    /// Restores a gateway chose this shard for by a newer partition than this shard has
    /// seen: they wait for the watch to catch up (see `ShardCore::restore_as`).
    pub(crate) behind_view: Vec<crate::players::BehindView>,
    /// Handoffs whose player's gateway lane has no link here yet, by that lane.
    pub(crate) awaiting_gateway: FxHashMap<GatewayLane, Vec<AwaitingHandoff>>,
    /// Versions and recent positions of everyone in this world.
    pub(crate) history: History,
    /// Clients just handed in whose view is still derived from what they were told.
    pub(crate) divergent: FxHashMap<PlayerId, Divergent>,
    /// Divergent clients with news this round: their views are brought forward once, at
    /// the end of the round (a resync looks at everyone in view; once per message it
    /// would be quadratic in a crowd).
    resync_due: Vec<PlayerId>,
    /// When an input for a handed-off player was last forwarded to its new owner.
    last_forward: Option<Instant>,
    pub(crate) resume_window: Duration,
    /// The game and its NPC ids, mail and changed states (see `game.rs`).
    pub(crate) game: crate::game::GameSlot,
    /// The core wants a block of entity ids ([`Transmit::WantIds`] at the next flush).
    pub(crate) want_ids_out: bool,
}

impl ShardCore {
    /// A core at `now` that knows no partition yet (the first [`Event::View`] brings it),
    /// running a world with no game rules.
    pub fn new(config: &CoreConfig, metrics: Arc<ShardMetrics>, now: Instant) -> ShardCore {
        ShardCore::with_game(config, metrics, now, Box::new(meridian_game::NoGame))
    }

    /// As [`ShardCore::new`], running `game` (one instance per shard).
    pub fn with_game(
        config: &CoreConfig,
        metrics: Arc<ShardMetrics>,
        now: Instant,
        game: Box<dyn meridian_game::Game>,
    ) -> ShardCore {
        ShardCore {
            game: crate::game::GameSlot::new(
                game,
                config.max_npcs,
                config.seed ^ u64::from(config.id.0),
            ),
            want_ids_out: false,
            id: config.id,
            world: World::new(config.world.clone()),
            geometry: Geometry::from_view(&ClusterView::default(), config.id, &config.world),
            live: FxHashSet::default(),
            incarnations: FxHashMap::default(),
            incarnation: config.incarnation.max(1),
            peers_up: FxHashSet::default(),
            metrics,
            now,
            links: FxHashMap::default(),
            gateway_links: FxHashMap::default(),
            seats: FxHashMap::default(),
            handed_off: FxHashMap::default(),
            ended: FxHashMap::default(),
            save_interval: config.save_interval,
            lease_ttl: config.lease_ttl,
            suspect_since: None,
            held_while_suspect: VecDeque::new(),
            closing_links: Vec::new(),
            closing_after_save: Vec::new(),
            last_save_round: now,
            saved: FxHashMap::default(),
            orders_seen: FxHashSet::default(),
            saves: Vec::new(),
            early: FxHashMap::default(),
            refused: FxHashMap::default(),
            ghosts: Ghosts::default(),
            outbox: Outbox::default(),
            peer_out: PeerRounds::default(),
            envelopes: Vec::with_capacity(1024),
            holders: Vec::new(),
            rng: SmallRng::seed_from_u64(config.seed ^ u64::from(config.id.0)),
            started: now,
            resume_keys: config.resume_keys.clone(),
            resumed_with: None,
            parked: FxHashMap::default(),
            behind_view: Vec::new(),
            awaiting_gateway: FxHashMap::default(),
            history: Default::default(),
            divergent: FxHashMap::default(),
            resync_due: Vec::new(),
            last_forward: None,
            resume_window: config.resume_window,
        }
    }

    /// Time since `since`, as of the current event (zero if `since` is later).
    pub(crate) fn since(&self, since: Instant) -> Duration {
        self.now.saturating_duration_since(since)
    }

    /// Handles one event at `now`. Its output waits for [`ShardCore::flush`] (the shell
    /// flushes once per round of events).
    ///
    /// A shard that did not run for longer than its lease TTL (no event at all, not even
    /// the periodic tick: a stopped process, a frozen VM) may have been taken for dead and
    /// its players restored elsewhere. Until etcd says whether its lease is alive, it acts
    /// on nothing: what arrives waits, in order (at most what arrives in one keep-alive
    /// round trip after it woke), and is taken once the lease is confirmed, or after the
    /// expiry has dropped the players that live elsewhere now. Without this a woken shard
    /// applies moves it held and hands players off as if it still owned them (found by
    /// `meridian-sim --pauses`).
    pub fn handle(&mut self, now: Instant, event: Event) {
        if self.suspect_since.is_none()
            && now.saturating_duration_since(self.now) > self.lease_ttl
            && !matches!(event, Event::LeaseExpired { .. })
        {
            let gap = now.saturating_duration_since(self.now);
            warn!(
                shard = %self.id,
                ?gap,
                "did not run for longer than its lease; acting on nothing until etcd says whether the lease is alive"
            );
            self.metrics.pauses.inc();
            self.suspect_since = Some(now);
        }
        let Some(since) = self.suspect_since else { return self.take(now, event) };
        match event {
            Event::LeaseConfirmed { asked } if asked >= since => {
                debug!(shard = %self.id, "lease confirmed after the pause");
                self.resume_after_pause(now);
            }
            Event::LeaseExpired { partition } => {
                // Whether the region was given away is judged by the partition etcd holds
                // now, or failing that read, by the newest one the watch brought meanwhile
                // (it waits in the queue), never by the one from before the pause: the watch
                // may not have brought the reassignment yet (seed 1643).
                let newest = self.held_while_suspect.iter().rev().find_map(|event| match event {
                    Event::View(view) => view.partition.as_ref(),
                    _ => None,
                });
                let owns =
                    partition.as_ref().or(newest).map(|p| p.regions_of(self.id).next().is_some());
                self.now = self.now.max(now);
                if self.after_lease_expiry(owns) {
                    // What peers and gateways sent the old incarnation went with it: its
                    // ghosts, handoffs and inputs are void (a held restore taken here brought
                    // back a player that lives elsewhere now: seed 303). Peers learn it died
                    // from etcd and drop its ghosts. A gateway may not: its watch can bring
                    // the death and the new registration in one view (seed 1643). So its
                    // streams end here, as a dead shard's would: the gateway answers what it
                    // sent on them, reconnects and restores its players where they live now.
                    let mut links: Vec<LinkId> = self.links.keys().copied().collect();
                    let mut ended = Vec::new();
                    self.held_while_suspect.retain(|event| match event {
                        Event::Peer { .. } | Event::Inputs { .. } => false,
                        Event::LinkOpened { link, .. } => {
                            links.push(*link);
                            false
                        }
                        Event::LinkClosed { link } | Event::LinkCut { link } => {
                            ended.push(*link);
                            false
                        }
                        _ => true,
                    });
                    for link in links {
                        self.drop_link(link);
                        if !ended.contains(&link) {
                            self.closing_links.push(link);
                        }
                    }
                }
                self.resume_after_pause(now);
            }
            Event::LeaseConfirmed { .. } => {}
            Event::Tick => self.now = self.now.max(now),
            other => self.held_while_suspect.push_back(other),
        }
    }

    /// Takes what waited while the lease was in doubt, in arrival order.
    fn resume_after_pause(&mut self, now: Instant) {
        self.suspect_since = None;
        while let Some(event) = self.held_while_suspect.pop_front() {
            self.take(now, event);
        }
    }

    /// Acts on one event.
    fn take(&mut self, now: Instant, event: Event) {
        self.now = self.now.max(now);
        match event {
            Event::LinkOpened { link, gateway, lane } => {
                self.links.insert(link, Link { gateway, lane });
                let opened = GatewayLane { gateway, lane };
                self.gateway_links.insert(opened, link);
                self.metrics.links.set(self.links.len() as i64);
                // Only the handoffs and restores of this lane's sessions: the gateway's other
                // lanes may not have their links here yet.
                for (from, player, generation, handoff, _) in
                    self.awaiting_gateway.remove(&opened).unwrap_or_default()
                {
                    self.handoff_in(from, player, generation, handoff);
                }
                self.restores_for(opened);
            }
            Event::Inputs { link, inputs } => {
                self.metrics.batches_in.inc();
                for input in inputs {
                    self.on_input(Some(link), input);
                }
            }
            Event::LinkClosed { link } => self.drop_link(link),
            Event::LinkCut { link } => {
                warn!(link = link.0, "gateway link not keeping up; cutting it");
                self.metrics.links_cut.inc();
                self.drop_link(link);
            }
            Event::Peer { from, messages } => {
                self.metrics.peer_messages_in.add(messages.len() as u64);
                for message in messages {
                    self.on_peer(from, message);
                }
            }
            Event::View(view) => self.on_view(&view),
            Event::PeersUp(up) => {
                self.peers_up = up.into_iter().collect();
            }
            Event::LeaseExpired { partition } => {
                let owns = partition.map(|p| p.regions_of(self.id).next().is_some());
                self.after_lease_expiry(owns);
            }
            Event::LeaseConfirmed { .. } => {}
            Event::Saved { players } => {
                let outbox = &mut self.outbox;
                self.closing_after_save.retain(|(player, link, session, _)| {
                    let saved = players.contains(&player.0);
                    if saved {
                        outbox.close(*link, *session);
                    }
                    !saved
                });
            }
            Event::SaveAll => {
                let players: Vec<PlayerId> =
                    self.seats.iter().filter(|(_, s)| !s.npc).map(|(p, _)| *p).collect();
                for player in players {
                    self.save(player);
                }
            }
            Event::Tick => self.housekeeping(),
            Event::GameTick => self.game_tick(),
            Event::Ids(ids) => self.ids_arrived(ids),
        }
    }

    /// How far a drain has got: (local players, handoffs not yet confirmed, whether inputs
    /// for handed-off players have stopped arriving).
    pub fn drain_status(&self, now: Instant) -> (usize, usize, bool) {
        let unconfirmed = self.handed_off.values().filter(|h| h.acked.is_none()).count();
        // Gateways switch a player's route when they read its `released_to` marker;
        // inputs they sent before that still arrive here and are forwarded. A shard that
        // stopped now would leave them unanswered.
        let quiet =
            self.last_forward.is_none_or(|at| now.saturating_duration_since(at) >= FORWARD_QUIET)
                && self
                    .handed_off
                    .values()
                    .all(|h| now.saturating_duration_since(h.since) >= FORWARD_QUIET);
        // NPCs are handed off like players while another shard lives to take them; the
        // last shard of a cluster that stops goes without them (NPCs are not saved: the
        // game makes its world again when the cluster starts).
        let others_live = self.live.iter().any(|s| *s != self.id);
        let npcs_left = if others_live { 0 } else { self.world.n_npcs() };
        (self.seats.len() - npcs_left, unconfirmed, quiet)
    }

    /// The players owned here and where they stand (for the simulator's checks).
    pub fn local_players(&self) -> impl Iterator<Item = (PlayerId, meridian_world::Position)> + '_ {
        self.world.local_players()
    }

    /// The shards a local player is mirrored to (`None` if it is not local here).
    pub fn ghosted_at(&self, player: PlayerId) -> Option<&[ShardId]> {
        self.seats.get(&player).map(|seat| seat.ghosted_at.as_slice())
    }

    /// This shard's incarnation, for its etcd record: it changes when the shard drops
    /// everything it held after being taken for dead.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The partition epoch this core acts on.
    pub fn epoch(&self) -> u64 {
        self.geometry.epoch
    }

    /// Every copy of a player here that is not local (ghosts), with its position.
    pub fn ghost_positions(&self) -> Vec<(PlayerId, meridian_world::Position)> {
        self.world.ghosts().collect()
    }

    /// Players with inputs held for them here (their handoff has not arrived).
    pub fn players_waited_for(&self) -> Vec<PlayerId> {
        let mut players: Vec<PlayerId> = self.early.keys().copied().collect();
        players.sort_unstable();
        players
    }

    /// Sizes of the core's internal maps and queues, for bounds checks.
    pub fn sizes(&self) -> CoreSizes {
        CoreSizes {
            seats: self.seats.len(),
            handed_off: self.handed_off.len(),
            early: self.early.values().map(|(_, inputs)| inputs.len()).sum(),
            refused: self.refused.len(),
            parked: self.parked.len(),
            awaiting_gateway: self.awaiting_gateway.values().map(Vec::len).sum(),
            divergent: self.divergent.len(),
            ghost_tracks: self.ghosts.tracks(),
        }
    }

    fn on_view(&mut self, view: &ClusterView) {
        self.carry_out_orders(&view.orders);
        self.live = view.shards.keys().copied().collect();
        let replaced: Vec<ShardId> = view
            .shards
            .iter()
            .filter(|(id, record)| {
                **id != self.id
                    && self.incarnations.get(id).is_some_and(|old| *old != record.incarnation)
            })
            .map(|(id, _)| *id)
            .collect();
        self.incarnations = view.shards.iter().map(|(id, r)| (*id, r.incarnation)).collect();
        for peer in replaced {
            self.peer_replaced(peer);
        }
        let epoch = view.partition.as_ref().map(|p| p.epoch).unwrap_or(0);
        if epoch != self.geometry.epoch {
            let config = self.world.config().clone();
            self.geometry = Geometry::from_view(view, self.id, &config);
            self.metrics.epoch.set(epoch as i64);
            self.rebalance();
            self.restores_behind_view();
        }
    }

    /// A peer registered again after its lease expired: it was taken for dead and dropped
    /// what it held, the copies of players mirrored there included, whether or not this
    /// shard's watch showed it gone in between (one view may bring both; `meridian-sim`
    /// seed 4348). Its own players' copies here are orphaned, as a dead owner's (their new
    /// owners take them over, or they go); players mirrored there are mirrored again.
    fn peer_replaced(&mut self, peer: ShardId) {
        tracing::info!(shard = %self.id, %peer, "peer registered again: it dropped what it held");
        self.ghosts.sources_gone(
            &mut self.world,
            &mut self.history,
            |s| s != peer,
            self.now,
            &mut self.envelopes,
        );
        self.route_envelopes();
        let mirrored: Vec<PlayerId> = self
            .seats
            .iter_mut()
            .filter_map(|(player, seat)| {
                let before = seat.ghosted_at.len();
                seat.ghosted_at.retain(|s| *s != peer);
                (seat.ghosted_at.len() != before).then_some(*player)
            })
            .collect();
        for player in mirrored {
            self.mirror(player);
        }
    }

    /// A new partition: ghosts go where the new borders need them, and every local player
    /// now standing in another shard's region is handed to it, exactly as if it had walked
    /// across a border.
    fn rebalance(&mut self) {
        let (me, live) = (self.id, &self.live);
        self.ghosts.sources_gone(
            &mut self.world,
            &mut self.history,
            |s| s == me || live.contains(&s),
            self.now,
            &mut self.envelopes,
        );
        self.route_envelopes();
        self.restore_orphaned_npcs();
        let players: Vec<PlayerId> = self.seats.keys().copied().collect();
        for player in &players {
            self.mirror(*player);
        }
        let mut moved = 0;
        for player in players {
            let owned = self.world.position(player).is_some_and(|at| self.geometry.owns(at));
            if !owned {
                self.hand_off(player);
                moved += 1;
            }
        }
        let epoch = self.geometry.epoch;
        tracing::info!(shard = %self.id, epoch, handed_off = moved, "partition changed");
    }

    fn on_peer(&mut self, from: ShardId, message: PeerMessage) {
        let player = PlayerId(message.player_id);
        if let Some(Peer::Released(released)) = &message.kind {
            // The player moved on from the shard it was handed to: late inputs follow it
            // (the shard it was handed to may be draining, gone before they arrive). The
            // Released is then applied to the ghost like any update.
            if let Some(handed) = self.handed_off.get_mut(&player) {
                if message.generation > handed.generation && released.new_owner != self.id.0 {
                    handed.to = ShardId(released.new_owner);
                    handed.incarnation = self.incarnations.get(&handed.to).copied().unwrap_or(0);
                }
            }
        }
        match message.kind {
            Some(Peer::Handoff(handoff)) => {
                self.handoff_in(from, player, message.generation, handoff)
            }
            Some(Peer::Action(request)) => self.action_request(from, player, request),
            Some(Peer::Answer(answer)) => self.action_answer(player, answer),
            Some(Peer::EntityMessage(entity_message)) => {
                self.entity_message(player, entity_message)
            }
            Some(Peer::Event(event)) if event.to != 0 => self.event_for_player(player, event),
            Some(Peer::Forwarded(input)) => self.on_input(None, input),
            Some(Peer::Needed(needed)) => {
                let holder = if needed.holder == 0 { from } else { ShardId(needed.holder) };
                self.ghost_needed(holder, player, message.generation);
            }
            Some(Peer::HandoffAck(_)) => {
                if let Some(handed) = self.handed_off.get_mut(&player) {
                    handed.acked.get_or_insert(self.now);
                }
            }
            // A ghost update. A player owned here never takes updates from elsewhere: such a
            // message is from a previous owner and already superseded.
            Some(_) if self.world.is_local(player) != Some(true) => {
                self.ghosts.apply(
                    &mut self.world,
                    &mut self.history,
                    from,
                    message,
                    self.now,
                    &mut self.envelopes,
                );
                let (me, live) = (self.id, &self.live);
                self.ghosts.orphan_unless_live(player, |s| s == me || live.contains(&s), self.now);
                self.route_envelopes();
                for (owner, player, version) in std::mem::take(&mut self.ghosts.needed) {
                    let needed = PeerMessage {
                        player_id: player.0,
                        generation: version.0,
                        subject_seq: version.1,
                        kind: Some(Peer::Needed(meridian_rpc::pb::GhostNeeded { holder: 0 })),
                    };
                    self.peer_out.push(owner, needed);
                }
            }
            Some(_) | None => {}
        }
    }

    /// One input for a player: applied in sequence if the player is here, forwarded if it
    /// was handed off, held briefly if its handoff has not arrived yet.
    pub(crate) fn on_input(&mut self, link: Option<LinkId>, input: PlayerInput) {
        let player = PlayerId(input.player_id);
        match (link, &input.kind) {
            (Some(link), Some(Input::Join(_))) => return self.join(link, input),
            // A restore passed on by the shard the player was handed off from: taken on
            // the player's own seat (see `restore`); held or passed on like any input if
            // the player is not here.
            (None, Some(Input::Join(join))) if join.restore => {
                if let Some(link) = self.seats.get(&player).map(|seat| seat.link) {
                    return self.join(link, input);
                }
                // Not here any more either (its link here broke too, say): restored here,
                // answering through its gateway lane's link, unless it went on from here.
                if !self.handed_off.contains_key(&player) {
                    let lane = GatewayLane::of_session(join.gateway_id, input.session);
                    if let Some(&link) = self.gateway_links.get(&lane) {
                        return self.join(link, input);
                    }
                }
            }
            (Some(link), Some(Input::Resume(_))) => return self.resume(link, input),
            _ => {}
        }
        if let Some(seat) = self.seats.get_mut(&player) {
            // Session ids are unique per gateway only: an input straight from a gateway
            // other than the seat's is from a connection the player has left (a login on
            // another gateway took it over), whatever its session number.
            let from = link.and_then(|link| self.links.get(&link)).map(|l| l.gateway);
            if seat.gateway != 0 && from.is_some_and(|gateway| gateway != seat.gateway) {
                debug!(%player, seq = input.seq, "input from another gateway's session dropped");
                return;
            }
            if seat.session == input.session && !matches!(input.kind, Some(Input::Leave(_))) {
                // The client speaks on the session its resume gave it: it has the fresh
                // token, and the one it resumed with is spent.
                seat.resume_previous = None;
            }
            return self.sequence(player, input);
        }
        if let Some(handed) = self.handed_off.get_mut(&player) {
            if handed.forwarded.len() == FORWARDED_KEPT {
                handed.forwarded.remove(0);
            }
            handed.forwarded.push(input.clone());
            self.metrics.inputs_forwarded.inc();
            self.last_forward = Some(self.now);
            debug!(%player, seq = input.seq, to = %handed.to, "input forwarded");
            let message = PeerMessage {
                player_id: player.0,
                generation: handed.generation + 1,
                subject_seq: 0,
                kind: Some(Peer::Forwarded(input)),
            };
            self.peer_out.push(handed.to, message);
            return;
        }
        if self.ended.get(&player).is_some_and(|(session, _)| *session == input.session) {
            debug!(%player, seq = input.seq, "input of a session that left the world here dropped");
            return;
        }
        let now = self.now;
        let entry = self.early.entry(player).or_insert_with(|| (now, Vec::new()));
        let leave = matches!(input.kind, Some(Input::Leave(_)));
        if entry.1.len() < EARLY_LIMIT || leave {
            entry.1.push((link, input));
        } else {
            let link = link.or_else(|| self.early_link(player, input.session));
            self.refuse_unplaced(link, input);
        }
    }

    /// Applies a local player's input if it is the next in sequence, and any held ones
    /// whose turn that makes it; holds it otherwise. Past the hold limit the newest input
    /// (this one or a held one) is refused at once, ahead of its turn (its answer may come
    /// before those of older inputs still missing), and its seq consumed, so later inputs
    /// still flow.
    pub(crate) fn sequence(&mut self, player: PlayerId, input: PlayerInput) {
        let Some(seat) = self.seats.get_mut(&player) else {
            return;
        };
        if input.session != seat.session {
            // From a connection the player has left since (it resumed on another one).
            debug!(%player, seq = input.seq, "input from an earlier session dropped");
            return;
        }
        let (link, session, seq) = (seat.link, seat.session, input.seq);
        match seat.inputs.offer(input) {
            Offered::Apply(input) => {
                self.apply(player, input);
                self.apply_held(player);
            }
            Offered::Held => {}
            Offered::Duplicate => debug!(%player, seq, "duplicate input dropped"),
            Offered::Refuse(refused) => {
                warn!(%player, seq = refused.seq, "too many out-of-order inputs; refusing the newest");
                self.answer_refused(link, session, refused, "too many inputs out of order");
            }
        }
    }

    /// Applies the player's held inputs as long as the next one is there.
    fn apply_held(&mut self, player: PlayerId) {
        // (Applying may hand the player off: the seat is looked up again each time.)
        while let Some(next) = self.seats.get_mut(&player).and_then(|s| s.inputs.next_held()) {
            self.apply(player, next);
        }
    }

    /// The gateway link that inputs of `session` for a player not here came through, if
    /// any did: forwarded inputs of that connection are answered through it.
    fn early_link(&self, player: PlayerId, session: u64) -> Option<LinkId> {
        let (_, inputs) = self.early.get(&player)?;
        inputs.iter().find(|(link, input)| link.is_some() && input.session == session)?.0
    }

    /// Gives up on an input for a player this shard does not have: answers it when the
    /// connection's link is known (a forwarded input on its own cannot be), and records
    /// its seq so that the player, should it arrive after all, steps over it. A `Leave` is
    /// kept instead, for such a player to leave the world.
    fn refuse_unplaced(&mut self, link: Option<LinkId>, input: PlayerInput) {
        let (player, session) = (PlayerId(input.player_id), input.session);
        let now = self.now;
        let entry = self.refused.entry((player, session));
        let (since, refused) = entry.or_insert_with(|| (now, Refused::default()));
        *since = now;
        let Some(input) = refused.record(input) else {
            return;
        };
        match link {
            Some(link) => self.answer_refused(link, session, input, "player is not on this shard"),
            None => {
                warn!(%player, seq = input.seq, "forwarded input for a player that never arrived; given up")
            }
        }
    }

    /// Answers an input that will not be applied: a Move with `UNAVAILABLE` and its
    /// client_time, a Ping with its Pong, a Chat (which its speaker would have seen) with
    /// an `UNAVAILABLE` error. A `Leave` is never refused; a kindless input wants nothing.
    pub(crate) fn answer_refused(
        &mut self,
        link: LinkId,
        session: u64,
        input: PlayerInput,
        detail: &str,
    ) {
        match input.kind {
            Some(Input::Move(m)) => {
                let error = server::error(ErrorCode::Unavailable, detail, m.client_time);
                self.outbox.push_move_answer(link, session, &error);
            }
            Some(Input::Action(action)) => {
                let error = server::error(ErrorCode::Unavailable, detail, action.client_time);
                self.outbox.push_move_answer(link, session, &error);
            }
            Some(Input::Ping(ping)) => {
                self.outbox.push(link, session, &server::pong(ping.client_time));
            }
            // A move the gateway refused: its own answer, in its turn.
            Some(Input::Refused(refused)) => self.answer_move_refused(link, session, refused),
            Some(Input::Chat(_)) => {
                let detail = format!("chat not delivered: {detail}");
                self.outbox.push(link, session, &server::error(ErrorCode::Unavailable, detail, 0));
            }
            Some(Input::Leave(_) | Input::Join(_) | Input::Resume(_)) | None => {}
        }
    }

    /// A player arrived (handed over, restored or resumed): inputs refused while it was not here are stepped
    /// over, a `Leave` among them is applied in its turn, and the inputs held for it are
    /// offered in arrival order.
    pub(crate) fn take_early_inputs(&mut self, player: PlayerId, session: u64) {
        let mut inputs = self.early.remove(&player).map(|(_, inputs)| inputs).unwrap_or_default();
        if let Some((_, refused)) = self.refused.remove(&(player, session)) {
            if let Some(seat) = self.seats.get_mut(&player) {
                seat.inputs.consume(&refused.seqs);
            }
            inputs.extend(refused.leave.map(|leave| (None, leave)));
        }
        for (link, input) in inputs {
            self.on_input(link, input);
        }
    }

    fn housekeeping(&mut self) {
        self.save_changed();
        self.restores_behind_view();
        let now = self.now;
        let outbox = &mut self.outbox;
        self.closing_after_save.retain(|(_, link, session, since)| {
            // The store is slow or down: the client is not kept waiting; its save goes on
            // being retried.
            let waited = now.saturating_duration_since(*since) > CLOSE_AFTER_SAVE_WITHIN;
            if waited {
                outbox.close(*link, *session);
            }
            !waited
        });
        self.ghosts.expire(&mut self.world, &mut self.history, self.now, &mut self.envelopes);
        self.route_envelopes();
        let divergent: Vec<PlayerId> = self.divergent.keys().copied().collect();
        for observer in divergent {
            self.resync(observer);
        }
        // Players standing in another shard's region whose handoff had to wait (the new
        // owner was not reachable yet) go now.
        let astray: Vec<PlayerId> = self
            .seats
            .keys()
            .copied()
            .filter(|p| self.world.position(*p).is_some_and(|at| !self.geometry.owns(at)))
            .collect();
        for player in astray {
            self.hand_off(player);
        }
        let now = self.now;
        self.history.expire(now);
        self.metrics.ghosts.set(self.ghosts.len() as i64);
        self.expire_awaiting_gateway(now);
        self.expire_actions(now);
        if self.game.orphans_waiting {
            self.restore_orphaned_npcs();
        }
        let expired: Vec<PlayerId> = self
            .early
            .iter()
            .filter(|(_, (since, _))| now - *since > EARLY_WAIT)
            .map(|(id, _)| *id)
            .collect();
        for player in expired {
            self.expire_early(player, now);
        }
        self.refused.retain(|_, (since, _)| now - *since < FORWARD_FOR);
        self.handed_off.retain(|_, h| now - h.since < FORWARD_FOR);
        self.ended.retain(|_, (_, since)| now - *since < FORWARD_FOR);
        let window = self.resume_window;
        self.parked.retain(|_, p| now - p.since <= window);
    }

    /// Restores passed on to this shard that waited for the link of `opened` (see
    /// `on_input`) are taken now, with what was held behind them, in seq order.
    fn restores_for(&mut self, opened: GatewayLane) {
        let waiting: Vec<PlayerId> = self
            .early
            .iter()
            .filter(|(_, (_, inputs))| {
                inputs.iter().any(|(link, input)| {
                    link.is_none()
                        && matches!(&input.kind, Some(Input::Join(join))
                            if join.restore
                                && GatewayLane::of_session(join.gateway_id, input.session) == opened)
                })
            })
            .map(|(player, _)| *player)
            .collect();
        for player in waiting {
            let Some((_, mut inputs)) = self.early.remove(&player) else { continue };
            inputs.sort_by_key(|(_, input)| input.seq);
            for (link, input) in inputs {
                self.on_input(link, input);
            }
        }
    }

    /// Handoffs that waited too long for their gateway's stream are given up, and so is
    /// the oldest beyond [`AWAITING_GATEWAY_LIMIT`]: a gateway that never opens a stream
    /// here must not make this shard hold handoffs for ever.
    fn expire_awaiting_gateway(&mut self, now: Instant) {
        let mut waiting = 0;
        self.awaiting_gateway.retain(|waits_for, handoffs| {
            handoffs.retain(|(from, player, .., since)| {
                let keep = now.saturating_duration_since(*since) < AWAITING_GATEWAY_FOR;
                if !keep {
                    let (gateway, lane) = (waits_for.gateway, waits_for.lane);
                    warn!(%player, %from, gateway, lane, "handoff gave up waiting for its gateway lane's link");
                }
                keep
            });
            waiting += handoffs.len();
            !handoffs.is_empty()
        });
        while waiting > AWAITING_GATEWAY_LIMIT {
            let oldest = self
                .awaiting_gateway
                .iter()
                .filter_map(|(waits_for, handoffs)| Some((handoffs.first()?.4, *waits_for)))
                .min();
            let Some((_, waits_for)) = oldest else { break };
            if let Some(handoffs) = self.awaiting_gateway.get_mut(&waits_for) {
                let (from, player, ..) = handoffs.remove(0);
                let (gateway, lane) = (waits_for.gateway, waits_for.lane);
                warn!(%player, %from, gateway, lane, "too many handoffs waiting for gateways; oldest given up");
                if handoffs.is_empty() {
                    self.awaiting_gateway.remove(&waits_for);
                }
            }
            waiting -= 1;
        }
    }

    /// Inputs for a player that has not arrived in time are refused in seq order, each
    /// answered through its connection's gateway link. Forwarded ones no link is known for
    /// wait until `FORWARD_FOR`: they cannot be answered, and applied late beats never.
    fn expire_early(&mut self, player: PlayerId, now: Instant) {
        let Some((since, mut inputs)) = self.early.remove(&player) else {
            return;
        };
        inputs.sort_by_key(|(_, input)| input.seq);
        let links: FxHashMap<u64, LinkId> =
            inputs.iter().filter_map(|(link, input)| Some((input.session, (*link)?))).collect();
        let give_up = now - since > FORWARD_FOR;
        let mut waiting = Vec::new();
        let n = inputs.len();
        for (link, input) in inputs {
            match link.or_else(|| links.get(&input.session).copied()) {
                None if !give_up => waiting.push((None, input)),
                link => self.refuse_unplaced(link, input),
            }
        }
        if waiting.len() < n {
            let refused = n - waiting.len();
            warn!(%player, refused, "inputs for a player that has not arrived refused");
        }
        if !waiting.is_empty() {
            self.early.insert(player, (since, waiting));
        }
    }

    /// Turns the world's envelopes into frames for their recipients' connections.
    pub(crate) fn route_envelopes(&mut self) {
        for envelope in self.envelopes.drain(..) {
            let Some(seat) = self.seats.get(&envelope.to) else {
                continue;
            };
            // (Checked for emptiness first: this runs per notification, and most rounds have
            // no client mid-handoff.)
            let divergent =
                if self.divergent.is_empty() { None } else { self.divergent.get(&envelope.to) };
            if let Some(divergent) = divergent {
                // A client just handed in gets its view from the told-vs-world difference;
                // only its own acks go through as they are, and chat from itself and from
                // speakers it has been told it sees (others are not in its view yet, or no
                // longer).
                match &envelope.note {
                    Notification::Moved { subject, .. } if *subject == envelope.to => {}
                    Notification::Chat { speaker: subject, .. }
                    | Notification::StateChanged { subject, .. }
                    | Notification::Event { source: subject, .. } => {
                        // One-off news about a subject the client has been told it sees
                        // (an Entered still to come carries the current state anyway).
                        let seen = *subject == envelope.to
                            || divergent.told.get(subject).is_some_and(|told| told.seen);
                        if !seen {
                            continue;
                        }
                    }
                    _ => {
                        self.resync_due.push(envelope.to);
                        continue;
                    }
                }
            }
            let (link, session, generation) = (seat.link, seat.session, seat.generation);
            let message = match envelope.note {
                Notification::Entered { subject, position, name, kind, state } => {
                    server::entered_as(subject.0, position.x, position.y, &*name, kind, &state)
                }
                Notification::Moved { subject, position, client_time } => {
                    let message = server::moved(subject.0, position.x, position.y, client_time);
                    if subject == envelope.to {
                        // The mover's own ack: counted so the gateway knows it is answered,
                        // and its position kept there in case this shard dies.
                        self.outbox.push_move_answer(link, session, &message);
                        self.outbox.track(link, session, position.x, position.y, generation);
                        continue;
                    }
                    message
                }
                Notification::Left { subject } => server::left(subject.0),
                Notification::Chat { speaker, text } => server::chat(speaker.0, &*text),
                note @ (Notification::StateChanged { .. } | Notification::Event { .. }) => {
                    match crate::game::game_notification(&note) {
                        Some(message) => message,
                        None => continue,
                    }
                }
            };
            self.outbox.push(link, session, &message);
        }
    }

    fn drop_link(&mut self, link: LinkId) {
        if let Some(closed) = self.links.remove(&link) {
            // Only this lane's: the gateway's other lanes keep their links and players.
            let lane = GatewayLane { gateway: closed.gateway, lane: closed.lane };
            if self.gateway_links.get(&lane) == Some(&link) {
                self.gateway_links.remove(&lane);
            }
        }
        self.outbox.forget_link(link);
        let gone: Vec<PlayerId> =
            self.seats.iter().filter(|(_, seat)| seat.link == link).map(|(id, _)| *id).collect();
        for player in gone {
            self.remove(player, true);
        }
        self.metrics.links.set(self.links.len() as i64);
    }

    /// This round's output, appended to `out`: per gateway link its batches in order,
    /// then per peer its round of messages. A gateway link whose stream cannot take a
    /// batch has stopped reading: the shell reports [`Event::LinkCut`] and sends nothing
    /// more on it (its players leave the world rather than slow everyone else down).
    pub fn flush(&mut self, out: &mut Vec<Transmit>) {
        if !self.resync_due.is_empty() {
            let mut due = std::mem::take(&mut self.resync_due);
            due.sort_unstable();
            due.dedup();
            for observer in due.drain(..) {
                self.resync(observer);
            }
            self.resync_due = due;
        }
        self.metrics.notifications.add(self.outbox.n_messages);
        for (code, n) in self.outbox.n_errors.drain(..) {
            self.metrics.errors.add(code.as_str_name(), n);
        }
        for (link, batches, bytes) in self.outbox.drain() {
            if !self.links.contains_key(&link) {
                continue;
            }
            self.metrics.delivery_bytes.add(bytes);
            for batch in batches {
                self.metrics.batches_out.inc();
                out.push(Transmit::Gateway { link, batch });
            }
        }
        for (to, messages) in self.peer_out.drain() {
            out.push(Transmit::Peer { to, messages });
        }
        if !self.saves.is_empty() {
            out.push(Transmit::Save(std::mem::take(&mut self.saves)));
        }
        out.extend(self.closing_links.drain(..).map(|link| Transmit::CloseLink { link }));
        self.flush_game(out);
    }

    /// Queues a save of a local player where it stands now (with a player store).
    pub(crate) fn save(&mut self, player: PlayerId) {
        if self.save_interval.is_none() {
            return;
        }
        let (Some(seat), Some(at)) = (self.seats.get(&player), self.world.position(player)) else {
            return;
        };
        if seat.npc {
            return;
        }
        let generation = seat.generation;
        self.saved.insert(player, (at, generation, state_hash(&seat.private)));
        let state = seat.private.clone();
        self.saves.push(SaveRecord { player: player.0, generation, at: (at.x, at.y), state });
    }

    /// Every `save_interval`: saves the local players whose cell changed since their last
    /// save (or who were never saved).
    fn save_changed(&mut self) {
        let Some(interval) = self.save_interval else { return };
        if self.now.saturating_duration_since(self.last_save_round) < interval {
            return;
        }
        self.last_save_round = self.now;
        let changed: Vec<PlayerId> = self
            .seats
            .iter()
            .filter(|(player, seat)| {
                let now = self
                    .world
                    .position(**player)
                    .map(|at| (at, seat.generation, state_hash(&seat.private)));
                !seat.npc && now.is_some() && self.saved.get(*player).copied() != now
            })
            .map(|(player, _)| *player)
            .collect();
        for player in changed {
            self.save(player);
        }
        let seats = &self.seats;
        self.saved.retain(|player, _| seats.contains_key(player));
    }

    /// Back from being taken for dead (a hang, or cut off from etcd past the TTL). If the
    /// coordinator gave this shard's region away meanwhile, gateways have restored its
    /// players elsewhere: this shard's copies are stale and are dropped without a word
    /// (not handed off, which would duplicate them). If nobody took over, it keeps them.
    /// The lease expired: if the region is not this shard's any more (`owns`, from the
    /// newest partition known; the current geometry's if `None`), the players here live
    /// elsewhere now and are dropped.
    /// Whether they were dropped.
    fn after_lease_expiry(&mut self, owns: Option<bool>) -> bool {
        if owns.unwrap_or_else(|| self.geometry.owner_count(self.id) > 0) {
            warn!(shard = %self.id, "lease expired but the region is still ours; keeping players");
            return false;
        }
        warn!(shard = %self.id, players = self.seats.len(), "taken for dead and replaced; dropping stale players");
        // A new life: peers and gateways that see it in the record know that what they gave
        // the old one is gone, even if their watch never showed this shard gone.
        self.incarnation = self.incarnation.saturating_add(1);
        let config = self.world.config().clone();
        self.world = World::new(config);
        self.seats.clear();
        self.handed_off.clear();
        self.early.clear();
        self.refused.clear();
        self.parked.clear();
        self.divergent.clear();
        self.history = Default::default();
        self.ghosts = Ghosts::default();
        self.envelopes.clear();
        self.metrics.players.set(0);
        true
    }

    /// Whether players may be handed to `to` now: it is registered (not dead, as far as
    /// etcd knows) and its peer stream is open. Otherwise the player stays here, served,
    /// until the next move, tick or partition.
    pub(crate) fn peer_ready(&self, to: ShardId) -> bool {
        self.live.contains(&to) && self.peers_up.contains(&to)
    }

    pub fn load_profile(&self) -> meridian_cluster::LoadProfile {
        let config = self.world.config();
        let band = meridian_cluster::LOAD_BAND;
        let mut load = meridian_cluster::LoadProfile {
            x: vec![0; config.width.div_ceil(band) as usize],
            y: vec![0; config.height.div_ceil(band) as usize],
        };
        for (_, at) in self.world.local_players() {
            load.x[(at.x / band) as usize] += 1;
            load.y[(at.y / band) as usize] += 1;
        }
        load
    }

    /// Players per square of [`meridian_cluster::DENSITY_CELL`] cells, squares with
    /// players only (`ready` is filled in by the admin route).
    pub fn density(&self) -> meridian_cluster::DensityReport {
        let cell = meridian_cluster::DENSITY_CELL;
        let mut squares: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
        for (_, at) in self.world.local_players() {
            *squares.entry((at.x / cell, at.y / cell)).or_default() += 1;
        }
        let mut npcs: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
        for (_, at, _) in self.world.npcs() {
            *npcs.entry((at.x / cell, at.y / cell)).or_default() += 1;
        }
        meridian_cluster::DensityReport {
            npcs: npcs.into_iter().map(|((column, row), n)| [column, row, n]).collect(),
            shard: self.id.0,
            epoch: self.geometry.epoch,
            ready: false,
            cell,
            counts: squares.into_iter().map(|((column, row), n)| [column, row, n]).collect(),
        }
    }

    pub fn report(&self, now: Instant) -> String {
        let mut players: Vec<String> = self
            .seats
            .iter()
            .filter(|(_, seat)| !seat.npc)
            .filter_map(|(id, seat)| {
                let at = self.world.position(*id)?;
                Some(format!(
                    "{{\"id\":{},\"generation\":{},\"x\":{},\"y\":{}}}",
                    id.0, seat.generation, at.x, at.y
                ))
            })
            .collect();
        for (id, handed) in &self.handed_off {
            if !handed.npc && handed.acked.is_none_or(|acked| now - acked < LISTED_AFTER_ACK) {
                players.push(format!(
                    "{{\"id\":{},\"generation\":{},\"x\":{},\"y\":{}}}",
                    id.0, handed.generation, handed.at.x, handed.at.y
                ));
            }
        }
        let npcs: Vec<String> = self
            .world
            .npcs()
            .map(|(id, at, kind)| {
                format!("{{\"id\":{},\"kind\":{kind},\"x\":{},\"y\":{}}}", id.0, at.x, at.y)
            })
            .collect();
        format!(
            "{{\"shard\":{},\"epoch\":{},\"players\":[{}],\"npcs\":[{}]}}",
            self.id.0,
            self.geometry.epoch,
            players.join(","),
            npcs.join(",")
        )
    }
}

/// Sizes of a core's maps and queues (see [`ShardCore::sizes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreSizes {
    pub seats: usize,
    pub handed_off: usize,
    pub early: usize,
    pub refused: usize,
    pub parked: usize,
    pub awaiting_gateway: usize,
    pub divergent: usize,
    pub ghost_tracks: usize,
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;

/// A cheap fingerprint of a private state, to save players whose state changed.
fn state_hash(state: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    state.hash(&mut hasher);
    hasher.finish()
}
