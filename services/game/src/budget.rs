//! Budgets for game actions that create entities: how many one player may have alive, how
//! many the shard may hold, and how fast one player may make them.
//!
//! An action that spawns an NPC costs the shard for as long as the NPC lives (its ticks,
//! its sight, the messages about it), so a rate limit on the action is not enough: a player
//! within 10 actions a second could fill a shard in minutes. [`SpawnBudget`] answers one
//! question per request, `admit(now, owner, owner_alive, shard_alive)`, and keeps only a
//! token bucket per owner. The game counts what is alive itself (it knows which entities
//! are whose, for instance from their private state), and `now` is the context's
//! ([`crate::Context::now`]): no clock is read here, so the same events give the same
//! answers.
//!
//! The buckets live in the game instance of one shard and measure that shard's time; a
//! player that crosses into another shard's region starts there with a full bucket. The
//! caps on what is alive do not depend on that, and a bucket that has refilled is dropped
//! ([`SpawnBudget::forget_refilled`]), so the map stays as small as the players spending.

use std::collections::HashMap;
use std::time::Duration;

use crate::EntityId;

/// A rate with bursts: `per_second` on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

impl Rate {
    /// The time one token takes to come back (the rate is not 0).
    fn interval(self) -> Duration {
        Duration::from_secs(1) / self.per_second.max(1)
    }
}

/// What a [`SpawnBudget`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnLimits {
    /// Entities one owner may have alive (as the game counts them).
    pub per_owner: usize,
    /// Entities of this kind the shard may hold, whoever made them.
    pub per_shard: usize,
    /// How fast one owner may make them.
    pub rate: Rate,
}

/// Why a [`SpawnBudget`] refused. The `Display` text is meant for the player (a game's
/// `Reply::Rejected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SpawnRefusal {
    #[error("you have {limit} alive already, the most one player may have")]
    OwnerFull { limit: usize },
    #[error("this part of the world holds {limit} already, the most it may have")]
    ShardFull { limit: usize },
    #[error(
        "too fast: at most {per_second} per second (bursts of {burst}); try again in \
         {retry_after_ms} ms"
    )]
    TooFast { per_second: u32, burst: u32, retry_after_ms: u64 },
}

/// How often a [`SpawnBudget`] refused, by reason, since it was made: for a game to log
/// or report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpawnRefusals {
    pub owner_full: u64,
    pub shard_full: u64,
    pub too_fast: u64,
}

/// One owner's token bucket, as the time at which it would be full ("theoretical arrival
/// time" of the generic cell rate algorithm): a request at `now` is allowed while
/// `full_at - now` leaves room for one more interval within the burst.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    full_at: Duration,
}

/// The budget of one game action that creates entities, on one shard. Sans-IO: time is the
/// `now` the caller passes.
#[derive(Debug, Clone)]
pub struct SpawnBudget {
    limits: SpawnLimits,
    buckets: HashMap<EntityId, Bucket>,
    refusals: SpawnRefusals,
}

impl SpawnBudget {
    pub fn new(limits: SpawnLimits) -> SpawnBudget {
        SpawnBudget { limits, buckets: HashMap::new(), refusals: SpawnRefusals::default() }
    }

    pub fn limits(&self) -> SpawnLimits {
        self.limits
    }

    /// Whether `owner`, with `owner_alive` entities alive, may make one more now, the shard
    /// holding `shard_alive`. Allowed, it is charged to the owner's rate; refused, nothing
    /// is charged (so a player at a cap does not also use up its rate). The caps are
    /// checked first: the shard's, then the owner's.
    pub fn admit(
        &mut self,
        now: Duration,
        owner: EntityId,
        owner_alive: usize,
        shard_alive: usize,
    ) -> Result<(), SpawnRefusal> {
        let limits = self.limits;
        if shard_alive >= limits.per_shard {
            self.refusals.shard_full += 1;
            return Err(SpawnRefusal::ShardFull { limit: limits.per_shard });
        }
        if owner_alive >= limits.per_owner {
            self.refusals.owner_full += 1;
            return Err(SpawnRefusal::OwnerFull { limit: limits.per_owner });
        }
        if limits.rate.per_second == 0 || limits.rate.burst == 0 {
            self.refusals.too_fast += 1;
            let Rate { per_second, burst } = limits.rate;
            return Err(SpawnRefusal::TooFast { per_second, burst, retry_after_ms: u64::MAX });
        }
        let interval = limits.rate.interval();
        let window = interval.saturating_mul(limits.rate.burst);
        let bucket = self.buckets.entry(owner).or_insert(Bucket { full_at: now });
        let full_at = bucket.full_at.max(now);
        let after = full_at.saturating_add(interval);
        if after.saturating_sub(now) > window {
            self.refusals.too_fast += 1;
            let retry_after = after.saturating_sub(now).saturating_sub(window);
            return Err(SpawnRefusal::TooFast {
                per_second: limits.rate.per_second,
                burst: limits.rate.burst,
                retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
            });
        }
        bucket.full_at = after;
        Ok(())
    }

