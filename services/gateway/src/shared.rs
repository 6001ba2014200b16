//! What the workers and the tasks beside them share: the read-mostly state every worker
//! reads ([`Shared`]), session ids, and the mail path from the link manager and the player
//! store to workers. Below the event loops and the core, which all use it; it uses none of
//! them.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::ShardId;
use tracing::error;

use crate::ids::IdPool;
use crate::routing::Routing;
use crate::{GatewayConfig, GatewayMetrics};

/// Mail a worker may have waiting before its senders wait for it.
const MAILBOX: usize = 1024;

/// What every worker shares: read-mostly, nothing locked per message.
pub struct Shared {
    pub config: GatewayConfig,
    /// Each worker's routing table, by worker index.
    pub routing: Routing,
    pub ids: Arc<IdPool>,
    pub metrics: Arc<GatewayMetrics>,
    pub stopping: Arc<AtomicBool>,
    /// Turn counter of the round-robin placement policy.
    pub round_robin: AtomicUsize,
    /// Caps on connections (per gateway, per address) and the per-connection limits.
    pub admission: crate::limits::Admission,
    /// Output queued per worker as of its last check, for the gateway-wide output budget.
    pub output_by_worker: Vec<AtomicUsize>,
    /// Woken when an event loop fails: the gateway stops and exits non-zero.
    pub worker_failed: tokio::sync::Notify,
    /// What login tokens are checked against.
    pub login_keys: crate::accounts::LoginKeys,
    /// Unix time for the core, from its `Instant`s (token expiries).
    pub clock: crate::accounts::UnixClock,
    /// Where logins ask the player store for their account's player (`--store`); without
    /// a store every login is a new player.
    pub accounts: Option<tokio::sync::mpsc::Sender<AccountRequest>>,
}

impl Shared {
    /// Records this worker's queued output; returns the gateway's total.
    pub fn report_output(&self, worker: usize, bytes: usize) -> usize {
        if let Some(mine) = self.output_by_worker.get(worker) {
            mine.store(bytes, Ordering::Relaxed);
        }
        self.output_by_worker.iter().map(|w| w.load(Ordering::Relaxed)).sum()
    }

