//! A log-linear histogram of delays in microseconds, exact below 128 µs and within 1%
//! above (128 linear sub-buckets per power of two), plus a lock-free recording twin.
//!
//! Thousands of bots record into one `AtomicHistogram` (one relaxed `fetch_add` per
//! sample, no lock, no per-bot copy of ~26 KiB of buckets); the once-a-second reporter
//! sweeps it into a plain `Histogram` for that second's percentiles and merges the sweep
//! into the run's total.

use std::sync::atomic::{AtomicU64, Ordering};

/// log2 of the number of linear sub-buckets per power of two: 2^-7 < 0.8% bucket width.
const SUB_BITS: u32 = 7;
const SUB_BUCKETS: u64 = 1 << SUB_BITS;
/// Values are clamped to `u32::MAX` µs (71 minutes); the exact maximum is kept aside.
const MAX_TRACKED: u64 = u32::MAX as u64;
const BUCKETS: usize = bucket_index(MAX_TRACKED) + 1;

/// The bucket of `value` µs. Below 128 every value has its own bucket; above, a value
/// with its highest set bit at `e` lands in octave `e - 7` at sub-bucket `value >> (e - 7)`.
const fn bucket_index(value: u64) -> usize {
    let value = if value > MAX_TRACKED { MAX_TRACKED } else { value };
    if value < SUB_BUCKETS {
        return value as usize;
    }
    let shift = 63 - value.leading_zeros() - SUB_BITS;
    ((shift as u64) * SUB_BUCKETS + (value >> shift)) as usize
}

/// The inclusive range of values that land in bucket `index`.
fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB_BUCKETS {
        return (index, index);
    }
    let shift = index / SUB_BUCKETS - 1;
    let mantissa = SUB_BUCKETS + index % SUB_BUCKETS;
    let low = mantissa << shift;
    (low, low + (1 << shift) - 1)
}

/// A plain histogram: one run's or one second's delays.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; BUCKETS], count: 0, sum: 0, max: 0 }
    }
}

impl Histogram {
    /// Bots record through `AtomicHistogram`; this is the plain path for tests.
    #[cfg(test)]
    pub fn record(&mut self, micros: u64) {
        self.counts[bucket_index(micros)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(micros);
        self.max = self.max.max(micros);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum = self.sum.saturating_add(other.sum);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The exact largest value recorded, or `None` when empty.
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// The exact mean, or `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding the sample of
    /// rank `ceil(q * count)`, never above the exact maximum. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        // The epsilon keeps `0.99 * 1000` from rounding up to rank 991.
        let exact_rank = q.clamp(0.0, 1.0) * self.count as f64 - 1e-9;
        let rank = (exact_rank.ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, high) = bucket_range(index);
                let middle = (low as f64 + high as f64) / 2.0;
                return Some(middle.min(self.max as f64));
            }
        }
        Some(self.max as f64)
    }
}

impl Histogram {
    /// The distribution as `(value µs, fraction of samples at or below it)` points for a
    /// CDF plot: one point per bucket where the fraction has grown by at least `min_step`
    /// since the last point (so at most ~`1 / min_step` points), plus the first and the
    /// last bucket. Values are bucket tops, clamped to the exact maximum. Empty when empty.
    pub fn cdf(&self, min_step: f64) -> Vec<(f64, f64)> {
        let mut points = Vec::new();
        if self.count == 0 {
            return points;
        }
        let mut seen = 0u64;
        let mut last_fraction = -1.0;
        for (index, &n) in self.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            seen += n;
            let fraction = seen as f64 / self.count as f64;
            let last = seen == self.count;
            if points.is_empty() || last || fraction - last_fraction >= min_step {
                let top = (bucket_range(index).1 as f64).min(self.max as f64);
                points.push((top, fraction));
                last_fraction = fraction;
            }
            if last {
                break;
            }
        }
        points
    }
}

