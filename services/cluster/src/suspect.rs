//! Fast death detection: proof that a member's process is gone, so that its lease can be
//! revoked at once instead of waited out (the TTL, 3 s by default).
//!
//! The proof is the kernel's: a host whose process died answers a connection to the
//! process's port with a reset (`ECONNREFUSED`) within a round trip. A process that is
//! only paused (SIGSTOP, a long GC pause, a VM migration) or cut off (a partition, a
//! machine gone) is no proof: its kernel still completes handshakes into the listen
//! backlog, or nothing answers at all. Those are left to the lease, which fences them.
//! So the evidence counts only refusals, only after a link to that life of the member
//! was up (a member that registered before its port is bound is starting, not dead), and
//! only [`CONFIRM_REFUSALS`] of them in a row over at least [`CONFIRM_SPAN`] (one refusal
//! can be a port briefly between listeners). Any connection that gets through clears it.
//!
//! Sans-IO: the dialler reports what its connects met, with the time; [`Refusals`] says
//! when the member is confirmed dead, once per life.

use std::time::{Duration, Instant};

/// Refused connects in a row that prove a member dead.
pub const CONFIRM_REFUSALS: u32 = 3;
/// The least time from the first of them to the last.
pub const CONFIRM_SPAN: Duration = Duration::from_millis(100);

/// What one dialler's connects to one life of a member met.
#[derive(Debug, Default)]
pub struct Refusals {
    /// A link to this life was up once: refusals count from then on.
    was_up: bool,
    first: Option<Instant>,
    count: u32,
    confirmed: bool,
}

impl Refusals {
    /// A connection got through (whatever came after the handshake).
    pub fn reached(&mut self) {
        self.was_up = true;
        self.first = None;
        self.count = 0;
    }

    /// A connect was refused at `now`. True exactly once per life: the member is dead.
    pub fn refused(&mut self, now: Instant) -> bool {
        if !self.was_up || self.confirmed {
            return false;
        }
        let first = *self.first.get_or_insert(now);
        self.count += 1;
        if self.count >= CONFIRM_REFUSALS && now.saturating_duration_since(first) >= CONFIRM_SPAN {
            self.confirmed = true;
        }
        self.confirmed
    }

    /// Another failure (a timeout, a TLS error, no route): no proof either way, and the
    /// refusals before it no longer come in a row.
    pub fn inconclusive(&mut self) {
        self.first = None;
        self.count = 0;
    }

    pub fn confirmed(&self) -> bool {
        self.confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn three_refusals_in_a_row_over_a_tenth_of_a_second_prove_a_death_once() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.reached();
        assert!(!r.refused(at(t0, 0)));
        assert!(!r.refused(at(t0, 50)));
        assert!(!r.refused(at(t0, 99)), "three, but within 100 ms");
        assert!(r.refused(at(t0, 150)));
        assert!(!r.refused(at(t0, 300)), "said once");
        assert!(r.confirmed());
    }

    #[test]
    fn a_member_never_reached_is_starting_not_dead() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        for ms in (0..2_000).step_by(50) {
            assert!(!r.refused(at(t0, ms)));
        }
    }

    #[test]
    fn a_connection_or_another_failure_between_refusals_starts_the_count_over() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.reached();
        r.refused(at(t0, 0));
        r.refused(at(t0, 100));
        r.reached();
        assert!(!r.refused(at(t0, 200)));
        assert!(!r.refused(at(t0, 300)));
        r.inconclusive();
        assert!(!r.refused(at(t0, 400)));
        assert!(!r.refused(at(t0, 500)));
        assert!(r.refused(at(t0, 600)));
    }
}
