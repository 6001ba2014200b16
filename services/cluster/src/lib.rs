//! Cluster state of Meridian kept in etcd: who is alive, who owns which part of the map.
//!
//! Members register under a cluster key prefix on leases ([`Registration`]); everyone
//! watches the prefix ([`ClusterWatch`]) and reads the result lock-free through an
//! [`EpochCell`]; one elected [`Coordinator`] computes and publishes the [`PartitionMap`]
//! with a strictly increasing epoch; player ids come from [`IdAllocator`] blocks. A node's
//! [`EtcdContact`] remembers when etcd last failed to answer it, so that leases etcd lets
//! lapse while it stalls are not taken for deaths (see `watch.rs`).
//!
//! This crate never touches client traffic and never blocks a hot path: readers of the
//! cluster view pin an epoch and read, writers swap a whole new view in.

mod balance;
mod contact;
mod coordinator;
mod epoch_cell;
mod error;
mod ids;
mod keys;
mod model;
mod registration;
mod watch;

pub use balance::rebalance;
pub use contact::{lapse_grace, EtcdContact};
pub use coordinator::{compute_partition, Coordinator};
pub use epoch_cell::EpochCell;
pub use error::ClusterError;
pub use ids::IdAllocator;
pub use keys::ClusterKeys;
pub use model::{
    ClusterView, DensityReport, GatewayId, GatewayRecord, LoadProfile, OrderKind, PartitionMap,
    PlayerOrder, Region, ShardId, ShardRecord, ShardState, DENSITY_CELL, LOAD_BAND,
};
pub use registration::{Registration, RegistrationStatus};
pub use watch::ClusterWatch;

/// The etcd client type, re-exported so dependants need not name the crate.
pub use etcd_client::Client as EtcdClient;

/// The partition map as etcd has it now (a linearizable read, not the watch's copy, which
/// may lag), or `None` if none was written yet.
pub async fn read_partition(
    client: &mut etcd_client::Client,
    keys: &ClusterKeys,
) -> Result<Option<PartitionMap>, ClusterError> {
    let key = keys.partition();
    let answer = client.get(key.as_str(), None).await.map_err(ClusterError::from_etcd)?;
    let Some(kv) = answer.kvs().first() else { return Ok(None) };
    serde_json::from_slice(kv.value())
        .map(Some)
        .map_err(|source| ClusterError::BadValue { key: key.clone(), source })
}

/// Connects to etcd with the timeouts every node uses.
pub async fn connect(endpoints: &[String]) -> Result<etcd_client::Client, ClusterError> {
    connect_with(endpoints, Some(std::time::Duration::from_secs(5))).await
}

/// Connects to etcd; `request_timeout: None` is for calls that block by design, such as
/// an election campaign, which waits as long as another member leads.
pub async fn connect_with(
    endpoints: &[String],
    request_timeout: Option<std::time::Duration>,
) -> Result<etcd_client::Client, ClusterError> {
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(std::time::Duration::from_secs(2))
        .with_keep_alive(std::time::Duration::from_secs(2), std::time::Duration::from_secs(2));
    if let Some(timeout) = request_timeout {
        options = options.with_timeout(timeout);
    }
    etcd_client::Client::connect(endpoints, Some(options)).await.map_err(ClusterError::Unreachable)
}
