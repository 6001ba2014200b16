//! Flags: a player plants a flag with a text on its cell (PLANT), and uproots its own
//! (UPROOT). A flag is a **persistent** NPC of kind [`FLAG`]: saved in the store by the
//! shard that owns its cell, brought back after that shard dies or the cluster restarts,
//! until its planter uproots it. Its public state is its text; its private state its
//! planter ([`planter_state`]). It never moves, and wolves leave it alone (they count,
//! hunt and are attacked as wolves only).
//!
//! UPROOT is an action on the flag, so it runs on the shard that owns the flag, where
//! the uprooter may be a copy of a neighbour's player: the planter check reads the flag's
//! private state there, the distance is measured there, and that shard writes the count.
//! It then tells the uprooter's own shard (a game message) that its cached count is stale.
//!
//! A player has at most [`FLAGS_PER_PLAYER`] flags standing. How many it has is kept in
//! the game's key-value space (`flag_count.rs`, key `flags/<player id>`): the store's
//! count is the truth, changed only by compare-and-set, and this shard's [`FlagCounts`]
//! is its cache, read (again) when a player joins or arrives. What that guarantees:
//!
//! - Every plant and uproot a shard makes reaches the store's count exactly once, however
//!   many shards write it at once: a write expects the version the shard last saw, and a
//!   conflict re-bases it on the entry as it is.
//! - A PLANT is checked against the shard's view (the count as last read or written here,
//!   plus its own changes not yet written). So a player planting on two shards at once
//!   (right as it crosses a border, the new shard reading the count before the old one's
//!   writes land) can go past the limit by what the old shard had not yet written (a
//!   flag, at most a few); the count still counts them all, and the player plants no more
//!   until it has uprooted below the limit again.
//! - A change not yet written when its shard dies (the few milliseconds between a plant or
//!   an uproot and the store taking the write) is lost with it: the count is then one
//!   short (one plant too many allowed) or one over (a place lost until an uproot).
//! - Until its count is read on a shard (a store round trip after joining or crossing a
//!   border), a player's PLANT is refused with "loading; try again".

use std::fmt;

use meridian_game::{Context, EntityId, GameError, KvAnswer, KvTicket, Position, Reply};

use crate::flag_count::{count_key, CountRefusal, CountRequest, FlagCounts};
use crate::{chebyshev, FLAG};

/// The longest text a flag carries, in bytes.
pub const FLAG_TEXT_MAX: usize = 64;
/// Flags one player may have standing.
pub const FLAGS_PER_PLAYER: u64 = 5;

/// A game message to a player's owner: a flag of its was uprooted on another shard, so
/// the count cached there is stale.
pub(crate) const MSG_FLAG_UPROOTED: u32 = 3;

/// Why a PLANT or an UPROOT was refused; its text is the `REJECTED` detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagRefusal {
    /// The text is over [`FLAG_TEXT_MAX`] bytes (this many).
    TextTooLong(usize),
    NotUtf8,
    /// This shard has no store: a flag could not outlive it.
    NoStore,
    /// The planter is not where this shard can plant (it is being handed off).
    NotHere,
    /// A flag stands on the cell already.
    CellTaken,
    /// The planter's count is not known here yet: it is being read.
    Loading,
    /// The planter has [`FLAGS_PER_PLAYER`] flags standing.
    TooMany,
    /// The shard would not spawn the flag.
    Spawn(GameError),
    /// UPROOT with no target, or one out of sight.
    NoTarget,
    NotAFlag,
    /// The flag was planted by someone else.
    NotYours,
    /// The uprooter is not in the flag's shard's sight.
    Unseen,
    /// More than one cell away.
    TooFar,
    /// The shard would not remove the flag.
    Despawn(GameError),
}

impl fmt::Display for FlagRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlagRefusal::TextTooLong(n) => {
                write!(f, "no flag: the text is {n} bytes, the most is {FLAG_TEXT_MAX}")
            }
            FlagRefusal::NotUtf8 => write!(f, "no flag: the text is not UTF-8"),
            FlagRefusal::NoStore => write!(f, "no flag: this shard has no store to keep flags in"),
            FlagRefusal::NotHere => write!(f, "no flag: your cell is not on this shard yet"),
            FlagRefusal::CellTaken => write!(f, "no flag: a flag stands on this cell already"),
            FlagRefusal::Loading => write!(f, "no flag: your flag count is loading; try again"),
            FlagRefusal::TooMany => write!(
                f,
                "no flag: you have {FLAGS_PER_PLAYER} planted already, the most one player may have"
            ),
            FlagRefusal::Spawn(error) => write!(f, "no flag: {error}"),
            FlagRefusal::NoTarget => write!(f, "uproot what? (target a flag next to you)"),
            FlagRefusal::NotAFlag => write!(f, "only flags can be uprooted"),
            FlagRefusal::NotYours => write!(f, "not your flag: only its planter may uproot it"),
            FlagRefusal::Unseen => write!(f, "the uprooter is out of the flag's sight"),
            FlagRefusal::TooFar => write!(f, "too far: stand next to the flag"),
            FlagRefusal::Despawn(error) => write!(f, "cannot uproot: {error}"),
        }
    }
}

