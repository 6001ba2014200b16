//! The bookkeeping: which moves of a bot wait for their ack, what the run counted, and
//! the JSON summary it all becomes.
//!
//! Delays are kept exactly (one `u32` of microseconds per acked move, a few hundred
//! thousand per run at most) and sorted once at the end, so percentiles are exact
//! nearest-rank values rather than histogram buckets. Counting follows `loadtest`'s rules
//! (see its `stats.rs`), because the benchmark suite adds up `moves_sent + moves_acked +
//! notifications` the same way for both clients: an ack counts whenever it arrives (drain
//! included), a notification only while moves are being sent.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The moves of one bot still waiting for an answer, oldest first.
#[derive(Debug, Default)]
pub struct Pending {
    moves: VecDeque<(u64, Instant)>,
}

impl Pending {
    /// Records a move sent at `at` with `client_time`.
    pub fn sent(&mut self, client_time: u64, at: Instant) {
        self.moves.push_back((client_time, at));
    }

    /// Takes the move answered by `client_time` off the list and says when it was sent;
    /// `None` if no move with that `client_time` is waiting. Answers come in order, so the
    /// match is almost always the oldest entry.
    pub fn answer(&mut self, client_time: u64) -> Option<Instant> {
        let position = self.moves.iter().position(|&(sent, _)| sent == client_time)?;
        self.moves.remove(position).map(|(_, at)| at)
    }

    /// Forgets every waiting move (they will never be answered) and says how many.
    pub fn forget_all(&mut self) -> usize {
        let forgotten = self.moves.len();
        self.moves.clear();
        forgotten
    }
}

/// One second of the run: what happened in it.
#[derive(Debug, Default, Clone)]
struct Second {
    bots: u64,
    sent: u64,
    acked: u64,
    notifications: u64,
    delays_us: Vec<u32>,
}

/// Everything the run counts.
#[derive(Debug)]
pub struct Tally {
    started: Instant,
    sending_ends: Instant,
    seconds: Vec<Second>,
    pub bots_connected: u64,
    pub connect_failures: u64,
    pub login_failures: u64,
    pub disconnects: u64,
    pub moves_sent: u64,
    pub moves_acked: u64,
    pub moves_errored: u64,
    pub moves_lost: u64,
    pub notifications: u64,
    pub acks_unmatched: u64,
    pub view_resets: u64,
    errors_by_code: BTreeMap<&'static str, u64>,
    send_lag_max: Duration,
}

impl Tally {
    pub fn new(started: Instant, sending_ends: Instant) -> Tally {
        Tally {
            started,
            sending_ends,
            seconds: Vec::new(),
            bots_connected: 0,
            connect_failures: 0,
            login_failures: 0,
            disconnects: 0,
            moves_sent: 0,
            moves_acked: 0,
            moves_errored: 0,
            moves_lost: 0,
            notifications: 0,
            acks_unmatched: 0,
            view_resets: 0,
            errors_by_code: BTreeMap::new(),
            send_lag_max: Duration::ZERO,
        }
    }

    fn second(&mut self, at: Instant) -> &mut Second {
        let index = at.saturating_duration_since(self.started).as_secs() as usize;
        if self.seconds.len() <= index {
            self.seconds.resize(index + 1, Second::default());
        }
        &mut self.seconds[index]
    }

    /// A move due at `due` went out at `now`.
    pub fn move_sent(&mut self, due: Instant, now: Instant) {
        self.moves_sent += 1;
        self.send_lag_max = self.send_lag_max.max(now.saturating_duration_since(due));
        self.second(now).sent += 1;
    }

    /// A bot's own ack arrived at `now` for a move sent at `sent_at`.
    pub fn acked(&mut self, sent_at: Instant, now: Instant) {
        self.moves_acked += 1;
        let delay_us = now.saturating_duration_since(sent_at).as_micros();
        let second = self.second(now);
        second.acked += 1;
        second.delays_us.push(u32::try_from(delay_us).unwrap_or(u32::MAX));
    }

    /// Any other server message, received at `now`; counted only while moves are sent.
    pub fn notification(&mut self, now: Instant) {
        if now < self.sending_ends {
            self.notifications += 1;
            self.second(now).notifications += 1;
        }
    }

    /// An `Error` answer, counted by its code.
    pub fn error(&mut self, code: i32) {
        *self.errors_by_code.entry(error_name(code)).or_insert(0) += 1;
    }

    /// How many bots are logged in at `now` (the latest value of a second is kept).
    pub fn bots_online(&mut self, now: Instant, online: u64) {
        self.second(now).bots = online;
    }

