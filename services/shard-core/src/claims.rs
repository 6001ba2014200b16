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
//! `ShardCore`, which sends claims when it seats a login and hands received ones here.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tracing::info;

use meridian_rpc::pb::{peer_message::Kind as Peer, Claim, PeerMessage};
use meridian_world::PlayerId;

use crate::core::ShardCore;
use crate::types::LinkId;

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

impl ShardCore {
    /// Tells every other shard of the login seated here for `player`.
    pub(crate) fn claim(&mut self, player: PlayerId) {
        let Some(seat) = self.roster.seat(player) else { return };
        let (login_stamp, session) = seat.login;
        let generation = seat.generation;
        for to in self.peers.others() {
            let message = PeerMessage {
                player_id: player.0,
                generation,
                subject_seq: 0,
                kind: Some(Peer::Claim(Claim { login_stamp, session })),
            };
            self.peer_out.push(to, message);
        }
    }

    /// Another shard seated a login of `player`: an older one here ends.
    pub(crate) fn on_claim(&mut self, player: PlayerId, claim: Claim) {
        let login = claim.login_stamp;
        self.claims.record(player, login, self.now);
        // (A seat of unknown stamp is a session going on, not a racing login: see `beaten`.)
        let older_here = self
            .roster
            .seat(player)
            .is_some_and(|seat| !seat.npc && seat.login.0 != 0 && seat.login.0 < login);
        if older_here {
            self.replace_older(player);
        }
    }

    /// Refuses a login that arrives after a newer login of its account was seated (here, or
    /// claimed by another shard): `REPLACED`, closed.
    pub(crate) fn refuse_older_login(&mut self, link: LinkId, session: u64) {
        self.tell_replaced(link, session);
        self.outbox.close(link, session);
        self.metrics.logins_replaced.inc();
    }

    /// Ends the older of two logins of `player`, seated here: `REPLACED`, closed, gone.
    pub(crate) fn replace_older(&mut self, player: PlayerId) {
        let Some(seat) = self.roster.seat(player) else { return };
        let (link, session) = (seat.link, seat.session);
        info!(%player, "a newer login of this account is seated on another shard; ending this one");
        self.remove(player, false);
        self.tell_replaced(link, session);
        self.outbox.close(link, session);
        self.metrics.logins_replaced.inc();
        self.route_envelopes();
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
