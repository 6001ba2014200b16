//! How many flags each player has planted, kept in the game's key-value space (key
//! `flags/<player id>`, value the count as decimal text) and cached per shard.
//!
//! The store's entry is the source of truth: it outlives every shard, and every change to
//! it is a compare-and-set on the version the shard last saw, so no change is lost or
//! counted twice when two shards write at once. A shard keeps, per player, a small
//! state machine, [`FlagCount`]: the entry as last seen (or unknown), the changes made
//! here and not yet written (`delta`), and at most one request out. It does no I/O: it
//! says which request to make next ([`FlagCount::poll`]), is told it was made
//! ([`FlagCount::sent`]) and what the store answered ([`FlagCount::answered`]).
//! [`FlagCounts`] holds one per player and maps tickets back to players; the game turns
//! its requests into `Context::kv_get` and `Context::kv_set`.
//!
//! A write is `stored + delta` expecting the stored version (0: no entry yet). Written:
//! that part of `delta` is done (changes made meanwhile still wait). Conflict: another
//! shard wrote first; the answer carries the entry as it is, and the write is made again
//! from it. Failed: the same write is tried again after [`RETRY_AFTER`], not at once. A
//! failed write may have happened all the same (the store's answer was lost): if the
//! conflict that follows shows exactly the value that write would have left, it is taken
//! as done, and as not done otherwise. That guess can only be wrong if another shard
//! wrote the same count in the same window (a player planting or uprooting on two shards
//! while the store fails): then one change is lost or counted twice.
//! A count never goes below 0: a decrease past 0 (of a count that was already short) is
//! dropped.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use meridian_game::{EntityId, KvAnswer, KvTicket, KvValue};

/// How long a count waits to ask the store again after a request failed or was refused.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The key of a player's count: `flags/<id>`.
pub fn count_key(player: EntityId) -> Vec<u8> {
    format!("flags/{}", player.0).into_bytes()
}

/// What a count asks of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountRequest {
    /// Read the entry.
    Read,
    /// Write `value` (as decimal text) if the entry's version is `expected` (0: absent).
    Write { value: u64, expected: u64 },
}

impl CountRequest {
    /// The value of a write, as the store keeps it.
    pub fn value_bytes(value: u64) -> Vec<u8> {
        value.to_string().into_bytes()
    }
}

/// Why a count does not let a player plant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountRefusal {
    /// The count is not known here yet (it is being read).
    Loading,
    /// The player has `limit` flags planted already.
    TooMany { limit: u64 },
}

/// A count as the store holds it: the value and its entry's version (0: no entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Stored {
    count: u64,
    version: u64,
}

impl Stored {
    /// An entry as the store answered it; a value that is not a count reads as 0 (the next
    /// write replaces it).
    fn of(entry: &Option<KvValue>) -> Stored {
        match entry {
            None => Stored::default(),
            Some(entry) => Stored {
                count: std::str::from_utf8(&entry.value)
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
                    .unwrap_or(0),
                version: entry.version,
            },
        }
    }
}

/// The request out: which (a write's base count, to know the part of `delta` it carries)
/// and its ticket once it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InFlight {
    request: CountRequest,
    base: u64,
    ticket: Option<KvTicket>,
}

/// A write that failed, and might have happened: the value it would have left, and the
/// part of `delta` it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Doubtful {
    value: u64,
    part: i64,
}

/// One player's count on one shard (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagCount {
    /// The entry as last seen; `None`: unknown (to be read).
    stored: Option<Stored>,
    /// Plants (+1) and uproots (-1) made here, not yet written.
    delta: i64,
    in_flight: Option<InFlight>,
    /// Read again even though the entry is known (it may have changed elsewhere).
    reread: bool,
    /// No request before this time (after a failure).
    retry_at: Option<Duration>,
    doubtful: Option<Doubtful>,
}

impl FlagCount {
    /// A count not known yet: its first request reads it.
    pub fn unknown() -> FlagCount {
        FlagCount::default()
    }

    /// The count as this shard sees it (the entry plus what waits to be written), if known.
    pub fn count(&self) -> Option<u64> {
        let stored = self.stored?;
        Some(u64::try_from(stored.count as i64 + self.delta).unwrap_or(0))
    }

    /// Whether a plant is allowed under `limit`.
    pub fn admit(&self, limit: u64) -> Result<(), CountRefusal> {
        match self.count() {
            None => Err(CountRefusal::Loading),
            Some(count) if count >= limit => Err(CountRefusal::TooMany { limit }),
            Some(_) => Ok(()),
        }
    }

