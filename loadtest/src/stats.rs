//! What the bots count, the once-a-second progress line, and the final JSON summary.
//!
//! Bots only touch atomics (`Stats`): counters and the shared delay histogram. The
//! reporter is the only reader; it turns deltas into per-second lines and keeps the run's
//! total histogram, so no lock is taken on the per-message path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meridian_protocol::pb::ErrorCode;
use serde::Serialize;
use tokio::time::Instant;

use crate::cli::Config;
use crate::histogram::{AtomicHistogram, Histogram};
use crate::ramp::RampSummary;

/// Error codes at or above this index share the last slot, reported as `UNKNOWN`.
const ERROR_SLOTS: usize = 16;

/// Everything the bots report, shared by all of them.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bots logged in right now.
    pub bots_online: AtomicU64,
    /// Bots that ever got their `LoginOk`.
    pub bots_connected: AtomicU64,
    pub connect_failures: AtomicU64,
    pub login_failures: AtomicU64,
    pub moves_sent: AtomicU64,
    pub moves_acked: AtomicU64,
    pub moves_errored: AtomicU64,
    pub moves_lost: AtomicU64,
    /// Moves unanswered when a `ViewReset` came and answered after it (acked or errored).
    pub moves_answered_after_reset: AtomicU64,
    /// Bots that moved to another gateway after `SHUTTING_DOWN` and resumed there.
    pub resumes: AtomicU64,
    /// Bots told `SHUTTING_DOWN` that could not resume on any other gateway.
    pub resume_failures: AtomicU64,
    /// Every other server message received during `--duration`.
    pub notifications: AtomicU64,
    pub disconnects: AtomicU64,
    /// Own `Moved` acks whose `client_time` matched no outstanding move.
    pub acks_unmatched: AtomicU64,
    pub view_resets: AtomicU64,
    /// How late the latest move was sent after its due time, at worst: if this grows, the
    /// load test itself is the bottleneck and its delays are not the server's.
    pub send_lag_max_us: AtomicU64,
    errors: AtomicU64,
    errors_by_code: [AtomicU64; ERROR_SLOTS],
    /// Move delays in µs, swept by the reporter once a second.
    pub delays: AtomicHistogram,
    /// With `--border-x/--border-y`: delays of moves that crossed a border, and of the rest.
    pub delays_crossing: AtomicHistogram,
    pub delays_inner: AtomicHistogram,
    /// Ramp mode: the delays of the current step, swept by the ramp at each step's edges.
    pub step_delays: AtomicHistogram,
    /// Per bot, the longest time between two of its move acks (its login counting as the
    /// first), in µs, recorded when the bot ends: how long a failover froze it.
    pub ack_gaps: AtomicHistogram,
    /// `--actions-per-second`: actions sent, and their fates: `ActionDone`, `REJECTED`,
    /// another error carrying their `client_time`, or no answer at all.
    pub actions_sent: AtomicU64,
    pub actions_answered: AtomicU64,
    pub actions_rejected: AtomicU64,
    pub actions_errored: AtomicU64,
    pub actions_lost: AtomicU64,
    /// `ActionDone`s whose `client_time` matched no outstanding action.
    pub actions_unmatched: AtomicU64,
    /// Delays from sending an action to its `ActionDone` or `REJECTED`, in µs.
    pub action_delays: AtomicHistogram,
    /// With `--border-x/--border-y`: actions aimed at a wolf across a border (a ghost on
    /// the bot's shard, so the action is carried out by the wolf's owner) and their delays,
    /// and the delays of those aimed at a wolf on the bot's side.
    pub actions_aimed_across: AtomicU64,
    pub action_delays_across: AtomicHistogram,
    pub action_delays_within: AtomicHistogram,
}

