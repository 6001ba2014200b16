//! Seeded randomness for tests: the seed comes from `MERIDIAN_TEST_SEED` or a fixed default,
//! is printed before anything random happens, and the same seed gives the same scenario on
//! every machine.
//!
//! The generator is SplitMix64, written out here rather than taken from a crate, so that a
//! seed recorded in a bug report keeps meaning the same script whatever crate versions the
//! workspace moves to.

use anyhow::bail;

/// The environment variable that overrides a test's default seed.
pub const SEED_ENV: &str = "MERIDIAN_TEST_SEED";

/// The seed for `test`: `MERIDIAN_TEST_SEED` (decimal, or hex with `0x`) if set, else `default`.
/// Prints it, with the command line that reproduces it, before the test does anything random.
///
/// # Panics
/// If the variable is set but is not a number: a typo must not silently run another seed.
pub fn test_seed(test: &str, default: u64) -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => parse_seed(&text).unwrap_or_else(|e| panic!("{e:#}")),
        Err(_) => default,
    };
    eprintln!("{test}: seed {seed} (reproduce with {SEED_ENV}={seed})");
    seed
}

/// `1234` or `0x4d2`.
pub fn parse_seed(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    };
    match parsed {
        Ok(seed) => Ok(seed),
        Err(e) => bail!("{SEED_ENV}={text:?} is not a seed (a u64, decimal or 0x hex): {e}"),
    }
}

/// A small, fast, deterministic generator (SplitMix64). Not for anything but tests.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// An independent generator for one part of a scenario (one bot, one phase), so that
    /// changing how one part draws numbers does not change the others.
    pub fn fork(&self, stream: u64) -> Rng {
        let mut mixer = Rng::new(self.state ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng::new(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by the multiply-high method (bias below 2^-32 for the
    /// small `n` tests use).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "Rng::range({lo}, {hi})");
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `lo..=hi`, for coordinates.
    pub fn range_u32(&mut self, lo: u32, hi: u32) -> u32 {
        self.range(u64::from(lo), u64::from(hi)) as u32
    }

    /// True with probability `p` (0.0..=1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 random bits make a uniform float in [0, 1).
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let a: Vec<u64> = {
            let mut rng = Rng::new(42);
            (0..10).map(|_| rng.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut rng = Rng::new(42);
            (0..10).map(|_| rng.next_u64()).collect()
        };
        assert_eq!(a, b);
        // The first SplitMix64 output for seed 42, so the sequence never changes silently.
        assert_eq!(a[0], 0xBDD7_3226_2FEB_6E95);
    }

    #[test]
    fn forks_differ_from_each_other_and_are_stable() {
        let root = Rng::new(7);
        let mut f1 = root.fork(1);
        let mut f2 = root.fork(2);
        assert_ne!(f1.next_u64(), f2.next_u64());
        assert_eq!(root.fork(1).next_u64(), Rng::new(7).fork(1).next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = rng.range(3, 7);
            assert!((3..=7).contains(&v));
            seen[(v - 3) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "every value of 3..=7 comes up: {seen:?}");
    }

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("1234").unwrap(), 1234);
        assert_eq!(parse_seed(" 0x4d2 ").unwrap(), 1234);
        assert!(parse_seed("twelve").is_err());
    }
}
