//! Player ids for logins on this gateway, claimed from etcd in blocks ahead of need: the
//! task that claims them into the core's [`IdPool`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{ClusterError, ClusterKeys, IdAllocator};
use meridian_gateway_core::ids::IdPool;
use tokio::sync::Notify;
use tracing::warn;

const BLOCK: u64 = 4096;

/// Claims the first blocks (so the gateway can place logins as soon as it serves) and
/// keeps claiming in the background as blocks are taken. `workers` may each take a block
/// at once (their first logins can come in the same millisecond), so the pool keeps one
/// block per worker plus a spare.
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
        let claim = meridian_cluster::until_etcd_answers("claiming player ids", patience, || {
            let mut allocator = allocator.clone();
            async move { allocator.claim_block().await }
        });
        blocks.push_back(claim.await?);
    }
    let refill = Arc::new(Notify::new());
    let wake = Arc::clone(&refill);
    let pool = Arc::new(IdPool::new(blocks, Box::new(move || wake.notify_one())));
    let background = Arc::clone(&pool);
    tokio::spawn(async move {
        loop {
            refill.notified().await;
            while background.len() < blocks_ahead {
                match allocator.claim_block().await {
                    Ok(block) => background.push(block),
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