/// Adds one to a counter; relaxed because the counters are only read for reporting.
pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Stats {
    /// Counts one `Error` from the server. A `REJECTED` that answers one of the bots'
    /// actions is not one: it is the game's answer, counted in `actions_rejected` alone.
    pub fn record_error(&self, code: i32) {
        let slot = usize::try_from(code).map_or(ERROR_SLOTS - 1, |c| c.min(ERROR_SLOTS - 1));
        bump(&self.errors);
        bump(&self.errors_by_code[slot]);
    }

    /// Every `Error` received so far, whatever its code.
    pub fn errors_total(&self) -> u64 {
        load(&self.errors)
    }

    /// Every `Error` received so far except `REJECTED`: the game's refusal of an action is
    /// an answer, not a failure of the server (even one that came too late to be matched
    /// to its action).
    pub fn failure_errors(&self) -> u64 {
        self.errors_total() - load(&self.errors_by_code[ErrorCode::Rejected as usize])
    }

    pub fn errors_by_code(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (slot, counter) in self.errors_by_code.iter().enumerate() {
            let n = load(counter);
            if n == 0 {
                continue;
            }
            let name = match ErrorCode::try_from(slot as i32) {
                Ok(code) if slot < ERROR_SLOTS - 1 => code.as_str_name().to_owned(),
                _ => "UNKNOWN".to_owned(),
            };
            *out.entry(name).or_default() += n;
        }
        out
    }
}

/// The counters the progress line differentiates.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    sent: u64,
    acked: u64,
    notifications: u64,
    /// Error answers that are failures (`Stats::failure_errors`).
    errors: u64,
    actions_sent: u64,
    actions_answered: u64,
}

impl Totals {
    fn read(stats: &Stats) -> Totals {
        Totals {
            sent: load(&stats.moves_sent),
            acked: load(&stats.moves_acked),
            notifications: load(&stats.notifications),
            errors: stats.failure_errors(),
            actions_sent: load(&stats.actions_sent),
            actions_answered: load(&stats.actions_answered) + load(&stats.actions_rejected),
        }
    }
}

/// One entry of `per_second` in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct SecondStats {
    /// Seconds since the first bot started, at the end of this interval.
    pub t: f64,
    /// Bots logged in at that moment.
    pub bots: u64,
    pub sent: u64,
    pub acked: u64,
    pub notifications: u64,
    /// Error answers received in this interval (a refused move's `RATE_LIMITED`, ...;
    /// a game's `REJECTED` is an answer, not counted).
    pub errors: u64,
    /// p50 and p99 of the acks received in this interval; null when there were none.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// What the reporter gathered over the run.
#[derive(Debug)]
pub struct Finished {
    pub delays: Histogram,
    pub per_second: Vec<SecondStats>,
    /// With `--warmup`: the delays of the intervals after it.
    pub steady: Option<Histogram>,
}

/// Sweeps the shared stats once a second into a progress line and a `SecondStats`.
#[derive(Debug)]
pub struct Reporter {
    started: Instant,
    bots_target: u32,
    /// `--actions-per-second` is on: the progress line shows actions too.
    actions: bool,
    /// Actions sent and answered (`ActionDone` or `REJECTED`) in the last closed interval.
    actions_in_interval: (u64, u64),
    last_at: Instant,
    last: Totals,
    total_delays: Histogram,
    /// `--warmup`: the delays of the intervals that began after it.
    warmup: Option<Duration>,
    steady_delays: Histogram,
    per_second: Vec<SecondStats>,
}

impl Reporter {
    pub fn new(started: Instant, bots_target: u32) -> Reporter {
        Reporter {
            started,
            bots_target,
            actions: false,
            actions_in_interval: (0, 0),
            last_at: started,
            last: Totals::default(),
            total_delays: Histogram::default(),
            warmup: None,
            steady_delays: Histogram::default(),
            per_second: Vec::new(),
        }
    }

    /// Also keeps the delays of every interval that begins `warmup` or more after the
    /// start (`--warmup`): a battle's, once its crowd has logged in and the balancer's first
    /// adjustment is over.
    pub fn with_warmup(mut self, warmup: Option<Duration>) -> Reporter {
        self.warmup = warmup;
        self
    }

    /// When the run started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Shows actions sent and answered on every progress line.
    pub fn with_actions(mut self, actions: bool) -> Reporter {
        self.actions = actions;
        self
    }

