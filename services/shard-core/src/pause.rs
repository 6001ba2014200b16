//! The core's pause part: whether this shard may act, after it did not run for longer
//! than its lease.
//!
//! A shard that did not run for longer than its lease TTL (no event at all, not even the
//! periodic tick: a stopped process, a frozen VM) may have been taken for dead and its
//! players restored elsewhere. Until etcd says whether its lease is alive, what arrives
//! waits here, in order, and is handed back once the lease is confirmed or has expired.
//!
//! Only `ShardCore::handle` calls it; it decides nothing about the world.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::types::{Event, LinkId};

pub(crate) struct Pause {
    lease_ttl: Duration,
    /// Since when the lease is in doubt, and what arrived meanwhile.
    suspect_since: Option<Instant>,
    held: VecDeque<Event>,
}

impl Pause {
    pub fn new(lease_ttl: Duration) -> Pause {
        Pause { lease_ttl, suspect_since: None, held: VecDeque::new() }
    }

    /// Whether `event` at `now`, the first after `last`, comes after a gap longer than the
    /// lease (a lease expiry itself never counts as one): from then on the lease is in
    /// doubt. Returns the gap when it starts the doubt.
    pub fn woke(&mut self, last: Instant, now: Instant, event: &Event) -> Option<Duration> {
        let gap = now.saturating_duration_since(last);
        if self.suspect_since.is_some()
            || gap <= self.lease_ttl
            || matches!(event, Event::LeaseExpired { .. })
        {
            return None;
        }
        self.suspect_since = Some(now);
        Some(gap)
    }

    /// Since when the lease is in doubt (`None`: the shard acts on what comes).
    pub fn suspect_since(&self) -> Option<Instant> {
        self.suspect_since
    }

    /// An event waits until the lease is known.
    pub fn hold(&mut self, event: Event) {
        self.held.push_back(event);
    }

    /// The shard was taken for dead: what peers and gateways sent the old incarnation is
    /// void. Drops the held peer messages, inputs and link events; returns the links opened
    /// meanwhile and those that ended meanwhile.
    pub fn void_for_new_life(&mut self) -> (Vec<LinkId>, Vec<LinkId>) {
        let (mut opened, mut ended) = (Vec::new(), Vec::new());
        self.held.retain(|event| match event {
            Event::Peer { .. } | Event::Inputs { .. } => false,
            Event::LinkOpened { link, .. } => {
                opened.push(*link);
                false
            }
            Event::LinkClosed { link } | Event::LinkCut { link } => {
                ended.push(*link);
                false
            }
            _ => true,
        });
        (opened, ended)
    }

    /// The lease is known: what waited, in arrival order, to be taken now.
    pub fn resume(&mut self) -> VecDeque<Event> {
        self.suspect_since = None;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    #[test]
    fn a_gap_longer_than_the_lease_holds_events_until_resumed_in_order() {
        let (mut pause, start) = (Pause::new(TTL), Instant::now());
        assert_eq!(pause.woke(start, start + TTL, &Event::Tick), None, "not longer");
        let woke = start + TTL + Duration::from_millis(1);
        assert_eq!(pause.woke(start, woke, &Event::Tick), Some(TTL + Duration::from_millis(1)));
        assert_eq!(pause.suspect_since(), Some(woke));
        assert_eq!(pause.woke(woke, woke + TTL * 2, &Event::Tick), None, "already in doubt");
        pause.hold(Event::LinkClosed { link: LinkId(1) });
        pause.hold(Event::SaveAll);
        let held: Vec<_> = pause.resume().into_iter().collect();
        assert!(matches!(held[..], [Event::LinkClosed { link: LinkId(1) }, Event::SaveAll]));
        assert_eq!(pause.suspect_since(), None);
    }

    #[test]
    fn a_lease_expiry_never_starts_the_doubt() {
        let (mut pause, start) = (Pause::new(TTL), Instant::now());
        let expired = Event::LeaseExpired { partition: None };
        assert_eq!(pause.woke(start, start + TTL * 10, &expired), None);
    }

    #[test]
    fn a_new_life_voids_what_peers_and_gateways_sent_and_says_which_links() {
        let (mut pause, start) = (Pause::new(TTL), Instant::now());
        pause.woke(start, start + TTL * 2, &Event::Tick);
        pause.hold(Event::LinkOpened { link: LinkId(4), gateway: 1, lane: 0 });
        pause.hold(Event::Inputs { link: LinkId(4), inputs: Vec::new() });
        pause.hold(Event::LinkCut { link: LinkId(2) });
        pause.hold(Event::Tick);
        assert_eq!(pause.void_for_new_life(), (vec![LinkId(4)], vec![LinkId(2)]));
        assert!(matches!(pause.resume().into_iter().collect::<Vec<_>>()[..], [Event::Tick]));
    }
}
