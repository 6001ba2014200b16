//! What a shard remembers of every player in its world: versions, recent steps and
//! recent departures, from which divergent client views are brought forward (see `views`).
//!
//! Exact client views across a handoff.
//!
//! Within one shard a client's view is the world's: notifications are position diffs of one
//! consistent world. A handoff moves a player into another shard's world, whose copies of
//! the neighbours may be a little ahead of or behind the old owner's (their updates travel
//! on different streams). So for a while the new owner keeps what the player was told
//! (each neighbour's position and version) and derives the player's notifications from the
//! difference with its own world instead of from the world's own diffs: a neighbour the new
//! world has further along is replayed step by step from its recent history (no jumps); one
//! the new world has not caught up with is left alone until it has (no Left + Entered). Once
//! told and world agree, the player goes back to the normal path.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use meridian_world::{PlayerId, Position};

/// A state of a player: (ownership generation, position counter). Ordered.
pub type Version = (u64, u64);

/// Recent states kept per player, for replays.
pub(crate) const KEEP: usize = 32;
/// After this long a divergent view converges anyway (a neighbour that never catches up
/// is shown where this world has it).
pub(crate) const CONVERGE_LIMIT: Duration = Duration::from_secs(3);
/// How long the version of a player who left this world is remembered.
const REMOVED_LIFETIME: Duration = Duration::from_secs(60);
/// How long a player that left the world is listed, with where it left, for clients
/// handed over from here (see [`History::departed_near`]).
const DEPARTED_FOR: Duration = Duration::from_secs(5);
/// Departures listed at most; beyond this the oldest is dropped.
const DEPARTED_LIMIT: usize = 4096;

struct Recent {
    version: Version,
    steps: VecDeque<(Version, Position)>,
    /// The player left the world (at `version`); kept a while so a client told about an
    /// older state knows this world is not behind but past it.
    removed: Option<Instant>,
    /// The player's ghost was dropped here only because it went out of reach of this
    /// shard's region: it is still in the world, and this world simply no longer knows
    /// where. Its version then says nothing about what a client was told since.
    out_of_reach: bool,
}

/// The latest versions and recent positions of every player in this shard's world.
#[derive(Default)]
pub struct History {
    players: FxHashMap<PlayerId, Recent>,
    /// Players that left the world lately: where, at which version, since when. Oldest
    /// first.
    departed: VecDeque<(PlayerId, Position, Version, Instant)>,
}

impl History {
    pub fn record(&mut self, id: PlayerId, version: Version, at: Position) {
        let recent = self.players.entry(id).or_insert_with(|| Recent {
            version,
            steps: VecDeque::with_capacity(4),
            removed: None,
            out_of_reach: false,
        });
        if !recent.steps.is_empty() && version <= recent.version {
            return;
        }
        recent.removed = None;
        recent.out_of_reach = false;
        recent.version = version;
        if recent.steps.len() == KEEP {
            recent.steps.pop_front();
        }
        recent.steps.push_back((version, at));
    }