    /// Closes the second that ends `now`: prints its line to stderr and keeps its entry.
    pub fn tick(&mut self, stats: &Stats, now: Instant) {
        let entry = self.close_interval(stats, now);
        self.print(stats, &entry, now);
        self.per_second.push(entry);
    }

    /// Closes the last, partial interval (kept only if something happened in it) and
    /// returns the run's delays, the per-second entries and, with a warm-up, the delays
    /// after it.
    pub fn finish(mut self, stats: &Stats, now: Instant) -> Finished {
        let entry = self.close_interval(stats, now);
        if entry.sent + entry.acked + entry.notifications > 0 || entry.p99_ms.is_some() {
            self.print(stats, &entry, now);
            self.per_second.push(entry);
        }
        Finished {
            delays: self.total_delays,
            per_second: self.per_second,
            steady: self.warmup.map(|_| self.steady_delays),
        }
    }

    fn close_interval(&mut self, stats: &Stats, now: Instant) -> SecondStats {
        let delays = stats.delays.sweep();
        self.total_delays.merge(&delays);
        // `last_at` is still this interval's beginning (`print` moves it on).
        if self.warmup.is_some_and(|warmup| self.last_at >= self.started + warmup) {
            self.steady_delays.merge(&delays);
        }
        let totals = Totals::read(stats);
        let entry = SecondStats {
            t: round3(now.saturating_duration_since(self.started).as_secs_f64()),
            bots: load(&stats.bots_online),
            sent: totals.sent - self.last.sent,
            acked: totals.acked - self.last.acked,
            notifications: totals.notifications - self.last.notifications,
            errors: totals.errors - self.last.errors,
            p50_ms: delays.quantile(0.5).map(micros_to_ms),
            p99_ms: delays.quantile(0.99).map(micros_to_ms),
        };
        self.actions_in_interval = (
            totals.actions_sent - self.last.actions_sent,
            totals.actions_answered - self.last.actions_answered,
        );
        self.last = totals;
        entry
    }

    fn print(&mut self, stats: &Stats, entry: &SecondStats, now: Instant) {
        let span = now.saturating_duration_since(self.last_at).as_secs_f64().max(1e-3);
        self.last_at = now;
        let p99 = entry.p99_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2} ms"));
        eprintln!(
            "[{:>7.1}s] bots {:>6}/{} | moves sent {:>7.0}/s acked {:>7.0}/s | notifications \
             {:>8.0}/s | p99 {p99} | errors {} | disconnects {}",
            entry.t,
            entry.bots,
            self.bots_target,
            entry.sent as f64 / span,
            entry.acked as f64 / span,
            entry.notifications as f64 / span,
            load(&stats.errors),
            load(&stats.disconnects),
        );
        if self.actions {
            let (sent, answered) = self.actions_in_interval;
            eprintln!(
                "[{:>7.1}s] actions sent {:>7.0}/s answered {:>7.0}/s (done or rejected)",
                entry.t,
                sent as f64 / span,
                answered as f64 / span,
            );
        }
    }
}

/// Delay percentiles in milliseconds; all null when no move was acknowledged.
#[derive(Debug, Clone, Serialize)]
pub struct DelaySummary {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
}

impl DelaySummary {
    fn of(delays: &Histogram) -> DelaySummary {
        DelaySummary {
            p50: delays.quantile(0.5).map(micros_to_ms),
            p90: delays.quantile(0.9).map(micros_to_ms),
            p99: delays.quantile(0.99).map(micros_to_ms),
            p999: delays.quantile(0.999).map(micros_to_ms),
            max: delays.max().map(|us| micros_to_ms(us as f64)),
            mean: delays.mean().map(micros_to_ms),
        }
    }
}

/// The five numbers of a box plot, in milliseconds: whiskers at p1 and p99 (the paper's
/// figures care about the tail, and min/max of thousands of samples are single outliers),
/// the box from p25 to p75, and the median.
#[derive(Debug, Clone, Serialize)]
pub struct BoxStats {
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
}

impl BoxStats {
    pub fn of(delays: &Histogram) -> Option<BoxStats> {
        let q = |q: f64| delays.quantile(q).map(micros_to_ms);
        Some(BoxStats { p1: q(0.01)?, p25: q(0.25)?, p50: q(0.5)?, p75: q(0.75)?, p99: q(0.99)? })
    }
}

