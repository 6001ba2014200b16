//! Graceful overload: when the gateways cannot take the shard's output as fast as it is
//! made (a battle too big for the cores it runs on), the shard applies fewer moves
//! instead of letting its links' queues fill until one is cut (which would take every
//! player on it out of the world).
//!
//! The shell reports, after each round, how many batches wait in each gateway link's
//! queue and how long the oldest of them has waited ([`crate::types::Event::LinkBacklog`]).
//! Past [`BACKLOG_HIGH`] batches on the fullest link, or past [`DELAY_HIGH`] on the
//! slowest, the share of moves refused grows by [`SHED_STEP`] each [`ADJUST_EVERY`], up
//! to [`MAX_SHED`]; at or below [`BACKLOG_LOW`] and [`DELAY_LOW`] on every link it
//! shrinks by the same step. The wait is what a player's answer spends in that queue: a
//! battle's batches are big (a megabyte each), so a few of them are already a long wait.
//!
//! Inputs the shard gets to longer than [`MOVE_WAIT_MAX`] after their link read them (the
//! shell says when: `Event::Inputs.read_at`) count as a wait too, and their moves are
//! refused whatever the share: under overload the moves that wait are the ones a backlog
//! made old, and applying them would make the next ones older still.
//!
//! A refused move is answered `RATE_LIMITED` ("the shard is overloaded"), in
//! its place among the player's answers, and counted in
//! `meridian_shard_moves_shed_total`: every move is answered, nobody is disconnected,
//! and the world goes on at the rate its gateways can carry, like a slowed clock.
//!
//! Owned by `ShardCore`, which feeds it the backlogs and asks it about each move.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::types::LinkId;

/// Batches waiting on one link past which the shard sheds more moves.
pub const BACKLOG_HIGH: usize = 32;
/// Batches waiting on every link at or below which it sheds fewer.
pub const BACKLOG_LOW: usize = 8;
/// How long the oldest batch on a link may have waited before the shard sheds more: the
/// players' moves wait behind it, so this is what the backlog costs them.
pub const DELAY_HIGH: Duration = Duration::from_millis(200);
/// At or under this (and [`BACKLOG_LOW`]) on every link it sheds fewer.
pub const DELAY_LOW: Duration = Duration::from_millis(50);
/// A move read from its gateway link longer ago than this when the shard gets to it is
/// refused, not applied: under overload the moves that wait are the ones a backlog made
/// old, and applying them late makes the next ones later still.
pub const MOVE_WAIT_MAX: Duration = Duration::from_millis(250);
/// How much the shed share changes per adjustment, in thousandths.
pub const SHED_STEP: u32 = 100;
/// The most moves ever shed, in thousandths: some moves always go through.
pub const MAX_SHED: u32 = 900;
/// How often the shed share may change.
pub const ADJUST_EVERY: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(crate) struct Overload {
    /// Per link with a backlog: batches queued, and how long the oldest has waited.
    backlog: FxHashMap<LinkId, (usize, Duration)>,
    /// How long ago the inputs being handled were read from their link.
    inputs_waited: Duration,
    /// The longest such wait since the last adjustment.
    inputs_waited_most: Duration,
    /// Thousandths of moves refused.
    shed: u32,
    /// Thousandths owed: a move is refused each time this passes 1,000.
    owed: u32,
    adjusted: Option<Instant>,
}

impl Overload {
    /// A link's queue holds `queued` batches now, the oldest queued `waited` ago.
    pub fn backlog(&mut self, link: LinkId, queued: usize, waited: Duration) {
        if queued == 0 {
            self.backlog.remove(&link);
        } else {
            self.backlog.insert(link, (queued, waited));
        }
    }

    /// The inputs handled next were read from their link `waited` ago.
    pub fn inputs_read(&mut self, waited: Duration) {
        self.inputs_waited = waited;
        self.inputs_waited_most = self.inputs_waited_most.max(waited);
    }