/// The shared, lock-free side: bots record, the reporter sweeps.
#[derive(Debug)]
pub struct AtomicHistogram {
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        AtomicHistogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    pub fn record(&self, micros: u64) {
        self.counts[bucket_index(micros)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(micros, Ordering::Relaxed);
        self.max.fetch_max(micros, Ordering::Relaxed);
    }

    /// Moves everything recorded so far into a plain histogram and starts from zero.
    ///
    /// A sample recorded during the sweep may have its bucket in this sweep and its sum
    /// in the next; the mean is off by that one sample for one second, nothing is lost.
    pub fn sweep(&self) -> Histogram {
        let mut out = Histogram::default();
        for (slot, atomic) in out.counts.iter_mut().zip(self.counts.iter()) {
            *slot = atomic.swap(0, Ordering::Relaxed);
            out.count += *slot;
        }
        out.sum = self.sum.swap(0, Ordering::Relaxed);
        out.max = self.max.swap(0, Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_with_under_one_percent_width() {
        assert_eq!(bucket_range(0), (0, 0));
        let mut expected_low = 0;
        for index in 0..BUCKETS {
            let (low, high) = bucket_range(index);
            assert_eq!(low, expected_low, "bucket {index} must start where {} ended", index - 1);
            assert!(high >= low);
            assert!((high - low) as f64 <= low as f64 / 128.0, "bucket {index} too wide");
            assert_eq!(bucket_index(low), index);
            assert_eq!(bucket_index(high), index);
            expected_low = high + 1;
        }
        assert_eq!(expected_low, MAX_TRACKED + 1, "the last bucket ends at the clamp");
        assert_eq!(bucket_index(u64::MAX), BUCKETS - 1, "huge values are clamped, not lost");
    }

    #[test]
    fn empty_histogram_has_no_percentiles() {
        let histogram = Histogram::default();
        assert_eq!(histogram.quantile(0.5), None);
        assert_eq!(histogram.max(), None);
        assert_eq!(histogram.mean(), None);
    }

    #[test]
    fn small_values_are_exact() {
        let mut histogram = Histogram::default();
        for v in [5, 1, 3, 2, 4] {
            histogram.record(v);
        }
        assert_eq!(histogram.quantile(0.0), Some(1.0));
        assert_eq!(histogram.quantile(0.5), Some(3.0));
        assert_eq!(histogram.quantile(0.8), Some(4.0));
        assert_eq!(histogram.quantile(1.0), Some(5.0));
        assert_eq!(histogram.mean(), Some(3.0));
    }

    #[test]
    fn percentiles_of_a_uniform_spread_are_within_one_percent() {
        let mut histogram = Histogram::default();
        for v in 1..=100_000u64 {
            histogram.record(v);
        }
        for (q, exact) in [(0.5, 50_000.0), (0.9, 90_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = histogram.quantile(q).unwrap();
            let error = (got - exact).abs() / exact;
            assert!(error < 0.01, "q{q}: got {got}, exact {exact}, error {error}");
        }
        assert_eq!(histogram.max(), Some(100_000));
        assert_eq!(histogram.mean(), Some(50_000.5));
    }

    #[test]
    fn the_tail_is_not_averaged_away() {
        let mut histogram = Histogram::default();
        for _ in 0..990 {
            histogram.record(1_000);
        }
        for _ in 0..10 {
            histogram.record(250_000);
        }
        assert!((histogram.quantile(0.99).unwrap() - 1_000.0).abs() < 10.0);
        let p999 = histogram.quantile(0.999).unwrap();
        assert!((p999 - 250_000.0).abs() / 250_000.0 < 0.01, "p999 {p999}");
        assert_eq!(histogram.quantile(1.0), Some(250_000.0), "p100 is clamped to the max");
    }

    #[test]
    fn cdf_climbs_to_one_with_bounded_points() {
        assert!(Histogram::default().cdf(0.01).is_empty());
        let mut histogram = Histogram::default();
        for v in 1..=10_000u64 {
            histogram.record(v);
        }
        let points = histogram.cdf(0.01);
        assert!(points.len() <= 102, "{} points", points.len());
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1), "monotonic");
        assert_eq!(points.last(), Some(&(10_000.0, 1.0)), "ends at the max with everything");
        let median = points.iter().find(|p| p.1 >= 0.5).unwrap().0;
        assert!((median - 5_000.0).abs() < 150.0, "median near 5000, got {median}");
        let mut single = Histogram::default();
        single.record(700);
        assert_eq!(single.cdf(0.01), vec![(700.0, 1.0)]);
    }

    #[test]
    fn sweeping_moves_samples_and_merging_adds_them() {
        let shared = AtomicHistogram::default();
        let mut total = Histogram::default();
        for v in [100, 200, 300] {
            shared.record(v);
        }
        let first = shared.sweep();
        assert_eq!(first.count(), 3);
        assert_eq!(first.max(), Some(300));
        total.merge(&first);
        shared.record(10_000);
        let second = shared.sweep();
        assert_eq!(second.count(), 1);
        assert_eq!(second.mean(), Some(10_000.0));
        total.merge(&second);
        assert_eq!(shared.sweep().count(), 0, "a sweep starts from zero");
        assert_eq!(total.count(), 4);
        assert_eq!(total.max(), Some(10_000));
        assert_eq!(total.mean(), Some(2_650.0));
    }
}
