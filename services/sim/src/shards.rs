//! The simulated shards and the streams between nodes: a shard core started, woken and fed
//! its events, its transmits taken to the streams they name, and each stream's in-order
//! delivery at the times its delays allow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::{CoreConfig, Event, ShardMetrics, Transmit};
use rand::Rng;

use crate::model;
use crate::store::Request;
use crate::{Ev, Key, Node, Payload, ShardNode, Sim, LEASE_TTL};

impl Sim {
    pub(crate) fn start_shard(&mut self, id: u32) {
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
            resume_keys: meridian_gateway_core::fuzzing::resume_key().into(),
            // With persistent entities there is a store, and players are saved in it too.
            save_interval: self.settings.entities.then_some(Duration::from_secs(1)),
            lease_ttl: LEASE_TTL,
            max_npcs: meridian_shard_core::types::DEFAULT_MAX_NPCS,
        };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ShardId(id)));
        let core = if self.settings.entities {
            let playing = Arc::clone(&self.games_playing);
            let game = Box::new(crate::keeper::Keeper { playing, planted: 0, steps: 0 });
            let first = Duration::from_millis(self.rng.random_range(0..100));
            self.after(first, Ev::GameTick(id));
            ShardCore::with_game(&config, metrics, self.now(), game)
        } else {
            ShardCore::new(&config, metrics, self.now())
        };
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

    pub(crate) fn shard_alive(&self, s: u32) -> bool {
        self.shards.get(&s).is_some_and(|n| n.core.is_some())
    }

    /// Hands a shard's core an event, or keeps it for when the shard wakes if it is paused
    /// (what reaches a stopped process waits in its sockets and its watch).
    pub(crate) fn hand_shard(&mut self, s: u32, now: Instant, event: Event) {
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
    pub(crate) fn wake(&mut self, s: u32) {
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
    pub(crate) fn keep_alive_answered(&mut self, s: u32) {
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
    pub(crate) fn pump_shard(&mut self, s: u32) {
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
                // The store's (with `Settings::entities`; without, no shard makes these).
                Transmit::Save(saves) => {
                    let players = saves.iter().map(|save| save.player).collect();
                    self.store_ask(s, Request::Players(players));
                }
                Transmit::WantIds => self.store_ask(s, Request::Ids),
                Transmit::Kv(requests) => self.store_ask(s, Request::Kv(requests)),
                Transmit::SaveEntities { round, saves } => {
                    if self.focus.is_some() {
                        let ids: Vec<u64> = saves.iter().map(|save| save.id()).collect();
                        let line = format!("shard {s} saves {saves:?}");
                        self.note(&ids, || line);
                    }
                    self.store_ask(s, Request::Save(round, saves))
                }
                Transmit::LoadEntities { areas } => self.store_ask(s, Request::Load(areas)),
                Transmit::ClaimEntities(claims) => {
                    if self.focus.is_some() {
                        let ids: Vec<u64> = claims.iter().map(|c| c.id).collect();
                        let line = format!("shard {s} claims {claims:?}");
                        self.note(&ids, || line);
                    }
                    self.store_ask(s, Request::Claim(claims))
                }
            }
        }
        self.out = out;
        for g in closed {
            self.cut_link(g, s, true);
        }
    }

    pub(crate) fn send(&mut self, key: Key, payload: Payload) {
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

    pub(crate) fn schedule(&mut self, key: Key) {
        let Some(stream) = self.streams.get_mut(&key) else { return };
        if stream.scheduled || !stream.open {
            return;
        }
        let Some((ready, _)) = stream.queue.front() else { return };
        let at = (*ready).max(stream.stalled_until).max(self.t);
        stream.scheduled = true;
        self.at(at, Ev::Deliver(key));
    }

    pub(crate) fn deliver(&mut self, key: Key) {
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
}
