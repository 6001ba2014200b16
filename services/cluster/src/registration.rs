//! A member's key on a lease, kept alive for as long as the member lives.
//!
//! The key disappears within the TTL after the process dies (that is how the cluster
//! learns of a death). If etcd is unreachable the member keeps serving; when etcd comes
//! back the registration is renewed, on a new lease if the old one expired meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::ClusterError;

/// Whether the member's key is currently held in etcd (for `/readyz`).
#[derive(Debug, Clone, Default)]
pub struct RegistrationStatus {
    registered: Arc<AtomicBool>,
    expirations: Arc<std::sync::atomic::AtomicU64>,
}

impl RegistrationStatus {
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// How many times etcd let this member's lease expire (the cluster took it for dead:
    /// a hang, or a network partition from etcd longer than the TTL).
    pub fn expirations(&self) -> u64 {
        self.expirations.load(Ordering::Relaxed)
    }
}

/// Handle to a running registration. Dropping it stops the keep-alive; [`Self::revoke`]
/// removes the key at once (a clean exit).
pub struct Registration {
    value: watch::Sender<String>,
    status: RegistrationStatus,
    lease: Arc<std::sync::atomic::AtomicI64>,
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl Registration {
    /// Puts `key = value` on a fresh lease of `ttl`, then keeps it alive in the background.
    /// Fails only if the very first registration fails, so a node that cannot reach etcd
    /// at start says so instead of running unseen.
    pub async fn start(
        client: Client,
        key: String,
        value: String,
        ttl: Duration,
    ) -> Result<Self, ClusterError> {
        let ttl_secs = ttl.as_secs().max(1) as i64;
        let mut first_client = client.clone();
        let lease_id = put_on_new_lease(&mut first_client, &key, &value, ttl_secs).await?;
        let status = RegistrationStatus::default();
        status.registered.store(true, Ordering::Relaxed);
        let lease = Arc::new(std::sync::atomic::AtomicI64::new(lease_id));
        let (sender, receiver) = watch::channel(value);
        let task = tokio::spawn(keep_alive(
            client.clone(),
            key,
            receiver,
            ttl_secs,
            Arc::clone(&lease),
            status.clone(),
        ));
        Ok(Registration { value: sender, status, lease, client, task })
    }

    pub fn status(&self) -> RegistrationStatus {
        self.status.clone()
    }

    /// The lease the key currently lives on (changes if etcd lost the old one).
    pub fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    /// A reader of the current lease id, for work bound to this member's life (elections).
    pub fn lease_source(&self) -> impl Fn() -> i64 + Send + Sync + 'static {
        let lease = Arc::clone(&self.lease);
        move || lease.load(Ordering::Relaxed)
    }

    /// A handle that rewrites the value, for tasks that outlive a borrow of `self`.
    pub fn updater(&self) -> impl Fn(String) + Send + Sync + 'static {
        let value = self.value.clone();
        move |new: String| {
            value.send_replace(new);
        }
    }

    /// Rewrites the value (e.g. a shard going from serving to draining).
    pub fn update(&self, value: String) {
        self.value.send_replace(value);
    }

    /// Stops the keep-alive and deletes the key by revoking its lease.
    pub async fn revoke(mut self) {
        self.task.abort();
        let lease = self.lease.load(Ordering::Relaxed);
        if let Err(error) = self.client.lease_revoke(lease).await {
            warn!(%error, "could not revoke lease; the key expires with its TTL");
        }
        self.status.registered.store(false, Ordering::Relaxed);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn put_on_new_lease(
    client: &mut Client,
    key: &str,
    value: &str,
    ttl_secs: i64,
) -> Result<i64, ClusterError> {
    let lease = client.lease_grant(ttl_secs, None).await.map_err(ClusterError::from_etcd)?;
    client
        .put(key, value, Some(PutOptions::new().with_lease(lease.id())))
        .await
        .map_err(ClusterError::from_etcd)?;
    Ok(lease.id())
}

async fn keep_alive(
    mut client: Client,
    key: String,
    mut value: watch::Receiver<String>,
    ttl_secs: i64,
    lease: Arc<std::sync::atomic::AtomicI64>,
    status: RegistrationStatus,
) {
    let period = Duration::from_millis((ttl_secs as u64 * 1000 / 3).max(200));
    loop {
        let lease_id = lease.load(Ordering::Relaxed);
        let outcome = renew_until_lost(&mut client, &key, &mut value, lease_id, period).await;
        status.registered.store(false, Ordering::Relaxed);
        if matches!(outcome, ClusterError::LeaseExpired) {
            status.expirations.fetch_add(1, Ordering::Relaxed);
        }
        warn!(key, error = %outcome, "registration lost; re-registering");
        let mut backoff = Duration::from_millis(100);
        loop {
            tokio::time::sleep(backoff).await;
            let current = value.borrow_and_update().clone();
            match put_on_new_lease(&mut client, &key, &current, ttl_secs).await {
                Ok(new_lease) => {
                    lease.store(new_lease, Ordering::Relaxed);
                    status.registered.store(true, Ordering::Relaxed);
                    info!(key, lease = new_lease, "re-registered");
                    break;
                }
                Err(error) => {
                    tracing::debug!(key, %error, "etcd still unreachable");
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Refreshes the lease every `period` and rewrites the value when it changes. Returns
/// why it stopped (etcd unreachable, or the lease is gone).
async fn renew_until_lost(
    client: &mut Client,
    key: &str,
    value: &mut watch::Receiver<String>,
    lease_id: i64,
    period: Duration,
) -> ClusterError {
    let (mut keeper, mut responses) = match client.lease_keep_alive(lease_id).await {
        Ok(pair) => pair,
        Err(error) => return ClusterError::from_etcd(error),
    };
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(error) = keeper.keep_alive().await {
                    return ClusterError::from_etcd(error);
                }
                match tokio::time::timeout(period * 2, responses.message()).await {
                    Ok(Ok(Some(response))) if response.ttl() > 0 => {}
                    Ok(Ok(Some(_))) => return ClusterError::LeaseExpired,
                    Ok(Ok(None)) => return ClusterError::Conflict("keep-alive stream closed".into()),
                    Ok(Err(error)) => return ClusterError::from_etcd(error),
                    Err(_) => return ClusterError::Conflict("keep-alive answer timed out".into()),
                }
            }
            changed = value.changed() => {
                if changed.is_err() {
                    // The handle is gone: nothing left to keep alive.
                    std::future::pending::<()>().await;
                }
                let current = value.borrow_and_update().clone();
                if let Err(error) = client
                    .put(key, current, Some(PutOptions::new().with_lease(lease_id)))
                    .await
                {
                    return ClusterError::from_etcd(error);
                }
            }
        }
    }
}
