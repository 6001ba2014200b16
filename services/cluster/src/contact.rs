//! What one node has seen of etcd itself: when it last failed to hear from it in time.
//!
//! A member's key disappears when its lease expires, and normally that means the member
//! died. But etcd expires leases by its own clock: when etcd stalls (a slow disk, a paused
//! VM, a long leader election) nobody's keep-alive gets through, and when it resumes it
//! expires every lease that fell due meanwhile, all at once, although every member is
//! alive and serving. Such a lapse says nothing about the member, and the node can tell:
//! it could not reach etcd itself just before. A node's registration and watch record
//! every failure here; the watch then keeps a record whose key vanished for a grace period
//! (see `watch.rs`), in which a live member re-registers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after the end of its own trouble with etcd a node keeps other members' lapsed
/// records, when it knows the lease TTL: two TTLs (the members' own keep-alives notice the
/// loss within one and re-register as soon as etcd answers) plus 2 s of slack.
pub fn lapse_grace(lease_ttl: Duration) -> Duration {
    lease_ttl * 2 + Duration::from_secs(2)
}

/// Shared by a node's [`Registration`](crate::Registration), [`ClusterWatch`](crate::ClusterWatch)
/// and [`Coordinator`](crate::Coordinator). Cloning shares it.
#[derive(Debug, Clone)]
pub struct EtcdContact {
    grace: Duration,
    last_lost: Arc<Mutex<Option<Instant>>>,
}

impl Default for EtcdContact {
    /// The grace for the default lease TTL of 3 s.
    fn default() -> Self {
        EtcdContact::new(lapse_grace(Duration::from_secs(3)))
    }
}

impl EtcdContact {
    pub fn new(grace: Duration) -> Self {
        EtcdContact { grace, last_lost: Arc::new(Mutex::new(None)) }
    }

    /// How long a lapse is given after trouble with etcd.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Records that etcd did not answer in time (or at all) just now.
    pub fn lost(&self) {
        *self.last_lost.lock().expect("invariant: the lock is never poisoned") =
            Some(Instant::now());
    }

    /// Whether this node failed to hear from etcd within the last grace period: if so, a
    /// member's lease lapsing may be etcd's doing, not the member's.
    pub fn recently_lost(&self) -> bool {
        self.last_lost
            .lock()
            .expect("invariant: the lock is never poisoned")
            .is_some_and(|at| at.elapsed() < self.grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trouble_counts_for_the_grace_period_only() {
        let contact = EtcdContact::new(Duration::from_millis(50));
        assert!(!contact.recently_lost(), "no trouble yet");
        contact.lost();
        assert!(contact.clone().recently_lost(), "clones share what was seen");
        let deadline = Instant::now() + Duration::from_secs(5);
        while contact.recently_lost() {
            assert!(Instant::now() < deadline, "the grace should pass");
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_grace_follows_the_lease_ttl() {
        assert_eq!(lapse_grace(Duration::from_secs(3)), Duration::from_secs(8));
    }
}
