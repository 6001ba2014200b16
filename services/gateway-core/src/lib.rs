//! The gateway worker's session core, sans-IO: everything a worker decides, for every event
//! loop alike (io_uring, epoll, QUIC), with no socket, clock, channel or task of its own.
//!
//! The door is small, like quinn-proto's `Connection` beside quinn's endpoint driver.
//! Events go in, each with the time it happened:
//! - [`Core::accept`] a client connection (TCP or WebSocket), [`Core::link_connected`] a
//!   relay link to a shard (its connecting task did the dialling and the handshake);
//! - [`Core::handle_read`] bytes an endpoint's socket received, [`Core::handle_sent`] bytes
//!   it wrote, [`Core::handle_closed`] its end (EOF or an error);
//! - [`Core::handle_mail`] what the tasks beside the workers say (a dead shard to restore
//!   from, the player store's answer to a login);
//! - [`Core::handle_timeout`] at [`Core::poll_timeout`], and [`Core::end_turn`] once per
//!   loop iteration, after its events (this iteration's inputs go to the links then).
//!
//! Effects come out as values: [`Core::poll_dirty`] lists the endpoints the loop must look
//! at; for each, [`Core::state`] says whether to read and how it is closing,
//! [`Core::take_output`] gives the bytes to write, [`Core::finish_output`] a last frame
//! before the write side is shut; [`Core::release`] forgets an endpoint whose socket the
//! loop has closed. [`Core::poll_account_request`] yields the player store lookups the
//! shell must send on.
//!
//! Client connections and relay links are endpoints of one id space ([`Endpoint`]), so each
//! loop has one read path and one write path for both. The core's rooms:
//! - `endpoints`: the slab of endpoints and their generations;
//! - `conn`: one client connection's session state (`Conn`, `Session`);
//! - `intake`: bytes in, framing, the input budget, paused reading;
//! - `messages/`: one client message kind per file (ping, login, moves, action, chat,
//!   logout, resume), dispatched by `messages/mod.rs`;
//! - `outgoing`: inputs batched per shard for this turn, and batches waiting for room;
//! - `links`: the relay links' lifecycle (open, heartbeat, silence, failure, routing);
//! - `delivery`: shard output into client output, in order across handoffs;
//! - `failover`: players whose shard or link failed, restored elsewhere;
//! - `output`: replies, output bounds, closing;
//! - `timers`: deadlines, resumes and handoffs waiting too long, linger.
//!
//! Beside the core, the values it decides with, also sans-IO:
//! - `limits`: connection caps, token buckets, input budgets;
//! - `routing`: the routing table of shards and their links;
//! - `shared`: what every worker's core shares, session ids, the core's mail;
//! - `uplink`: one relay link's framing and TLS session (rustls, which is sans-IO too);
//! - `websocket`: the WebSocket upgrade and frames;
//! - `accounts`: login tokens and the player store's interface;
//! - `ids`: the block of player ids a worker takes from;
//! - `metrics`: the gateway's counters, which the shell's admin port renders.
//!
//! Only the gateway's event loops (`meridian-gateway`'s `uring.rs`, `epoll.rs`, `quic.rs`,
//! and its `shell.rs`, which they call) and the harness of `fuzzing.rs` call the door; nothing outside this crate touches a
//! connection's state. This crate has no tokio, mio, io-uring or quinn below it (`.ci/rooms`
//! checks with `cargo tree`), so the compiler keeps it sans-IO: it cannot open a socket,
//! spawn a task, sleep or wait on a channel.

pub mod accounts;
mod conn;
mod delivery;
mod endpoints;
mod failover;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod ids;
mod intake;
pub mod limits;
mod links;
mod messages;
mod metrics;
mod outgoing;
mod output;
pub mod routing;
pub mod shared;
#[cfg(test)]
mod tests;
mod timers;
pub mod uplink;
pub mod websocket;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_protocol::pb::ErrorCode;

pub use metrics::GatewayMetrics;

use crate::limits::Refusal;
use crate::routing::RoutingTable;
use crate::shared::{session_id, session_parts, AccountRequest, CoreMail, Shared};
use crate::uplink::{LinkFailure, Uplink};
use crate::websocket::WsState;

pub use conn::Closing;
use conn::{Conn, Session};
use endpoints::{Endpoints, Entry};
use outgoing::Outgoing;