    /// The progress line of second `index`, if it has been seen.
    pub fn progress_line(&self, index: usize, bots_target: u32) -> Option<String> {
        let second = self.seconds.get(index)?;
        Some(format!(
            "[{:>4}s] bots {}/{} | moves sent {}/s acked {}/s | notifications {}/s",
            index + 1,
            second.bots,
            bots_target,
            second.sent,
            second.acked,
            second.notifications,
        ))
    }

    /// The figures of the whole run, for the summary.
    pub fn figures(&self) -> Figures {
        let mut all: Vec<u32> =
            self.seconds.iter().flat_map(|s| s.delays_us.iter().copied()).collect();
        all.sort_unstable();
        let per_second = self
            .seconds
            .iter()
            .enumerate()
            .map(|(index, second)| {
                let mut delays = second.delays_us.clone();
                delays.sort_unstable();
                SecondFigures {
                    t: (index + 1) as f64,
                    bots: second.bots,
                    sent: second.sent,
                    acked: second.acked,
                    notifications: second.notifications,
                    p50_ms: quantile_ms(&delays, 0.5),
                    p99_ms: quantile_ms(&delays, 0.99),
                }
            })
            .collect();
        Figures {
            delay_ms: DelayFigures::of(&all),
            delay_box_ms: BoxFigures::of(&all),
            delay_cdf: cdf_ms(&all, 200),
            per_second,
            errors_by_code: self
                .errors_by_code
                .iter()
                .map(|(&name, &count)| (name.to_owned(), count))
                .collect(),
            send_lag_max_ms: ms(self.send_lag_max.as_micros() as f64),
        }
    }
}

/// The figures computed at the end from the kept delays.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub delay_ms: DelayFigures,
    pub delay_box_ms: Option<BoxFigures>,
    pub delay_cdf: Vec<[f64; 2]>,
    pub per_second: Vec<SecondFigures>,
    pub errors_by_code: BTreeMap<String, u64>,
    pub send_lag_max_ms: f64,
}

/// Delay percentiles in milliseconds, all null when nothing was acked (as `loadtest`).
#[derive(Debug, Serialize, PartialEq)]
pub struct DelayFigures {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
}

impl DelayFigures {
    fn of(sorted_us: &[u32]) -> DelayFigures {
        let mean = (!sorted_us.is_empty()).then(|| {
            ms(sorted_us.iter().map(|&d| f64::from(d)).sum::<f64>() / sorted_us.len() as f64)
        });
        DelayFigures {
            p50: quantile_ms(sorted_us, 0.5),
            p90: quantile_ms(sorted_us, 0.9),
            p99: quantile_ms(sorted_us, 0.99),
            p999: quantile_ms(sorted_us, 0.999),
            max: sorted_us.last().map(|&d| ms(f64::from(d))),
            mean,
        }
    }
}

/// The five numbers of the report's box plots (whiskers at p1 and p99), in milliseconds.
#[derive(Debug, Serialize)]
pub struct BoxFigures {
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
}

impl BoxFigures {
    fn of(sorted_us: &[u32]) -> Option<BoxFigures> {
        let q = |q| quantile_ms(sorted_us, q);
        Some(BoxFigures { p1: q(0.01)?, p25: q(0.25)?, p50: q(0.5)?, p75: q(0.75)?, p99: q(0.99)? })
    }
}

