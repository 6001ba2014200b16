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
//! (see `players.rs`, `handover.rs` and `resume.rs`).
//!
//! `ShardCore` composes the core's parts and orchestrates them, handing each the others it
//! needs as arguments: `Roster` (seats, parked players, divergent views and resume
//! tokens, `roster.rs`), `Inputs` (inputs for players not here, `inputs.rs`), `Handoffs`
//! (handed off from here, waiting to come in, `handoffs.rs`), `Ghosts` (`ghosts.rs`),
//! `History` (`history.rs`), `Saves` (`saves.rs`), `Pause` (the lease in doubt,
//! `pause.rs`), `GameSlot` (`game_slot.rs`), `Outbox` and `PeerRounds` (`outbox.rs`),
//! `GatewayLinks` (`gateway_links.rs`), `PeersSeen` (`peers_seen.rs`). Each
//! owns its state behind private fields, and none of them imports this file. What needs
//! several parts at once is `ShardCore`'s: events and housekeeping here, players joining,
//! moving and leaving in `players.rs`, changing hands in `handover.rs`, coming back in
//! `resume.rs`, the game's host in `game.rs`; client views across a handoff and the
//! admin reports are functions of the parts they read (`views.rs`, `reports.rs`).

use rustc_hash::FxHashSet;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PlayerOrder, ShardId};
use meridian_protocol::pb::ErrorCode;
use meridian_protocol::server;
use meridian_rpc::pb::player_input::Kind as Input;
use meridian_rpc::pb::{peer_message::Kind as Peer, PeerMessage, PlayerInput};
use meridian_world::{Envelope, PlayerId, World};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tracing::{debug, warn};

use crate::claims::Claims;
use crate::game_slot::GameSlot;
use crate::gateway_links::GatewayLinks;
use crate::geometry::Geometry;
use crate::ghosts::Ghosts;
use crate::handoffs::Handoffs;
use crate::history::History;
use crate::inputs::Inputs;
use crate::metrics::ShardMetrics;
use crate::outbox::{Outbox, PeerRounds};
use crate::overload::Overload;
use crate::pause::Pause;
use crate::peers_seen::PeersSeen;
use crate::persistent_slot::Persistent;
use crate::reports;
use crate::roster::{fresh_nonce, Roster};
use crate::routes::RouteCache;
use crate::saves::Saves;
use crate::sequence::Offered;
use crate::types::{CoreConfig, Event, GatewayLane, LinkId, Transmit, FORWARDED_KEPT};
use crate::views;

/// Housekeeping period: expiries, retries of waiting handoffs. The shell (or the
/// simulator) hands the core [`Event::Tick`] this often.
pub const TICK: Duration = Duration::from_millis(100);