/// `--actions-per-second`: what became of the actions, apart from the moves.
#[derive(Debug, Clone, Serialize)]
pub struct ActionSummary {
    /// Actions per second per bot, as asked.
    pub per_second_per_bot: f64,
    pub sent: u64,
    /// Answered `ActionDone`: the game carried the action out.
    pub answered: u64,
    /// Answered `REJECTED`: the game refused it (no wolf adjacent, no target).
    pub rejected: u64,
    /// Answered by another error carrying its `client_time` (`RATE_LIMITED`,
    /// `UNAVAILABLE`: the target's shard did not answer in time).
    pub errored: u64,
    /// Not answered by the end of the drain, or unanswered at a `ViewReset`.
    pub lost: u64,
    /// `ActionDone`s that matched no outstanding action.
    pub unmatched: u64,
    /// From sending to `ActionDone` or `REJECTED` (both are the game's answer).
    pub delay_ms: DelaySummary,
    /// Only with `--border-x/--border-y`: actions aimed at a wolf across a border when
    /// sent, and the delays of those and of the ones aimed at a wolf on the bot's side
    /// (actions aimed at no one are in neither).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aimed_across: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_across_ms: Option<DelaySummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_within_ms: Option<DelaySummary>,
}

impl ActionSummary {
    fn of(stats: &Stats, interval: Duration, borders: bool) -> ActionSummary {
        let across = stats.action_delays_across.sweep();
        let within = stats.action_delays_within.sweep();
        ActionSummary {
            per_second_per_bot: round3(1.0 / interval.as_secs_f64()),
            sent: load(&stats.actions_sent),
            answered: load(&stats.actions_answered),
            rejected: load(&stats.actions_rejected),
            errored: load(&stats.actions_errored),
            lost: load(&stats.actions_lost),
            unmatched: load(&stats.actions_unmatched),
            delay_ms: DelaySummary::of(&stats.action_delays.sweep()),
            aimed_across: borders.then(|| load(&stats.actions_aimed_across)),
            delay_across_ms: borders.then(|| DelaySummary::of(&across)),
            delay_within_ms: borders.then(|| DelaySummary::of(&within)),
        }
    }
}

/// The delay CDF's resolution: a point per 0.5% of the samples (at most ~200 points).
const CDF_STEP: f64 = 0.005;

/// The final report, printed to stdout and written to `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The run's name in reports (`--label`).
    pub label: String,
    pub bots_target: u32,
    pub bots_connected: u64,
    pub duration_s: f64,
    pub move_interval_ms: f64,
    pub moves_sent: u64,
    pub moves_acked: u64,
    pub moves_lost: u64,
    pub moves_errored: u64,
    /// Moves still unanswered when a `ViewReset` came, answered after it (counted in
    /// `moves_acked` or `moves_errored` too): they crossed the reset on the wire.
    pub moves_answered_after_reset: u64,
    /// With `--resume-addr`: bots that resumed on another gateway after `SHUTTING_DOWN`,
    /// and those that could not (they count as disconnected too).
    pub resumes: u64,
    pub resume_failures: u64,
    /// Server messages other than the bots' own answers, received during `--duration`.
    pub notifications: u64,
    pub notifications_per_s: f64,
    pub delay_ms: DelaySummary,
    /// Only with `--warmup`: the delays of acks received once it was over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_steady_ms: Option<DelaySummary>,
    /// Per bot, the longest gap between two of its move acks (from its login to its first
    /// ack included), over the bots: a shard's death shows here as the time its players
    /// waited to be restored.
    pub ack_gap_ms: DelaySummary,
    /// `[delay ms, fraction of acked moves at or below it]`, for the CDF plot.
    pub delay_cdf: Vec<[f64; 2]>,
    pub delay_box_ms: Option<BoxStats>,
    /// Only with `--border-x/--border-y`: moves whose ack crossed a border, and the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_crossing_ms: Option<DelaySummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_inner_ms: Option<DelaySummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moves_crossing: Option<u64>,
    /// `Error`s by code; a `REJECTED` answering an action is in `actions.rejected`, not here.
    pub errors_by_code: BTreeMap<String, u64>,
    pub disconnects: u64,
    pub login_failures: u64,
    pub connect_failures: u64,
    pub acks_unmatched: u64,
    pub view_resets: u64,
    pub send_lag_max_ms: f64,
    /// Wall time from the first bot's start to the last bot's end (drain and logout included).
    pub elapsed_s: f64,
    pub per_second: Vec<SecondStats>,
    /// Only with `--ramp`: every step and the largest passing number of bots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampSummary>,
    /// Only with `--actions-per-second`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actions: Option<ActionSummary>,
    pub seed: u64,
}

