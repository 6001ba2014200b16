//! A member's key on a lease, kept alive for as long as the member lives.
//!
//! The key disappears within the TTL after the process dies (that is how the cluster
//! learns of a death). If etcd is unreachable or stalls, the member keeps serving (whether
//! it is registered is reported, not a condition of readiness); as soon as etcd answers
//! again the registration is renewed: on the same lease if etcd kept it, else on a new one
//! (a stalled etcd expires every lease that fell due while it was stopped the moment it
//! resumes). Every failure to hear from etcd is recorded in the node's [`EtcdContact`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{ClusterError, EtcdContact};

/// Whether the member's key is currently held in etcd (the `etcd_registered` gauge; not a
/// condition of readiness: a node serves its players whether or not etcd answers).
#[derive(Debug, Clone, Default)]
pub struct RegistrationStatus {
    registered: Arc<AtomicBool>,
    expirations: Arc<std::sync::atomic::AtomicU64>,
    /// When the latest keep-alive that etcd answered with the lease alive was sent.
    confirmed: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
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

    /// When the latest keep-alive etcd answered with the lease alive was sent: the lease
    /// was alive at least until then.
    pub fn confirmed(&self) -> Option<std::time::Instant> {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn confirm(&self, asked: std::time::Instant) {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = Some(asked);
    }
}

/// Told of each lease expiry, before the key goes on a new lease: the receiver answers on
/// the enclosed sender once the member has judged what it still owns and updated its value
/// (see [`Registration::start_judged`]). A receiver that is gone, or drops the sender,
/// lets the key go on at once.
pub type ExpiryJudge = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>;

/// Waits for `judge`'s answer to an expiry, if there is a judge.
async fn judged(judge: Option<&ExpiryJudge>) {
    let Some(judge) = judge else { return };
    let (done, answer) = tokio::sync::oneshot::channel();
    if judge.send(done).await.is_ok() {
        let _ = answer.await;
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
    /// Puts `key = value` on a fresh lease of `ttl`, then keeps it alive in the background,
    /// recording in `contact` every time etcd does not answer in time. Fails only if the
    /// very first registration fails, so a node that cannot reach etcd at start says so
    /// instead of running unseen.
    pub async fn start(
        client: Client,
        key: String,
        value: String,
        ttl: Duration,
        contact: EtcdContact,
    ) -> Result<Self, ClusterError> {
        Registration::start_judged(client, key, value, ttl, contact, None).await
    }

    /// [`Self::start`], and when etcd lets the lease expire, the key goes on a new lease
    /// only once `judge` has answered: the member decides first what it still owns and
    /// updates its value (a shard taken for dead comes back saying it is a new life, never
    /// as the old one).
    pub async fn start_judged(
        client: Client,
        key: String,
        value: String,
        ttl: Duration,
        contact: EtcdContact,
        judge: Option<ExpiryJudge>,
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
            contact,
            judge,
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
    contact: EtcdContact,
    judge: Option<ExpiryJudge>,
) {
    let period = Duration::from_millis((ttl_secs as u64 * 1000 / 3).max(200));
    loop {
        let lease_id = lease.load(Ordering::Relaxed);
        let outcome =
            renew_until_lost(&mut client, &key, &mut value, lease_id, period, &contact, &status)
                .await;
        contact.lost();
        status.registered.store(false, Ordering::Relaxed);
        let mut expired = matches!(outcome, ClusterError::LeaseExpired);
        warn!(key, error = %outcome, "registration lost; renewing it as soon as etcd answers");
        if expired {
            status.expirations.fetch_add(1, Ordering::Relaxed);
            judged(judge.as_ref()).await;
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            let current = value.borrow_and_update().clone();
            // The lease we had first: if etcd kept it (a keep-alive answer was only late),
            // the key stays put, and so does everything else on that lease (the
            // coordinator's election key). The put also writes a value that changed while
            // etcd did not answer. A lease etcd no longer has makes the put fail with
            // "lease not found", and the key goes on a new lease.
            let renewed = if expired {
                None
            } else {
                let asked = std::time::Instant::now();
                match put_on_lease(&mut client, &key, &current, lease_id).await {
                    Ok(()) => {
                        status.confirm(asked);
                        Some(lease_id)
                    }
                    Err(error) if error.is_lease_not_found() => {
                        info!(key, %error, "the lease expired while etcd did not answer");
                        status.expirations.fetch_add(1, Ordering::Relaxed);
                        expired = true;
                        // The value may change with the judgement: read it again.
                        judged(judge.as_ref()).await;
                        continue;
                    }
                    Err(error) => {
                        tracing::debug!(key, %error, "etcd still unreachable");
                        contact.lost();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                        continue;
                    }
                }
            };
            let renewed = match renewed {
                Some(lease) => Ok(lease),
                None => put_on_new_lease(&mut client, &key, &current, ttl_secs).await,
            };
            match renewed {
                Ok(new_lease) => {
                    lease.store(new_lease, Ordering::Relaxed);
                    status.registered.store(true, Ordering::Relaxed);
                    if new_lease == lease_id {
                        info!(key, lease = new_lease, "registration renewed on the same lease");
                    } else {
                        info!(key, lease = new_lease, "re-registered on a new lease");
                    }
                    break;
                }
                Err(error) => {
                    tracing::debug!(key, %error, "etcd still unreachable");
                    contact.lost();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                }
            }
        }
    }
}

/// The longest wait between two attempts to renew a lost registration: short, so a member
/// is back in etcd within a fraction of a second of etcd answering again (an attempt
/// already waiting on a stalled etcd is answered the moment it resumes).
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);

async fn put_on_lease(
    client: &mut Client,
    key: &str,
    value: &str,
    lease_id: i64,
) -> Result<(), ClusterError> {
    client
        .put(key, value, Some(PutOptions::new().with_lease(lease_id)))
        .await
        .map_err(ClusterError::from_etcd)?;
    Ok(())
}

/// Refreshes the lease every `period` and rewrites the value when it changes. Returns
/// why it stopped (etcd unreachable, or the lease is gone). An answer that comes later than
/// a period is recorded in `contact` too: etcd stalled for that long, and other members'
/// leases may have lapsed meanwhile even though this one was renewed in time.
async fn renew_until_lost(
    client: &mut Client,
    key: &str,
    value: &mut watch::Receiver<String>,
    lease_id: i64,
    period: Duration,
    contact: &EtcdContact,
    status: &RegistrationStatus,
) -> ClusterError {
    let (mut keeper, mut responses) = match client.lease_keep_alive(lease_id).await {
        Ok(pair) => pair,
        Err(error) => return ClusterError::from_etcd(error),
    };
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let asked = tokio::time::Instant::now();
                if let Err(error) = keeper.keep_alive().await {
                    return ClusterError::from_etcd(error);
                }
                match tokio::time::timeout(period * 2, responses.message()).await {
                    Ok(Ok(Some(response))) if response.ttl() > 0 => {
                        status.confirm(asked.into_std());
                        if asked.elapsed() > period {
                            contact.lost();
                        }
                    }
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

/// Takes a shard proven dead (its ports refuse connections: see `suspect.rs`) out of the
/// cluster at once: revokes the lease its record lives on, if the record is still of the
/// life `incarnation` that died (0: whatever life). Its keys go with the lease (its record,
/// its election candidacy), so every watcher sees it leave and the coordinator gives its
/// region away, without waiting out the TTL. Returns whether a lease was revoked: false if
/// the record is gone already or a new life registered.
pub async fn revoke_dead_shard(
    client: &mut Client,
    keys: &crate::ClusterKeys,
    shard: crate::ShardId,
    incarnation: u64,
) -> Result<bool, ClusterError> {
    let answer = client.get(keys.shard(shard), None).await.map_err(ClusterError::from_etcd)?;
    let Some(kv) = answer.kvs().first() else {
        return Ok(false);
    };
    let record: Option<crate::ShardRecord> = serde_json::from_slice(kv.value()).ok();
    let same_life = record.is_some_and(|r| incarnation == 0 || r.incarnation == incarnation);
    if !same_life || kv.lease() == 0 {
        return Ok(false);
    }
    match client.lease_revoke(kv.lease()).await {
        Ok(_) => Ok(true),
        // Expired or revoked by another node meanwhile: gone all the same.
        Err(etcd_client::Error::GRpcStatus(status)) if status.code() == tonic::Code::NotFound => {
            Ok(false)
        }
        Err(error) => Err(ClusterError::from_etcd(error)),
    }
}
