//! Player ids for logins on this gateway, claimed from etcd in blocks ahead of need, so a
//! login never waits on etcd and the pool's lock is taken once per block, not per login.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meridian_cluster::{ClusterError, ClusterKeys, IdAllocator};
use tokio::sync::Notify;
use tracing::warn;

const BLOCK: u64 = 4096;

pub struct IdPool {
    blocks: Mutex<VecDeque<Range<u64>>>,
    refill: Notify,
}

impl IdPool {
    /// Claims the first blocks (so the gateway can place logins as soon as it serves) and
    /// keeps claiming in the background as blocks are taken. `workers` may each take a
    /// block at once (their first logins can come in the same millisecond), so the pool
    /// keeps one block per worker plus a spare.
    pub async fn start(
        client: meridian_cluster::EtcdClient,
        keys: &ClusterKeys,
        workers: usize,
    ) -> Result<Arc<IdPool>, ClusterError> {
        let blocks_ahead = workers + 1;
        let mut allocator = IdAllocator::new(client, keys, BLOCK);
        let mut blocks = VecDeque::new();
        for _ in 0..blocks_ahead {
            let patience = meridian_cluster::START_PATIENCE;
            let claim =
                meridian_cluster::until_etcd_answers("claiming player ids", patience, || {
                    let mut allocator = allocator.clone();
                    async move { allocator.claim_block().await }
                });
            blocks.push_back(claim.await?);
        }
        let pool = Arc::new(IdPool { blocks: Mutex::new(blocks), refill: Notify::new() });
        let background = Arc::clone(&pool);
        tokio::spawn(async move {
            loop {
                background.refill.notified().await;
                while background.len() < blocks_ahead {
                    match allocator.claim_block().await {
                        Ok(block) => background.lock().push_back(block),
                        Err(error) => {
                            warn!(%error, "cannot claim player ids; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            }
        });
        Ok(pool)
    }

    /// A pool with fixed blocks and no refill (tests and fuzzing of the session core).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn fixed(blocks: Vec<Range<u64>>) -> Arc<IdPool> {
        Arc::new(IdPool { blocks: Mutex::new(blocks.into()), refill: Notify::new() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Range<u64>>> {
        self.blocks.lock().expect("invariant: id pool lock is never poisoned")
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// A fresh block for a worker, or `None` if etcd has been unreachable for long enough
    /// that the pool ran dry (the login is then refused with UNAVAILABLE).
    pub fn take_block(&self) -> Option<Range<u64>> {
        let block = self.lock().pop_front();
        self.refill.notify_one();
        block
    }
}
