//! Where a viewer's notifications go this round, remembered by player id in a small table
//! that stays in cache (issue 29).
//!
//! A battle's round tells every viewer about every mover: per notification, finding the
//! viewer's seat (a map of thousands of seats, hundreds of bytes each) and reading where
//! its output is were two cache misses, over half of the fan-out's time. This table
//! answers the same question from one slot of a few dozen kilobytes, indexed by the id's
//! hash: a miss (another player in the slot, or a stale entry) goes to the seat as before
//! and fills the slot.
//!
//! An entry is good for one stamp: the stamp changes whenever a seat is made, taken away
//! or moved to another link (the roster's version), and whenever the outbox starts a new
//! round or forgets a link (its round), which is every place the answer could change.

use meridian_world::PlayerId;

/// Slots in the table (a power of two): a 2,000-player battle fills under half of them,
/// and the table is 64 KiB.
const SLOTS: usize = 4_096;
/// A route is kept in 32 bits: the link's place in the outbox below this, the delivery's
/// index below `1 << INDEX_BITS`. A route outside these is not kept (found each time).
const MAX_LINKS: u32 = 1 << (32 - INDEX_BITS);
const INDEX_BITS: u32 = 24;

/// Where a connection's output is in this round's outbox: its link's place there, and its
/// delivery's index in that link's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub link_at: u32,
    pub index: u32,
}

/// 16 bytes: four to a cache line.
#[derive(Clone, Copy)]
struct Slot {
    player: PlayerId,
    stamp: u32,
    /// `link_at << INDEX_BITS | index`.
    at: u32,
}

const EMPTY: Slot = Slot { player: PlayerId(0), stamp: 0, at: 0 };

pub(crate) struct RouteCache {
    slots: Vec<Slot>,
    /// What the stamp was made for: (the roster's version, the outbox's round).
    made_for: (u64, u64),
    /// Never 0 once begun: 0 marks an empty slot.
    stamp: u32,
}

impl Default for RouteCache {
    fn default() -> RouteCache {
        RouteCache { slots: vec![EMPTY; SLOTS], made_for: (u64::MAX, u64::MAX), stamp: 0 }
    }
}

impl RouteCache {
    /// Starts a batch of lookups for the roster's `version` and the outbox's `round`: the
    /// entries of any other pair are stale.
    pub fn begin(&mut self, version: u64, round: u64) {
        if self.made_for == (version, round) {
            return;
        }
        self.made_for = (version, round);
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // Four billion rounds on: no slot may carry the stamp of one that old.
            self.slots.fill(EMPTY);
            self.stamp = 1;
        }
    }

    pub fn get(&self, player: PlayerId) -> Option<Route> {
        let slot = &self.slots[index(player)];
        let fresh = slot.player == player && slot.stamp == self.stamp && self.stamp != 0;
        fresh.then(|| Route { link_at: slot.at >> INDEX_BITS, index: slot.at & mask() })
    }

    pub fn put(&mut self, player: PlayerId, route: Route) {
        if route.link_at >= MAX_LINKS || route.index > mask() {
            return;
        }
        let at = route.link_at << INDEX_BITS | route.index;
        self.slots[index(player)] = Slot { player, stamp: self.stamp, at };
    }
}

fn mask() -> u32 {
    (1 << INDEX_BITS) - 1
}

fn index(player: PlayerId) -> usize {
    // Fibonacci hashing: ids are often sequential, and their top bits then spread evenly.
    (player.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(index: u32) -> Route {
        Route { link_at: 1, index }
    }

    #[test]
    fn an_entry_holds_until_the_roster_or_the_round_changes() {
        let mut cache = RouteCache::default();
        cache.begin(1, 1);
        assert_eq!(cache.get(PlayerId(5)), None, "every slot starts stale");
        cache.put(PlayerId(5), route(3));
        assert_eq!(cache.get(PlayerId(5)), Some(route(3)));
        cache.begin(1, 1);
        assert_eq!(cache.get(PlayerId(5)), Some(route(3)), "the same version and round");
        cache.begin(2, 1);
        assert_eq!(cache.get(PlayerId(5)), None, "a seat came, went or moved");
        cache.put(PlayerId(5), route(4));
        cache.begin(2, 2);
        assert_eq!(cache.get(PlayerId(5)), None, "a new round");
    }

    #[test]
    fn a_route_too_big_to_keep_is_not_kept() {
        let mut cache = RouteCache::default();
        cache.begin(0, 0);
        cache.put(PlayerId(5), Route { link_at: MAX_LINKS, index: 0 });
        assert_eq!(cache.get(PlayerId(5)), None);
        cache.put(PlayerId(5), Route { link_at: 0, index: mask() + 1 });
        assert_eq!(cache.get(PlayerId(5)), None);
        let largest = Route { link_at: MAX_LINKS - 1, index: mask() };
        cache.put(PlayerId(5), largest);
        assert_eq!(cache.get(PlayerId(5)), Some(largest));
    }

    #[test]
    fn a_stamp_that_wraps_empties_the_table() {
        let mut cache = RouteCache::default();
        cache.begin(0, 0);
        cache.put(PlayerId(5), route(3));
        cache.stamp = u32::MAX;
        cache.slots[index(PlayerId(6))] = Slot { player: PlayerId(6), stamp: 1, at: 9 };
        cache.begin(0, 1);
        assert_eq!(cache.stamp, 1);
        assert_eq!(cache.get(PlayerId(6)), None, "an entry of four billion rounds ago");
    }

    #[test]
    fn players_sharing_a_slot_never_get_each_others_route() {
        let mut cache = RouteCache::default();
        cache.begin(0, 0);
        let first = PlayerId(1);
        let other = (2..u64::MAX)
            .map(PlayerId)
            .find(|p| index(*p) == index(first))
            .expect("some id shares the slot");
        cache.put(first, route(1));
        assert_eq!(cache.get(other), None);
        cache.put(other, route(2));
        assert_eq!(cache.get(first), None, "the slot was taken over");
        assert_eq!(cache.get(other), Some(route(2)));
    }
}