    /// A flag was planted.
    pub fn planted(&mut self) {
        self.delta += 1;
    }

    /// A flag was uprooted (if the count is unknown, it is read first, then written).
    pub fn uprooted(&mut self) {
        self.delta -= 1;
    }

    /// The entry may have changed elsewhere: read it again when nothing is out.
    pub fn refresh(&mut self) {
        self.reread = true;
    }

    /// Nothing to tell the store and nothing out: the count may be forgotten.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_none() && self.delta == 0 && self.doubtful.is_none()
    }

    /// The request to make now, if any; it counts as out from here ([`FlagCount::sent`]
    /// gives its ticket, [`FlagCount::not_sent`] takes it back).
    pub fn poll(&mut self, now: Duration) -> Option<CountRequest> {
        if self.in_flight.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        self.retry_at = None;
        let stored = match self.stored {
            Some(stored) if !(self.reread && self.doubtful.is_none()) => stored,
            _ => return Some(self.out(CountRequest::Read, 0)),
        };
        let count = stored.count as i64;
        if count + self.delta < 0 {
            // Fewer flags counted than uprooted: the count was short already.
            self.delta = -count;
        }
        if self.delta == 0 && self.doubtful.is_none() {
            return None;
        }
        let value = (count + self.delta) as u64;
        Some(self.out(CountRequest::Write { value, expected: stored.version }, stored.count))
    }

    fn out(&mut self, request: CountRequest, base: u64) -> CountRequest {
        self.in_flight = Some(InFlight { request, base, ticket: None });
        request
    }

    /// The request [`FlagCount::poll`] gave was made: its answer will carry `ticket`.
    pub fn sent(&mut self, ticket: KvTicket) {
        if let Some(flight) = &mut self.in_flight {
            flight.ticket = Some(ticket);
        }
    }

    /// The request [`FlagCount::poll`] gave could not be made (the shard refused it at
    /// once): it is made again after [`RETRY_AFTER`].
    pub fn not_sent(&mut self, now: Duration) {
        self.in_flight = None;
        self.retry_at = Some(now + RETRY_AFTER);
    }

    /// The store's answer to the request with `ticket`; false if that is not this count's
    /// request out (then nothing changes).
    pub fn answered(&mut self, now: Duration, ticket: KvTicket, answer: &KvAnswer) -> bool {
        let Some(flight) = self.in_flight.filter(|f| f.ticket == Some(ticket)) else {
            return false;
        };
        self.in_flight = None;
        match (flight.request, answer) {
            (CountRequest::Read, KvAnswer::Found(entry)) => {
                self.stored = Some(Stored::of(entry));
                self.reread = false;
            }
            (CountRequest::Write { value, .. }, KvAnswer::Written { version }) => {
                self.stored = Some(Stored { count: value, version: *version });
                self.delta -= value as i64 - flight.base as i64;
                // The same version was expected: a failed write before it did not happen.
                self.doubtful = None;
            }
            (CountRequest::Write { .. }, KvAnswer::Conflict(entry)) => {
                let current = Stored::of(entry);
                if let Some(doubtful) = self.doubtful.take() {
                    if doubtful.value == current.count {
                        self.delta -= doubtful.part;
                    }
                }
                self.stored = Some(current);
            }
            (request, KvAnswer::Failed(_)) => {
                if let CountRequest::Write { value, .. } = request {
                    // The first failed write is the one that may have happened: a retry
                    // expects the same version, so it cannot have happened as well.
                    let part = value as i64 - flight.base as i64;
                    self.doubtful.get_or_insert(Doubtful { value, part });
                }
                self.retry_at = Some(now + RETRY_AFTER);
            }
            (_, _) => {
                // An answer of the wrong sort for the request: trust nothing, read again.
                self.stored = None;
            }
        }
        true
    }
}

/// The counts of every player this shard deals with, and which request is whose.
#[derive(Debug, Clone, Default)]
pub struct FlagCounts {
    counts: BTreeMap<EntityId, FlagCount>,
    tickets: HashMap<KvTicket, EntityId>,
}

impl FlagCounts {
    pub fn new() -> FlagCounts {
        FlagCounts::default()
    }

    /// A player's count, made (unknown: to be read) if this shard had none.
    pub fn of(&mut self, player: EntityId) -> &mut FlagCount {
        self.counts.entry(player).or_default()
    }

    /// A player's count as this shard sees it, if known.
    pub fn count(&self, player: EntityId) -> Option<u64> {
        self.counts.get(&player).and_then(FlagCount::count)
    }

