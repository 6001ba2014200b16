//! The etcd model's views reaching the nodes: each node's watch lags on its own, a shard
//! acts on the partition and members it sees, peer streams open as shards see each other.

use std::collections::BTreeSet;
use std::time::Duration;

use meridian_cluster::ShardId;
use meridian_shard_core::Event;
use rand::Rng;

use crate::{Ev, Key, Node, Sim};

impl Sim {
    /// Tells every node about the newest view, each after its own watch lag.
    pub(crate) fn publish(&mut self) {
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

    pub(crate) fn view_to(&mut self, node: Node, version: usize) {
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

    pub(crate) fn peer_connect(&mut self, a: u32, b: u32) {
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

    pub(crate) fn peers_changed(&mut self, s: u32) {
        let now = self.now();
        let Some(node) = self.shards.get_mut(&s) else { return };
        let up: Vec<ShardId> = node.peers_up.iter().map(|p| ShardId(*p)).collect();
        if node.core.is_some() {
            self.hand_shard(s, now, Event::PeersUp(up));
        }
    }
}