    /// The player's recorded steps, oldest first (the last is its newest state).
    pub fn steps(&self, id: PlayerId) -> impl Iterator<Item = (Version, Position)> + '_ {
        self.players.get(&id).into_iter().flat_map(|r| r.steps.iter().copied())
    }

    /// Records a step another shard's history had: in its place among the steps kept if it
    /// is older than the newest (a gap this world missed), as [`History::record`] if newer.
    pub fn fill(&mut self, id: PlayerId, version: Version, at: Position) {
        let Some(recent) = self.players.get_mut(&id).filter(|r| !r.steps.is_empty()) else {
            self.record(id, version, at);
            return;
        };
        if version > recent.version {
            self.record(id, version, at);
            return;
        }
        let place = recent.steps.partition_point(|(v, _)| *v < version);
        let known = recent.steps.get(place).is_some_and(|(v, _)| *v == version);
        if known || (place == 0 && recent.steps.len() == KEEP) {
            return;
        }
        recent.steps.insert(place, (version, at));
        if recent.steps.len() > KEEP {
            recent.steps.pop_front();
        }
    }

    /// The newest state of the player this world has had.
    pub fn version(&self, id: PlayerId) -> Option<Version> {
        self.players.get(&id).map(|r| r.version)
    }

    /// Whether this world's copy of the player was dropped only for being out of reach.
    pub(crate) fn out_of_reach(&self, id: PlayerId) -> bool {
        self.players.get(&id).is_some_and(|r| r.out_of_reach)
    }

    /// The player's copy left this world: it left the world itself (`left_world`), or only
    /// went out of this shard's reach. Its last version is remembered for a while.
    pub fn forget(&mut self, id: PlayerId, left_world: bool, now: Instant) {
        if let Some(recent) = self.players.get_mut(&id) {
            if let (true, Some(&(_, at))) = (left_world, recent.steps.back()) {
                if self.departed.len() == DEPARTED_LIMIT {
                    self.departed.pop_front();
                }
                self.departed.push_back((id, at, recent.version, now));
            }
            recent.removed = Some(now);
            recent.out_of_reach = !left_world;
            recent.steps.clear();
        }
    }

    /// Drops the memory of players gone for long.
    pub fn expire(&mut self, now: Instant) {
        self.players.retain(|_, r| {
            r.removed.is_none_or(|since| now.saturating_duration_since(since) < REMOVED_LIFETIME)
        });
        while self
            .departed
            .front()
            .is_some_and(|(.., since)| now.saturating_duration_since(*since) >= DEPARTED_FOR)
        {
            self.departed.pop_front();
        }
    }

    /// Players that left the world lately within `range` cells of `at` (and have not come
    /// back): where they left and their last version. A client handed over from here was
    /// told they left; the new owner may not have removed them yet.
    pub fn departed_near(
        &self,
        at: Position,
        range: u32,
    ) -> impl Iterator<Item = (PlayerId, Position, Version)> + '_ {
        self.departed
            .iter()
            .filter(move |(_, left, ..)| {
                left.x.abs_diff(at.x) <= range && left.y.abs_diff(at.y) <= range
            })
            .filter(|(id, _, version, _)| {
                self.players.get(id).is_some_and(|r| {
                    r.removed.is_some() && !r.out_of_reach && r.version == *version
                })
            })
            .map(|&(id, left, version, _)| (id, left, version))
    }

    /// The player's recent walk from where it came into sight (by `sees`) to where it is,
    /// if the history holds a continuous walk from out of sight. `None` otherwise.
    pub(crate) fn walk_into_sight(
        &self,
        id: PlayerId,
        sees: impl Fn(Position) -> bool,
    ) -> Option<Vec<Position>> {
        let recent = self.players.get(&id)?;
        let mut steps: Vec<Position> = recent.steps.iter().map(|(_, at)| *at).collect();
        // A state can repeat a position (a handoff, a refreshed ghost): not a step.
        steps.dedup();
        let outside = steps.iter().rposition(|at| !sees(*at))?;
        let walk = &steps[outside..];
        let continuous =
            walk.windows(2).all(|w| w[0].x.abs_diff(w[1].x) + w[0].y.abs_diff(w[1].y) <= 1);
        (continuous && walk.len() > 1).then(|| walk[1..].to_vec())
    }

    /// Positions after `from`, oldest first (the last is the current one), if they form a
    /// continuous walk from `start` (the position the client has for `from`): one cell per
    /// step. `None` if they do not (the history has a gap, or does not reach back): no
    /// replay is possible then.
    pub(crate) fn steps_after(
        &self,
        id: PlayerId,
        from: Version,
        start: Position,
    ) -> Option<Vec<Position>> {
        let recent = self.players.get(&id)?;
        let steps: Vec<Position> =
            recent.steps.iter().filter(|(v, _)| *v > from).map(|(_, at)| *at).collect();
        let mut last = start;
        for step in &steps {
            if last.x.abs_diff(step.x) + last.y.abs_diff(step.y) > 1 {
                return None;
            }
            last = *step;
        }
        Some(steps)
    }
}

/// What one client has been told about one neighbour.
#[derive(Debug, Clone, Copy)]
pub struct Told {
    pub at: Position,
    pub version: Version,
    /// In the client's view; false for a neighbour just out of sight (see `ViewEntry.seen`).
    pub seen: bool,
    /// The client was told this neighbour left the world, at `version` (see
    /// `ViewEntry.gone`).
    pub gone: bool,
}

/// A client whose view is derived from its told state until it matches the world.
pub struct Divergent {
    pub told: FxHashMap<PlayerId, Told>,
    pub since: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PlayerId = PlayerId(7);

