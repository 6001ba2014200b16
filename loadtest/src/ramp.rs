//! Ramp mode (`--ramp`): add bots step by step and find the largest number whose p99
//! own-move delay stays under `--max-p99`.
//!
//! The decision is pure and lives here so it can be tested without a server: `Ramp` says
//! how many bots the next step should have, judges each step's measurement, and keeps the
//! largest passing step. The driving loop (connecting bots, sleeping, sweeping the step's
//! histogram) is in `main.rs`.

use std::time::Duration;

use serde::Serialize;

/// The ramp's settings, validated by `cli`.
#[derive(Debug, Clone, PartialEq)]
pub struct RampConfig {
    /// Bots in the first step.
    pub start: u32,
    /// Bots added per step.
    pub step: u32,
    /// How long each step is measured, after its bots have connected and settled.
    pub step_duration: Duration,
    /// A step passes only if its p99 own-move delay is at most this.
    pub max_p99: Duration,
    /// The ramp never goes past this many bots (`--bots`).
    pub max_bots: u32,
}

/// Acks must keep up with moves: a step whose acks fall this far behind its sends fails
/// even if the acks that did arrive were quick (a stalled server answers nothing late).
pub const MIN_ACKED_FRACTION: f64 = 0.95;

/// What was measured during one step's window.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct StepMeasure {
    pub bots_target: u32,
    pub bots_online: u64,
    pub sent: u64,
    pub acked: u64,
    /// Connect and login failures, disconnects and error answers during the step.
    pub failures: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub notifications_per_s: f64,
}

/// One judged step, as it appears in the JSON summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepResult {
    #[serde(flatten)]
    pub measure: StepMeasure,
    pub passed: bool,
    /// Why the step failed; empty when it passed.
    pub reasons: Vec<String>,
}

/// The ramp's outcome in the JSON summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RampSummary {
    pub max_p99_ms: f64,
    pub step: u32,
    pub step_duration_s: f64,
    pub max_bots: u32,
    pub steps: Vec<StepResult>,
    /// The largest step that passed; `None` if the first one failed (or none ran).
    pub largest_passing: Option<u32>,
    /// Why the ramp stopped: a failed step, `--bots` reached, or `--duration` ran out.
    pub stopped_because: String,
}

#[derive(Debug)]
pub struct Ramp {
    config: RampConfig,
    steps: Vec<StepResult>,
}

impl Ramp {
    pub fn new(config: RampConfig) -> Ramp {
        Ramp { config, steps: Vec::new() }
    }

    /// The number of bots for the next step, or `None` when the ramp is over: the last
    /// step failed, or it already had `max_bots`.
    pub fn next_target(&self) -> Option<u32> {
        match self.steps.last() {
            None => Some(self.config.start.min(self.config.max_bots)),
            Some(last) if !last.passed => None,
            Some(last) if last.measure.bots_target >= self.config.max_bots => None,
            Some(last) => {
                let next = last.measure.bots_target.saturating_add(self.config.step);
                Some(next.min(self.config.max_bots))
            }
        }
    }

    /// Judges one step's measurement and keeps it.
    pub fn record(&mut self, measure: StepMeasure) -> &StepResult {
        let max_p99_ms = self.config.max_p99.as_secs_f64() * 1e3;
        let mut reasons = Vec::new();
        match measure.p99_ms {
            None => reasons.push("no move was acknowledged".to_owned()),
            Some(p99) if p99 > max_p99_ms => {
                reasons.push(format!("p99 {p99:.2} ms is over {max_p99_ms:.2} ms"));
            }
            Some(_) => {}
        }
        if (measure.acked as f64) < MIN_ACKED_FRACTION * measure.sent as f64 {
            reasons.push(format!(
                "only {} of {} moves sent were acknowledged in the step",
                measure.acked, measure.sent
            ));
        }
        if measure.bots_online < u64::from(measure.bots_target) {
            reasons.push(format!(
                "only {} of {} bots online",
                measure.bots_online, measure.bots_target
            ));
        }
        if measure.failures > 0 {
            reasons.push(format!(
                "{} failures (connect, login, disconnect or error answers)",
                measure.failures
            ));
        }
        self.steps.push(StepResult { measure, passed: reasons.is_empty(), reasons });
        self.steps.last().expect("invariant: just pushed")
    }

    /// The largest passing step before the first failure.
    pub fn largest_passing(&self) -> Option<u32> {
        self.steps.iter().take_while(|s| s.passed).map(|s| s.measure.bots_target).last()
    }

