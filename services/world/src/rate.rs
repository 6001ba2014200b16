//! The per-player move budget: a token bucket with burst `move_rate`, refilled continuously at
//! `move_rate` tokens per second by the `now` the caller passes.
//!
//! Credit is counted in integer units (one move costs one billion units and one nanosecond
//! refills `move_rate` units), so the budget is exact and the same on every machine; floats
//! would make "the 21st move is refused" depend on rounding.

use std::time::Duration;

/// What one move costs, in credit units.
const UNITS_PER_MOVE: u128 = 1_000_000_000;

/// A player's remaining moves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MoveBudget {
    /// Credit in units; at most `move_rate * UNITS_PER_MOVE`, which fits in a `u64`.
    credit: u64,
    /// When `credit` was last brought up to date. `None` means "full at whatever time comes
    /// first", for budgets created where no clock is at hand (a ghost promoted to local).
    refilled_at: Option<Duration>,
}

impl MoveBudget {
    /// A full budget whose refill clock starts at `now`.
    pub(crate) fn full_at(now: Duration, move_rate: u32) -> MoveBudget {
        MoveBudget { credit: capacity(move_rate), refilled_at: Some(now) }
    }

    /// A full budget whose refill clock starts at the first move.
    pub(crate) fn full(move_rate: u32) -> MoveBudget {
        MoveBudget { credit: capacity(move_rate), refilled_at: None }
    }

    /// Spends one move if the budget allows it at `now`; a refused move spends nothing.
    pub(crate) fn try_take(&mut self, now: Duration, move_rate: u32) -> bool {
        self.refill(now, move_rate);
        let cost = UNITS_PER_MOVE as u64;
        if self.credit >= cost {
            self.credit -= cost;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Duration, move_rate: u32) {
        if let Some(last) = self.refilled_at {
            // A clock that goes backwards refills nothing, and the later time is kept so that
            // the same interval is never credited twice.
            let elapsed = now.saturating_sub(last).as_nanos();
            let gained = elapsed.saturating_mul(u128::from(move_rate));
            let credit = (u128::from(self.credit) + gained).min(u128::from(capacity(move_rate)));
            self.credit = u64::try_from(credit).expect("invariant: credit is capped by capacity");
            self.refilled_at = Some(last.max(now));
        } else {
            self.refilled_at = Some(now);
        }
    }
}

fn capacity(move_rate: u32) -> u64 {
    u64::from(move_rate) * UNITS_PER_MOVE as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn millis(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_full_budget_allows_a_burst_of_move_rate() {
        let mut budget = MoveBudget::full_at(millis(0), 20);
        for _ in 0..20 {
            assert!(budget.try_take(millis(0), 20));
        }
        assert!(!budget.try_take(millis(0), 20));
        assert!(!budget.try_take(millis(49), 20), "a move needs 50 ms of refill at 20/s");
        assert!(budget.try_take(millis(50), 20));
        assert!(!budget.try_take(millis(50), 20));
    }

    #[test]
    fn refill_stops_at_the_burst() {
        let mut budget = MoveBudget::full_at(millis(0), 3);
        assert!(budget.try_take(millis(0), 3));
        let later = millis(3_600_000);
        for _ in 0..3 {
            assert!(budget.try_take(later, 3));
        }
        assert!(!budget.try_take(later, 3));
    }

    #[test]
    fn a_clock_going_backwards_credits_nothing_twice() {
        let mut budget = MoveBudget::full_at(millis(1_000), 1);
        assert!(budget.try_take(millis(1_000), 1));
        assert!(!budget.try_take(millis(500), 1));
        assert!(!budget.try_take(millis(1_999), 1));
        assert!(budget.try_take(millis(2_000), 1));
    }

    #[test]
    fn an_unstarted_budget_starts_its_clock_at_the_first_move() {
        let mut budget = MoveBudget::full(2);
        assert!(budget.try_take(millis(10_000), 2));
        assert!(budget.try_take(millis(10_000), 2));
        assert!(!budget.try_take(millis(10_000), 2));
        assert!(budget.try_take(millis(10_500), 2));
    }

    proptest! {
        /// In any window of time, no more moves pass than the burst plus what the window refills.
        #[test]
        fn never_more_than_burst_plus_refill(
            rate in 1u32..50,
            gaps in proptest::collection::vec(0u64..120, 1..300),
        ) {
            let mut budget = MoveBudget::full_at(Duration::ZERO, rate);
            let mut now = 0u64;
            let mut accepted = Vec::new();
            for gap in gaps {
                now += gap;
                if budget.try_take(millis(now), rate) {
                    accepted.push(now);
                }
            }
            for (i, &start) in accepted.iter().enumerate() {
                for (j, &end) in accepted.iter().enumerate().skip(i) {
                    let moves = (j - i + 1) as u64;
                    // Window [start, end] refills rate * (end - start) / 1000 moves.
                    let allowed = u64::from(rate) + u64::from(rate) * (end - start) / 1000;
                    prop_assert!(
                        moves <= allowed,
                        "{} moves in [{}, {}] ms at {}/s", moves, start, end, rate
                    );
                }
            }
        }
    }
}
