//! A player's inputs in `seq` order, with no gap that can hold them for ever.
//!
//! Gateways number a connection's inputs 1, 2, 3, ...; a handoff can make them reach the
//! owner by two paths (forwarded by the old owner, straight from the gateway), so the owner
//! applies them in `seq` order and holds the early ones. An input that is never applied
//! would hold every later one for ever, so none simply disappears: it is applied in
//! order, or refused — answered (by the caller) and its seq marked consumed, which the
//! sequence steps over. That holds across owners too: a new owner is told, for every seq
//! the old one consumed ahead of its turn, a kindless input it applies as nothing.
//!
//! Pure: no clock, no I/O; the world task answers what is refused.

use std::collections::BTreeMap;

use meridian_rpc::pb::{player_input::Kind as Input, PlayerInput};

/// A set of seqs, kept as disjoint inclusive ranges: inputs refused one after another (the
/// usual case: a run of them, newest first) cost one range.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SeqSet {
    /// start -> end, inclusive; ranges neither overlap nor touch.
    ranges: BTreeMap<u64, u64>,
}

impl SeqSet {
    pub fn contains(&self, seq: u64) -> bool {
        self.ranges.range(..=seq).next_back().is_some_and(|(_, end)| *end >= seq)
    }

    pub fn insert(&mut self, seq: u64) {
        if self.contains(seq) {
            return;
        }
        let before = self.ranges.range(..seq).next_back().map(|(s, e)| (*s, *e));
        let after_end = seq.checked_add(1).and_then(|next| self.ranges.remove(&next));
        match before {
            Some((start, end)) if end + 1 == seq => {
                self.ranges.insert(start, after_end.unwrap_or(seq));
            }
            _ => {
                self.ranges.insert(seq, after_end.unwrap_or(seq));
            }
        }
    }

    /// Forgets every seq below `seq`.
    pub fn remove_below(&mut self, seq: u64) {
        while let Some((&start, &end)) = self.ranges.first_key_value() {
            if start >= seq {
                break;
            }
            self.ranges.remove(&start);
            if end >= seq {
                self.ranges.insert(seq, end);
                break;
            }
        }
    }

    /// The seqs, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|(start, end)| *start..=*end)
    }
}

/// What became of an input offered to the sequence.
#[derive(Debug, PartialEq)]
pub(crate) enum Offered {
    /// Next in line: apply it, then whatever [`InputSequence::next_held`] gives.
    Apply(PlayerInput),
    /// Early: held until its turn.
    Held,
    /// Its seq was applied or consumed already (a copy by the other path).
    Duplicate,
    /// Too many were held: this input, or the newest held one (the one returned), is
    /// refused. The caller answers it now; its seq is consumed.
    Refuse(PlayerInput),
}

/// A local player's inputs: which seq is next, the early ones held, and the seqs ahead of
/// the next that were consumed without being applied.
#[derive(Debug)]
pub(crate) struct InputSequence {
    next: u64,
    held: BTreeMap<u64, PlayerInput>,
    consumed: SeqSet,
    /// Inputs held at most (a `Leave` is held beyond it: it must be applied, and a
    /// connection has one).
    limit: usize,
}

fn is_leave(input: &PlayerInput) -> bool {
    matches!(input.kind, Some(Input::Leave(_)))
}

impl InputSequence {
    pub fn new(next: u64, limit: usize) -> InputSequence {
        InputSequence { next, held: BTreeMap::new(), consumed: SeqSet::default(), limit }
    }

    /// The seq applied next.
    pub fn next(&self) -> u64 {
        self.next
    }

    pub fn offer(&mut self, input: PlayerInput) -> Offered {
        let seq = input.seq;
        if seq < self.next || self.consumed.contains(seq) || self.held.contains_key(&seq) {
            return Offered::Duplicate;
        }
        if seq == self.next {
            self.advance();
            return Offered::Apply(input);
        }
        if self.held.len() < self.limit || is_leave(&input) {
            self.held.insert(seq, input);
            return Offered::Held;
        }
        // Full: the newest input goes, so those closest to their turn stay.
        let newest_held = self.held.iter().rev().find(|(_, held)| !is_leave(held));
        let refused = match newest_held.map(|(seq, _)| *seq) {
            Some(newest) if newest > seq => {
                let evicted = self.held.remove(&newest).expect("invariant: just found");
                self.held.insert(seq, input);
                evicted
            }
            _ => input,
        };
        self.consumed.insert(refused.seq);
        Offered::Refuse(refused)
    }

    /// The held input whose turn it is now, if any.
    pub fn next_held(&mut self) -> Option<PlayerInput> {
        let input = self.held.remove(&self.next)?;
        self.advance();
        Some(input)
    }

