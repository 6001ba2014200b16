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

#[cfg(feature = "etcd")]
mod admission;
mod balance;
#[cfg(feature = "etcd")]
mod contact;
#[cfg(feature = "etcd")]
mod coordinator;
mod epoch_cell;
#[cfg(feature = "etcd")]
mod error;
#[cfg(feature = "etcd")]
mod ids;
mod keys;
mod layout;
mod model;
#[cfg(feature = "etcd")]
mod patience;
mod ports;
#[cfg(feature = "etcd")]
mod registration;
mod suspect;
mod transport;
#[cfg(feature = "etcd")]
mod watch;

#[cfg(feature = "etcd")]
pub use admission::admit;
pub use balance::{rebalance, Bounds};
#[cfg(feature = "etcd")]
pub use contact::{lapse_grace, EtcdContact};
#[cfg(feature = "etcd")]
pub use coordinator::Coordinator;
pub use epoch_cell::EpochCell;
#[cfg(feature = "etcd")]
pub use error::{gist, ClusterError};
#[cfg(feature = "etcd")]
pub use ids::IdAllocator;
pub use keys::ClusterKeys;
pub use layout::compute_partition;
pub use model::{
    ClusterView, DensityReport, GatewayId, GatewayRecord, LoadProfile, OrderKind, PartitionMap,
    PlayerOrder, Region, ShardId, ShardRecord, ShardState, DENSITY_CELL, LOAD_BAND,
};
#[cfg(feature = "etcd")]
pub use patience::{until_etcd_answers, START_PATIENCE};
pub use ports::listen_port;
#[cfg(feature = "etcd")]
pub use registration::{revoke_dead_shard, ExpiryJudge, Registration, RegistrationStatus};
pub use suspect::{Refusals, CONFIRM_REFUSALS, CONFIRM_SPAN};
pub use transport::{Incompatible, Mismatch, Transport, CLUSTER_PROTOCOL};
#[cfg(feature = "etcd")]
pub use watch::ClusterWatch;

/// The etcd client type, re-exported so dependants need not name the crate.
#[cfg(feature = "etcd")]
pub use etcd_client::Client as EtcdClient;

/// The partition map as etcd has it now (a linearizable read, not the watch's copy, which
/// may lag), or `None` if none was written yet.
#[cfg(feature = "etcd")]
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

/// How to reach etcd: its endpoints and, for an etcd that asks for them, TLS and a user.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Etcd {
    /// `http://host:port` or, with [`Etcd::tls`], `https://host:port`.
    pub endpoints: Vec<String>,
    pub tls: Option<EtcdTls>,
    /// A user and password (etcd's authentication, `etcdctl auth enable`).
    pub user: Option<(String, String)>,
}

/// TLS to etcd: the CA that issued etcd's server certificate and, for an etcd that asks
/// for client certificates (`--client-cert-auth`), this node's certificate and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: std::path::PathBuf,
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Etcd {
    /// The question a person should ask when etcd does not answer, for messages and logs:
    /// "is etcd running at http://127.0.0.1:2379?".
    pub fn running_at(&self) -> String {
        format!("is etcd running at {}?", self.endpoints.join(","))
    }
}

impl std::fmt::Debug for Etcd {
    /// Never prints the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .finish()
    }
}

impl Etcd {
    /// Plain etcd at `endpoints`.
    pub fn plain(endpoints: Vec<String>) -> Etcd {
        Etcd { endpoints, ..Etcd::default() }
    }

    #[cfg(feature = "etcd")]
    fn options(&self) -> Result<etcd_client::ConnectOptions, ClusterError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|source| ClusterError::TlsFile { path: path.into(), source })
        };
        let mut options = etcd_client::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(config);
        }
        if let Some((name, password)) = &self.user {
            // etcd's tokens expire (`--auth-token-ttl`, 5 minutes by default): a call that
            // meets an expired one authenticates again and is retried.
            options =
                options.with_user(name.clone(), password.clone()).with_auto_token_refresh(true);
        }
        Ok(options)
    }
}

/// Connects to etcd with the timeouts every node uses.
#[cfg(feature = "etcd")]
pub async fn connect(etcd: &Etcd) -> Result<etcd_client::Client, ClusterError> {
    connect_with(etcd, Some(std::time::Duration::from_secs(5))).await
}

/// Connects to etcd; `request_timeout: None` is for calls that block by design, such as
/// an election campaign, which waits as long as another member leads. TLS files are read
/// at each connect (a renewed certificate is used from the next one).
#[cfg(feature = "etcd")]
pub async fn connect_with(
    etcd: &Etcd,
    request_timeout: Option<std::time::Duration>,
) -> Result<etcd_client::Client, ClusterError> {
    let mut options = etcd
        .options()?
        .with_connect_timeout(std::time::Duration::from_secs(2))
        // HTTP/2 pings find a connection that broke silently (a stalled etcd, a dropped
        // route). etcd's server takes at most one ping per 5 s (`--grpc-keepalive-min-time`)
        // and none on a connection without a request in flight: a client that pings more
        // often gets its connection closed (`too_many_pings`), failing whatever request it
        // carried, an election campaign most of all. Every 10 s, and only under a request.
        .with_keep_alive(std::time::Duration::from_secs(10), std::time::Duration::from_secs(3))
        .with_keep_alive_while_idle(false);
    if let Some(timeout) = request_timeout {
        options = options.with_timeout(timeout);
    }
    etcd_client::Client::connect(&etcd.endpoints, Some(options))
        .await
        .map_err(ClusterError::Unreachable)
}
