//! The world task: the tokio shell around the shard's core (`core.rs`).
//!
//! Commands from every gateway stream and every peer shard arrive on one bounded queue and
//! are handed to the core a round at a time, with the time they are handled; the round's
//! output goes to the gateway streams' queues and the peer tasks' queues. The task also
//! tells the core when the cluster view changes, which peer streams are open, and ticks
//! it every [`TICK`]. It decides nothing about the world: that is the core's.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use meridian_cluster::{ClusterView, ShardId};
use meridian_rpc::pb::PeerMessage;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::command::{frame_bytes, Command, LinkOut};
use crate::core::{ShardCore, TICK};
use crate::peer::PeerSenders;
use crate::types::{CoreConfig, Event, LinkId, Transmit};
use crate::ShardMetrics;
use meridian_shard_core::Backlog;

/// Commands queued for the world task before gateway and peer streams are slowed down.
const COMMAND_QUEUE: usize = 4096;
/// Commands applied per round before output is flushed.
const ROUND: usize = 512;
/// Messages kept for a peer the partition names but that has no stream yet.
const PENDING_FOR_UNKNOWN_PEER: usize = 65_536;

pub struct WorldActor {
    core: ShardCore,
    commands: mpsc::Receiver<Command>,
    view: watch::Receiver<ClusterView>,
    peer_senders: PeerSenders,
    links: HashMap<LinkId, LinkOut>,
    /// Rounds for peers the partition names whose stream is not set up yet.
    pending: HashMap<ShardId, Vec<PeerMessage>>,
    peers_up: Vec<ShardId>,
    metrics: Arc<ShardMetrics>,
    out: Vec<Transmit>,
    /// Where the core's saves go (to the player store's writer, if there is one).
    saves: crate::saver::Saves,
    game_tick: Option<std::time::Duration>,
    ids: EntityIds,
    /// Where the game's key-value requests go (to the store's task, if there is a store).
    kv: crate::kv::KvRequests,
    /// Where persistent entities are saved, loaded and claimed (with a store).
    entities: Option<crate::entities::Entities>,
}

/// The game's part of the shell: the game, its tick, and where entity ids come from.
pub struct GameShell {
    pub game: Box<dyn meridian_game::Game>,
    pub tick: Option<std::time::Duration>,
    pub ids: EntityIds,
    pub kv: crate::kv::KvRequests,
    pub entities: Option<crate::entities::Entities>,
}

/// Blocks of cluster-unique entity ids (the players' counter in etcd), claimed in the
/// background when the core asks: the core never waits on etcd to spawn.
pub struct EntityIds {
    want: Arc<tokio::sync::Notify>,
    blocks: mpsc::Receiver<std::ops::Range<u64>>,
}

/// Entity ids claimed at once for NPCs.
const ID_BLOCK: u64 = 1024;

impl EntityIds {
    pub fn start(
        client: meridian_cluster::EtcdClient,
        keys: &meridian_cluster::ClusterKeys,
    ) -> EntityIds {
        let want = Arc::new(tokio::sync::Notify::new());
        let (send, blocks) = mpsc::channel(4);
        let mut allocator = meridian_cluster::IdAllocator::new(client, keys, ID_BLOCK);
        let wanted = Arc::clone(&want);
        tokio::spawn(async move {
            loop {
                wanted.notified().await;
                loop {
                    match allocator.claim_block().await {
                        Ok(block) => {
                            if send.send(block).await.is_err() {
                                return;
                            }
                            break;
                        }
                        Err(error) => {
                            warn!(%error, "cannot claim entity ids for NPCs; retrying");
                            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        }
                    }
                }
            }
        });
        EntityIds { want, blocks }
    }
}

impl WorldActor {
    pub fn new(
        config: &CoreConfig,
        view: watch::Receiver<ClusterView>,
        peer_senders: PeerSenders,
        metrics: Arc<ShardMetrics>,
        saves: crate::saver::Saves,
        game: GameShell,
    ) -> (mpsc::Sender<Command>, WorldActor) {
        let (sender, commands) = mpsc::channel(COMMAND_QUEUE);
        let core = ShardCore::with_game(config, Arc::clone(&metrics), Instant::now(), game.game);
        let actor = WorldActor {
            core,
            commands,
            view,
            peer_senders,
            links: HashMap::new(),
            pending: HashMap::new(),
            peers_up: Vec::new(),
            metrics,
            out: Vec::new(),
            saves,
            game_tick: game.tick,
            ids: game.ids,
            kv: game.kv,
            entities: game.entities,
        };
        (sender, actor)
    }