    /// The longest any link's oldest batch has waited, as last reported.
    pub fn longest_wait(&self) -> Duration {
        self.backlog.values().map(|(_, waited)| *waited).max().unwrap_or_default()
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
        let fullest = self.backlog.values().map(|(queued, _)| *queued).max().unwrap_or(0);
        let waited = self.longest_wait().max(std::mem::take(&mut self.inputs_waited_most));
        let shed = if fullest > BACKLOG_HIGH || waited > DELAY_HIGH {
            (self.shed + SHED_STEP).min(MAX_SHED)
        } else if fullest <= BACKLOG_LOW && waited <= DELAY_LOW {
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

    /// Whether the next move is to be refused: it waited too long, or it is the share's.
    pub fn shed_move(&mut self) -> bool {
        if self.inputs_waited > MOVE_WAIT_MAX {
            return true;
        }
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

    fn shed_of(overload: &mut Overload, moves: u32) -> u32 {
        (0..moves).filter(|_| overload.shed_move()).count() as u32
    }

    #[test]
    fn a_full_link_sheds_a_growing_share_and_an_empty_one_gives_it_back() {
        let mut overload = Overload::default();
        let start = Instant::now();
        assert_eq!(shed_of(&mut overload, 100), 0, "nothing shed without a backlog");
        overload.backlog(LinkId(1), BACKLOG_HIGH + 1, Duration::ZERO);
        assert_eq!(overload.adjust(start), Some(100));
        assert_eq!(overload.adjust(start + ADJUST_EVERY / 2), None, "one step per period");
        assert_eq!(shed_of(&mut overload, 1000), 100);
        for step in 2..=12 {
            overload.adjust(start + ADJUST_EVERY * step);
        }
        assert_eq!(shed_of(&mut overload, 1000), MAX_SHED, "never more than the cap");
        // Between the marks: the share holds.
        overload.backlog(LinkId(1), BACKLOG_LOW + 1, Duration::ZERO);
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 13), None);
        overload.backlog(LinkId(1), 0, Duration::ZERO);
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 14), Some(MAX_SHED - SHED_STEP));
    }

    #[test]
    fn a_batch_waiting_too_long_sheds_even_on_a_short_queue() {
        let mut overload = Overload::default();
        let start = Instant::now();
        let ms = Duration::from_millis;
        overload.backlog(LinkId(1), 2, DELAY_HIGH + ms(1));
        assert_eq!(overload.adjust(start), Some(SHED_STEP), "an old batch on a short queue");
        // Between the marks the share holds; under the low one (and a short queue) it goes.
        overload.backlog(LinkId(1), 2, DELAY_LOW + ms(1));
        assert_eq!(overload.adjust(start + ADJUST_EVERY), None);
        overload.backlog(LinkId(1), 2, DELAY_LOW);
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 2), Some(0));
        // A long queue of fresh batches still counts.
        overload.backlog(LinkId(1), BACKLOG_HIGH + 1, ms(0));
        assert_eq!(overload.adjust(start + ADJUST_EVERY * 3), Some(SHED_STEP));
    }

    #[test]
    fn a_move_that_waited_too_long_is_refused_and_its_wait_sheds_more() {
        let mut overload = Overload::default();
        let start = Instant::now();
        overload.inputs_read(MOVE_WAIT_MAX);
        assert_eq!(shed_of(&mut overload, 10), 0, "not older than the limit: applied");
        overload.inputs_read(MOVE_WAIT_MAX + Duration::from_millis(1));
        assert_eq!(shed_of(&mut overload, 10), 10, "every move of a batch read too long ago");
        // A late batch also makes the share grow, so the queue behind it drains.
        assert_eq!(overload.adjust(start), Some(SHED_STEP));
        overload.inputs_read(Duration::ZERO);
        assert_eq!(shed_of(&mut overload, 10), 1, "fresh moves: only the share");
        assert_eq!(overload.adjust(start + ADJUST_EVERY), Some(0));
    }

    #[test]
    fn the_fullest_link_decides_and_a_forgotten_one_counts_no_more() {
        let mut overload = Overload::default();
        let now = Instant::now();
        overload.backlog(LinkId(1), 1, Duration::ZERO);
        overload.backlog(LinkId(2), BACKLOG_HIGH * 2, Duration::ZERO);
        assert_eq!(overload.adjust(now), Some(SHED_STEP));
        overload.forget(LinkId(2));
        assert_eq!(overload.adjust(now + ADJUST_EVERY), Some(0));
    }
}