    /// Marks seqs as consumed elsewhere (refused and answered while the player was not
    /// here): the sequence steps over them. Held copies of them are dropped.
    pub fn consume(&mut self, seqs: &SeqSet) {
        for seq in seqs.iter().filter(|seq| *seq >= self.next) {
            self.held.remove(&seq);
            self.consumed.insert(seq);
        }
        self.skip_consumed();
    }

    /// Moves past the seq just taken and every consumed one right after it.
    fn advance(&mut self) {
        self.next += 1;
        self.skip_consumed();
    }

    fn skip_consumed(&mut self) {
        self.consumed.remove_below(self.next);
        if let Some((&start, &end)) = self.consumed.ranges.first_key_value() {
            // Ranges never touch, so the one after this starts beyond `end + 1`.
            if start == self.next {
                self.consumed.ranges.remove(&start);
                self.next = end.saturating_add(1);
            }
        }
    }

    /// What a new owner needs to carry on: the next seq, and the inputs to forward to it in
    /// seq order, the held ones as they are and a kindless one (applied as nothing) for
    /// each seq consumed here ahead of its turn.
    pub fn into_handoff(self, player_id: u64, session: u64) -> (u64, Vec<PlayerInput>) {
        let InputSequence { next, mut held, consumed, .. } = self;
        for seq in consumed.iter() {
            held.insert(seq, PlayerInput { session, player_id, seq, kind: None });
        }
        (next, held.into_values().collect())
    }
}

/// Inputs for a player not on this shard that had to be refused (answered where the
/// connection's gateway link was known), kept a while in case the player arrives after
/// all: its sequence then steps over them, and a `Leave` among them is applied.
#[derive(Debug, Default)]
pub(crate) struct Refused {
    pub seqs: SeqSet,
    /// A `Leave` is never refused: the connection is gone, and a player that arrives
    /// later must not stay in the world on it.
    pub leave: Option<PlayerInput>,
}

impl Refused {
    /// Whether the input of `seq` was given up on.
    pub fn contains(&self, seq: u64) -> bool {
        self.seqs.contains(seq) || self.leave.as_ref().is_some_and(|l| l.seq == seq)
    }

    /// Records an input given up on; whether it is new here (and so to be answered).
    pub fn record(&mut self, input: PlayerInput) -> Option<PlayerInput> {
        if self.contains(input.seq) {
            return None;
        }
        if is_leave(&input) {
            self.leave = Some(input);
            return None;
        }
        self.seqs.insert(input.seq);
        Some(input)
    }
}

#[cfg(test)]
mod tests {
    use meridian_protocol::pb::{Chat, Ping};
    use meridian_rpc::pb::Leave;

    use super::*;

    fn ping(seq: u64) -> PlayerInput {
        let kind = Some(Input::Ping(Ping { client_time: seq }));
        PlayerInput { session: 1, player_id: 2, seq, kind }
    }

    fn leave(seq: u64) -> PlayerInput {
        PlayerInput { session: 1, player_id: 2, seq, kind: Some(Input::Leave(Leave::default())) }
    }

    /// Offers each input and returns the seqs applied, in order, as the world task does.
    fn feed(
        sequence: &mut InputSequence,
        inputs: impl IntoIterator<Item = PlayerInput>,
    ) -> Vec<u64> {
        let mut applied = Vec::new();
        for input in inputs {
            if let Offered::Apply(input) = sequence.offer(input) {
                applied.push(input.seq);
                while let Some(next) = sequence.next_held() {
                    applied.push(next.seq);
                }
            }
        }
        applied
    }

    fn set(seqs: &[u64]) -> SeqSet {
        let mut set = SeqSet::default();
        for seq in seqs {
            set.insert(*seq);
        }
        set
    }

    #[test]
    fn a_seq_set_merges_neighbours_into_ranges() {
        let mut seqs = set(&[5, 7, 6, 1, 10, 9]);
        assert_eq!(
            seqs.ranges.iter().map(|(s, e)| (*s, *e)).collect::<Vec<_>>(),
            vec![(1, 1), (5, 7), (9, 10)]
        );
        assert!(seqs.contains(6) && !seqs.contains(8) && !seqs.contains(0));
        seqs.insert(8);
        assert_eq!(seqs.ranges.len(), 2, "8 joins 5..=7 and 9..=10");
        seqs.remove_below(6);
        assert_eq!(seqs.iter().collect::<Vec<_>>(), vec![6, 7, 8, 9, 10]);
        seqs.insert(u64::MAX);
        assert!(seqs.contains(u64::MAX));
    }

