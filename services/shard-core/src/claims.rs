//! One account, one player. Two logins of one account can race to two shards: each
//! gateway asked every shard for the player, none held it yet, and each placed its login
//! (a new account, say, whose two devices connect at once). Both are seated. So every
//! shard that seats a login tells every other shard (`Claim`, with the login's
//! `Join.login_stamp`: the gateway's Unix milliseconds and id), and a
//! shard holding an older login of the same player ends it: its connection is told
//! `REPLACED` and closed, its player leaves the world (observers see `Left`), as when the
//! account logs in again on the same shard. The later login wins everywhere, whichever
//! claim arrives first.
//!
//! A claim is remembered for [`CLAIM_MEMORY`], so an older login that reaches a shard
//! after the newer one's claim (handed off, or placed late) leaves on arrival. Owned by
//! `ShardCore`, which sends claims when it seats a login and hands received ones here
//! (`players.rs`: `claim`, `on_claim`).

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use meridian_world::PlayerId;

/// How long a claim is remembered.
pub const CLAIM_MEMORY: Duration = Duration::from_secs(10);
/// Claims remembered at most; past it the ones older than [`CLAIM_MEMORY`] are dropped.
const MAX_CLAIMS: usize = 65_536;

/// A login's stamp (`Join.login_stamp`): the later the newer. Only stamps are compared:
/// the session of one login changes when it resumes. Two logins with one stamp (the same
/// millisecond on the same gateway) beat neither (the shard they meet on keeps the later
/// arrival, see `players.rs`); 0 is unknown (a copy restored or resumed without one).
pub(crate) type Login = u64;

#[derive(Default)]
pub(crate) struct Claims {
    seen: FxHashMap<PlayerId, (Login, Instant)>,
}

impl Claims {
    /// Another shard seated `login` of `player` at `now`.
    pub fn record(&mut self, player: PlayerId, login: Login, now: Instant) {
        if self.seen.len() >= MAX_CLAIMS {
            self.seen.retain(|_, (_, at)| now.saturating_duration_since(*at) < CLAIM_MEMORY);
        }
        let entry = self.seen.entry(player).or_insert((login, now));
        if login >= entry.0 {
            *entry = (login, now);
        }
    }

    /// Whether a newer login of `player` than `login` was claimed lately. A login of
    /// unknown stamp (0: a copy restored or resumed without one) is never beaten: it is the
    /// player's own session going on, not a racing login.
    pub fn beaten(&self, player: PlayerId, login: Login, now: Instant) -> bool {
        login != 0
            && self.seen.get(&player).is_some_and(|(newer, at)| {
                *newer > login && now.saturating_duration_since(*at) < CLAIM_MEMORY
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_later_login_beats_the_earlier_for_a_while() {
        let mut claims = Claims::default();
        let now = Instant::now();
        let player = PlayerId(7);
        claims.record(player, 200, now);
        assert!(claims.beaten(player, 100, now), "an earlier stamp is beaten");
        assert!(!claims.beaten(player, 200, now), "the claimed login itself stands, resumed too");
        assert!(!claims.beaten(player, 300, now), "a later login stands");
        assert!(!claims.beaten(PlayerId(8), 1, now), "another player");
        claims.record(player, 150, now);
        assert!(claims.beaten(player, 160, now), "an older claim does not lower it");
        assert!(!claims.beaten(player, 100, now + CLAIM_MEMORY), "forgotten after a while");
        assert!(!claims.beaten(player, 0, now), "a copy of unknown stamp is never beaten");
    }
}
