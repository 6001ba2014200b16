//! A value read by many threads without locks and replaced as a whole, rarely.
//!
//! Readers pin a crossbeam epoch and borrow the current value; a writer swaps in a new
//! value and the old one is freed once no pinned reader can still see it. This is how the
//! gateway's worker threads read the routing table on every frame without contention.

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use std::sync::atomic::Ordering;

pub struct EpochCell<T> {
    current: Atomic<T>,
}

impl<T: Send + Sync + 'static> EpochCell<T> {
    pub fn new(value: T) -> Self {
        EpochCell { current: Atomic::new(value) }
    }

    /// Runs `f` on the current value. Keep `f` short: it holds the epoch pinned.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let guard = epoch::pin();
        let shared = self.current.load(Ordering::Acquire, &guard);
        // SAFETY: `current` is never null (set in `new`, only ever swapped for another
        // owned value) and the pinned guard keeps the loaded value alive until `f` returns.
        let value = unsafe { shared.deref() };
        f(value)
    }

    /// Replaces the value; the old one is dropped when every reader has moved on.
    pub fn store(&self, value: T) {
        let guard = epoch::pin();
        let old = self.current.swap(Owned::new(value), Ordering::AcqRel, &guard);
        // SAFETY: `old` was unlinked by the swap above, so no new reader can load it, and
        // destruction is deferred past every guard pinned before the swap.
        unsafe { guard.defer_destroy(old) };
    }
}

impl<T> Drop for EpochCell<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self` proves no reader holds a reference into the cell.
        unsafe {
            let guard = epoch::unprotected();
            let current = self.current.load(Ordering::Relaxed, guard);
            if !current.is_null() {
                drop(current.into_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_see_a_whole_value_while_writers_swap() {
        let cell = Arc::new(EpochCell::new(vec![0u64; 64]));
        let writer = {
            let cell = Arc::clone(&cell);
            std::thread::spawn(move || {
                for i in 1..=2000u64 {
                    cell.store(vec![i; 64]);
                }
            })
        };
        let mut last = 0;
        while last < 2000 {
            let (first, all_same) = cell.read(|v| (v[0], v.iter().all(|&x| x == v[0])));
            assert!(all_same, "a reader saw a torn value");
            assert!(first >= last, "values go forward");
            last = first;
        }
        writer.join().expect("writer thread");
    }
}
