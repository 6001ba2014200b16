//! How long to wait before connecting again: the one reconnect backoff of the gateway's
//! relay links and the shard's peer streams.
//!
//! Sans-IO: it only says how long, and the caller sleeps. There is no jitter: the delays
//! are 50 ms doubling to 1 s, the same every time, so a test or the simulator can count on
//! them.

use std::time::Duration;

/// Delays that double from `first` up to `max`; [`Backoff::reset`] starts them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// The reconnect backoff of relay links and peer streams: 50 ms doubling to 1 s.
    pub const RECONNECT: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

    /// Delays from `first`, doubling, never over `max` (nor under `first`).
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        let max = if max.as_nanos() < first.as_nanos() { first } else { max };
        Backoff { first, max, next: first }
    }

    /// How long to wait before the next attempt; the one after waits twice as long, up to
    /// the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// The connection worked: the next delay is the first again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(delays: impl Iterator<Item = Duration>) -> Vec<u128> {
        delays.map(|d| d.as_millis()).collect()
    }

    #[test]
    fn reconnect_doubles_from_50_ms_and_stays_at_1_s() {
        let mut backoff = Backoff::RECONNECT;
        let delays = millis((0..8).map(|_| backoff.next_delay()));
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn reset_starts_again_from_the_first_delay() {
        let mut backoff = Backoff::RECONNECT;
        for _ in 0..4 {
            backoff.next_delay();
        }
        backoff.reset();
        assert_eq!(millis((0..2).map(|_| backoff.next_delay())), [50, 100]);
    }

    #[test]
    fn a_maximum_under_the_first_delay_is_the_first_delay() {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(millis((0..3).map(|_| backoff.next_delay())), [2000, 2000, 2000]);
    }

    #[test]
    fn doubling_near_the_largest_duration_saturates() {
        let mut backoff = Backoff::new(Duration::MAX / 2 + Duration::from_secs(1), Duration::MAX);
        backoff.next_delay();
        assert_eq!(backoff.next_delay(), Duration::MAX);
        assert_eq!(backoff.next_delay(), Duration::MAX);
    }
}