    pub fn summary(self, out_of_time: bool) -> RampSummary {
        let stopped_because = match self.steps.last() {
            _ if out_of_time => "--duration ran out before the ramp ended".to_owned(),
            None => "no step ran".to_owned(),
            Some(last) if !last.passed => {
                let reasons = last.reasons.join("; ");
                format!("the step with {} bots failed: {reasons}", last.measure.bots_target)
            }
            Some(_) => format!("--bots {} reached and passed", self.config.max_bots),
        };
        RampSummary {
            max_p99_ms: self.config.max_p99.as_secs_f64() * 1e3,
            step: self.config.step,
            step_duration_s: self.config.step_duration.as_secs_f64(),
            max_bots: self.config.max_bots,
            largest_passing: self.largest_passing(),
            steps: self.steps,
            stopped_because,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(start: u32, step: u32, max_bots: u32) -> RampConfig {
        RampConfig {
            start,
            step,
            step_duration: Duration::from_secs(2),
            max_p99: Duration::from_millis(50),
            max_bots,
        }
    }

    fn healthy(bots: u32, p99_ms: f64) -> StepMeasure {
        StepMeasure {
            bots_target: bots,
            bots_online: u64::from(bots),
            sent: u64::from(bots) * 2,
            acked: u64::from(bots) * 2,
            failures: 0,
            p50_ms: Some(p99_ms / 4.0),
            p99_ms: Some(p99_ms),
            notifications_per_s: 0.0,
        }
    }

    #[test]
    fn steps_grow_until_a_step_fails_and_the_last_pass_is_reported() {
        let mut ramp = Ramp::new(config(100, 100, 1_000));
        assert_eq!(ramp.next_target(), Some(100));
        assert!(ramp.record(healthy(100, 5.0)).passed);
        assert_eq!(ramp.next_target(), Some(200));
        assert!(ramp.record(healthy(200, 49.9)).passed);
        assert_eq!(ramp.next_target(), Some(300));
        let failed = ramp.record(healthy(300, 50.1)).clone();
        assert!(!failed.passed);
        assert!(failed.reasons[0].contains("p99 50.10 ms"), "{:?}", failed.reasons);
        assert_eq!(ramp.next_target(), None, "a failed step ends the ramp");
        assert_eq!(ramp.largest_passing(), Some(200));
        let summary = ramp.summary(false);
        assert_eq!(summary.largest_passing, Some(200));
        assert!(summary.stopped_because.contains("300 bots failed"), "{}", summary.stopped_because);
    }

    #[test]
    fn the_last_step_is_clamped_to_max_bots_and_then_the_ramp_stops() {
        let mut ramp = Ramp::new(config(400, 400, 1_000));
        for expected in [400, 800, 1_000] {
            assert_eq!(ramp.next_target(), Some(expected));
            ramp.record(healthy(expected, 1.0));
        }
        assert_eq!(ramp.next_target(), None);
        let summary = ramp.summary(false);
        assert_eq!(summary.largest_passing, Some(1_000));
        assert!(summary.stopped_because.contains("reached"));
        assert_eq!(Ramp::new(config(5_000, 10, 300)).next_target(), Some(300));
    }

    #[test]
    fn a_step_whose_acks_fall_behind_fails_even_with_a_low_p99() {
        let mut ramp = Ramp::new(config(10, 10, 100));
        let stalled = StepMeasure { acked: 10, sent: 20, ..healthy(10, 1.0) };
        let result = ramp.record(stalled);
        assert!(!result.passed);
        assert!(result.reasons[0].contains("only 10 of 20"), "{:?}", result.reasons);
        assert_eq!(ramp.largest_passing(), None, "the first step failed: nothing passed");
    }

    #[test]
    fn missing_bots_failures_and_silence_each_fail_a_step() {
        let mut ramp = Ramp::new(config(10, 10, 100));
        let short = StepMeasure { bots_online: 9, ..healthy(10, 1.0) };
        assert!(ramp.record(short).reasons[0].contains("9 of 10 bots"));
        let mut ramp = Ramp::new(config(10, 10, 100));
        let errors = StepMeasure { failures: 3, ..healthy(10, 1.0) };
        assert!(ramp.record(errors).reasons[0].contains("3 failures"));
        let mut ramp = Ramp::new(config(10, 10, 100));
        let silent = StepMeasure { acked: 0, p99_ms: None, p50_ms: None, ..healthy(10, 1.0) };
        let result = ramp.record(silent);
        assert!(!result.passed);
        assert!(result.reasons[0].contains("no move was acknowledged"));
    }

    #[test]
    fn running_out_of_time_is_said_as_such() {
        let mut ramp = Ramp::new(config(10, 10, 100));
        ramp.record(healthy(10, 1.0));
        let summary = ramp.summary(true);
        assert_eq!(summary.largest_passing, Some(10));
        assert!(summary.stopped_because.contains("--duration"));
    }
}