/// How long a connection being closed after an error may keep its read side open, so the
/// client reads the error before the socket goes away.
pub const LINGER: Duration = Duration::from_secs(2);

/// How often the event loops call [`Core::handle_timeout`]: the granularity of every
/// deadline the core keeps (login, idle, linger, resume, restore, heartbeats).
pub const TICK: Duration = Duration::from_millis(250);

/// How long a stopping gateway waits for its shards' answers to the moves and actions it
/// relayed before it refuses them (`UNAVAILABLE`) and tells the client `SHUTTING_DOWN`:
/// with [`TICK`], under [`LINGER`], which bounds the whole stop.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// How long a stopping gateway keeps reading a client after its `SHUTTING_DOWN`: a move it
/// sent before it read the goodbye is answered `SHUTTING_DOWN` with its `client_time`
/// (not relayed), then the connection closes.
pub const GOODBYE_GRACE: Duration = Duration::from_millis(50);

/// Bytes read from a connection and not yet handled. A connection over its input budget
/// is not read any more, but what was already on its way still arrives (an io_uring
/// multishot receive keeps completing until its cancellation lands); past this much the
/// client is cut off.
pub const INBUF_LIMIT: usize = 256 * 1024;

/// WebSocket connections refused admission that a worker keeps until their upgrade is
/// done, to tell them why (DESIGN 2b: a refused client is sent `UNAVAILABLE`). Past this,
/// or for a refused TCP connection, the refusal is written at once and the socket closed.
pub const REFUSED_UPGRADES_MAX: usize = 64;

/// Which event loop the workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoBackend {
    Uring,
    Epoll,
}

impl std::fmt::Display for IoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoBackend::Uring => "uring",
            IoBackend::Epoll => "epoll",
        })
    }
}

/// How a new login picks its shard (dev-mode spawns go to the owner of the cell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The next healthy shard in turn; it spawns the player at a random cell of its region.
    RoundRobin,
    /// The healthy shard with the fewest players.
    LeastLoaded,
}

/// What the core decides with, out of the gateway's configuration (`GatewayConfig::core`).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub placement: Placement,
    pub gateway: meridian_cluster::GatewayId,
    /// The event loop, for the metrics' labels.
    pub io: IoBackend,
    /// Largest frame body accepted from or sent to a client.
    pub max_frame: usize,
    /// Bytes of unsent output a client may have queued before it is cut off.
    pub max_output_bytes: usize,
    /// Connection caps, rate limits and deadlines (see `limits`).
    pub limits: limits::Limits,
    pub dev_mode: bool,
    /// Checks the resume tokens clients present.
    pub resume_keys: meridian_protocol::TokenKeys,
    /// Whether logins ask the player store for their account's player
    /// ([`Core::poll_account_request`]); without one every login is a new player.
    pub store: bool,
}

/// One endpoint of a worker, a client connection or a relay link, for its whole life: its
/// index is reused after [`Core::release`], its generation never (24 bits each, as in
/// session ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    index: u32,
    generation: u32,
}

impl Endpoint {
    pub fn new(index: u32, generation: u32) -> Endpoint {
        Endpoint { index: index & 0x00ff_ffff, generation: generation & 0x00ff_ffff }
    }

    /// Its index: an event loop keeps its own per-endpoint state in a table by it.
    pub fn index(self) -> u32 {
        self.index
    }

    pub fn generation(self) -> u32 {
        self.generation
    }
}

/// Which front a client connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Length-delimited frames on TCP, or on a QUIC stream.
    Stream,
    /// WebSocket frames after an HTTP upgrade.
    WebSocket,
}

/// A connection the core does not take.
#[derive(Debug)]
pub enum Refused {
    /// Write this refusal (a whole frame) and close.
    Tell(Refusal),
    /// Close without a word (a WebSocket past [`REFUSED_UPGRADES_MAX`]).
    Close,
}

/// What the event loop is to do with an endpoint now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointState {
    pub closing: Closing,
    /// Its input budget is spent: the loop stops reading it until this clears (TCP flow
    /// control then slows the client). A connection closing after a flush is still read,
    /// to see the client close its side.
    pub paused: bool,
    /// Bytes [`Core::take_output`] has for it.
    pub output: usize,
}

