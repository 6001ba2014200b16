//! Cluster-unique player ids, handed out in blocks so etcd is asked once per block.
//!
//! The counter key holds the next unallocated id; a block is claimed with a
//! compare-and-swap on the key's modification revision, so two gateways never get the
//! same block. Ids start at 1 (proto3 does not send 0, and clients treat 0 as "none").

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use crate::{ClusterError, ClusterKeys};

#[derive(Clone)]
pub struct IdAllocator {
    client: Client,
    key: String,
    block: u64,
}

impl IdAllocator {
    pub fn new(client: Client, keys: &ClusterKeys, block: u64) -> Self {
        IdAllocator { client, key: keys.next_player_id(), block: block.max(1) }
    }

    /// Claims the next block `[first, first + block)`.
    pub async fn claim_block(&mut self) -> Result<std::ops::Range<u64>, ClusterError> {
        for _ in 0..64 {
            let current =
                self.client.get(self.key.as_str(), None).await.map_err(ClusterError::from_etcd)?;
            let (next, compare) = match current.kvs().first() {
                Some(kv) => {
                    let next = std::str::from_utf8(kv.value())
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(1);
                    (
                        next,
                        Compare::mod_revision(
                            self.key.as_str(),
                            CompareOp::Equal,
                            kv.mod_revision(),
                        ),
                    )
                }
                None => (1, Compare::version(self.key.as_str(), CompareOp::Equal, 0)),
            };
            let end = next + self.block;
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                self.key.as_str(),
                end.to_string(),
                None,
            )]);
            let response = self.client.txn(txn).await.map_err(ClusterError::from_etcd)?;
            if response.succeeded() {
                return Ok(next..end);
            }
        }
        Err(ClusterError::Conflict(self.key.clone()))
    }
}