impl Summary {
    pub fn build(
        config: &Config,
        stats: &Stats,
        finished: Finished,
        elapsed: Duration,
        ramp: Option<RampSummary>,
    ) -> Summary {
        let Finished { delays, per_second, steady } = finished;
        let delays = &delays;
        // A ramp ends when it ends; rates are over the time moves were actually sent.
        let duration_s = match &ramp {
            Some(_) => per_second.last().map_or(config.duration.as_secs_f64(), |s| s.t).max(1e-3),
            None => config.duration.as_secs_f64(),
        };
        let notifications = load(&stats.notifications);
        let borders = !(config.border_x.is_empty() && config.border_y.is_empty());
        let crossing = stats.delays_crossing.sweep();
        let inner = stats.delays_inner.sweep();
        Summary {
            label: config.label.clone(),
            bots_target: config.bots,
            bots_connected: load(&stats.bots_connected),
            duration_s,
            move_interval_ms: config.move_interval.as_secs_f64() * 1e3,
            moves_sent: load(&stats.moves_sent),
            moves_acked: load(&stats.moves_acked),
            moves_lost: load(&stats.moves_lost),
            moves_errored: load(&stats.moves_errored),
            moves_answered_after_reset: load(&stats.moves_answered_after_reset),
            resumes: load(&stats.resumes),
            resume_failures: load(&stats.resume_failures),
            notifications,
            notifications_per_s: round3(notifications as f64 / duration_s),
            delay_ms: DelaySummary::of(delays),
            delay_steady_ms: steady.as_ref().map(DelaySummary::of),
            ack_gap_ms: DelaySummary::of(&stats.ack_gaps.sweep()),
            delay_cdf: delays
                .cdf(CDF_STEP)
                .into_iter()
                .map(|(us, fraction)| [micros_to_ms(us), fraction])
                .collect(),
            delay_box_ms: BoxStats::of(delays),
            delay_crossing_ms: borders.then(|| DelaySummary::of(&crossing)),
            delay_inner_ms: borders.then(|| DelaySummary::of(&inner)),
            moves_crossing: borders.then(|| crossing.count()),
            errors_by_code: stats.errors_by_code(),
            disconnects: load(&stats.disconnects),
            login_failures: load(&stats.login_failures),
            connect_failures: load(&stats.connect_failures),
            acks_unmatched: load(&stats.acks_unmatched),
            view_resets: load(&stats.view_resets),
            send_lag_max_ms: micros_to_ms(load(&stats.send_lag_max_us) as f64),
            elapsed_s: round3(elapsed.as_secs_f64()),
            per_second,
            ramp,
            actions: config
                .action_interval
                .map(|interval| ActionSummary::of(stats, interval, borders)),
            seed: config.seed,
        }
    }
}

/// Microseconds to milliseconds, kept to the microsecond.
fn micros_to_ms(micros: f64) -> f64 {
    round3(micros / 1e3)
}