/// Everything but the endpoint slab, so that handling one connection can borrow it and
/// the context at once.
struct Ctx {
    worker: usize,
    shared: Arc<Shared>,
    /// This turn's inputs per shard, and batches waiting for room on a link.
    outgoing: Outgoing,
    ids: Range<u64>,
    /// Client endpoints with new output or a new closing state, for the event loop.
    dirty: Vec<u32>,
    /// Player store lookups for the shell to send ([`Core::poll_account_request`]).
    account_requests: VecDeque<AccountRequest>,
    /// The time of the event being handled (the core reads no clock of its own).
    now: Instant,
    /// Since when the gateway is stopping ([`Core::shut_down`]).
    shutting_down: Option<Instant>,
    /// A timer due before the next tick (a goodbye's grace ending).
    wake_at: Option<Instant>,
}

pub struct Core {
    endpoints: Endpoints,
    ctx: Ctx,
    /// Refused WebSocket connections waiting to be told (at most [`REFUSED_UPGRADES_MAX`]).
    refused_upgrades: usize,
    /// The frames a WebSocket read brought, reused from read to read.
    ws_frames: Vec<u8>,
    /// The routing table version the links were last checked against.
    links_version: u64,
    /// When [`Core::handle_timeout`] is due next.
    next_timeout: Instant,
}

impl Ctx {
    /// This worker's routing table.
    fn routing(&self) -> &meridian_cluster::EpochCell<RoutingTable> {
        &self.shared.routing[self.worker]
    }

    /// Queues a client endpoint for the event loop's attention this turn.
    fn mark_dirty(&mut self, conn: &mut Conn, slot: u32) {
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(slot);
        }
    }
}

impl Core {
    pub fn new(worker: usize, shared: Arc<Shared>, now: Instant) -> Core {
        Core {
            endpoints: Endpoints::default(),
            ctx: Ctx {
                worker,
                shared,
                outgoing: Outgoing::default(),
                ids: 0..0,
                dirty: Vec::new(),
                account_requests: VecDeque::new(),
                now,
                shutting_down: None,
                wake_at: None,
            },
            refused_upgrades: 0,
            ws_frames: Vec::new(),
            links_version: 0,
            next_timeout: now + TICK,
        }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.ctx.shared
    }

    /// Client connections open (links not counted).
    pub fn open_connections(&self) -> usize {
        self.endpoints.clients
    }

    /// Admits a client connection from `peer` at `now`; its endpoint, or how to refuse it.
    /// A WebSocket connection refused admission is kept (not counted by the admission) to
    /// be told why once upgraded, unless [`REFUSED_UPGRADES_MAX`] already wait.
    pub fn accept(
        &mut self,
        now: Instant,
        peer: Option<IpAddr>,
        front: Front,
    ) -> Result<Endpoint, Refused> {
        self.ctx.now = now;
        let shared = Arc::clone(&self.ctx.shared);
        let admitted = shared.admission.admit(peer, now);
        if let Err(refusal) = &admitted {
            shared.metrics.connections_refused.inc(refusal.reason());
            shared.metrics.error(ErrorCode::Unavailable);
        }
        let (ws, admitted) = match (front, admitted) {
            (Front::Stream, Ok(())) => (None, true),
            (Front::Stream, Err(refusal)) => return Err(Refused::Tell(refusal)),
            (Front::WebSocket, Ok(())) => (Some(Box::new(WsState::new(None))), true),
            (Front::WebSocket, Err(_)) if self.refused_upgrades >= REFUSED_UPGRADES_MAX => {
                shared.metrics.ws_handshake_failures.inc();
                return Err(Refused::Close);
            }
            (Front::WebSocket, Err(refusal)) => {
                self.refused_upgrades += 1;
                (Some(Box::new(WsState::new(Some(refusal.frame())))), false)
            }
        };
        if ws.is_some() {
            shared.metrics.ws_connections.add(1);
        }
        if admitted {
            shared.metrics.connections.add(1);
            shared.metrics.accepted.inc();
        }
        let limits = shared.admission.limits();
        let conn = Conn::new(peer, ws, admitted, limits, now);
        Ok(self.endpoints.insert(Entry::Client(Box::new(conn))))
    }