    /// An event loop stopped on an error: count it and make the gateway stop.
    pub fn worker_failed(&self) {
        self.metrics.worker_failures.inc();
        self.worker_failed.notify_one();
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl Shared {
    /// One worker's shared state without etcd or sockets, for the core's tests and the
    /// fuzzing harness: the config's limits and dev mode, routing by `table`, player ids
    /// from `ids`, no player store, metrics in a registry of its own.
    pub(crate) fn for_tests(
        config: GatewayConfig,
        table: crate::routing::RoutingTable,
        ids: Vec<std::ops::Range<u64>>,
    ) -> Shared {
        let registry = meridian_observe::Registry::default();
        let metrics = GatewayMetrics::new(&registry, config.id, config.io);
        Shared {
            routing: Arc::new(vec![meridian_cluster::EpochCell::new(table)]),
            ids: crate::ids::IdPool::fixed(ids),
            metrics: Arc::new(metrics),
            stopping: Arc::new(AtomicBool::new(false)),
            round_robin: AtomicUsize::new(0),
            admission: crate::limits::Admission::new(config.limits.clone()),
            output_by_worker: vec![AtomicUsize::new(0)],
            worker_failed: tokio::sync::Notify::new(),
            login_keys: crate::accounts::LoginKeys::new(None, config.dev_mode),
            clock: crate::accounts::UnixClock::now(),
            accounts: None,
            config,
        }
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl GatewayConfig {
    /// A one-worker gateway's config for tests: round-robin placement, the given limits,
    /// resume tokens signed with `resume_key`, nothing else configured.
    pub(crate) fn for_tests(
        limits: crate::limits::Limits,
        dev_mode: bool,
        resume_key: meridian_protocol::TokenKey,
    ) -> GatewayConfig {
        GatewayConfig {
            placement: crate::Placement::RoundRobin,
            id: meridian_cluster::GatewayId(1),
            cluster: "test".into(),
            etcd: Default::default(),
            io: crate::IoBackend::Epoll,
            workers: 1,
            max_frame: meridian_protocol::DEFAULT_MAX_FRAME,
            max_output_bytes: 1 << 20,
            limits,
            dev_mode,
            lease_ttl: Duration::from_secs(3),
            resume_keys: resume_key.into(),
            admin: meridian_observe::Private::Closed,
            advertise_admin: None,
            advertise: None,
            jwks: None,
            accounts: None,
            tls: None,
        }
    }
}

/// A session id names one connection on one worker for its whole life:
/// `worker (16 bits) | slot (24 bits) | generation (24 bits)`.
pub fn session_id(worker: usize, slot: u32, generation: u32) -> u64 {
    ((worker as u64) << 48)
        | (u64::from(slot & 0x00ff_ffff) << 24)
        | u64::from(generation & 0x00ff_ffff)
}

pub fn session_parts(session: u64) -> (usize, u32, u32) {
    (
        (session >> 48) as usize,
        ((session >> 24) & 0x00ff_ffff) as u32,
        (session & 0x00ff_ffff) as u32,
    )
}

pub fn session_worker(session: u64) -> usize {
    session_parts(session).0
}

/// What the link manager and the player store tell a worker.
pub enum Mail {
    /// A relay link to a shard is connected for this worker: the event loop takes its
    /// socket, then hands the rest to its core (`Core::link_connected`).
    LinkUp(crate::uplink::LinkUp),
    /// Mail for the worker's core itself (`Core::handle_mail`).
    Core(CoreMail),
}

/// What a worker's core is told by the tasks beside it, through its event loop.
pub enum CoreMail {
    /// Shard output handed over directly, as if read from the shard's link: for the core's
    /// tests and the simulator's harness, which have no sockets.
    #[cfg(any(test, feature = "fuzzing"))]
    Deliveries { from: ShardId, deliveries: Vec<meridian_rpc::pb::Delivery> },
    /// This shard is gone and its region reassigned: restore its players elsewhere.
    Restore { dead: ShardId },
    /// The player store's answer to a login's [`AccountRequest`].
    Account { session: u64, answer: AccountAnswer },
}

/// A login waiting for its account's player from the player store.
#[derive(Debug, Clone)]
pub struct AccountRequest {
    pub worker: usize,
    pub session: u64,
    pub account: String,
    pub name: String,
    /// The id the player gets if the account is new (from the worker's id block).
    pub new_id: u64,
}

#[derive(Debug)]
pub enum AccountAnswer {
    Player(crate::accounts::AccountPlayer),
    /// The id offered belongs to another account: ask again with another.
    IdTaken,
    Unavailable(String),
    /// The request never reached the store: its queue was full. The login is refused
    /// `UNAVAILABLE` and may be tried again.
    Busy,
}

/// A worker's inbox for shard output, and the way to wake its event loop.
///
/// Waking costs a system call (an eventfd write) on the relay's side, so it is done only
/// when the worker may not know about new mail yet: once `woken` is set, later mail rides
/// on the same wake until the worker starts its next drain. Under load one write then
/// carries many deliveries instead of one each.
pub struct Mailbox {
    pub(crate) sender: SyncSender<Mail>,
    pub(crate) waker: Arc<dyn Fn() + Send + Sync>,
    pub(crate) woken: Arc<AtomicBool>,
}

impl Mailbox {
    pub fn wake(&self) {
        // Pairs with the fence in `Inbox::drain_start`: either the worker's drain sees the
        // mail just queued, or this sees the flag it cleared and wakes it.
        fence(Ordering::SeqCst);
        if !self.woken.swap(true, Ordering::SeqCst) {
            (self.waker)();
        }
    }

    /// Hands the worker a connected relay link.
    pub async fn link_up(&self, up: crate::uplink::LinkUp) {
        self.send(Mail::LinkUp(up)).await;
    }

    /// Tells the worker to restore the players of a dead shard.
    pub async fn restore(&self, dead: ShardId) {
        self.send(Mail::Core(CoreMail::Restore { dead })).await;
    }

    /// Hands a login its account's player (or why not).
    pub async fn account(&self, session: u64, answer: AccountAnswer) {
        self.send(Mail::Core(CoreMail::Account { session, answer })).await;
    }

    async fn send(&self, mut mail: Mail) {
        loop {
            match self.sender.try_send(mail) {
                Ok(()) => return self.wake(),
                Err(TrySendError::Full(back)) => {
                    mail = back;
                    self.wake();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }
}

/// The worker's end of its [`Mailbox`].
pub struct Inbox {
    receiver: Receiver<Mail>,
    woken: Arc<AtomicBool>,
}

impl Inbox {
    /// Called before each drain: mail queued from now on wakes the worker again.
    pub fn drain_start(&self) {
        self.woken.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub fn try_recv(&self) -> Option<Mail> {
        self.receiver.try_recv().ok()
    }
}

/// A worker's mailbox: the relay's sending end, the worker's end, and the shared wake flag.
pub(crate) fn mailbox() -> (SyncSender<Mail>, Inbox, Arc<AtomicBool>) {
    let (sender, receiver) = sync_channel(MAILBOX);
    let woken = Arc::new(AtomicBool::new(false));
    (sender, Inbox { receiver, woken: Arc::clone(&woken) }, woken)
}

/// What a backend needs to start one worker.
pub struct WorkerStart {
    pub index: usize,
    pub listener: std::net::TcpListener,
    /// The worker's WebSocket listener (`--ws`), on the same loop as `listener`.
    pub ws_listener: Option<std::net::TcpListener>,
    pub shared: Arc<Shared>,
    pub mail: Inbox,
}

/// Logs a worker's death and makes the gateway stop: a node with a dead event loop is
/// not healthy (its players were taken out of the world by the loop on its way out).
pub fn report_exit(index: usize, shared: &Shared, result: std::io::Result<()>) {
    if let Err(err) = result {
        error!(worker = index, error = %err, "worker stopped on an I/O error; the gateway stops");
        shared.worker_failed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_wake_carries_all_mail_until_the_worker_drains() {
        let (sender, receiver) = sync_channel(MAILBOX);
        let woken = Arc::new(AtomicBool::new(false));
        let inbox = Inbox { receiver, woken: Arc::clone(&woken) };
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let waker = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let mailbox = Mailbox { sender, waker, woken };
        for dead in 1..=3 {
            mailbox.restore(ShardId(dead)).await;
        }
        assert_eq!(wakes.load(Ordering::SeqCst), 1, "one wake for mail the worker has not seen");
        inbox.drain_start();
        let mut drained = 0;
        while inbox.try_recv().is_some() {
            drained += 1;
        }
        assert_eq!(drained, 3);
        mailbox.restore(ShardId(4)).await;
        assert_eq!(wakes.load(Ordering::SeqCst), 2, "mail after a drain wakes again");
    }

    #[test]
    fn session_ids_round_trip() {
        let id = session_id(3, 0x00ab_cdef, 0x0012_3456);
        assert_eq!(session_parts(id), (3, 0x00ab_cdef, 0x0012_3456));
        assert_ne!(session_id(0, 1, 0), 0, "session ids are never zero for slot > 0");
    }
}
