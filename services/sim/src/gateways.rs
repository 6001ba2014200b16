//! The simulated gateways: each one's relayed inputs taken to its streams to the shards and
//! its clients' output to them, and its stream to a shard opened and cut.

use std::time::Duration;

use meridian_shard_core::{Event, LinkId};
use rand::Rng;

use crate::{Ev, Key, Payload, Sim};

impl Sim {
    /// Takes a gateway's relayed inputs to its streams and its clients' output to them.
    pub(crate) fn pump_gateway(&mut self, g: u32) {
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

    pub(crate) fn connect(&mut self, g: u32, s: u32) {
        let Some(node) = self.gateways.get(&g) else { return };
        if !node.known.contains(&s) || node.harness.link_is_up(s) {
            return;
        }
        if !self.shard_alive(s) {
            // No process holds its port: the connect is refused. Refusals in a row prove
            // the shard dead and the gateway revokes its lease at once, as relay.rs does,
            // rather than waiting out the TTL. A paused shard's port still accepts (the
            // kernel completes the handshake), so it is never taken for dead this way.
            let now = self.now();
            let lease_only = self.settings.faults.lease_only_deaths;
            if !lease_only && self.refusals.entry((g, s)).or_default().refused(now) {
                self.outcome.deaths_detected += 1;
                self.note_all(|| {
                    format!("gateway {g}: shard {s}'s port refuses connects; its lease revoked")
                });
                self.after(Duration::ZERO, Ev::LeaseExpiry(s, 0));
            }
            self.after(Duration::from_millis(200), Ev::Connect(g, s));
            return;
        }
        self.refusals.entry((g, s)).or_default().reached();
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
    pub(crate) fn cut_link(&mut self, g: u32, s: u32, reconnect: bool) {
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
}