    /// Bytes an endpoint's socket received at `now`.
    pub fn handle_read(&mut self, now: Instant, endpoint: Endpoint, data: &[u8]) {
        self.ctx.now = now;
        match self.endpoints.get_mut(endpoint) {
            Some(Entry::Client(_)) => self.read_client(endpoint.index, data, now),
            Some(Entry::Link(_)) => self.read_link(endpoint.index, data, now),
            None => {}
        }
    }

    /// Bytes of what [`Core::take_output`] gave that the socket has written.
    pub fn handle_sent(&mut self, endpoint: Endpoint, bytes: usize) {
        match self.endpoints.get_mut(endpoint) {
            Some(Entry::Client(conn)) => {
                self.ctx.shared.metrics.bytes_out.add(bytes as u64);
                conn.sending = conn.sending.saturating_sub(bytes);
            }
            Some(Entry::Link(uplink)) => uplink.sending = uplink.sending.saturating_sub(bytes),
            None => {}
        }
    }

    /// The endpoint's socket reached its end (`None`) or failed. A client that was being
    /// served leaves the world now; one already closing is closed at once; a link is let
    /// go.
    pub fn handle_closed(
        &mut self,
        now: Instant,
        endpoint: Endpoint,
        error: Option<std::io::Error>,
    ) {
        self.ctx.now = now;
        match self.endpoints.get_mut(endpoint) {
            Some(Entry::Client(conn)) if conn.closing == Closing::No => {
                let slot = endpoint.index;
                let session = session_id(self.ctx.worker, slot, conn.generation_slot);
                self.ctx.close(conn, slot, session, Closing::Abort);
            }
            Some(Entry::Client(conn)) => {
                // It read our close and closed too: finish now.
                conn.closing = Closing::Abort;
                self.ctx.mark_dirty(conn, endpoint.index);
            }
            Some(Entry::Link(_)) => {
                let failure = error.map_or(LinkFailure::Closed, LinkFailure::Socket);
                self.fail_link(endpoint.index, failure);
            }
            None => {}
        }
    }

    /// What the tasks beside the workers sent (the shell drains its inbox into this; a
    /// link's socket it takes itself, then calls [`Core::link_connected`]).
    pub fn handle_mail(&mut self, now: Instant, mail: CoreMail) {
        self.ctx.now = now;
        match mail {
            #[cfg(any(test, feature = "fuzzing"))]
            CoreMail::Deliveries { from, deliveries } => self.apply_deliveries(from, deliveries),
            CoreMail::Restore { dead } => {
                // Links the routing table no longer has are let go first, so no player is
                // restored onto one.
                self.reconcile_links();
                self.restore(dead);
            }
            CoreMail::Account { session, answer } => {
                let (_, slot, generation) = session_parts(session);
                let conn = self.endpoints.conn_mut(slot);
                if let Some(conn) =
                    conn.filter(|c| c.generation_slot == generation && c.closing == Closing::No)
                {
                    self.ctx.account_answer(conn, slot, answer);
                }
            }
        }
    }

