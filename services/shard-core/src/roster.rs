//! Who is here: the seats of the players and NPCs owned by this shard, the players parked
//! after their connection dropped (kept for the resume window), the clients just handed
//! in whose view is still derived from what they were told, and the resume tokens that
//! take a player back (the keys that sign them, and the nonce the resume being answered
//! came with).
//!
//! A part of the core: `ShardCore` composes it and alone calls it; it imports no other
//! part. Joining, leaving and handing off, which also touch the world, the ghosts and the
//! outbox, are `ShardCore`'s (`players.rs`, `handover.rs`, `resume.rs`), done through these methods.

use std::time::{Duration, Instant};

use meridian_protocol::{TokenError, TokenKeys};
use meridian_world::PlayerId;
use rand::Rng;
use rustc_hash::FxHashMap;

use crate::history::Divergent;
use crate::types::{LinkId, Parked, Seat};

/// What a resume token says about a player this shard may hold (see
/// [`Roster::check_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenCheck {
    /// The player is neither seated (as a player) nor parked here: nothing to say.
    NotHeld,
    /// Genuine, for this player, and its current (or previous) token.
    TakesBack,
    /// Held here, but the token does not take it back, for this reason (the label of
    /// `meridian_shard_resume_tokens_refused_total`).
    Refused(&'static str),
}

pub(crate) struct Roster {
    seats: FxHashMap<PlayerId, Seat>,
    parked: FxHashMap<PlayerId, Parked>,
    /// Clients just handed in whose view is still derived from what they were told.
    divergent: FxHashMap<PlayerId, Divergent>,
    /// Counts seats made, taken away and moved to another link (see `routes.rs`, whose
    /// entries it voids). A seat's `link` and `session` change only through this file.
    version: u64,
    resume_keys: TokenKeys,
    resume_window: Duration,
    /// The nonce of the token the resume being answered came with (see
    /// `Seat::resume_previous`).
    resumed_with: Option<u64>,
}

impl Roster {
    pub(crate) fn new(resume_keys: TokenKeys, resume_window: Duration) -> Roster {
        Roster {
            seats: FxHashMap::default(),
            parked: FxHashMap::default(),
            divergent: FxHashMap::default(),
            version: 0,
            resume_keys,
            resume_window,
            resumed_with: None,
        }
    }

    // Seats.

    pub(crate) fn seat(&self, player: PlayerId) -> Option<&Seat> {
        self.seats.get(&player)
    }

    pub(crate) fn seat_mut(&mut self, player: PlayerId) -> Option<&mut Seat> {
        self.seats.get_mut(&player)
    }

    pub(crate) fn is_seated(&self, player: PlayerId) -> bool {
        self.seats.contains_key(&player)
    }

    /// Seats `player` (replacing a seat it had).
    pub(crate) fn insert_seat(&mut self, player: PlayerId, seat: Seat) {
        self.seats.insert(player, seat);
        self.version += 1;
    }

    /// Moves `player`'s seat to `link` of `gateway` (the same session over a new stream).
    pub(crate) fn relink(&mut self, player: PlayerId, link: LinkId, gateway: u32) {
        if let Some(seat) = self.seats.get_mut(&player) {
            seat.link = link;
            seat.gateway = gateway;
            self.version += 1;
        }
    }

    /// Changes whenever a seat is made, taken away or moved to another link.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Takes `player`'s seat away (it leaves, or is handed off).
    pub(crate) fn unseat(&mut self, player: PlayerId) -> Option<Seat> {
        self.version += 1;
        self.seats.remove(&player)
    }

    /// How many are seated, NPCs included.
    pub(crate) fn n_seated(&self) -> usize {
        self.seats.len()
    }

    /// The seated players and NPCs, in the map's order.
    pub(crate) fn seated(&self) -> Vec<PlayerId> {
        self.seats.keys().copied().collect()
    }

    /// The seated players (not NPCs), in the map's order.
    pub(crate) fn seated_players(&self) -> Vec<PlayerId> {
        self.seats.iter().filter(|(_, s)| !s.npc).map(|(p, _)| *p).collect()
    }

    /// The players seated on `link`.
    pub(crate) fn seated_on(&self, link: LinkId) -> Vec<PlayerId> {
        self.seats.iter().filter(|(_, seat)| seat.link == link).map(|(id, _)| *id).collect()
    }

    /// The seats whose `keep` holds, in the map's order.
    pub(crate) fn seated_where(&self, keep: impl Fn(&Seat) -> bool) -> Vec<PlayerId> {
        self.seats.iter().filter(|(_, seat)| keep(seat)).map(|(id, _)| *id).collect()
    }

    /// Every seat, read-only, for the parts and reports that look over all of them.
    pub(crate) fn seats(&self) -> &FxHashMap<PlayerId, Seat> {
        &self.seats
    }

    /// `peer` holds no ghost of anyone here any more: the players that were mirrored
    /// there (and are to be mirrored again).
    pub(crate) fn forget_holder(&mut self, peer: meridian_cluster::ShardId) -> Vec<PlayerId> {
        self.seats
            .iter_mut()
            .filter_map(|(player, seat)| {
                let before = seat.ghosted_at.len();
                seat.ghosted_at.retain(|s| *s != peer);
                (seat.ghosted_at.len() != before).then_some(*player)
            })
            .collect()
    }

