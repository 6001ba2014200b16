//! A group of bot threads that stops at its first failure: the failures in the order they
//! happened, and the flag every thread checks between steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::bail;

#[derive(Default)]
pub(crate) struct Failures {
    list: Mutex<Vec<String>>,
    abort: AtomicBool,
}

impl Failures {
    /// Records a failure and stops the group.
    pub fn fail(&self, what: String) {
        self.list.lock().expect("invariant: the lock is never poisoned").push(what);
        self.abort();
    }

    /// Stops the group without a failure (a deadline passed, the test is done).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }

    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }

    pub fn first(&self) -> Option<String> {
        self.list.lock().expect("invariant: the lock is never poisoned").first().cloned()
    }

    /// The first failure, with how many of the group (`members`: "slots", "walkers")
    /// failed after it.
    pub fn check(&self, members: &str) -> anyhow::Result<()> {
        let list = self.list.lock().expect("invariant: the lock is never poisoned");
        if let Some(first) = list.first() {
            let others = list.len() - 1;
            let more = if others > 0 {
                format!("\n({others} more {members} failed after it)")
            } else {
                String::new()
            };
            bail!("{first}{more}");
        }
        Ok(())
    }
}

/// Why a thread of the group stopped early.
pub(crate) enum Stop {
    /// Another one failed first.
    Aborted,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Failed(e)
    }
}
