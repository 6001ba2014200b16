//! The core's part of the game's key-value space (issue 34): the requests a game makes
//! through its `Context`, waiting to go to the shell (`Transmit::Kv`), and how many are
//! out. The store itself is the shell's: it carries a shard's requests out in the order
//! they were made and hands the answers back (`Event::KvAnswers`), which the core gives to
//! the game's `kv_answer` hook in a later round. So a hook never waits on the store and
//! the core stays sans-IO.
//!
//! Bounded: at most [`KV_IN_FLIGHT`] requests a shard has made and not had answered; past
//! it a request is refused at once (`GameError::KvBusy`), as is one with an empty or too
//! long key or too big a value (`GameError::KvTooBig`), and every request without a store
//! (`GameError::NoStore`).

use meridian_game::{GameError, KvAnswer, KvTicket, KV_KEY_MAX, KV_VALUE_MAX};

/// Requests made and not yet answered, at most, per shard.
pub const KV_IN_FLIGHT: usize = 1024;

/// What a request asks of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    Get,
    /// Write `value` (`None`: delete) if the entry's version is `expected` (0: absent), or
    /// whatever it is with `expected: None`.
    Set {
        value: Option<Vec<u8>>,
        expected: Option<u64>,
    },
}

/// A game's request, for the shell to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRequest {
    pub ticket: KvTicket,
    pub key: Vec<u8>,
    pub op: KvOp,
}

/// The store's answer to a request, from the shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvReply {
    pub ticket: KvTicket,
    pub key: Vec<u8>,
    pub answer: KvAnswer,
}

pub(crate) struct KvRequests {
    enabled: bool,
    next_ticket: u64,
    in_flight: usize,
    out: Vec<KvRequest>,
}

impl KvRequests {
    /// `enabled`: the shard has a store.
    pub fn new(enabled: bool) -> KvRequests {
        KvRequests { enabled, next_ticket: 1, in_flight: 0, out: Vec::new() }
    }

    /// Queues a request for the shell, or says why not.
    pub fn ask(&mut self, key: &[u8], op: KvOp) -> Result<KvTicket, GameError> {
        if !self.enabled {
            return Err(GameError::NoStore);
        }
        if key.is_empty() || key.len() > KV_KEY_MAX {
            return Err(GameError::KvTooBig(key.len()));
        }
        if let KvOp::Set { value: Some(value), .. } = &op {
            if value.len() > KV_VALUE_MAX {
                return Err(GameError::KvTooBig(value.len()));
            }
        }
        if self.in_flight >= KV_IN_FLIGHT {
            return Err(GameError::KvBusy(KV_IN_FLIGHT));
        }
        let ticket = KvTicket(self.next_ticket);
        self.next_ticket += 1;
        self.in_flight += 1;
        self.out.push(KvRequest { ticket, key: key.to_vec(), op });
        Ok(ticket)
    }

    /// An answer came back: one fewer out.
    pub fn answered(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The requests made since the last call, in order.
    pub fn take(&mut self) -> Option<Vec<KvRequest>> {
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_bounded_checked_and_taken_in_order() {
        let mut kv = KvRequests::new(true);
        assert_eq!(kv.ask(b"", KvOp::Get), Err(GameError::KvTooBig(0)));
        assert_eq!(kv.ask(&[b'k'; KV_KEY_MAX + 1], KvOp::Get), Err(GameError::KvTooBig(129)));
        let big = KvOp::Set { value: Some(vec![0; KV_VALUE_MAX + 1]), expected: None };
        assert_eq!(kv.ask(b"k", big), Err(GameError::KvTooBig(KV_VALUE_MAX + 1)));
        assert_eq!(kv.in_flight(), 0, "a refused request is not out");
        let first = kv.ask(b"a", KvOp::Get).unwrap();
        let second = kv.ask(b"b", KvOp::Set { value: None, expected: Some(3) }).unwrap();
        assert!(first < second);
        let taken = kv.take().unwrap();
        assert_eq!(taken.iter().map(|r| r.ticket).collect::<Vec<_>>(), vec![first, second]);
        assert_eq!(kv.take(), None);
        for _ in 2..KV_IN_FLIGHT {
            kv.ask(b"c", KvOp::Get).unwrap();
        }
        assert_eq!(kv.ask(b"d", KvOp::Get), Err(GameError::KvBusy(KV_IN_FLIGHT)));
        kv.answered();
        assert!(kv.ask(b"d", KvOp::Get).is_ok(), "room again once one is answered");
    }

    #[test]
    fn without_a_store_every_request_is_refused() {
        let mut kv = KvRequests::new(false);
        assert_eq!(kv.ask(b"k", KvOp::Get), Err(GameError::NoStore));
        assert_eq!(kv.take(), None);
    }
}