impl From<FlagRefusal> for Reply {
    fn from(refusal: FlagRefusal) -> Reply {
        Reply::Rejected(refusal.to_string())
    }
}

/// A flag's text from a PLANT's payload: UTF-8, at most [`FLAG_TEXT_MAX`] bytes (empty
/// is allowed).
pub fn flag_text(payload: &[u8]) -> Result<&str, FlagRefusal> {
    if payload.len() > FLAG_TEXT_MAX {
        return Err(FlagRefusal::TextTooLong(payload.len()));
    }
    std::str::from_utf8(payload).map_err(|_| FlagRefusal::NotUtf8)
}

/// A flag's private state: its planter's id, 8 bytes little-endian.
pub fn planter_state(planter: EntityId) -> Vec<u8> {
    planter.0.to_le_bytes().to_vec()
}

/// The planter a flag's private state names, if it names one.
pub fn planter(private: &[u8]) -> Option<EntityId> {
    let bytes: [u8; 8] = private.try_into().ok()?;
    Some(EntityId(u64::from_le_bytes(bytes))).filter(|id| id.0 != 0)
}

/// A shard's part of the flags: the counts it caches, and whether it found it has no
/// store (then it asks the store nothing more).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    counts: FlagCounts,
    no_store: bool,
}

impl Flags {
    pub fn new() -> Flags {
        Flags::default()
    }

    /// The counts this shard caches.
    pub fn counts(&self) -> &FlagCounts {
        &self.counts
    }

    /// A player joined or arrived: its count is read (again: it may have changed while
    /// the player was elsewhere).
    pub fn count_wanted(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        if self.no_store {
            return;
        }
        self.counts.of(player).refresh();
        self.pump(ctx, player);
    }

    /// A flag of `player` was uprooted on another shard: the count cached here is stale.
    pub fn uprooted_elsewhere(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        self.count_wanted(ctx, player);
    }

    /// The store's answer to a count's request.
    pub fn kv_answer(&mut self, ctx: &mut Context<'_>, ticket: KvTicket, answer: &KvAnswer) {
        if let Some(player) = self.counts.answered(ctx.now(), ticket, answer) {
            self.pump(ctx, player);
        }
    }

    /// Every game tick: requests that wait for a retry go out, and the idle counts of
    /// players not owned here are forgotten.
    pub fn tick(&mut self, ctx: &mut Context<'_>) {
        if self.no_store {
            return;
        }
        self.counts.forget_idle(|p| ctx.entity(p).is_some_and(|e| e.owned && e.is_player()));
        for player in self.counts.due(ctx.now()) {
            self.pump(ctx, player);
        }
    }

    /// Makes the request `player`'s count has to make now, if any.
    fn pump(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        let now = ctx.now();
        let Some(request) = self.counts.poll(player, now) else { return };
        let key = count_key(player);
        let made = match request {
            CountRequest::Read => ctx.kv_get(&key),
            CountRequest::Write { value, expected } => {
                ctx.kv_set(&key, Some(&CountRequest::value_bytes(value)), Some(expected))
            }
        };
        match made {
            Ok(ticket) => self.counts.sent(player, ticket),
            Err(GameError::NoStore) => {
                // A shard's store does not come later: stop asking.
                self.no_store = true;
                self.counts = FlagCounts::new();
            }
            Err(_) => self.counts.not_sent(player, now),
        }
    }

    /// PLANT: a flag with the payload's text on the actor's cell.
    pub fn plant(&mut self, ctx: &mut Context<'_>, actor: EntityId, payload: &[u8]) -> Reply {
        match self.try_plant(ctx, actor, payload) {
            Ok(flag) => Reply::Done(flag.0.to_string().into_bytes()),
            Err(refusal) => refusal.into(),
        }
    }

