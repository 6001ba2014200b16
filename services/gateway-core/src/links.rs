//! The worker's relay links to the shards, as endpoints of the core: a connected link
//! taken on, bytes from it turned into deliveries, its heartbeats and silence, sealing
//! what is queued for it at the end of a turn, and letting it go when it fails or leaves
//! the routing table (its players then go to `failover`). Called by the door and `timers`.

use std::sync::Arc;
use std::time::Instant;

use tracing::warn;

use super::endpoints::Entry;
use super::{Core, Endpoint};
use crate::uplink::{Connected, LinkFailure, Uplink};

impl Core {
    /// Starts driving a link its connecting task connected; its endpoint, for the event
    /// loop to read and write its socket. `None` for a link the routing table no longer has
    /// or one this worker already drives: the event loop closes the socket, and dropping
    /// `up` tells its connecting task.
    pub fn link_connected(&mut self, now: Instant, up: Connected) -> Option<Endpoint> {
        self.ctx.now = now;
        let routed = self.ctx.routing().read(|t| t.links.iter().any(|l| Arc::ptr_eq(l, &up.link)));
        if !routed || self.endpoints.find_link(&up.link).is_some() {
            return None;
        }
        let link = Arc::clone(&up.link);
        link.set_up(true);
        tracing::info!(worker = self.ctx.worker, shard = %link.id, "relay link open");
        self.ctx.shared.metrics.relay_links_opened.inc();
        Some(self.endpoints.insert(Entry::Link(Box::new(Uplink::new(up, now)))))
    }

    /// Sets what a link may hold unsent (the simulator's harness makes it small).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn set_link_room(&mut self, endpoint: Endpoint, bytes: usize) {
        if let Some(Entry::Link(uplink)) = self.endpoints.get_mut(endpoint) {
            uplink.room = bytes;
        }
    }

    /// Bytes a link's socket received.
    pub(super) fn read_link(&mut self, index: u32, data: &[u8], now: Instant) {
        let Some(uplink) = self.endpoints.link_mut(index).filter(|u| !u.failed) else { return };
        let from = uplink.link.id;
        let mut batches = Vec::new();
        let received = uplink.received(data, now, |deliveries| batches.push(deliveries));
        for deliveries in batches {
            self.ctx.shared.metrics.batches_from_shards.inc();
            self.apply_deliveries(from, deliveries);
        }
        if let Err(failure) = received {
            self.fail_link(index, failure);
        }
    }

    /// Lets a link go: every move in flight on it is answered, its players are let go (and
    /// restored when its shard is back, or gone), and its connecting task may connect again.
    /// The event loop closes the socket once nothing is in flight on it.
    pub(super) fn fail_link(&mut self, index: u32, failure: LinkFailure) {
        let Some(uplink) = self.endpoints.link_mut(index).filter(|u| !u.failed) else { return };
        let link = Arc::clone(&uplink.link);
        uplink.let_go();
        uplink.ready = true;
        link.set_up(false);
        match failure {
            LinkFailure::Unrouted => {
                tracing::info!(worker = self.ctx.worker, shard = %link.id, "relay link closed")
            }
            failure => {
                warn!(worker = self.ctx.worker, shard = %link.id, %failure, "relay link failed")
            }
        }
        self.ctx.shared.metrics.relay_links_failed.inc();
        self.link_down(&link);
    }

    /// Lets go the links the routing table no longer has (their shard left, or came back
    /// as a new incarnation).
    pub(super) fn reconcile_links(&mut self) {
        let version = self.ctx.routing().read(|t| t.version);
        if version == self.links_version {
            return;
        }
        self.links_version = version;
        let routing = self.ctx.routing();
        let mut gone = self.endpoints.link_indices();
        gone.retain(|&index| {
            self.endpoints.link_mut(index).is_some_and(|uplink| {
                !uplink.failed
                    && !routing.read(|t| t.links.iter().any(|l| Arc::ptr_eq(l, &uplink.link)))
            })
        });
        for index in gone {
            self.fail_link(index, LinkFailure::Unrouted);
        }
    }

    /// The links' periodic work: heartbeats where nothing was sent for a while, and links
    /// silent too long let go.
    pub(super) fn tick_links(&mut self, now: Instant) {
        let mut silent = Vec::new();
        for i in 0..self.endpoints.link_count() {
            let Some((index, uplink)) = self.endpoints.link_at(i) else { continue };
            if uplink.failed {
                continue;
            }
            if uplink.silent(now) {
                silent.push(index);
            } else {
                // Sealing queues the heartbeat if one is due.
                uplink.dirty = true;
            }
        }
        for index in silent {
            self.fail_link(index, LinkFailure::Silent(meridian_rpc::link::SILENCE));
        }
    }

    /// Seals what was queued on each link this turn (TLS records, a heartbeat if due), for
    /// the event loop to write.
    pub(super) fn seal_links(&mut self, now: Instant) {
        let mut failures = Vec::new();
        // Every loop turn: by position, without collecting the links first.
        for i in 0..self.endpoints.link_count() {
            let Some((index, uplink)) = self.endpoints.link_at(i) else { continue };
            if !uplink.dirty {
                continue;
            }
            uplink.dirty = false;
            uplink.ready = true;
            if !uplink.failed {
                if let Err(failure) = uplink.seal(now) {
                    failures.push((index, failure));
                }
            }
        }
        for (index, failure) in failures {
            self.fail_link(index, failure);
        }
    }
}