    /// The players whose count has a request to make at `now`.
    pub fn due(&self, now: Duration) -> Vec<EntityId> {
        let mut due = Vec::new();
        for (player, count) in &self.counts {
            if count.clone().poll(now).is_some() {
                due.push(*player);
            }
        }
        due
    }

    /// The request to make for `player` now, if any.
    pub fn poll(&mut self, player: EntityId, now: Duration) -> Option<CountRequest> {
        self.counts.get_mut(&player)?.poll(now)
    }

    /// The request polled for `player` was made with `ticket`.
    pub fn sent(&mut self, player: EntityId, ticket: KvTicket) {
        self.of(player).sent(ticket);
        self.tickets.insert(ticket, player);
    }

    /// The request polled for `player` could not be made.
    pub fn not_sent(&mut self, player: EntityId, now: Duration) {
        self.of(player).not_sent(now);
    }

    /// The store's answer to `ticket`: the player whose count it was, if it was one.
    pub fn answered(
        &mut self,
        now: Duration,
        ticket: KvTicket,
        answer: &KvAnswer,
    ) -> Option<EntityId> {
        let player = self.tickets.remove(&ticket)?;
        let count = self.counts.get_mut(&player)?;
        count.answered(now, ticket, answer).then_some(player)
    }

    /// Forgets the idle counts of players `keep` does not keep (a cache of players gone
    /// elsewhere would go stale).
    pub fn forget_idle(&mut self, keep: impl Fn(EntityId) -> bool) {
        self.counts.retain(|player, count| !count.is_idle() || keep(*player));
    }

    /// How many players' counts this shard holds.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::ZERO;

    fn entry(count: u64, version: u64) -> KvAnswer {
        KvAnswer::Found(Some(KvValue { value: CountRequest::value_bytes(count), version }))
    }

    fn conflict(count: u64, version: u64) -> KvAnswer {
        KvAnswer::Conflict(Some(KvValue { value: CountRequest::value_bytes(count), version }))
    }

    /// Polls a request, sends it with `ticket`, and returns it.
    fn send(count: &mut FlagCount, now: Duration, ticket: u64) -> Option<CountRequest> {
        let request = count.poll(now)?;
        count.sent(KvTicket(ticket));
        Some(request)
    }

    /// A count known to be `value` at `version`.
    fn known(value: u64, version: u64) -> FlagCount {
        let mut count = FlagCount::unknown();
        assert_eq!(send(&mut count, T0, 1), Some(CountRequest::Read));
        assert!(count.answered(T0, KvTicket(1), &entry(value, version)));
        count
    }