    /// Drops the buckets that are full again at `now`: a full bucket and no bucket are the
    /// same to [`SpawnBudget::admit`]. Call it now and then (a game's tick).
    pub fn forget_refilled(&mut self, now: Duration) {
        self.buckets.retain(|_, bucket| bucket.full_at > now);
    }

    /// Owners with a bucket that is not full.
    pub fn owners_spending(&self) -> usize {
        self.buckets.len()
    }

    pub fn refusals(&self) -> SpawnRefusals {
        self.refusals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANN: EntityId = EntityId(1);
    const BOB: EntityId = EntityId(2);

    fn budget() -> SpawnBudget {
        SpawnBudget::new(SpawnLimits {
            per_owner: 5,
            per_shard: 8,
            rate: Rate { per_second: 1, burst: 3 },
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_burst_then_the_rate() {
        let mut budget = budget();
        for alive in 0..3 {
            assert_eq!(budget.admit(ms(0), ANN, alive, alive), Ok(()), "burst {alive}");
        }
        let refused = budget.admit(ms(0), ANN, 3, 3);
        assert_eq!(
            refused,
            Err(SpawnRefusal::TooFast { per_second: 1, burst: 3, retry_after_ms: 1000 })
        );
        assert_eq!(budget.admit(ms(999), ANN, 3, 3).map_err(|_| ()), Err(()), "not yet");
        assert_eq!(budget.admit(ms(1000), ANN, 3, 3), Ok(()), "one token back after 1 s");
        assert_eq!(budget.admit(ms(1500), ANN, 4, 4).map_err(|_| ()), Err(()));
        assert_eq!(budget.refusals(), SpawnRefusals { too_fast: 3, ..Default::default() });
        // Another owner has a bucket of its own.
        assert_eq!(budget.admit(ms(1500), BOB, 0, 4), Ok(()));
    }

    #[test]
    fn the_caps_come_first_and_charge_nothing() {
        let mut budget = budget();
        assert_eq!(budget.admit(ms(0), ANN, 5, 5), Err(SpawnRefusal::OwnerFull { limit: 5 }));
        assert_eq!(budget.admit(ms(0), ANN, 0, 8), Err(SpawnRefusal::ShardFull { limit: 8 }));
        assert_eq!(budget.admit(ms(0), ANN, 5, 9), Err(SpawnRefusal::ShardFull { limit: 8 }));
        // None of those used a token: the whole burst is still there.
        for alive in 0..3 {
            assert_eq!(budget.admit(ms(0), ANN, alive, alive), Ok(()));
        }
        let refusals = budget.refusals();
        assert_eq!((refusals.owner_full, refusals.shard_full, refusals.too_fast), (1, 2, 0));
    }

    #[test]
    fn a_long_pause_refills_to_the_burst_and_no_further() {
        let mut budget = budget();
        assert_eq!(budget.admit(ms(0), ANN, 0, 0), Ok(()));
        let later = Duration::from_secs(3600);
        for alive in 0..3 {
            assert_eq!(budget.admit(later, ANN, alive, alive), Ok(()));
        }
        assert!(budget.admit(later, ANN, 3, 3).is_err(), "an hour saved up is still 3");
    }

    #[test]
    fn refilled_buckets_are_forgotten() {
        let mut budget = budget();
        budget.admit(ms(0), ANN, 0, 0).expect("allowed");
        budget.admit(ms(0), ANN, 1, 1).expect("allowed");
        budget.admit(ms(500), BOB, 0, 2).expect("allowed");
        assert_eq!(budget.owners_spending(), 2);
        budget.forget_refilled(ms(1500));
        assert_eq!(budget.owners_spending(), 1, "ann's two tokens are back at 2 s, bob's at 1.5");
        budget.forget_refilled(ms(2000));
        assert_eq!(budget.owners_spending(), 0);
        // Forgetting changes nothing for the next request.
        assert_eq!(budget.admit(ms(2000), ANN, 0, 0), Ok(()));
    }

    #[test]
    fn a_rate_of_zero_allows_nothing() {
        let mut budget = SpawnBudget::new(SpawnLimits {
            per_owner: 5,
            per_shard: 5,
            rate: Rate { per_second: 0, burst: 3 },
        });
        assert!(matches!(budget.admit(ms(0), ANN, 0, 0), Err(SpawnRefusal::TooFast { .. })));
    }
}
