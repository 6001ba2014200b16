//! What one bot sees of the entities of one kind (the wolves of the example game), so that
//! its actions can aim at the nearest one.
//!
//! Only `--actions-per-second` uses it. It is fed from `Entered`, `Moved`, `Left` and
//! `ViewReset` as the reader decodes them and read by the writer when an action is due; it
//! keeps a small vector with room reserved up front, so following the view allocates
//! nothing per message once the bot has seen its usual crowd.

/// Room reserved for tracked entities; a bot sees a few dozen NPCs at most in the example.
const RESERVED: usize = 64;

/// The entities of one kind in a bot's sight, and the bot's own cell.
#[derive(Debug)]
pub struct Sight {
    kind: u32,
    me: Option<(u32, u32)>,
    /// `(entity id, x, y)`, in no particular order.
    tracked: Vec<(u64, u32, u32)>,
}

impl Sight {
    /// Tracks the entities whose `Entered.kind` is `kind`.
    pub fn new(kind: u32) -> Sight {
        Sight { kind, me: None, tracked: Vec::with_capacity(RESERVED) }
    }

    /// The bot's own cell (from `LoginOk`, its own acks, `ViewReset`).
    pub fn set_me(&mut self, at: (u32, u32)) {
        self.me = Some(at);
    }

    /// An entity came into sight: tracked if it is of the kind, else forgotten (ids are
    /// never reused, but a stale entry must not survive a kind it no longer has).
    pub fn entered(&mut self, id: u64, kind: u32, at: (u32, u32)) {
        let index = self.tracked.iter().position(|&(tracked, _, _)| tracked == id);
        match (kind == self.kind, index) {
            (true, Some(i)) => self.tracked[i] = (id, at.0, at.1),
            (true, None) => self.tracked.push((id, at.0, at.1)),
            (false, Some(i)) => {
                self.tracked.swap_remove(i);
            }
            (false, None) => {}
        }
    }

    /// An entity in sight moved; entities not tracked are ignored.
    pub fn moved(&mut self, id: u64, at: (u32, u32)) {
        if let Some(entry) = self.tracked.iter_mut().find(|(tracked, _, _)| *tracked == id) {
            *entry = (id, at.0, at.1);
        }
    }

    /// An entity went out of sight (or died).
    pub fn left(&mut self, id: u64) {
        if let Some(i) = self.tracked.iter().position(|&(tracked, _, _)| tracked == id) {
            self.tracked.swap_remove(i);
        }
    }

    /// The view starts over (`ViewReset`): the `Entered` that follow rebuild it.
    pub fn reset(&mut self, me: Option<(u32, u32)>) {
        self.tracked.clear();
        if me.is_some() {
            self.me = me;
        }
    }

    /// The nearest tracked entity (Chebyshev distance, the sight's metric; ties to the
    /// lowest id) and its cell; `None` when none is in sight. With no own cell known yet,
    /// the lowest id.
    pub fn nearest_at(&self) -> Option<(u64, (u32, u32))> {
        let distance = |x: u32, y: u32| match self.me {
            Some((mx, my)) => mx.abs_diff(x).max(my.abs_diff(y)),
            None => 0,
        };
        self.tracked
            .iter()
            .map(|&(id, x, y)| (distance(x, y), id, (x, y)))
            .min()
            .map(|(_, id, at)| (id, at))
    }

    /// The bot's own cell, once known.
    pub fn me(&self) -> Option<(u32, u32)> {
        self.me
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Sight {
        /// The id [`Sight::nearest_at`] picks, 0 for none (the action's target).
        fn nearest(&self) -> u64 {
            self.nearest_at().map_or(0, |(id, _)| id)
        }

        fn len(&self) -> usize {
            self.tracked.len()
        }
    }

    const WOLF: u32 = 1;

    #[test]
    fn nothing_in_sight_aims_at_zero() {
        let mut sight = Sight::new(WOLF);
        assert_eq!(sight.nearest(), 0);
        sight.set_me((5, 5));
        sight.entered(7, 0, (5, 6));
        assert_eq!(sight.nearest(), 0, "a player (kind 0) is no target");
        assert_eq!(sight.len(), 0);
    }

    #[test]
    fn the_nearest_entity_of_the_kind_wins_and_follows_moves() {
        let mut sight = Sight::new(WOLF);
        sight.set_me((10, 10));
        sight.entered(100, WOLF, (14, 10));
        sight.entered(101, WOLF, (10, 12));
        sight.entered(102, 2, (10, 11));
        assert_eq!(sight.nearest(), 101, "2 cells away beats 4; kind 2 is not tracked");
        sight.moved(100, (11, 11));
        assert_eq!(sight.nearest(), 100, "the wolf that came closer");
        assert_eq!(sight.nearest_at(), Some((100, (11, 11))));
        sight.moved(999, (10, 10));
        assert_eq!(sight.nearest(), 100, "a move of an untracked entity changes nothing");
        sight.set_me((10, 13));
        assert_eq!(sight.nearest(), 101, "the bot moved");
        sight.left(101);
        assert_eq!(sight.nearest(), 100);
        sight.left(100);
        assert_eq!(sight.nearest(), 0);
    }

    #[test]
    fn ties_go_to_the_lowest_id_and_reentry_updates_in_place() {
        let mut sight = Sight::new(WOLF);
        sight.set_me((0, 0));
        sight.entered(9, WOLF, (1, 1));
        sight.entered(3, WOLF, (0, 1));
        assert_eq!(sight.nearest(), 3);
        sight.entered(9, WOLF, (0, 0));
        assert_eq!(sight.len(), 2, "entered twice is tracked once");
        assert_eq!(sight.nearest(), 9);
        sight.entered(9, 0, (0, 0));
        assert_eq!(sight.nearest(), 3, "an id seen with another kind is forgotten");
    }

    #[test]
    fn a_view_reset_forgets_everything_in_sight() {
        let mut sight = Sight::new(WOLF);
        sight.set_me((1, 1));
        sight.entered(5, WOLF, (2, 2));
        sight.reset(Some((50, 50)));
        assert_eq!(sight.nearest(), 0);
        sight.entered(6, WOLF, (60, 60));
        sight.entered(5, WOLF, (2, 2));
        assert_eq!(sight.nearest(), 6, "the own cell came with the reset");
    }
}
