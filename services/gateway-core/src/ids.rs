//! Player ids for logins on this gateway, in blocks claimed ahead of need (from etcd, by
//! the shell's task: `meridian-gateway`'s `ids.rs`), so a login never waits on etcd and the
//! pool's lock is taken once per block, not per login.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Mutex;

/// Blocks of player ids, and the hook that asks for more.
pub struct IdPool {
    blocks: Mutex<VecDeque<Range<u64>>>,
    /// Called after a block is taken: the shell's refill task wakes and tops the pool up.
    refill: Box<dyn Fn() + Send + Sync>,
}

impl IdPool {
    /// A pool holding `blocks`, calling `refill` whenever a worker takes one.
    pub fn new(blocks: VecDeque<Range<u64>>, refill: Box<dyn Fn() + Send + Sync>) -> IdPool {
        IdPool { blocks: Mutex::new(blocks), refill }
    }

    /// Adds a claimed block at the back.
    pub fn push(&self, block: Range<u64>) {
        self.lock().push_back(block);
    }

    /// A pool with fixed blocks and no refill (tests and fuzzing of the session core).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn fixed(blocks: Vec<Range<u64>>) -> std::sync::Arc<IdPool> {
        std::sync::Arc::new(IdPool::new(blocks.into(), Box::new(|| ())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Range<u64>>> {
        self.blocks.lock().expect("invariant: id pool lock is never poisoned")
    }

    /// Blocks in the pool.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// A fresh block for a worker, or `None` if etcd has been unreachable for long enough
    /// that the pool ran dry (the login is then refused with UNAVAILABLE).
    pub fn take_block(&self) -> Option<Range<u64>> {
        let block = self.lock().pop_front();
        (self.refill)();
        block
    }
}