/// The core: its parts, and what no part holds yet (the world, the geometry, the round's
/// envelopes).
///
/// The fields the orchestration files (`players.rs`, `handover.rs`, `resume.rs`,
/// `game.rs`) use are `pub(crate)` because those files borrow several of them at once (a
/// seat from the roster while pushing to the outbox and the peer rounds, the world with
/// the envelopes): accessor methods on `ShardCore` would borrow the whole core and forbid
/// that split. What they reach through such a field is the part's methods; each part's own
/// state stays behind its private fields. The rest are private to this file.
pub struct ShardCore {
    pub(crate) id: ShardId,
    pub(crate) world: World,
    pub(crate) geometry: Geometry,
    /// Live shards, their registrations, this shard's own, open peer streams (see
    /// `peers_seen.rs`).
    pub(crate) peers: PeersSeen,
    pub(crate) metrics: Arc<ShardMetrics>,
    /// The time of the event being handled.
    pub(crate) now: Instant,
    /// Whether the lease is in doubt after a pause, and what waits meanwhile (see
    /// [`ShardCore::handle`] and `pause.rs`).
    pause: Pause,
    /// Open gateway links, by lane, and those to end (see `gateway_links.rs`).
    pub(crate) links: GatewayLinks,
    /// Seats, parked players, divergent views, resume tokens (see `roster.rs`).
    pub(crate) roster: Roster,
    /// Players handed off from here, and handoffs and restores waiting to come in (see
    /// `handoffs.rs`).
    pub(crate) handoffs: Handoffs,
    /// Inputs for players not seated here (see `inputs.rs`).
    pub(crate) inputs: Inputs,
    /// What goes to the player store, and the logouts waiting for it (see `saves.rs`).
    pub(crate) saves: Saves,
    pub(crate) persistent: Persistent,
    /// Operators' orders seen (carried out if the player was here), of those still in etcd.
    orders_seen: FxHashSet<u64>,
    pub(crate) ghosts: Ghosts,
    pub(crate) outbox: Outbox,
    pub(crate) peer_out: PeerRounds,
    pub(crate) envelopes: Vec<Envelope>,
    /// Where viewers' output goes this round (see `routes.rs`).
    pub(crate) routes: RouteCache,
    pub(crate) holders: Vec<ShardId>,
    /// Spawn cells and resume nonces (see [`ShardCore::random_spawn`]); the game has its
    /// own (`GameSlot`), so the game's draws do not change these.
    rng: SmallRng,
    /// When the core was made: the world's clock counts from here ([`ShardCore::elapsed`]).
    started: Instant,
    /// Versions and recent positions of everyone in this world.
    pub(crate) history: History,
    /// Divergent clients with news this round: their views are brought forward once, at
    /// the end of the round (a resync looks at everyone in view; once per message it
    /// would be quadratic in a crowd).
    pub(crate) resync_due: Vec<PlayerId>,
    /// The game and its NPC ids, mail and changed states (see `game.rs`).
    pub(crate) game: GameSlot,
    /// The share of moves refused while the gateways cannot take the output (see
    /// `overload.rs`).
    pub(crate) overload: Overload,
    /// Logins of players seated on other shards, lately (see `claims.rs`).
    pub(crate) claims: Claims,
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
            game: GameSlot::new(
                game,
                config.max_npcs,
                config.seed ^ u64::from(config.id.0),
                config.save_interval.is_some(),
            ),
            overload: Overload::default(),
            claims: Claims::default(),
            id: config.id,
            world: World::new(config.world.clone()),
            geometry: Geometry::from_view(&ClusterView::default(), config.id, &config.world),
            peers: PeersSeen::new(config.id, config.incarnation),
            metrics,
            now,
            links: GatewayLinks::default(),
            roster: Roster::new(config.resume_keys.clone(), config.resume_window),
            handoffs: Handoffs::default(),
            inputs: Inputs::default(),
            saves: Saves::new(config.save_interval, now),
            persistent: Persistent::new(config.save_interval, now),
            pause: Pause::new(config.lease_ttl),
            orders_seen: FxHashSet::default(),
            ghosts: Ghosts::default(),
            outbox: Outbox::default(),
            peer_out: PeerRounds::default(),
            envelopes: Vec::with_capacity(1024),
            routes: RouteCache::default(),
            holders: Vec::new(),
            rng: SmallRng::seed_from_u64(config.seed ^ u64::from(config.id.0)),
            started: now,
            history: Default::default(),
            resync_due: Vec::new(),
        }
    }

    /// Time since `since`, as of the current event (zero if `since` is later).
    pub(crate) fn since(&self, since: Instant) -> Duration {
        self.now.saturating_duration_since(since)
    }

    /// Time since the core was made, as of the current event: the world's and the game's
    /// clock.
    pub(crate) fn elapsed(&self) -> Duration {
        self.since(self.started)
    }

    /// A random cell of this shard's region, for a login the gateway gives no spawn
    /// (`None` while the shard holds no region), from the core's seeded generator.
    pub(crate) fn random_spawn(&mut self) -> Option<meridian_world::Position> {
        self.geometry.random_cell(&mut self.rng)
    }

    /// A nonce for a fresh resume token (see [`fresh_nonce`]), from the same generator as
    /// spawn cells: the draws keep their order.
    pub(crate) fn resume_nonce(&mut self) -> u64 {
        fresh_nonce(&mut self.rng)
    }

    /// Carries out each operator's order the first time it is seen, if its player is here
    /// (see `players.rs`); a shard the player reaches later has seen the order too and
    /// leaves it be. Orders no longer in the view are forgotten.
    fn carry_out_orders(&mut self, orders: &BTreeMap<u64, PlayerOrder>) {
        self.orders_seen.retain(|id| orders.values().any(|order| order.id == *id));
        for (&player, order) in orders {
            if !self.orders_seen.insert(order.id) {
                continue;
            }
            self.carry_out_order(PlayerId(player), &order.kind);
        }
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
        if let Some(gap) = self.pause.woke(self.now, now, &event) {
            warn!(
                shard = %self.id,
                ?gap,
                "did not run for longer than its lease; acting on nothing until etcd says whether the lease is alive"
            );
            self.metrics.pauses.inc();
        }
        let Some(since) = self.pause.suspect_since() else { return self.take(now, event) };
        match event {
            Event::LeaseConfirmed { asked } if asked >= since => {
                debug!(shard = %self.id, "lease confirmed after the pause");
                self.resume_after_pause(now);
            }
            Event::LeaseExpired { .. } => {
                // Taken for dead, whatever the map says now: every gateway saw this shard's
                // record go and restores its players where the coordinator puts them, and
                // the coordinator may not have drawn that map yet when this shard reads it
                // (or has drawn this shard back in already). Its players are dropped, and
                // their gateways restore them, here or elsewhere (issue 33: kept, they were
                // the lost moves and the players on two shards after a SIGSTOP).
                self.now = self.now.max(now);
                if self.after_lease_expiry(Some(false)) {
                    // What peers and gateways sent the old incarnation went with it: its
                    // ghosts, handoffs and inputs are void (a held restore taken here brought
                    // back a player that lives elsewhere now: seed 303). Peers learn it died
                    // from etcd and drop its ghosts. A gateway may not: its watch can bring
                    // the death and the new registration in one view (seed 1643). So its
                    // streams end here, as a dead shard's would: the gateway answers what it
                    // sent on them, reconnects and restores its players where they live now.
                    let mut links = self.links.ids();
                    let (opened, ended) = self.pause.void_for_new_life();
                    links.extend(opened);
                    for link in links {
                        self.drop_link(link);
                        if !ended.contains(&link) {
                            self.links.close(link);
                        }
                    }
                }
                self.resume_after_pause(now);
            }
            Event::LeaseConfirmed { .. } => {}
            Event::Tick => self.now = self.now.max(now),
            // News about the shell's queues, not about players: kept, never held.
            Event::LinkBacklog { link, queued } => self.overload.backlog(link, queued),
            other => self.pause.hold(other),
        }
    }

    /// Takes what waited while the lease was in doubt, in arrival order.
    fn resume_after_pause(&mut self, now: Instant) {
        for event in self.pause.resume() {
            self.take(now, event);
        }
    }

    /// Acts on one event.
    fn take(&mut self, now: Instant, event: Event) {
        self.now = self.now.max(now);
        match event {
            Event::LinkOpened { link, gateway, lane } => {
                let opened = self.links.opened(link, gateway, lane);
                self.metrics.links.set(self.links.len() as i64);
                // Only the handoffs and restores of this lane's sessions: the gateway's other
                // lanes may not have their links here yet.
                for (from, player, generation, handoff, _) in self.handoffs.lane_opened(opened) {
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
            Event::LinkBacklog { link, queued } => {
                self.overload.backlog(link, queued);
                if let Some(shed) = self.overload.adjust(self.now) {
                    if shed > 0 && self.metrics.overload_shed.get() == 0 {
                        warn!(
                            link = link.0,
                            batches = queued.batches,
                            bytes = queued.bytes,
                            "gateways not keeping up with the output; shedding moves"
                        );
                    } else if shed == 0 {
                        tracing::info!("gateways keeping up again; applying every move");
                    }
                    self.metrics.overload_shed.set(i64::from(shed));
                }
            }
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
                self.peers.streams_up(up);
            }
            Event::LeaseExpired { partition } => {
                let owns = partition.map(|p| p.regions_of(self.id).next().is_some());
                self.after_lease_expiry(owns);
            }
            Event::LeaseConfirmed { .. } => {}
            Event::Saved { players } => self.saves.stored(&players, &mut self.outbox),
            Event::SaveAll => {
                for player in self.roster.seated_players() {
                    self.save(player);
                }
                self.save_all_entities();
            }
            Event::Tick => self.housekeeping(),
            Event::GameTick => self.game_tick(),
            Event::Ids(ids) => self.ids_arrived(ids),
            Event::KvAnswers(replies) => self.kv_answers(replies),
            Event::EntitiesFound(records) => self.entities_found(records),
            Event::EntitiesClaimed(records) => self.entities_claimed(records),
            Event::EntitiesSaved { through, refused } => self.entities_saved(through, refused),
        }
    }

    /// How far a drain has got: (local players, handoffs not yet confirmed, whether inputs
    /// for handed-off players have stopped arriving).
    pub fn drain_status(&self, now: Instant) -> (usize, usize, bool) {
        let unconfirmed = self.handoffs.unconfirmed();
        // Gateways switch a player's route when they read its `released_to` marker;
        // inputs they sent before that still arrive here and are forwarded. A shard that
        // stopped now would leave them unanswered.
        let quiet = self.inputs.forwarding_quiet(now) && self.handoffs.quiet(now);
        // NPCs are handed off like players while another shard lives to take them; the
        // last shard of a cluster that stops goes without them (NPCs are not saved: the
        // game makes its world again when the cluster starts).
        let others_live = self.peers.others_live();
        let npcs_left = if others_live { 0 } else { self.world.n_npcs() };
        (self.roster.n_seated() - npcs_left, unconfirmed, quiet)
    }

    /// The players owned here and where they stand (for the simulator's checks).
    pub fn local_players(&self) -> impl Iterator<Item = (PlayerId, meridian_world::Position)> + '_ {
        self.world.local_players()
    }

    /// The shards a local player is mirrored to (`None` if it is not local here).
    pub fn ghosted_at(&self, player: PlayerId) -> Option<&[ShardId]> {
        self.roster.seat(player).map(|seat| seat.ghosted_at.as_slice())
    }

    /// This shard's incarnation, for its etcd record: it changes when the shard drops
    /// everything it held after being taken for dead.
    pub fn incarnation(&self) -> u64 {
        self.peers.incarnation()
    }

    /// The partition epoch this core acts on.
    /// Ghost holds given up on after 2 s without the old owner's `Released`
    /// (`meridian_shard_ghost_release_timeouts_total`; see `Ghosts::release_timeouts`).
    pub fn ghost_release_timeouts(&self) -> u64 {
        self.ghosts.release_timeouts()
    }

    pub fn epoch(&self) -> u64 {
        self.geometry.epoch
    }

    /// Every copy of a player here that is not local (ghosts), with its position.
    pub fn ghost_positions(&self) -> Vec<(PlayerId, meridian_world::Position)> {
        self.world.ghosts().collect()
    }

    /// Copies shown here whose messages come from `shard`, or that `shard` released to an
    /// owner that has not spoken for them yet (the simulator's check after a death).
    pub fn copies_from(&self, shard: ShardId) -> Vec<PlayerId> {
        self.ghosts.copies_from(shard)
    }

    /// Players with inputs held for them here (their handoff has not arrived).
    pub fn players_waited_for(&self) -> Vec<PlayerId> {
        self.inputs.players_waited_for()
    }

    /// Sizes of the core's internal maps and queues, for bounds checks.
    pub fn sizes(&self) -> CoreSizes {
        let (early, refused) = self.inputs.sizes();
        let (handed_off, awaiting_gateway) = self.handoffs.sizes();
        CoreSizes {
            seats: self.roster.n_seated(),
            handed_off,
            early,
            refused,
            parked: self.roster.n_parked(),
            awaiting_gateway,
            divergent: self.roster.n_divergent(),
            ghost_tracks: self.ghosts.tracks(),
        }
    }

    fn on_view(&mut self, view: &ClusterView) {
        self.carry_out_orders(&view.orders);
        for peer in self.peers.view(view) {
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
        self.entities_after_view();
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
        for player in self.roster.forget_holder(peer) {
            self.mirror(player);
        }
    }

    /// A new partition: ghosts go where the new borders need them, and every local player
    /// now standing in another shard's region is handed to it, exactly as if it had walked
    /// across a border.
    fn rebalance(&mut self) {
        let peers = &self.peers;
        self.ghosts.sources_gone(
            &mut self.world,
            &mut self.history,
            |s| peers.live_or_me(s),
            self.now,
            &mut self.envelopes,
        );
        self.route_envelopes();
        self.restore_orphaned_npcs();
        let players: Vec<PlayerId> = self.roster.seated();
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
            if let Some(handed) = self.handoffs.handed_mut(player) {
                if message.generation > handed.generation && released.new_owner != self.id.0 {
                    handed.to = ShardId(released.new_owner);
                    handed.incarnation = self.peers.incarnation_of(handed.to);
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
            Some(Peer::Forwarded(input)) => self.on_forwarded(message.generation, input),
            Some(Peer::Needed(needed)) => {
                let holder = if needed.holder == 0 { from } else { ShardId(needed.holder) };
                self.ghost_needed(holder, player, message.generation);
            }
            Some(Peer::Claim(claim)) => self.on_claim(player, claim),
            Some(Peer::HandoffAck(_)) => {
                if let Some(handed) = self.handoffs.handed_mut(player) {
                    handed.acked.get_or_insert(self.now);
                }
            }
            // A ghost update. A player owned here never takes updates from elsewhere: such a
            // message is from a previous owner and already superseded.
            Some(_) if self.world.is_local(player) != Some(true) => {
                self.note_persistent_ghost(&message);
                self.ghosts.apply(
                    &mut self.world,
                    &mut self.history,
                    from,
                    message,
                    self.now,
                    &mut self.envelopes,
                );
                let peers = &self.peers;
                self.ghosts.orphan_unless_live(player, |s| peers.live_or_me(s), self.now);
                self.route_envelopes();
                for (owner, player, version) in self.ghosts.take_needed() {
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
                if let Some(link) = self.roster.seat(player).map(|seat| seat.link) {
                    return self.join(link, input);
                }
                // Not here any more either (its link here broke too, say): restored here,
                // answering through its gateway lane's link, unless it went on from here.
                if self.handoffs.handed(player).is_none() {
                    let lane = GatewayLane::of_session(join.gateway_id, input.session);
                    if let Some(link) = self.links.of_lane(lane) {
                        return self.join(link, input);
                    }
                }
            }
            (Some(link), Some(Input::Resume(_))) => return self.resume(link, input),
            _ => {}
        }
        if let Some(seat) = self.roster.seat_mut(player) {
            // Session ids are unique per gateway only: an input straight from a gateway
            // other than the seat's is from a connection the player has left (a login on
            // another gateway took it over), whatever its session number.
            let from = link.and_then(|link| self.links.gateway_of(link));
            if seat.gateway != 0 && from.is_some_and(|gateway| gateway != seat.gateway) {
                debug!(%player, seq = input.seq, "input from another gateway's session dropped");
                return self.budgets_of_a_left_session(player, input);
            }
            if seat.session == input.session && !matches!(input.kind, Some(Input::Leave(_))) {
                // The client speaks on the session its resume gave it: it has the fresh
                // token, and the one it resumed with is spent.
                seat.resume_previous = None;
            }
            return self.sequence(player, input);
        }
        if let Some(handed) = self.handoffs.handed_mut(player) {
            if handed.forwarded.len() == FORWARDED_KEPT {
                handed.forwarded.remove(0);
            }
            handed.forwarded.push(input.clone());
            self.metrics.inputs_forwarded.inc();
            self.inputs.forwarded(self.now);
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
        if self.inputs.ended(player, input.session) {
            debug!(%player, seq = input.seq, "input of a session that left the world here dropped");
            return;
        }
        if self.inputs.given_up(&input) {
            debug!(%player, seq = input.seq, "copy of an input given up on dropped");
            return;
        }
        if link.is_none() && matches!(input.kind, Some(Input::Leave(_))) {
            // A forwarded Leave wants no answer and nothing waits behind it: it is kept as
            // given up on at once (see `refuse_unplaced`), so a player that comes on its
            // session still leaves, in its turn. (A gateway sends a failed resume's Leave
            // to every shard; a copy forwarded by one the player was handed from would
            // otherwise wait `FORWARD_FOR` for a player that never comes: seed 15979.)
            return self.refuse_unplaced(None, input);
        }
        if let Some((link, input)) = self.inputs.hold(player, link, input, self.now) {
            self.refuse_unplaced(link, input);
        }
    }

    /// Applies a local player's input if it is the next in sequence, and any held ones
    /// whose turn that makes it; holds it otherwise. Past the hold limit the newest input
    /// (this one or a held one) is refused at once, ahead of its turn (its answer may come
    /// before those of older inputs still missing), and its seq consumed, so later inputs
    /// still flow.
    pub(crate) fn sequence(&mut self, player: PlayerId, input: PlayerInput) {
        let Some(seat) = self.roster.seat_mut(player) else {
            return;
        };
        if input.session != seat.session {
            // From a connection the player has left since (it resumed on another one).
            debug!(%player, seq = input.seq, "input from an earlier session dropped");
            return self.budgets_of_a_left_session(player, input);
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
        while let Some(next) = self.roster.seat_mut(player).and_then(|s| s.inputs.next_held()) {
            self.apply(player, next);
        }
    }

    /// Gives up on an input for a player this shard does not have: answers it when the
    /// connection's link is known (a forwarded input on its own cannot be), and records
    /// its seq so that the player, should it arrive after all, steps over it. A `Leave` is
    /// kept instead, for such a player to leave the world.
    pub(crate) fn refuse_unplaced(&mut self, link: Option<LinkId>, input: PlayerInput) {
        let (player, session) = (PlayerId(input.player_id), input.session);
        let Some(input) = self.inputs.refuse(input, self.now) else {
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
        let (mut inputs, refused) = self.inputs.arrived(player, session);
        if let Some(refused) = refused {
            if let Some(seat) = self.roster.seat_mut(player) {
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
        self.saves.expire(self.now, &mut self.outbox);
        let timeouts =
            self.ghosts.expire(&mut self.world, &mut self.history, self.now, &mut self.envelopes);
        self.metrics.ghost_release_timeouts.add(timeouts);
        self.route_envelopes();
        for observer in self.roster.divergent_players() {
            self.resync(observer);
        }
        // Players standing in another shard's region whose handoff had to wait (the new
        // owner was not reachable yet) go now.
        let astray: Vec<PlayerId> = self
            .roster
            .seated()
            .into_iter()
            .filter(|p| self.world.position(*p).is_some_and(|at| !self.geometry.owns(at)))
            .collect();
        for player in astray {
            self.hand_off(player);
        }
        let now = self.now;
        self.history.expire(now);
        self.metrics.ghosts.set(self.ghosts.len() as i64);
        self.handoffs.expire_awaiting_gateway(now);
        self.expire_actions(now);
        if self.game.orphans_waiting() {
            self.restore_orphaned_npcs();
        }
        for player in self.inputs.overdue(now) {
            for (link, input) in self.inputs.expire(player, now) {
                self.refuse_unplaced(link, input);
            }
        }
        self.inputs.expire_memory(now);
        self.handoffs.expire_handed_off(now);
        self.roster.expire_parked(now);
    }

    /// Restores passed on to this shard that waited for the link of `opened` (see
    /// `on_input`) are taken now, with what was held behind them, in seq order.
    fn restores_for(&mut self, opened: GatewayLane) {
        for inputs in self.inputs.restores_for(opened) {
            for (link, input) in inputs {
                self.on_input(link, input);
            }
        }
    }

    /// Brings a divergent client's view toward the world (see `views.rs`); it stays
    /// divergent while something waits.
    pub(crate) fn resync(&mut self, observer: PlayerId) {
        let Some(divergent) = self.roster.take_divergent(observer) else { return };
        let Some(seat) = self.roster.seat(observer) else { return };
        let (parts, out) = ((&self.world, &self.history), &mut self.outbox);
        let still =
            views::resync(observer, divergent, (seat.link, seat.session), parts, out, self.now);
        if let Some(still) = still {
            self.roster.set_divergent(observer, still);
        }
    }

    fn drop_link(&mut self, link: LinkId) {
        // Only this link's players: the gateway's other lanes keep their links and players.
        self.links.gone(link);
        self.outbox.forget_link(link);
        self.overload.forget(link);
        for player in self.roster.seated_on(link) {
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
        self.metrics.notifications.add(self.outbox.n_messages());
        for (code, n) in self.outbox.drain_errors() {
            self.metrics.errors.add(code.as_str_name(), n);
        }
        for (link, batches, bytes) in self.outbox.drain() {
            if !self.links.is_open(link) {
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
        if let Some(saves) = self.saves.take_round() {
            out.push(Transmit::Save(saves));
        }
        out.extend(self.links.take_closing().into_iter().map(|link| Transmit::CloseLink { link }));
        self.flush_game(out);
    }

    /// The lease expired (a hang, or cut off from etcd past the TTL, or etcd stalled). If
    /// the region is not this shard's any more (`owns`, from the partition read with the
    /// expiry; the current geometry's if `None`), or the shard did not run meanwhile (then
    /// `owns` is `Some(false)`), gateways restore its players elsewhere: this shard's copies
    /// are stale and are dropped without a word (not handed off, which would duplicate
    /// them). If the region is still its own, it keeps them. Whether they were dropped.
    fn after_lease_expiry(&mut self, owns: Option<bool>) -> bool {
        if owns.unwrap_or_else(|| self.geometry.owner_count(self.id) > 0) {
            warn!(shard = %self.id, "lease expired but the region is still ours; keeping players");
            return false;
        }
        warn!(shard = %self.id, players = self.roster.n_seated(), "taken for dead and replaced; dropping stale players");
        // A new life: peers and gateways that see it in the record know that what they gave
        // the old one is gone, even if their watch never showed this shard gone.
        self.peers.new_life();
        let config = self.world.config().clone();
        self.world = World::new(config);
        self.roster.clear();
        self.handoffs.clear_handed_off();
        self.inputs.clear();
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
        self.peers.ready(to)
    }

    /// Where this shard's players stand, for the coordinator's load-aware borders.
    pub fn load_profile(&self) -> meridian_cluster::LoadProfile {
        reports::load_profile(&self.world)
    }

    /// Players per square of [`meridian_cluster::DENSITY_CELL`] cells, squares with
    /// players only (`ready` is filled in by the admin route).
    pub fn density(&self) -> meridian_cluster::DensityReport {
        reports::density(&self.world, self.id, self.geometry.epoch)
    }

    /// The `/players` report: JSON of the players this shard owns (and those handed off
    /// lately), and its NPCs.
    pub fn report(&self, now: Instant) -> String {
        reports::players(
            &self.world,
            self.roster.seats(),
            &self.handoffs,
            (self.id, self.geometry.epoch),
            now,
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
