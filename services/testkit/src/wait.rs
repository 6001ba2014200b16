//! Waiting on a condition with a deadline, and saying what was expected when it passes.

use std::time::{Duration, Instant};

use anyhow::bail;

/// How long a test waits for something the server should do "at once" (an answer, a
/// notification). Generous so a loaded CI machine does not fail a correct server; a test that
/// passes only because of it is still a test that can fail, because the wait ends.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// The instant `within` from now.
pub fn deadline(within: Duration) -> Instant {
    Instant::now() + within
}

/// Polls `condition` until it holds or `deadline` passes; the error names `what` was expected.
///
/// The poll interval starts at 5 ms and backs off to 100 ms, so a condition that holds quickly
/// is seen quickly and a slow one does not burn a core.
pub fn wait_until(
    deadline: Instant,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if condition() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "timed out after {:.1} s waiting for {what}",
                now.duration_since(started).as_secs_f64()
            );
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_that_holds_returns_at_once() {
        let started = Instant::now();
        wait_until(deadline(Duration::from_secs(5)), "true", || true).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_condition_that_never_holds_fails_with_what_was_expected() {
        let err = wait_until(deadline(Duration::from_millis(50)), "the moon", || false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("waiting for the moon"), "{err}");
    }

    #[test]
    fn the_condition_is_polled_until_it_holds() {
        let mut calls = 0;
        wait_until(deadline(Duration::from_secs(5)), "third call", || {
            calls += 1;
            calls == 3
        })
        .unwrap();
        assert_eq!(calls, 3);
    }
}
