//! The faults the seed draws (borders moved, a shard killed, paused or joining, a gateway
//! stream cut, a peer stream stalled, etcd stalled), each applied at its drawn time.

use std::time::Duration;

use rand::Rng;

use crate::{Ev, FaultKind, Key, Sim, LEASE_TTL};

impl Sim {
    pub(crate) fn fault(&mut self, kind: FaultKind) {
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
        self.dying.push((s, self.t));
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
}