    // Parked players.

    pub(crate) fn park(&mut self, player: PlayerId, parked: Parked) {
        self.parked.insert(player, parked);
    }

    /// Takes `player` out of the parked ones (it is back, or removed).
    pub(crate) fn take_parked(&mut self, player: PlayerId) -> Option<Parked> {
        self.parked.remove(&player)
    }

    pub(crate) fn parked_mut(&mut self, player: PlayerId) -> Option<&mut Parked> {
        self.parked.get_mut(&player)
    }

    #[cfg(test)]
    pub(crate) fn parked(&self, player: PlayerId) -> Option<&Parked> {
        self.parked.get(&player)
    }

    pub(crate) fn n_parked(&self) -> usize {
        self.parked.len()
    }

    /// Whether a player parked since `since` may still resume at `now`.
    pub(crate) fn within_resume_window(&self, since: Instant, now: Instant) -> bool {
        now.saturating_duration_since(since) <= self.resume_window
    }

    /// Forgets the players parked longer than the resume window.
    pub(crate) fn expire_parked(&mut self, now: Instant) {
        let window = self.resume_window;
        self.parked.retain(|_, p| now - p.since <= window);
    }

    // Divergent views.

    pub(crate) fn divergent(&self, player: PlayerId) -> Option<&Divergent> {
        self.divergent.get(&player)
    }

    /// Whether any client's view is divergent (checked before per-notification lookups:
    /// most rounds have no client mid-handoff).
    pub(crate) fn any_divergent(&self) -> bool {
        !self.divergent.is_empty()
    }

    pub(crate) fn divergent_players(&self) -> Vec<PlayerId> {
        self.divergent.keys().copied().collect()
    }

    pub(crate) fn set_divergent(&mut self, player: PlayerId, divergent: Divergent) {
        self.divergent.insert(player, divergent);
    }

    /// Takes `player`'s divergent view away (its view starts over, or is brought forward).
    pub(crate) fn take_divergent(&mut self, player: PlayerId) -> Option<Divergent> {
        self.divergent.remove(&player)
    }

    pub(crate) fn n_divergent(&self) -> usize {
        self.divergent.len()
    }

    // Resume tokens.

    /// A resume token for `player` with `nonce`.
    pub(crate) fn mint_token(&self, player: PlayerId, nonce: u64) -> Vec<u8> {
        self.resume_keys.mint(player.0, nonce)
    }

    /// Whether `token` takes `player` back from here: genuine, for that player, and the
    /// one token issued last to the player this shard holds (seated, or parked). On
    /// success the token's nonce is kept as the one the resume came with.
    pub(crate) fn check_token(&mut self, player: PlayerId, token: &[u8]) -> TokenCheck {
        let held = match (self.seats.get(&player), self.parked.get(&player)) {
            (Some(seat), _) if !seat.npc => Some((seat.resume_nonce, seat.resume_previous)),
            (_, Some(parked)) => Some((parked.resume_nonce, parked.resume_previous)),
            _ => None,
        };
        let Some((current, previous)) = held else { return TokenCheck::NotHeld };
        let reason = match self.resume_keys.verify(token) {
            Ok(token)
                if token.player_id == player.0
                    && (token.nonce == current || Some(token.nonce) == previous) =>
            {
                self.resumed_with = Some(token.nonce);
                return TokenCheck::TakesBack;
            }
            Ok(token) if token.player_id == player.0 => "spent",
            Ok(_) => "other player",
            Err(TokenError::UnknownKey) => "unknown key",
            Err(_) => "forged",
        };
        TokenCheck::Refused(reason)
    }

    /// A resume is being answered: no token has taken anyone back yet.
    pub(crate) fn forget_resumed_with(&mut self) {
        self.resumed_with = None;
    }

    /// The nonce of the token the resume being answered came with, taken (once).
    pub(crate) fn take_resumed_with(&mut self) -> Option<u64> {
        self.resumed_with.take()
    }

    #[cfg(test)]
    pub(crate) fn resume_keys(&self) -> &TokenKeys {
        &self.resume_keys
    }

    #[cfg(test)]
    pub(crate) fn set_resume_keys(&mut self, keys: TokenKeys) {
        self.resume_keys = keys;
    }

    /// Forgets everyone: the shard starts a new life (see `ShardCore::after_lease_expiry`).
    pub(crate) fn clear(&mut self) {
        self.version += 1;
        self.seats.clear();
        self.parked.clear();
        self.divergent.clear();
    }
}

/// A nonce for a fresh resume token: any but the one a player holds (nonces are compared
/// per player, so a repeat across players is harmless). Drawn from the core's seeded
/// generator, so that spawn cells and nonces keep one sequence.
pub(crate) fn fresh_nonce(rng: &mut impl Rng) -> u64 {
    rng.random::<u64>().max(1)
}

#[cfg(test)]
#[path = "roster_tests.rs"]
mod tests;