    #[test]
    fn an_unknown_count_is_read_before_anyone_plants() {
        let mut count = FlagCount::unknown();
        assert_eq!(count.admit(5), Err(CountRefusal::Loading));
        assert_eq!(send(&mut count, T0, 1), Some(CountRequest::Read));
        assert_eq!(count.poll(T0), None, "one request out at a time");
        assert!(count.answered(T0, KvTicket(1), &KvAnswer::Found(None)));
        assert_eq!(count.count(), Some(0));
        assert_eq!(count.poll(T0), None, "nothing to write");
        assert!(count.is_idle());
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 1, expected: 0 }));
        assert!(count.answered(T0, KvTicket(2), &KvAnswer::Written { version: 7 }));
        assert_eq!(count.count(), Some(1));
        assert_eq!(count.poll(T0), None);
        assert!(count.is_idle());
    }

    #[test]
    fn the_limit_counts_what_waits_to_be_written() {
        let mut count = known(4, 3);
        assert_eq!(count.admit(5), Ok(()));
        count.planted();
        assert_eq!(count.admit(5), Err(CountRefusal::TooMany { limit: 5 }));
        assert_eq!(count.count(), Some(5));
    }

    #[test]
    fn changes_made_while_a_write_is_out_are_written_after_it() {
        let mut count = known(2, 5);
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 3, expected: 5 }));
        count.planted();
        count.planted();
        assert_eq!(count.poll(T0), None, "the first write is still out");
        assert_eq!(count.count(), Some(5));
        assert!(count.answered(T0, KvTicket(2), &KvAnswer::Written { version: 6 }));
        assert_eq!(count.count(), Some(5), "two plants still wait");
        assert_eq!(send(&mut count, T0, 3), Some(CountRequest::Write { value: 5, expected: 6 }));
        assert!(count.answered(T0, KvTicket(3), &KvAnswer::Written { version: 8 }));
        assert!(count.is_idle());
    }

    #[test]
    fn a_conflict_writes_again_from_the_entry_as_it_is() {
        let mut count = known(2, 5);
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 3, expected: 5 }));
        // Another shard wrote 4 meanwhile (the player planted there too).
        assert!(count.answered(T0, KvTicket(2), &conflict(4, 9)));
        assert_eq!(count.count(), Some(5));
        assert_eq!(send(&mut count, T0, 3), Some(CountRequest::Write { value: 5, expected: 9 }));
        // The entry was deleted meanwhile: the key must be absent.
        assert!(count.answered(T0, KvTicket(3), &KvAnswer::Conflict(None)));
        assert_eq!(send(&mut count, T0, 4), Some(CountRequest::Write { value: 1, expected: 0 }));
        assert!(count.answered(T0, KvTicket(4), &KvAnswer::Written { version: 10 }));
        assert_eq!(count.count(), Some(1));
        assert!(count.is_idle());
    }

    #[test]
    fn a_failure_is_retried_later_not_at_once() {
        let mut count = FlagCount::unknown();
        assert_eq!(send(&mut count, T0, 1), Some(CountRequest::Read));
        assert!(count.answered(T0, KvTicket(1), &KvAnswer::Failed("down".into())));
        assert_eq!(count.poll(T0), None, "no spinning on a failed store");
        assert_eq!(count.poll(RETRY_AFTER / 2), None);
        assert_eq!(send(&mut count, RETRY_AFTER, 2), Some(CountRequest::Read));
        assert!(count.answered(RETRY_AFTER, KvTicket(2), &entry(1, 4)));
        count.planted();
        // A request the shard refuses at once (too many out) waits as well.
        assert_eq!(count.poll(RETRY_AFTER), Some(CountRequest::Write { value: 2, expected: 4 }));
        count.not_sent(RETRY_AFTER);
        assert_eq!(count.poll(RETRY_AFTER), None);
        let later = RETRY_AFTER * 2;
        assert_eq!(send(&mut count, later, 3), Some(CountRequest::Write { value: 2, expected: 4 }));
        assert!(count.answered(later, KvTicket(3), &KvAnswer::Written { version: 5 }));
        assert_eq!(count.count(), Some(2));
        assert!(count.is_idle());
    }

    #[test]
    fn a_failed_write_that_happened_after_all_is_not_counted_twice() {
        let mut count = known(2, 5);
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 3, expected: 5 }));
        assert!(count.answered(T0, KvTicket(2), &KvAnswer::Failed("timeout".into())));
        assert!(!count.is_idle());
        // Another plant while it waits; the retry carries both.
        count.planted();
        let later = RETRY_AFTER;
        assert_eq!(send(&mut count, later, 3), Some(CountRequest::Write { value: 4, expected: 5 }));
        // The store shows the failed write's value: it happened; one plant is left.
        assert!(count.answered(later, KvTicket(3), &conflict(3, 6)));
        assert_eq!(count.count(), Some(4));
        assert_eq!(send(&mut count, later, 4), Some(CountRequest::Write { value: 4, expected: 6 }));
        assert!(count.answered(later, KvTicket(4), &KvAnswer::Written { version: 7 }));
        assert!(count.is_idle());
    }

    #[test]
    fn a_failed_write_is_retried_even_if_the_change_was_undone_meanwhile() {
        let mut count = known(2, 5);
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 3, expected: 5 }));
        assert!(count.answered(T0, KvTicket(2), &KvAnswer::Failed("timeout".into())));
        count.uprooted();
        // Nothing left to change, but whether the plant was written must be found out.
        let later = RETRY_AFTER;
        assert_eq!(send(&mut count, later, 3), Some(CountRequest::Write { value: 2, expected: 5 }));
        assert!(count.answered(later, KvTicket(3), &conflict(3, 6)));
        assert_eq!(count.count(), Some(2), "the plant was written, the uproot was not");
        assert_eq!(send(&mut count, later, 4), Some(CountRequest::Write { value: 2, expected: 6 }));
        assert!(count.answered(later, KvTicket(4), &KvAnswer::Written { version: 7 }));
        assert!(count.is_idle());
    }

    #[test]
    fn a_count_never_goes_below_zero() {
        let mut count = known(1, 3);
        count.uprooted();
        count.uprooted();
        assert_eq!(count.count(), Some(0));
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 0, expected: 3 }));
        assert!(count.answered(T0, KvTicket(2), &KvAnswer::Written { version: 4 }));
        assert!(count.is_idle(), "the decrease past 0 is dropped");
        count.uprooted();
        assert_eq!(count.poll(T0), None, "nothing below 0 is written");
        assert_eq!(count.count(), Some(0));
        // A conflict that lowers the entry under what waits is clamped the same way.
        let mut count = known(3, 3);
        count.uprooted();
        count.uprooted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 1, expected: 3 }));
        assert!(count.answered(T0, KvTicket(2), &conflict(1, 8)));
        assert_eq!(count.count(), Some(0));
        assert_eq!(send(&mut count, T0, 3), Some(CountRequest::Write { value: 0, expected: 8 }));
    }

    #[test]
    fn an_uproot_of_an_unknown_count_reads_then_writes() {
        let mut count = FlagCount::unknown();
        count.uprooted();
        assert_eq!(count.count(), None);
        assert_eq!(send(&mut count, T0, 1), Some(CountRequest::Read));
        assert!(count.answered(T0, KvTicket(1), &entry(3, 2)));
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 2, expected: 2 }));
    }

    #[test]
    fn a_refresh_reads_again_and_keeps_what_waits() {
        let mut count = known(5, 2);
        count.refresh();
        count.uprooted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Read));
        // The player uprooted one elsewhere meanwhile.
        assert!(count.answered(T0, KvTicket(2), &entry(4, 3)));
        assert_eq!(send(&mut count, T0, 3), Some(CountRequest::Write { value: 3, expected: 3 }));
    }

    #[test]
    fn answers_to_other_requests_and_garbage_change_nothing_they_should_not() {
        let mut count = FlagCount::unknown();
        assert_eq!(send(&mut count, T0, 1), Some(CountRequest::Read));
        assert!(!count.answered(T0, KvTicket(9), &entry(2, 2)), "not its ticket");
        assert_eq!(count.count(), None);
        let garbage = KvValue { value: b"many".to_vec(), version: 4 };
        assert!(count.answered(T0, KvTicket(1), &KvAnswer::Found(Some(garbage))));
        assert_eq!(count.count(), Some(0), "a value that is no count reads as 0");
        count.planted();
        assert_eq!(send(&mut count, T0, 2), Some(CountRequest::Write { value: 1, expected: 4 }));
        // A read's answer to a write: the entry is read again.
        assert!(count.answered(T0, KvTicket(2), &entry(7, 7)));
        assert_eq!(count.count(), None);
        assert_eq!(send(&mut count, T0, 3), Some(CountRequest::Read));
    }

    #[test]
    fn counts_map_tickets_to_players_and_forget_idle_ones() {
        let (ann, bob) = (EntityId(1), EntityId(2));
        let mut counts = FlagCounts::new();
        counts.of(ann);
        counts.of(bob).uprooted();
        assert_eq!(counts.due(T0), vec![ann, bob]);
        assert_eq!(counts.poll(ann, T0), Some(CountRequest::Read));
        counts.sent(ann, KvTicket(10));
        assert_eq!(counts.poll(bob, T0), Some(CountRequest::Read));
        counts.sent(bob, KvTicket(11));
        assert_eq!(counts.due(T0), Vec::<EntityId>::new());
        assert_eq!(counts.answered(T0, KvTicket(11), &entry(2, 1)), Some(bob));
        assert_eq!(counts.answered(T0, KvTicket(11), &entry(2, 1)), None, "answered once");
        assert_eq!(counts.answered(T0, KvTicket(10), &KvAnswer::Found(None)), Some(ann));
        assert_eq!(counts.count(ann), Some(0));
        assert_eq!(counts.count(bob), Some(1));
        // Bob's decrease is still to be written: kept even though bob is not kept.
        counts.forget_idle(|_| false);
        assert_eq!(counts.len(), 1);
        assert_eq!(counts.count(bob), Some(1));
        assert_eq!(counts.poll(bob, T0), Some(CountRequest::Write { value: 1, expected: 1 }));
        counts.sent(bob, KvTicket(12));
        assert_eq!(counts.answered(T0, KvTicket(12), &KvAnswer::Written { version: 2 }), Some(bob));
        counts.forget_idle(|player| player == bob);
        assert_eq!(counts.len(), 1);
        counts.forget_idle(|_| false);
        assert!(counts.is_empty());
    }

    #[test]
    fn a_key_names_its_player_in_decimal() {
        assert_eq!(count_key(EntityId(42)), b"flags/42".to_vec());
        assert_eq!(CountRequest::value_bytes(5), b"5".to_vec());
    }
}