fn round3(value: f64) -> f64 {
    (value * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_named_by_their_protocol_code() {
        let stats = Stats::default();
        stats.record_error(ErrorCode::RateLimited as i32);
        stats.record_error(ErrorCode::RateLimited as i32);
        stats.record_error(ErrorCode::Unavailable as i32);
        stats.record_error(99);
        stats.record_error(-1);
        let by_code = stats.errors_by_code();
        assert_eq!(by_code.get("RATE_LIMITED"), Some(&2));
        assert_eq!(by_code.get("UNAVAILABLE"), Some(&1));
        assert_eq!(by_code.get("UNKNOWN"), Some(&2));
        assert_eq!(by_code.len(), 3, "codes never seen are left out: {by_code:?}");
    }

    #[test]
    fn a_warm_up_keeps_the_delays_of_the_intervals_after_it_apart() {
        let stats = Stats::default();
        let start = Instant::now();
        let mut reporter = Reporter::new(start, 1).with_warmup(Some(Duration::from_secs(1)));
        stats.delays.record(900_000);
        reporter.tick(&stats, start + Duration::from_secs(1));
        stats.delays.record(4_000);
        stats.delays.record(6_000);
        reporter.tick(&stats, start + Duration::from_secs(2));
        let finished = reporter.finish(&stats, start + Duration::from_millis(2_600));
        assert_eq!(finished.delays.count(), 3);
        let steady = finished.steady.expect("a warm-up was asked for");
        assert_eq!(steady.count(), 2, "the first second's delay is left out");
        assert!(steady.quantile(1.0).is_some_and(|us| us < 10_000.0), "{steady:?}");
    }

    #[test]
    fn reporter_counts_each_interval_once_and_keeps_the_total() {
        let stats = Stats::default();
        let start = Instant::now();
        let mut reporter = Reporter::new(start, 1);
        for _ in 0..3 {
            bump(&stats.moves_sent);
            bump(&stats.moves_acked);
        }
        stats.delays.record(2_000);
        reporter.tick(&stats, start + Duration::from_secs(1));
        bump(&stats.moves_acked);
        stats.delays.record(4_000);
        reporter.tick(&stats, start + Duration::from_secs(2));
        reporter.tick(&stats, start + Duration::from_millis(2_500));
        let Finished { delays: total, per_second: seconds, steady } =
            reporter.finish(&stats, start + Duration::from_millis(2_600));
        assert!(steady.is_none(), "no warm-up, no steady delays");
        assert_eq!(seconds.len(), 3, "an idle last interval is left out");
        assert_eq!(total.count(), 2);
        let acked: Vec<u64> = seconds.iter().map(|s| s.acked).collect();
        assert_eq!(acked, [3, 1, 0]);
        assert_eq!(seconds[0].p99_ms, Some(2.0));
        assert_eq!(seconds[0].p50_ms, Some(2.0));
        assert_eq!(seconds[1].p99_ms, Some(4.0));
        assert_eq!(seconds[2].p99_ms, None);
        assert_eq!(seconds[2].t, 2.5);
    }

    #[test]
    fn rejected_actions_are_answers_not_failures() {
        let stats = Stats::default();
        stats.record_error(ErrorCode::Rejected as i32);
        stats.record_error(ErrorCode::Rejected as i32);
        stats.record_error(ErrorCode::RateLimited as i32);
        assert_eq!(stats.errors_total(), 3);
        assert_eq!(stats.failure_errors(), 1, "only RATE_LIMITED counts against a ramp step");
    }

    #[test]
    fn the_action_summary_keeps_each_fate_apart() {
        let stats = Stats::default();
        for counter in [&stats.actions_sent; 5] {
            bump(counter);
        }
        bump(&stats.actions_answered);
        bump(&stats.actions_rejected);
        bump(&stats.actions_rejected);
        bump(&stats.actions_errored);
        bump(&stats.actions_lost);
        stats.action_delays.record(3_000);
        stats.action_delays.record(5_000);
        let summary = ActionSummary::of(&stats, Duration::from_millis(500), false);
        assert_eq!(summary.per_second_per_bot, 2.0);
        assert_eq!(
            (summary.sent, summary.answered, summary.rejected, summary.errored, summary.lost),
            (5, 1, 2, 1, 1)
        );
        assert_eq!(summary.delay_ms.p50, Some(3.0));
        assert_eq!(summary.delay_ms.max, Some(5.0));
        assert!(summary.delay_across_ms.is_none(), "no borders, no split");
    }
}