    #[test]
    fn inputs_are_applied_in_seq_order_whatever_order_they_arrive_in() {
        let mut sequence = InputSequence::new(1, 8);
        assert_eq!(feed(&mut sequence, [3, 2, 5].map(ping)), Vec::<u64>::new());
        assert_eq!(feed(&mut sequence, [1].map(ping)), vec![1, 2, 3]);
        assert_eq!(feed(&mut sequence, [4].map(ping)), vec![4, 5]);
        assert_eq!(sequence.offer(ping(2)), Offered::Duplicate);
        assert_eq!(sequence.next, 6);
    }

    #[test]
    fn past_the_limit_the_newest_is_refused_and_its_seq_is_stepped_over() {
        let mut sequence = InputSequence::new(1, 3);
        assert_eq!(feed(&mut sequence, [2, 3, 4].map(ping)), Vec::<u64>::new());
        assert_eq!(sequence.offer(ping(6)), Offered::Refuse(ping(6)), "the newest: the new one");
        assert_eq!(sequence.offer(ping(5)), Offered::Refuse(ping(5)));
        assert_eq!(sequence.offer(ping(5)), Offered::Duplicate, "consumed");
        assert_eq!(feed(&mut sequence, [1, 7].map(ping)), vec![1, 2, 3, 4, 7], "no gap at 5, 6");
    }

    #[test]
    fn past_the_limit_an_older_input_takes_the_place_of_the_newest_held() {
        let mut sequence = InputSequence::new(1, 2);
        feed(&mut sequence, [3, 9].map(ping));
        assert_eq!(sequence.offer(ping(2)), Offered::Refuse(ping(9)), "9 is the newest");
        assert_eq!(feed(&mut sequence, [1, 4, 10].map(ping)), vec![1, 2, 3, 4]);
        assert_eq!(feed(&mut sequence, (5..=8).map(ping)), vec![5, 6, 7, 8, 10], "over 9");
    }

    #[test]
    fn a_leave_is_held_past_the_limit_and_never_refused() {
        let mut sequence = InputSequence::new(1, 1);
        feed(&mut sequence, [2].map(ping));
        assert_eq!(sequence.offer(leave(4)), Offered::Held);
        assert_eq!(sequence.offer(ping(3)), Offered::Refuse(ping(3)), "the Leave stays");
        assert_eq!(feed(&mut sequence, [1].map(ping)), vec![1, 2, 4]);
    }

    #[test]
    fn seqs_consumed_elsewhere_are_stepped_over_and_their_copies_dropped() {
        let mut sequence = InputSequence::new(2, 8);
        feed(&mut sequence, [4].map(ping));
        sequence.consume(&set(&[1, 3, 4, 5]));
        assert_eq!(sequence.next, 2, "1 was behind already");
        assert_eq!(feed(&mut sequence, [2, 6].map(ping)), vec![2, 6], "3 ..= 5 stepped over");
        assert_eq!(sequence.offer(ping(4)), Offered::Duplicate);
        let mut at_next = InputSequence::new(3, 8);
        at_next.consume(&set(&[3, 4]));
        assert_eq!(at_next.next, 5, "consuming the next seq moves on at once");
    }

    #[test]
    fn a_handoff_carries_held_inputs_and_a_kindless_one_per_consumed_seq() {
        let mut sequence = InputSequence::new(1, 2);
        feed(&mut sequence, [2, 3].map(ping));
        assert!(matches!(sequence.offer(ping(4)), Offered::Refuse(_)));
        let (next, forward) = sequence.into_handoff(2, 1);
        assert_eq!(next, 1);
        let carried: Vec<(u64, bool)> = forward.iter().map(|i| (i.seq, i.kind.is_some())).collect();
        assert_eq!(carried, vec![(2, true), (3, true), (4, false)]);
        // The new owner steps over the consumed seq by applying its kindless input.
        let mut new_owner = InputSequence::new(next, 8);
        assert_eq!(
            feed(&mut new_owner, forward.into_iter().chain([ping(1), ping(5)])),
            vec![1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn refused_inputs_are_recorded_once_and_a_leave_is_kept() {
        let mut refused = Refused::default();
        let chat =
            PlayerInput { seq: 3, kind: Some(Input::Chat(Chat { text: "hi".into() })), ..ping(3) };
        assert!(refused.record(chat.clone()).is_some(), "answered the first time");
        assert!(refused.record(chat).is_none(), "not twice");
        assert!(refused.record(leave(4)).is_none(), "a Leave is kept, not answered");
        assert_eq!(refused.leave, Some(leave(4)));
        assert_eq!(refused.seqs.iter().collect::<Vec<_>>(), vec![3]);
    }
}