#[derive(Debug, Serialize)]
pub struct SecondFigures {
    pub t: f64,
    pub bots: u64,
    pub sent: u64,
    pub acked: u64,
    pub notifications: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Nearest rank: the smallest sample with at least `q` of all samples at or below it.
fn quantile_ms(sorted_us: &[u32], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    // The epsilon keeps 0.99 * 1000 from becoming rank 991 through rounding.
    let rank = ((q.clamp(0.0, 1.0) * sorted_us.len() as f64 - 1e-9).ceil() as usize).max(1);
    Some(ms(f64::from(sorted_us[rank - 1])))
}

/// `points` points of the delay CDF, `[ms, fraction at or below]`, evenly spaced in rank.
fn cdf_ms(sorted_us: &[u32], points: usize) -> Vec<[f64; 2]> {
    if sorted_us.is_empty() {
        return Vec::new();
    }
    let n = sorted_us.len();
    let mut out: Vec<[f64; 2]> = Vec::with_capacity(points);
    for i in 1..=points {
        let rank = (i * n).div_ceil(points).max(1);
        let point = [ms(f64::from(sorted_us[rank - 1])), rank as f64 / n as f64];
        if out.last() != Some(&point) {
            out.push(point);
        }
    }
    out
}

/// Microseconds to milliseconds, kept to the microsecond.
fn ms(micros: f64) -> f64 {
    (micros).round() / 1e3
}

/// The name of an `ErrorCode` (proto/client.proto), as `loadtest` reports it.
fn error_name(code: i32) -> &'static str {
    const NAMES: [&str; 12] = [
        "ERROR_UNSPECIFIED",
        "MALFORMED",
        "FRAME_TOO_LARGE",
        "NOT_LOGGED_IN",
        "ALREADY_LOGGED_IN",
        "RATE_LIMITED",
        "UNAVAILABLE",
        "INVALID_TOKEN",
        "SHUTTING_DOWN",
        "INVALID_ARGUMENT",
        "REPLACED",
        "REJECTED",
    ];
    usize::try_from(code).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_matched_by_client_time_in_any_order() {
        let t0 = Instant::now();
        let mut pending = Pending::default();
        for (i, ct) in [10, 20, 30].into_iter().enumerate() {
            pending.sent(ct, t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(pending.answer(20), Some(t0 + Duration::from_millis(1)), "out of order");
        assert_eq!(pending.answer(20), None, "an answer matches once");
        assert_eq!(pending.answer(99), None, "never sent");
        assert_eq!(pending.answer(10), Some(t0));
        assert_eq!(pending.forget_all(), 1, "30 still waits");
        assert_eq!(pending.forget_all(), 0);
    }

    #[test]
    fn notifications_count_only_while_moves_are_sent_and_acks_always() {
        let t0 = Instant::now();
        let ends = t0 + Duration::from_secs(2);
        let mut tally = Tally::new(t0, ends);
        tally.move_sent(t0, t0 + Duration::from_millis(3));
        tally.acked(t0 + Duration::from_millis(3), t0 + Duration::from_millis(5));
        tally.notification(t0 + Duration::from_millis(5));
        tally.notification(ends);
        tally.acked(ends, ends + Duration::from_millis(1));
        assert_eq!((tally.moves_sent, tally.moves_acked, tally.notifications), (1, 2, 1));
        let figures = tally.figures();
        assert_eq!(figures.send_lag_max_ms, 3.0);
        assert_eq!(figures.per_second.len(), 3, "seconds 0, 1 (empty) and 2");
        assert_eq!(figures.per_second[0].acked, 1);
        assert_eq!(figures.per_second[0].p50_ms, Some(2.0));
        assert_eq!(figures.per_second[1].p50_ms, None);
        assert_eq!(figures.per_second[2].acked, 1);
        assert_eq!(figures.delay_ms.max, Some(2.0));
        assert_eq!(figures.delay_ms.mean, Some(1.5));
    }

    #[test]
    fn percentiles_are_exact_nearest_rank() {
        let delays: Vec<u32> = (1..=1000).collect();
        assert_eq!(quantile_ms(&delays, 0.5), Some(0.5));
        assert_eq!(quantile_ms(&delays, 0.99), Some(0.99), "rank 990, not 991");
        assert_eq!(quantile_ms(&delays, 0.999), Some(0.999));
        assert_eq!(quantile_ms(&delays, 1.0), Some(1.0));
        assert_eq!(quantile_ms(&delays, 0.0), Some(0.001));
        assert_eq!(quantile_ms(&[], 0.5), None);
        assert_eq!(quantile_ms(&[7_000], 0.99), Some(7.0));
        let empty = DelayFigures::of(&[]);
        assert_eq!(
            empty,
            DelayFigures { p50: None, p90: None, p99: None, p999: None, max: None, mean: None }
        );
        assert!(BoxFigures::of(&[]).is_none());
    }

    #[test]
    fn the_cdf_climbs_to_one_without_repeating_points() {
        let delays = [1_000, 1_000, 1_000, 2_000];
        let cdf = cdf_ms(&delays, 200);
        assert_eq!(cdf.first(), Some(&[1.0, 0.25]));
        assert_eq!(cdf.last(), Some(&[2.0, 1.0]));
        assert!(cdf.windows(2).all(|w| w[0][1] < w[1][1] && w[0][0] <= w[1][0]), "{cdf:?}");
        assert!(cdf_ms(&[], 200).is_empty());
        assert_eq!(cdf_ms(&(0..10_000).collect::<Vec<_>>(), 200).len(), 200);
    }

    #[test]
    fn errors_are_named_as_the_proto_names_them() {
        let mut tally = Tally::new(Instant::now(), Instant::now());
        tally.error(5);
        tally.error(5);
        tally.error(11);
        tally.error(-1);
        tally.error(12);
        let names = tally.figures().errors_by_code;
        assert_eq!(names.get("RATE_LIMITED"), Some(&2));
        assert_eq!(names.get("REJECTED"), Some(&1));
        assert_eq!(names.get("UNKNOWN"), Some(&2));
    }
}