    /// The routing table may have changed (the event loops need not say: [`Core::end_turn`]
    /// looks every turn): links it no longer has are let go now.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn handle_routing(&mut self, now: Instant) {
        self.ctx.now = now;
        self.reconcile_links();
    }

    /// Periodic work at `now` (due at [`Core::poll_timeout`]; early calls do it early).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.ctx.now = now;
        self.next_timeout = now + TICK;
        self.ctx.wake_at = None;
        self.tick(now);
    }

    /// When [`Core::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Instant {
        self.ctx.wake_at.map_or(self.next_timeout, |at| at.min(self.next_timeout))
    }

    /// The end of a loop iteration: links the routing table dropped are let go, this
    /// turn's inputs go to their links, and every link with something to send is sealed.
    pub fn end_turn(&mut self, now: Instant) {
        self.ctx.now = now;
        self.reconcile_links();
        self.flush_inputs();
        self.seal_links(now);
    }

    /// A player store lookup for the shell to send. If it cannot (the store's queue is
    /// full), it answers [`AccountAnswer::Busy`] through [`Core::handle_mail`].
    pub fn poll_account_request(&mut self) -> Option<AccountRequest> {
        self.ctx.account_requests.pop_front()
    }

    /// Endpoints with new output or a new state since the last call, links included.
    pub fn poll_dirty(&mut self, into: &mut Vec<Endpoint>) {
        into.clear();
        let mut clients = std::mem::take(&mut self.ctx.dirty);
        for slot in clients.drain(..) {
            if let Some(conn) = self.endpoints.conn_mut(slot) {
                conn.dirty = false;
                into.push(Endpoint::new(slot, conn.generation_slot));
            }
        }
        self.ctx.dirty = clients;
        self.endpoints.dirty_links(into);
    }

    /// What the event loop is to do with `endpoint`; `None` once it is released.
    pub fn state(&self, endpoint: Endpoint) -> Option<EndpointState> {
        Some(match self.endpoints.get(endpoint)? {
            Entry::Client(conn) => EndpointState {
                closing: conn.closing,
                paused: conn.read_paused,
                output: conn.out.len(),
            },
            Entry::Link(uplink) => EndpointState {
                closing: if uplink.failed { Closing::Abort } else { Closing::No },
                paused: false,
                output: uplink.out.len(),
            },
        })
    }

    /// Moves the bytes waiting for `endpoint` to `into` (which the loop has emptied: what
    /// it holds is taken to be written), counting them as being sent until
    /// [`Core::handle_sent`] says they are.
    pub fn take_output(&mut self, endpoint: Endpoint, into: &mut Vec<u8>) {
        let (out, sending) = match self.endpoints.get_mut(endpoint) {
            Some(Entry::Client(conn)) if conn.closing != Closing::Abort => {
                (&mut conn.out, &mut conn.sending)
            }
            Some(Entry::Link(uplink)) if !uplink.failed => (&mut uplink.out, &mut uplink.sending),
            _ => return,
        };
        if into.is_empty() {
            std::mem::swap(into, out);
        } else {
            into.append(out);
        }
        *sending += into.len();
    }

    /// Everything of a connection closing after a flush is written: a WebSocket session
    /// gets its close frame now, behind everything else (true: there is that to write
    /// before the write side is shut).
    pub fn finish_output(&mut self, endpoint: Endpoint) -> bool {
        let Some(Entry::Client(conn)) = self.endpoints.get_mut(endpoint) else { return false };
        let Some(ws) = conn.ws.as_mut() else { return false };
        let before = conn.out.len();
        let code = ws.close_code();
        ws.close(&mut conn.out, code);
        conn.out.len() != before
    }

    /// The loop closed the endpoint's socket with nothing in flight on it: the endpoint is
    /// forgotten, and late output addressed to it is recognised by its generation.
    pub fn release(&mut self, endpoint: Endpoint) {
        if self.endpoints.get(endpoint).is_none() {
            return;
        }
        match self.endpoints.remove(endpoint.index) {
            Some(Entry::Client(conn)) => {
                let metrics = &self.ctx.shared.metrics;
                if conn.ws.is_some() {
                    metrics.ws_connections.add(-1);
                }
                if conn.admitted {
                    metrics.connections.add(-1);
                    self.ctx.shared.admission.release(conn.peer);
                } else {
                    self.refused_upgrades -= 1;
                }
            }
            // Dropping the link lets its connecting task connect again.
            Some(Entry::Link(_)) | None => {}
        }
    }

    /// The gateway is stopping: every client is told `SHUTTING_DOWN` (then a resume on
    /// another gateway moves its player there) and closed after flushing, each once what it
    /// is owed is answered: the moves and actions relayed to its shard (what it sends
    /// meanwhile is relayed too). Past [`SHUTDOWN_WAIT`] what is still unanswered is
    /// refused (see `timers.rs`). So nothing relayed goes unanswered; a move the client
    /// sends after the goodbye is on its way is not read, and was not applied.
    pub fn shut_down(&mut self, now: Instant) {
        self.ctx.now = now;
        self.ctx.shutting_down.get_or_insert(now);
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            self.ctx.goodbye_once_answered(conn, slot);
        }
    }

    /// Closes everything after the event loop failed: every player leaves the world (its
    /// shard parks it for the resume window) and the inputs are handed to the links.
    pub fn abandon_all(&mut self, now: Instant) {
        self.ctx.now = now;
        for slot in 0..self.endpoints.len() {
            let Some(conn) = self.endpoints.conn_mut(slot) else { continue };
            let session = session_id(self.ctx.worker, slot, conn.generation_slot);
            self.ctx.close(conn, slot, session, Closing::Abort);
        }
        self.flush_inputs();
        self.seal_links(now);
    }
}