    fn at(x: u32, y: u32) -> Position {
        Position { x, y }
    }

    #[test]
    fn a_player_that_left_the_world_is_known_gone_at_its_last_version() {
        let mut history = History::default();
        history.record(P, (1, 5), at(10, 10));
        history.forget(P, true, Instant::now());
        assert!(!history.out_of_reach(P));
        assert_eq!(history.version(P), Some((1, 5)));
        assert_eq!(history.steps_after(P, (1, 4), at(10, 10)), Some(vec![]));
    }

    #[test]
    fn players_that_left_the_world_lately_are_listed_near_where_they_left() {
        // A client handed over right after it was told Left takes that with it: the new
        // owner may not have removed the player yet.
        let mut history = History::default();
        history.record(P, (2, 5), at(10, 10));
        history.record(PlayerId(8), (1, 3), at(90, 90));
        history.record(PlayerId(9), (1, 4), at(12, 12));
        history.forget(P, true, Instant::now());
        history.forget(PlayerId(8), true, Instant::now());
        history.forget(PlayerId(9), false, Instant::now());
        let near: Vec<_> = history.departed_near(at(15, 15), 5).collect();
        assert_eq!(near, vec![(P, at(10, 10), (2, 5))], "far, or only out of reach: not listed");
        // Back in the world (a resume): no longer gone.
        history.record(P, (3, 0), at(10, 11));
        assert_eq!(history.departed_near(at(15, 15), 5).count(), 0);
    }

    #[test]
    fn a_ghost_dropped_out_of_reach_is_unknown_not_gone() {
        // Its owner stopped updating this shard; a client told about a newer state must
        // wait for the ghost to come back instead of being told the player left.
        let mut history = History::default();
        history.record(P, (1, 5), at(10, 10));
        history.forget(P, false, Instant::now());
        assert!(history.out_of_reach(P));
        assert_eq!(history.version(P), Some((1, 5)));
        history.record(P, (1, 9), at(12, 11));
        assert!(!history.out_of_reach(P));
        assert_eq!(history.version(P), Some((1, 9)));
    }

    #[test]
    fn a_walk_into_sight_starts_where_it_entered() {
        let mut history = History::default();
        for (seq, x) in [(1, 30), (2, 29), (3, 28), (4, 27), (5, 27)] {
            history.record(P, (1, seq), at(x, 10));
        }
        let sees = |p: Position| p.x <= 28;
        assert_eq!(history.walk_into_sight(P, sees), Some(vec![at(28, 10), at(27, 10)]));
        // Always in sight as far as the history goes back: nothing to replay.
        assert_eq!(history.walk_into_sight(P, |_| true), None);
    }

    #[test]
    fn steps_from_another_history_fill_the_gaps_of_this_one() {
        // This world missed (1, 2) and (1, 3): they travelled on a stream that lagged, and
        // a newer state came first.
        let mut history = History::default();
        history.record(P, (1, 1), at(10, 10));
        history.record(P, (2, 3), at(12, 10));
        assert_eq!(history.steps_after(P, (1, 1), at(10, 10)), None, "a gap: no replay");
        for (version, x) in [((1, 1), 10), ((1, 2), 11), ((1, 3), 12), ((2, 3), 12)] {
            history.fill(P, version, at(x, 10));
        }
        assert_eq!(
            history.steps_after(P, (1, 1), at(10, 10)),
            Some(vec![at(11, 10), at(12, 10), at(12, 10)])
        );
        assert_eq!(history.version(P), Some((2, 3)), "the newest state stays the newest");
        history.fill(P, (2, 4), at(13, 10));
        assert_eq!(history.version(P), Some((2, 4)), "a newer one is recorded");
    }

    #[test]
    fn replays_only_continuous_walks() {
        let mut history = History::default();
        for (seq, x) in [(1, 10), (2, 11), (3, 12)] {
            history.record(P, (1, seq), at(x, 10));
        }
        assert_eq!(history.steps_after(P, (1, 1), at(10, 10)), Some(vec![at(11, 10), at(12, 10)]));
        assert_eq!(history.steps_after(P, (1, 1), at(5, 10)), None);
        // Versions never go back.
        history.record(P, (1, 2), at(40, 40));
        assert_eq!(history.version(P), Some((1, 3)));
    }
}
