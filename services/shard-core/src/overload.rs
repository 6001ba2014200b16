//! Graceful overload: when the gateways cannot take the shard's output as fast as it is
//! made (a battle too big for the cores it runs on), the shard applies fewer moves
//! instead of letting its links' queues fill until one is cut (which would take every
//! player on it out of the world).
//!
//! The shell reports, after each round, how many batches wait in each gateway link's
//! queue and how many frame bytes they hold ([`crate::types::Event::LinkBacklog`]). Past
//! [`BACKLOG_HIGH`] batches holding more than [`BACKLOG_HIGH_BYTES`] on one link, the share
//! of moves refused grows by [`SHED_STEP`] each [`ADJUST_EVERY`], up to [`MAX_SHED`]; once
//! every link is at or below [`BACKLOG_LOW`] batches or [`BACKLOG_LOW_BYTES`], it shrinks
//! by the same step. Both marks, because a battle's round is megabytes in a few batches
//! (eight of them queued are a busy gateway's 0.1-0.2 s), and a small world's rounds are
//! many small batches that a gateway stalled for a moment (a contended machine) lets pile
//! up without being behind on anything a player would notice. A refused move is answered `RATE_LIMITED` ("the shard is overloaded"), in
//! its place among the player's answers, and counted in
//! `meridian_shard_moves_shed_total`: every move is answered, nobody is disconnected,
//! and the world goes on at the rate its gateways can carry, like a slowed clock.
//!
//! Owned by `ShardCore`, which feeds it the backlogs and asks it about each move.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::types::{Backlog, LinkId};

/// Batches waiting on one link past which the shard sheds more moves (if they also hold
/// more than [`BACKLOG_HIGH_BYTES`]).
pub const BACKLOG_HIGH: usize = 8;
pub const BACKLOG_HIGH_BYTES: usize = 1 << 20;
/// Batches, or bytes, waiting on every link at or below which it sheds fewer.
pub const BACKLOG_LOW: usize = 2;
pub const BACKLOG_LOW_BYTES: usize = 256 << 10;
/// How much the shed share changes per adjustment, in thousandths.
pub const SHED_STEP: u32 = 100;
/// The most moves ever shed, in thousandths: some moves always go through.
pub const MAX_SHED: u32 = 900;
/// How often the shed share may change.
pub const ADJUST_EVERY: Duration = Duration::from_millis(100);

impl Backlog {
    fn behind(self) -> bool {
        self.batches > BACKLOG_HIGH && self.bytes > BACKLOG_HIGH_BYTES
    }

    fn caught_up(self) -> bool {
        self.batches <= BACKLOG_LOW || self.bytes <= BACKLOG_LOW_BYTES
    }
}

#[derive(Default)]
pub(crate) struct Overload {
    backlog: FxHashMap<LinkId, Backlog>,
    /// Thousandths of moves refused.
    shed: u32,
    /// Thousandths owed: a move is refused each time this passes 1,000.
    owed: u32,
    adjusted: Option<Instant>,
}

impl Overload {
    /// What a link's queue holds now.
    pub fn backlog(&mut self, link: LinkId, queued: Backlog) {
        if queued.batches == 0 {
            self.backlog.remove(&link);
        } else {
            self.backlog.insert(link, queued);
        }
    }

    pub fn forget(&mut self, link: LinkId) {
        self.backlog.remove(&link);
    }

    /// Moves the shed share toward what the backlogs ask for, at most one step per
    /// [`ADJUST_EVERY`]. Returns the new share if it changed.
    pub fn adjust(&mut self, now: Instant) -> Option<u32> {
        if self.adjusted.is_some_and(|at| now.saturating_duration_since(at) < ADJUST_EVERY) {
            return None;
        }
        let shed = if self.backlog.values().any(|b| b.behind()) {
            (self.shed + SHED_STEP).min(MAX_SHED)
        } else if self.backlog.values().all(|b| b.caught_up()) {
            self.shed.saturating_sub(SHED_STEP)
        } else {
            self.shed
        };
        self.adjusted = Some(now);
        if shed == self.shed {
            return None;
        }
        self.shed = shed;
        Some(shed)
    }

    /// Whether the next move is to be refused.
    pub fn shed_move(&mut self) -> bool {
        if self.shed == 0 {
            return false;
        }
        self.owed += self.shed;
        if self.owed >= 1000 {
            self.owed -= 1000;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `batches` of a battle's size (a megabyte each, as the batch limit allows).
    fn big(batches: usize) -> Backlog {
        Backlog { batches, bytes: batches << 20 }
    }

    fn shed_of(overload: &mut Overload, moves: u32) -> u32 {
        (0..moves).filter(|_| overload.shed_move()).count() as u32
    }

    #[test]
    fn a_full_link_sheds_a_growing_share_and_an_empty_one_gives_it_back() {
        let mut overload = Overload::default();
        let start = Instant::now();
        assert_eq!(shed_of(&mut overload, 100), 0, "nothing shed without a backlog");
        overload.backlog(LinkId(1), big(BACKLOG_HIGH + 1));
        assert_eq!(overload.adjust(start), Some(100));
        assert_eq!(overload.adjust(start + ADJUST_EVERY / 2), None, "one step per period");
        assert_eq!(shed_of(&mut overload, 1000), 100);
        for step in 2..=12 {
            overload.adjust(start + ADJUST_EVERY * step);
        }
        assert_eq!(shed_of(&mut overload, 1000), MAX_SHED, "never more than the cap");
        // Between the marks: the share holds.
        overload.backlog(LinkId(1), big(BACKLOG_LOW + 1));
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 13), None);
        overload.backlog(LinkId(1), big(0));
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 14), Some(MAX_SHED - SHED_STEP));
    }

    #[test]
    fn the_fullest_link_decides_and_a_forgotten_one_counts_no_more() {
        let mut overload = Overload::default();
        let now = Instant::now();
        overload.backlog(LinkId(1), big(1));
        overload.backlog(LinkId(2), big(BACKLOG_HIGH * 2));
        assert_eq!(overload.adjust(now), Some(SHED_STEP));
        overload.forget(LinkId(2));
        assert_eq!(overload.adjust(now + ADJUST_EVERY), Some(0));
    }

    /// A gateway stalled for a moment lets a small world's rounds pile up in many small
    /// batches: no player is behind on anything, and no move is refused for it (a
    /// contended CI machine refused a paced move when the wait alone decided).
    #[test]
    fn many_small_batches_shed_nothing_and_few_big_ones_do() {
        let mut overload = Overload::default();
        let now = Instant::now();
        let small = Backlog { batches: 200, bytes: BACKLOG_HIGH_BYTES };
        overload.backlog(LinkId(1), small);
        assert_eq!(overload.adjust(now), None, "many batches, a megabyte in all");
        overload.backlog(LinkId(1), Backlog { batches: BACKLOG_HIGH, bytes: 64 << 20 });
        assert_eq!(overload.adjust(now + ADJUST_EVERY), None, "few batches, however big");
        overload.backlog(LinkId(1), big(BACKLOG_HIGH + 1));
        assert_eq!(overload.adjust(now + ADJUST_EVERY * 2), Some(SHED_STEP));
        // Caught up by either mark: few batches, or few bytes.
        overload.backlog(LinkId(1), Backlog { batches: 100, bytes: BACKLOG_LOW_BYTES });
        assert_eq!(overload.adjust(now + ADJUST_EVERY * 3), Some(0));
    }
}
