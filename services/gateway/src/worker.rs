//! Worker threads: one per core, each with its own listener and event loop.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::shared::{mailbox, AccountSender, Mailbox, Shared, WorkerFailed, WorkerStart};
use crate::sockets::bind_worker_listener;
use crate::{GatewayError, IoBackend};

pub struct Workers {
    shared: Arc<Shared>,
    /// Each worker's way to the player store, if there is one.
    accounts: Option<AccountSender>,
    failed: Arc<WorkerFailed>,
    threads: Vec<JoinHandle<()>>,
    mailboxes: Vec<Mailbox>,
}

impl Workers {
    pub fn new(
        shared: Arc<Shared>,
        accounts: Option<AccountSender>,
        failed: Arc<WorkerFailed>,
    ) -> Workers {
        Workers { shared, accounts, failed, threads: Vec::new(), mailboxes: Vec::new() }
    }

    pub fn mailboxes(&self) -> Vec<Mailbox> {
        self.mailboxes
            .iter()
            .map(|m| Mailbox {
                sender: m.sender.clone(),
                waker: Arc::clone(&m.waker),
                woken: Arc::clone(&m.woken),
            })
            .collect()
    }

    /// Starts the QUIC front as the next worker: deliveries reach it by the worker index in
    /// its session ids, like any TCP worker.
    pub fn spawn_quic(
        &mut self,
        front: crate::QuicFront,
        waiting: Arc<meridian_observe::Gate>,
    ) -> Result<(), GatewayError> {
        let index = self.mailboxes.len();
        let (sender, mail, woken) = mailbox(self.accounts.clone());
        let shared = Arc::clone(&self.shared);
        let (waker, thread) =
            crate::quic::spawn(index, front, shared, mail, Arc::clone(&self.failed), waiting)
                .map_err(|source| GatewayError::Worker { index, source })?;
        self.threads.push(thread);
        self.mailboxes.push(Mailbox { sender, waker, woken });
        Ok(())
    }

    /// Starts a worker per game listener; each also accepts on the WebSocket listener of
    /// the same index, if there is one.
    pub fn spawn_loops(
        &mut self,
        io: IoBackend,
        listeners: Vec<std::net::TcpListener>,
        ws_listeners: Vec<Option<std::net::TcpListener>>,
    ) -> Result<(), GatewayError> {
        let mut ws_listeners = ws_listeners.into_iter();
        for listener in listeners {
            let index = self.mailboxes.len();
            let (sender, mail, woken) = mailbox(self.accounts.clone());
            let start = WorkerStart {
                index,
                listener,
                ws_listener: ws_listeners.next().flatten(),
                shared: Arc::clone(&self.shared),
                mail,
                failed: Arc::clone(&self.failed),
            };
            let (waker, thread) = match io {
                IoBackend::Uring => crate::uring::spawn(start),
                IoBackend::Epoll => crate::epoll::spawn(start),
            }
            .map_err(|source| GatewayError::Worker { index, source })?;
            self.threads.push(thread);
            self.mailboxes.push(Mailbox { sender, waker, woken });
        }
        Ok(())
    }

    pub fn join(self) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// One listener per worker on the same address (SO_REUSEPORT lets the kernel spread new
/// connections across them). The first is the one the caller bound; it must come from
/// [`crate::sockets::bind_game_listener`], which founds the group these join.
pub fn reuseport_listeners(
    first: std::net::TcpListener,
    workers: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..workers.max(1) {
        listeners.push(bind_worker_listener(addr)?);
    }
    for listener in &listeners {
        listener.set_nonblocking(true)?;
    }
    Ok(listeners)
}