    pub async fn run(mut self) {
        let mut round = Vec::with_capacity(ROUND);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Without a game the timer never fires (a day is as good as never here).
        let game_period = self.game_tick.unwrap_or(std::time::Duration::from_secs(86_400));
        let mut game_tick = tokio::time::interval(game_period);
        game_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let first = self.view.borrow_and_update().clone();
        self.core.handle(Instant::now(), Event::View(first));
        loop {
            tokio::select! {
                n = self.commands.recv_many(&mut round, ROUND) => {
                    if n == 0 {
                        break;
                    }
                    self.peers_changed();
                    for command in round.drain(..) {
                        self.handle(command);
                    }
                }
                changed = self.view.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let view = self.view.borrow_and_update().clone();
                    // Rounds kept for a peer that has left the cluster will never go.
                    self.pending.retain(|peer, _| view.shards.contains_key(peer));
                    self.core.handle(Instant::now(), Event::View(view));
                }
                _ = tick.tick() => {
                    self.peers_changed();
                    self.core.handle(Instant::now(), Event::Tick);
                }
                _ = game_tick.tick(), if self.game_tick.is_some() => {
                    // The core reads no clock, so the game hook is timed here; a tick held
                    // while the lease is in doubt runs later, untimed (the counter tells).
                    let (started, ticks) = (Instant::now(), self.metrics.game_ticks.get());
                    self.core.handle(started, Event::GameTick);
                    if self.metrics.game_ticks.get() > ticks {
                        self.metrics.game_tick_seconds.observe(started.elapsed().as_secs_f64());
                    }
                }
                Some(ids) = self.ids.blocks.recv() => {
                    self.core.handle(Instant::now(), Event::Ids(ids));
                }
            }
            self.flush();
        }
        debug!("world task stopped");
    }

    /// Tells the core which peer streams are open, when that changed.
    fn peers_changed(&mut self) {
        let mut up: Vec<ShardId> = self.peer_senders.read(|peers| {
            peers
                .iter()
                .filter(|(_, p)| p.up.load(std::sync::atomic::Ordering::Acquire))
                .map(|(id, _)| *id)
                .collect()
        });
        up.sort_unstable();
        if up != self.peers_up {
            self.peers_up = up.clone();
            self.core.handle(Instant::now(), Event::PeersUp(up));
        }
    }

    fn handle(&mut self, command: Command) {
        let now = Instant::now();
        match command {
            Command::Open { link, gateway, lane, out } => {
                self.links.insert(link, out);
                self.core.handle(now, Event::LinkOpened { link, gateway, lane });
            }
            Command::Inputs { link, inputs } => {
                self.core.handle(now, Event::Inputs { link, inputs })
            }
            Command::Closed { link } => {
                self.links.remove(&link);
                self.core.handle(now, Event::LinkClosed { link });
            }
            Command::Peer { from, messages } => {
                self.core.handle(now, Event::Peer { from, messages })
            }
            Command::Report { reply } => {
                let _ = reply.send(self.core.report(now));
            }
            Command::Load { reply } => {
                let _ = reply.send((self.core.load_profile(), self.core.incarnation()));
            }
            Command::Density { reply } => {
                let _ = reply.send(self.core.density());
            }
            Command::LeaseExpired { partition } => {
                self.core.handle(now, Event::LeaseExpired { partition })
            }
            Command::LeaseConfirmed { asked } => {
                self.core.handle(now, Event::LeaseConfirmed { asked })
            }
            Command::Saved { players } => self.core.handle(now, Event::Saved { players }),
            Command::KvAnswers { replies } => self.core.handle(now, Event::KvAnswers(replies)),
            Command::EntitiesFound { records } => {
                self.core.handle(now, Event::EntitiesFound(records))
            }
            Command::EntitiesClaimed { records } => {
                self.core.handle(now, Event::EntitiesClaimed(records))
            }
            Command::EntitiesSaved { through, refused } => {
                self.core.handle(now, Event::EntitiesSaved { through, refused })
            }
            Command::SaveAll { reply } => {
                self.core.handle(now, Event::SaveAll);
                self.flush();
                let _ = reply.send(());
            }
            Command::DrainStatus { reply } => {
                let _ = reply.send(self.core.drain_status(now));
            }
        }
    }

    /// Sends the round's output, then tells the core how many batches (and frame bytes)
    /// wait on each gateway link (a backlog makes it shed moves). A gateway link whose queue is full anyway has
    /// stopped reading: the core cuts it (which makes output of its own: its players
    /// leave), and nothing more is sent on it.
    fn flush(&mut self) {
        loop {
            self.core.flush(&mut self.out);
            let mut cut = Vec::new();
            let mut peers: Vec<(ShardId, Vec<PeerMessage>)> = Vec::new();
            for transmit in self.out.drain(..) {
                match transmit {
                    Transmit::Gateway { link, batch } => {
                        if cut.contains(&link) {
                            continue;
                        }
                        let Some(out) = self.links.get(&link) else { continue };
                        // Counted before it is queued: the writer may take it at once.
                        let bytes = frame_bytes(&batch);
                        out.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
                        if out.batches.try_send(Ok(batch)).is_err() {
                            out.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                            cut.push(link);
                        }
                    }
                    Transmit::Peer { to, messages } => peers.push((to, messages)),
                    Transmit::Save(saves) => self.saves.push(saves),
                    Transmit::WantIds => self.ids.want.notify_one(),
                    // Never full: the core keeps at most as many requests out as it holds.
                    Transmit::Kv(requests) => {
                        if self.kv.try_send(requests).is_err() {
                            warn!("the store's key-value task is gone; requests dropped");
                        }
                    }
                    // Only a shard with a store makes these.
                    Transmit::SaveEntities { round, saves } => {
                        if let Some(entities) = &self.entities {
                            entities.push(round, saves);
                        }
                    }
                    Transmit::LoadEntities { areas } => {
                        if let Some(entities) = &self.entities {
                            entities.load(areas);
                        }
                    }
                    Transmit::ClaimEntities(claims) => {
                        if let Some(entities) = &self.entities {
                            entities.claim(claims);
                        }
                    }
                    // Dropping the sender ends the stream.
                    Transmit::CloseLink { link } => {
                        self.links.remove(&link);
                    }
                }
            }
            self.send_to_peers(peers);
            if cut.is_empty() {
                // How far behind each gateway is: the core sheds moves before a queue fills.
                let now = Instant::now();
                for (&link, out) in &self.links {
                    let batches = out.batches.max_capacity() - out.batches.capacity();
                    let bytes = out.queued_bytes.load(Ordering::Relaxed);
                    let queued = Backlog { batches, bytes };
                    self.core.handle(now, Event::LinkBacklog { link, queued });
                }
                return;
            }
            for link in cut {
                self.links.remove(&link);
                self.core.handle(Instant::now(), Event::LinkCut { link });
            }
        }
    }

    fn send_to_peers(&mut self, rounds: Vec<(ShardId, Vec<PeerMessage>)>) {
        if rounds.is_empty() && self.pending.is_empty() {
            return;
        }
        let metrics = &self.metrics;
        let pending = &mut self.pending;
        self.peer_senders.read(|senders| {
            let mut rounds = rounds;
            // Rounds kept for peers whose stream now exists go first, in order.
            for (to, kept) in pending.iter_mut() {
                if senders.contains_key(to) {
                    let round = std::mem::take(kept);
                    match rounds.iter_mut().find(|(peer, _)| peer == to) {
                        Some((_, messages)) => {
                            let newer = std::mem::replace(messages, round);
                            messages.extend(newer);
                        }
                        None => rounds.push((*to, round)),
                    }
                }
            }
            pending.retain(|_, kept| !kept.is_empty());
            for (to, round) in rounds {
                match senders.get(&to) {
                    Some(handle) => {
                        if handle.sender.try_send(round).is_err() {
                            metrics.peer_rounds_dropped.inc();
                            warn!(peer = %to, "peer queue full or closed; round dropped");
                        }
                    }
                    None => {
                        // The partition named a peer whose stream is not set up yet (the
                        // world task can see a new map a moment before the peer manager):
                        // keep the round for the next flush, within a bound.
                        let kept = pending.entry(to).or_default();
                        if kept.len() + round.len() <= PENDING_FOR_UNKNOWN_PEER {
                            kept.extend(round);
                        } else {
                            metrics.peer_rounds_dropped.inc();
                            warn!(peer = %to, "no stream to peer; round dropped");
                        }
                    }
                }
            }
        });
    }
}