    fn try_plant(
        &mut self,
        ctx: &mut Context<'_>,
        actor: EntityId,
        payload: &[u8],
    ) -> Result<EntityId, FlagRefusal> {
        let text = flag_text(payload)?;
        if self.counts.count(actor).is_none() && !self.no_store {
            // Not asked for yet (or forgotten): ask now, which also finds out whether
            // this shard has a store.
            self.count_wanted(ctx, actor);
        }
        if self.no_store {
            return Err(FlagRefusal::NoStore);
        }
        let at = ctx.position(actor).filter(|at| ctx.owns(*at)).ok_or(FlagRefusal::NotHere)?;
        if flag_at(ctx, at).is_some() {
            return Err(FlagRefusal::CellTaken);
        }
        match self.counts.of(actor).admit(FLAGS_PER_PLAYER) {
            Ok(()) => {}
            Err(CountRefusal::Loading) => return Err(FlagRefusal::Loading),
            Err(CountRefusal::TooMany { .. }) => {
                // Flags of the player's may have been uprooted elsewhere: read again,
                // so that the next try sees it.
                self.count_wanted(ctx, actor);
                return Err(FlagRefusal::TooMany);
            }
        }
        // Spawned, given its planter, then made persistent: its first save has it all.
        let flag = ctx.spawn(FLAG, "flag", at, text.as_bytes().to_vec());
        let flag = flag.map_err(FlagRefusal::Spawn)?;
        let persisted =
            ctx.set_private_state(flag, planter_state(actor)).and_then(|()| ctx.persist(flag));
        if let Err(error) = persisted {
            let _ = ctx.despawn(flag);
            return Err(match error {
                GameError::NoStore => FlagRefusal::NoStore,
                error => FlagRefusal::Spawn(error),
            });
        }
        self.counts.of(actor).planted();
        self.pump(ctx, actor);
        Ok(flag)
    }

    /// UPROOT: the actor's flag `target`, next to it, goes. Runs on the flag's shard; the
    /// actor may be a copy of a neighbour's player here.
    pub fn uproot(
        &mut self,
        ctx: &mut Context<'_>,
        actor: EntityId,
        target: Option<EntityId>,
    ) -> Reply {
        match self.try_uproot(ctx, actor, target) {
            Ok(()) => Reply::done(),
            Err(refusal) => refusal.into(),
        }
    }

    fn try_uproot(
        &mut self,
        ctx: &mut Context<'_>,
        actor: EntityId,
        target: Option<EntityId>,
    ) -> Result<(), FlagRefusal> {
        let flag = target.and_then(|t| ctx.entity(t)).ok_or(FlagRefusal::NoTarget)?;
        if flag.kind != FLAG {
            return Err(FlagRefusal::NotAFlag);
        }
        if planter(ctx.private_state(flag.id).unwrap_or_default()) != Some(actor) {
            return Err(FlagRefusal::NotYours);
        }
        let from = ctx.position(actor).ok_or(FlagRefusal::Unseen)?;
        if chebyshev(from, flag.position) > 1 {
            return Err(FlagRefusal::TooFar);
        }
        ctx.despawn(flag.id).map_err(FlagRefusal::Despawn)?;
        if !self.no_store {
            self.counts.of(actor).uprooted();
            self.pump(ctx, actor);
        }
        if ctx.entity(actor).is_some_and(|e| !e.owned) {
            ctx.send(actor, flag.id, MSG_FLAG_UPROOTED, b"");
        }
        Ok(())
    }
}

/// The flag standing on `at`, if one does.
fn flag_at(ctx: &Context<'_>, at: Position) -> Option<EntityId> {
    ctx.within(at, 0)
        .into_iter()
        .filter_map(|id| ctx.entity(id))
        .find(|e| e.kind == FLAG && e.position == at)
        .map(|e| e.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_text_is_short_utf8() {
        assert_eq!(flag_text(b""), Ok(""));
        assert_eq!(flag_text("héllo".as_bytes()), Ok("héllo"));
        assert_eq!(flag_text(&[b'a'; FLAG_TEXT_MAX]).map(str::len), Ok(FLAG_TEXT_MAX));
        assert_eq!(flag_text(&[b'a'; FLAG_TEXT_MAX + 1]), Err(FlagRefusal::TextTooLong(65)));
        assert_eq!(flag_text(&[0xff, 0xfe]), Err(FlagRefusal::NotUtf8));
        assert_eq!(
            FlagRefusal::TextTooLong(65).to_string(),
            "no flag: the text is 65 bytes, the most is 64"
        );
    }

    #[test]
    fn a_planter_survives_its_bytes() {
        assert_eq!(planter(&planter_state(EntityId(17))), Some(EntityId(17)));
        assert_eq!(planter(&planter_state(EntityId(u64::MAX))), Some(EntityId(u64::MAX)));
        assert_eq!(planter(b""), None, "no planter: nobody's flag");
        assert_eq!(planter(&[0; 8]), None);
        assert_eq!(planter(&[1; 9]), None);
    }
}
