//! The channels between a worker and the tasks beside it: the mail path from the link
//! manager and the player store to a worker ([`Mailbox`], [`Inbox`]), the way to the player
//! store, and how a worker's death reaches the gateway. The values they carry are the
//! core's (`meridian_gateway_core::shared`, re-exported here).

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::ShardId;
use tracing::error;

pub use meridian_gateway_core::shared::*;

use crate::GatewayMetrics;

/// Mail a worker may have waiting before its senders wait for it.
const MAILBOX: usize = 1024;

/// Player store lookups waiting for the task that sends them (see `answer_logins`).
pub type AccountSender = tokio::sync::mpsc::Sender<AccountRequest>;

/// What the link manager and the player store tell a worker.
pub enum Mail {
    /// A relay link to a shard is connected for this worker: the event loop takes its
    /// socket, then hands the rest to its core (`Core::link_connected`).
    LinkUp(crate::uplink::LinkUp),
    /// Mail for the worker's core itself (`Core::handle_mail`).
    Core(CoreMail),
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

/// The worker's end of its [`Mailbox`], and its way to the player store.
pub struct Inbox {
    receiver: Receiver<Mail>,
    woken: Arc<AtomicBool>,
    /// Where logins ask the player store for their account's player (`--store`); without
    /// a store every login is a new player.
    accounts: Option<AccountSender>,
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

    /// Queues a player store lookup; `false` if there is no store or its queue is full.
    pub fn ask_store(&self, request: AccountRequest) -> bool {
        self.accounts.as_ref().is_some_and(|a| a.try_send(request).is_ok())
    }
}

/// A worker's mailbox: the relay's sending end, the worker's end, and the shared wake flag.
pub(crate) fn mailbox(
    accounts: Option<AccountSender>,
) -> (SyncSender<Mail>, Inbox, Arc<AtomicBool>) {
    let (sender, receiver) = sync_channel(MAILBOX);
    let woken = Arc::new(AtomicBool::new(false));
    (sender, Inbox { receiver, woken: Arc::clone(&woken), accounts }, woken)
}

/// What a backend needs to start one worker.
pub struct WorkerStart {
    pub index: usize,
    pub listener: std::net::TcpListener,
    /// The worker's WebSocket listener (`--ws`), on the same loop as `listener`.
    pub ws_listener: Option<std::net::TcpListener>,
    pub shared: Arc<Shared>,
    pub mail: Inbox,
    pub failed: Arc<WorkerFailed>,
}

/// How a worker's death reaches the gateway: counted, and the gateway stops and exits
/// non-zero.
pub struct WorkerFailed {
    notify: tokio::sync::Notify,
    metrics: Arc<GatewayMetrics>,
}

impl WorkerFailed {
    pub fn new(metrics: Arc<GatewayMetrics>) -> WorkerFailed {
        WorkerFailed { notify: tokio::sync::Notify::new(), metrics }
    }

    /// An event loop stopped on an error: count it and make the gateway stop.
    pub fn report(&self) {
        self.metrics.worker_failures.inc();
        self.notify.notify_one();
    }

    /// Until a worker fails.
    pub async fn wait(&self) {
        self.notify.notified().await;
    }
}

/// Logs a worker's death and makes the gateway stop: a node with a dead event loop is
/// not healthy (its players were taken out of the world by the loop on its way out).
pub fn report_exit(index: usize, failed: &WorkerFailed, result: std::io::Result<()>) {
    if let Err(err) = result {
        error!(worker = index, error = %err, "worker stopped on an I/O error; the gateway stops");
        failed.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn one_wake_carries_all_mail_until_the_worker_drains() {
        let (sender, receiver) = sync_channel(MAILBOX);
        let woken = Arc::new(AtomicBool::new(false));
        let inbox = Inbox { receiver, woken: Arc::clone(&woken), accounts: None };
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
}
