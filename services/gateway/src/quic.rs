//! The QUIC front: the public protocol over one bidirectional QUIC stream per session.
//!
//! It is one more worker, driven like the io_uring and epoll loops: a thread owns a
//! [`Core`] and feeds it the bytes each session's stream delivers, so framing,
//! limits, error codes, routing, placement and the relay are the very same code, and TCP
//! and QUIC players share one world. The thread runs a single-threaded tokio runtime for
//! quinn: an accept task and one handshake task per incoming connection, one reader task
//! per session (stream bytes into one bounded event queue), and the core task that owns
//! every session and writes their output with `poll_write` from its own context, so a
//! blocked stream wakes it when it can take more. A session is keyed by its connection,
//! never by the peer's address: a client whose address changes (connection migration)
//! keeps its session and player.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meridian_observe::{Gate, GateLimits};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info};

use crate::core::{Closing, Core, Endpoint, Front, Refused, LINGER};
use crate::quic_tls::{server_config, PresentedCert, QuicCert, QuicSetupError, QuicTimeouts, ALPN};
use crate::shared::{report_exit, Inbox, Shared, WorkerFailed};
use crate::shell;
use crate::uplink::LinkUp;
use crate::GatewayMetrics;

/// Events from the accept and reader tasks waiting for the core task. When it is full,
/// readers wait, and QUIC flow control slows the clients down.
const EVENTS: usize = 1024;
/// Largest chunk a reader hands over at once.
const READ_CHUNK: usize = 64 * 1024;
/// How long the TLS handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How long a connected client may take to open its session stream (a client opens it,
/// and writes its login, as soon as the handshake is done).
const STREAM_WITHIN: Duration = Duration::from_secs(2);
/// Handshakes in flight beyond which a client must first prove its address (a QUIC Retry
/// round trip), so a flood of spoofed Initial packets costs the gateway one packet each.
const HANDSHAKES_BEFORE_RETRY: usize = 256;
/// Handshakes in flight beyond which new clients are refused outright. A handshake counts
/// until it is done, not while the client is waited for to open its stream: that wait is
/// bounded by [`WAITING_FOR_STREAM`] instead, so idle connections cannot fill this.
const HANDSHAKES_MAX: usize = 4096;
/// Connections past their handshake waiting for their session stream, bounded like every
/// connection not yet trusted (`meridian_observe::gate`): at most 16 from one address
/// (more are closed at once with [`CLOSE_BUSY`]; the addresses `--limit-exempt` names have
/// no such share), 1,024 in all, past which a newcomer takes the place of the oldest.
pub const WAITING_FOR_STREAM: GateLimits = GateLimits { per_address: 16, max: 1024 };

/// Application close codes (QUIC CONNECTION_CLOSE), for clients' logs.
const CLOSE_DONE: u32 = 0;
const CLOSE_NO_ALPN: u32 = 1;
const CLOSE_NO_STREAM: u32 = 2;
const CLOSE_BUSY: u32 = 3;

/// A bound QUIC socket and its TLS configuration, made before the gateway starts so bad
/// certificates and taken ports are reported at start-up.
pub struct QuicFront {
    socket: std::net::UdpSocket,
    server: quinn::ServerConfig,
    cert: PresentedCert,
    timeouts: QuicTimeouts,
}

impl QuicFront {
    pub fn bind(
        addr: SocketAddr,
        cert: &QuicCert,
        timeouts: QuicTimeouts,
    ) -> Result<QuicFront, QuicSetupError> {
        let (server, cert) = server_config(cert, timeouts)?;
        let socket = std::net::UdpSocket::bind(addr)
            .map_err(|source| QuicSetupError::Bind { addr, source })?;
        Ok(QuicFront { socket, server, cert, timeouts })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The certificate clients are shown (its SHA-256, and its PEM in dev mode).
    pub fn cert(&self) -> &PresentedCert {
        &self.cert
    }

    pub fn timeouts(&self) -> QuicTimeouts {
        self.timeouts
    }
}

/// The loop's part of one endpoint: a session's QUIC stream or a relay link's socket, the
/// output it took from the core, and how much of it is written.
struct Io {
    endpoint: Endpoint,
    side: Side,
    out: Vec<u8>,
    written: usize,
    /// Listed in the core task's `blocked`: the stream took less than there was to send.
    blocked: bool,
}

enum Side {
    Session {
        connection: quinn::Connection,
        send: quinn::SendStream,
        /// Our side of the stream is finished (after a closing error or a logout).
        finished: bool,
    },
    /// The QUIC front is a tokio task, so its relay links are tokio sockets, read by a
    /// task each and written from the core task.
    Link { write: tokio::net::tcp::OwnedWriteHalf, reader: tokio::task::JoinHandle<()> },
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Side::Link { reader, .. } = &self.side {
            reader.abort();
        }
    }
}

enum Event {
    Opened {
        connection: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    },
    /// Bytes a session's stream or a link's socket brought.
    Data {
        endpoint: Endpoint,
        bytes: Bytes,
    },
    /// The client finished its side of the stream, reset it, or the connection ended
    /// (closed by the client, idle timeout, or a TLS/transport error); or a link's socket
    /// reached its end or failed.
    Ended {
        endpoint: Endpoint,
        error: Option<io::Error>,
    },
}

pub type WakeFn = Arc<dyn Fn() + Send + Sync>;

/// Starts the QUIC worker thread. `index` is its worker number in session ids.
pub fn spawn(
    index: usize,
    front: QuicFront,
    shared: Arc<Shared>,
    mail: Inbox,
    failed: Arc<WorkerFailed>,
    waiting: Arc<Gate>,
) -> io::Result<(WakeFn, JoinHandle<()>)> {
    let notify = Arc::new(Notify::new());
    let waker = Arc::clone(&notify);
    let thread = std::thread::Builder::new().name("gw-quic".into()).spawn(move || {
        let result = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(
            |runtime| runtime.block_on(serve(index, front, shared, mail, notify, waiting)),
        );
        report_exit(index, &failed, result)
    })?;
    Ok((Arc::new(move || waker.notify_one()), thread))
}

/// The core task's state: the core, each endpoint's stream or socket by the endpoint's
/// index, and the endpoints whose stream was full.
struct Loop {
    core: Core,
    ios: Vec<Option<Io>>,
    blocked: Vec<Endpoint>,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
}

async fn serve(
    index: usize,
    front: QuicFront,
    shared: Arc<Shared>,
    mail: Inbox,
    notify: Arc<Notify>,
    waiting: Arc<Gate>,
) -> io::Result<()> {
    let addr = front.socket.local_addr()?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(front.server),
        front.socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    let (events_in, mut events) = mpsc::channel(EVENTS);
    let metrics = Arc::clone(&shared.metrics);
    let exempt = shared.config.limits.exempt.clone();
    let accepting = tokio::spawn(accept_loop(
        endpoint.clone(),
        events_in.clone(),
        Arc::clone(&metrics),
        Waiting { gate: waiting, exempt },
    ));
    let mut this = Loop {
        core: Core::new(index, Arc::clone(&shared), Instant::now()),
        ios: Vec::new(),
        blocked: Vec::new(),
        events: events_in,
        metrics,
    };
    let mut dirty = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    info!(worker = index, %addr, idle_timeout = ?front.timeouts.idle, keep_alive = ?front.timeouts.keep_alive, "QUIC front started");
    loop {
        // The core's tick, or a timer of its own due sooner (a goodbye's grace).
        let due = tokio::time::Instant::from_std(this.core.poll_timeout());
        // The branches' futures are dropped before a handler runs, so handlers may use
        // `this` that the write branch borrows.
        tokio::select! {
            event = events.recv() => {
                if let Some(event) = event {
                    this.on_event(event);
                }
                // Take what else is queued, bounded so mail and output are not starved.
                for _ in 0..EVENTS {
                    match events.try_recv() {
                        Ok(event) => this.on_event(event),
                        Err(_) => break,
                    }
                }
            }
            () = notify.notified() => {}
            () = poll_fn(|cx| this.poll_blocked(cx)) => {}
            () = tokio::time::sleep_until(due) => this.core.handle_timeout(Instant::now()),
        }
        let now = Instant::now();
        let mut ups = Vec::new();
        shell::take_mail(&mut this.core, &mail, now, |up| ups.push(up));
        for up in ups {
            this.open_link(up, now);
        }
        this.core.end_turn(now);
        shell::send_account_requests(&mut this.core, &mail, now);
        if shared.stopping.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(now);
            accepting.abort();
            endpoint.set_server_config(None);
            this.core.shut_down(now);
        }
        this.core.poll_dirty(&mut dirty);
        if !dirty.is_empty() {
            poll_fn(|cx| {
                for &endpoint in &dirty {
                    this.write(cx, endpoint);
                }
                Poll::Ready(())
            })
            .await;
        }
        if let Some(since) = stopping_since {
            if this.core.open_connections() == 0 || since.elapsed() > LINGER {
                break;
            }
        }
    }
    endpoint.close(CLOSE_DONE.into(), b"gateway stopped");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    info!(worker = index, "QUIC front stopped");
    Ok(())
}

impl Loop {
    fn io(&mut self, endpoint: Endpoint) -> Option<&mut Io> {
        let io = self.ios.get_mut(endpoint.index() as usize)?.as_mut()?;
        (io.endpoint == endpoint).then_some(io)
    }

    fn open(&mut self, endpoint: Endpoint, side: Side) {
        let index = endpoint.index() as usize;
        if self.ios.len() <= index {
            self.ios.resize_with(index + 1, || None);
        }
        self.ios[index] = Some(Io { endpoint, side, out: Vec::new(), written: 0, blocked: false });
    }

    /// A connected relay link: a reader task for its socket.
    fn open_link(&mut self, up: LinkUp, now: Instant) {
        let (stream, connected) = up.split();
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else { return };
        let Some(endpoint) = self.core.link_connected(now, connected) else { return };
        let (read, write) = stream.into_split();
        let reader = tokio::spawn(read_link(read, endpoint, self.events.clone()));
        self.open(endpoint, Side::Link { write, reader });
    }

    fn on_event(&mut self, event: Event) {
        let now = Instant::now();
        match event {
            Event::Opened { connection, send, recv } => {
                let peer = connection.remote_address().ip();
                let endpoint = match self.core.accept(now, Some(peer), Front::Stream) {
                    Ok(endpoint) => endpoint,
                    Err(refused) => {
                        let frame = match refused {
                            Refused::Tell(refusal) => Some(refusal.frame()),
                            Refused::Close => None,
                        };
                        // Told why, then closed once the client had time to read it.
                        let mut send = send;
                        tokio::spawn(async move {
                            if let Some(frame) = frame {
                                let _ = send.write_all(&frame).await;
                            }
                            let _ = send.finish();
                            let _ = tokio::time::timeout(LINGER, connection.closed()).await;
                            connection.close(CLOSE_DONE.into(), b"refused");
                        });
                        return;
                    }
                };
                self.metrics.quic_connections.add(1);
                let reader = connection.clone();
                self.open(endpoint, Side::Session { connection, send, finished: false });
                let (events, metrics) = (self.events.clone(), Arc::clone(&self.metrics));
                tokio::spawn(read_stream(recv, reader, endpoint, events, metrics));
            }
            Event::Data { endpoint, bytes } => {
                if self.io(endpoint).is_some() {
                    self.core.handle_read(now, endpoint, &bytes);
                }
            }
            Event::Ended { endpoint, error } => {
                if self.io(endpoint).is_some() {
                    self.core.handle_closed(now, endpoint, error);
                }
            }
        }
    }

    /// Writes what the endpoint's stream or socket takes now; one that takes less stays in
    /// `blocked`, and tokio wakes the core task when it has room again. An endpoint aborted
    /// is closed and released.
    fn write(&mut self, cx: &mut Context<'_>, endpoint: Endpoint) {
        use tokio::io::AsyncWrite;
        let Some(state) = self.core.state(endpoint) else { return };
        if self.io(endpoint).is_none() {
            return;
        }
        if state.closing == Closing::Abort {
            return self.finish(endpoint);
        }
        let io = self.ios[endpoint.index() as usize].as_mut().expect("invariant: checked above");
        loop {
            let unsent = shell::unwritten(&mut self.core, endpoint, &mut io.out, &mut io.written);
            if unsent.is_empty() {
                break;
            }
            let wrote = match &mut io.side {
                Side::Session { send, .. } => AsyncWrite::poll_write(Pin::new(send), cx, unsent),
                Side::Link { write, .. } => AsyncWrite::poll_write(Pin::new(write), cx, unsent),
            };
            match wrote {
                Poll::Ready(Ok(n)) => {
                    io.written += n;
                    self.core.handle_sent(endpoint, n);
                }
                Poll::Ready(Err(error)) => {
                    self.core.handle_closed(Instant::now(), endpoint, Some(error));
                    return self.finish(endpoint);
                }
                Poll::Pending => break,
            }
        }
        if io.written < io.out.len() {
            if !io.blocked {
                io.blocked = true;
                self.blocked.push(endpoint);
            }
            return;
        }
        if let Side::Session { send, finished, .. } = &mut io.side {
            if state.closing == Closing::AfterFlush && !*finished {
                // Like TCP's half-close: the client reads everything, then sees the end of
                // the stream, and closes the connection.
                *finished = true;
                let _ = send.finish();
            }
        }
    }

    /// Retries the endpoints whose stream was full; ready when any of them moved.
    fn poll_blocked(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.blocked.is_empty() {
            return Poll::Pending;
        }
        let mut moved = false;
        for endpoint in std::mem::take(&mut self.blocked) {
            let Some(io) = self.io(endpoint) else {
                moved = true;
                continue;
            };
            io.blocked = false;
            let unsent = io.out.len() - io.written;
            self.write(cx, endpoint);
            let still = self.io(endpoint).map(|io| io.out.len() - io.written);
            moved |= still != Some(unsent);
        }
        if moved {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn finish(&mut self, endpoint: Endpoint) {
        if let Some(io) = self.ios[endpoint.index() as usize].take() {
            if let Side::Session { connection, .. } = &io.side {
                self.metrics.quic_connections.add(-1);
                connection.close(CLOSE_DONE.into(), b"closed");
            }
        }
        self.core.release(endpoint);
    }
}

/// Hands a relay link's bytes to the core task.
async fn read_link(
    mut read: tokio::net::tcp::OwnedReadHalf,
    endpoint: Endpoint,
    events: mpsc::Sender<Event>,
) {
    use tokio::io::AsyncReadExt;
    loop {
        let mut bytes = Vec::with_capacity(READ_CHUNK);
        let event = match read.read_buf(&mut bytes).await {
            Ok(0) => Event::Ended { endpoint, error: None },
            Ok(_) => Event::Data { endpoint, bytes: bytes.into() },
            Err(error) => Event::Ended { endpoint, error: Some(error) },
        };
        let ended = matches!(event, Event::Ended { .. });
        if events.send(event).await.is_err() || ended {
            return;
        }
    }
}

/// The connections waiting for their session stream, and the addresses with no share.
#[derive(Clone)]
struct Waiting {
    gate: Arc<Gate>,
    exempt: Vec<meridian_gateway_core::limits::AddressBlock>,
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
    waiting: Waiting,
) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    while let Some(incoming) = endpoint.accept().await {
        let busy = in_flight.load(Ordering::Relaxed);
        if busy >= HANDSHAKES_MAX {
            metrics.quic_handshake_failures.inc();
            debug!(remote = %incoming.remote_address(), busy, "QUIC handshakes saturated; refused");
            incoming.refuse();
            continue;
        }
        if busy >= HANDSHAKES_BEFORE_RETRY
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            let _ = incoming.retry();
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(Arc::clone(&in_flight));
        let (events, metrics, waiting) = (events.clone(), Arc::clone(&metrics), waiting.clone());
        tokio::spawn(handshake(incoming, guard, events, metrics, waiting));
    }
}

/// One handshake counted as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client's handshake, on its own task so a slow or failing one disturbs nobody; it
/// counts as in flight (`in_flight`) until the handshake is done, then waits for the
/// client's stream holding a pass at the `waiting` gate.
async fn handshake(
    incoming: quinn::Incoming,
    in_flight: InFlight,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
    waiting: Waiting,
) {
    let remote = incoming.remote_address();
    let started = Instant::now();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(error) => {
            metrics.quic_handshake_failures.inc();
            debug!(%remote, %error, "QUIC connection refused");
            return;
        }
    };
    let connection = match tokio::time::timeout(HANDSHAKE_WITHIN, connecting).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            metrics.quic_handshake_failures.inc();
            debug!(%remote, %error, "QUIC handshake failed");
            return;
        }
        Err(_) => {
            metrics.quic_handshake_failures.inc();
            debug!(%remote, "QUIC handshake timed out");
            return;
        }
    };
    drop(in_flight);
    // rustls refuses a client offering only other protocols; one offering none at all
    // would get through it, so the protocol is checked here as well.
    let protocol = connection
        .handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol);
    if protocol.as_deref() != Some(ALPN) {
        metrics.quic_handshake_failures.inc();
        debug!(%remote, "QUIC client without ALPN meridian/1 refused");
        connection.close(CLOSE_NO_ALPN.into(), b"ALPN meridian/1 required");
        return;
    }
    metrics.quic_handshakes.inc();
    metrics.quic_handshake_seconds.observe(started.elapsed().as_secs_f64());
    debug!(%remote, elapsed = ?started.elapsed(), "QUIC handshake complete");
    // The handshake proved the address (the client read our packets), so its share is
    // its own, not a spoofer's.
    let exempt = waiting.exempt.iter().any(|block| block.contains(remote.ip()));
    let Some(pass) = waiting.gate.admit_as(remote.ip(), exempt) else {
        debug!(%remote, "QUIC client refused: its address has too many connections without a stream");
        connection
            .close(CLOSE_BUSY.into(), b"too many connections without a stream from your address");
        return;
    };
    match pass.within(STREAM_WITHIN, connection.accept_bi()).await {
        Ok(Ok((send, recv))) => {
            drop(pass);
            let _ = events.send(Event::Opened { connection, send, recv }).await;
        }
        Ok(Err(error)) => debug!(%remote, %error, "QUIC client left before opening its stream"),
        Err(cut) => {
            debug!(%remote, ?cut, "QUIC client opened no stream in time, or was evicted");
            connection.close(CLOSE_NO_STREAM.into(), b"open one bidirectional stream");
        }
    }
}

/// Hands a session's stream bytes to the core task, and notices path changes.
async fn read_stream(
    mut recv: quinn::RecvStream,
    connection: quinn::Connection,
    endpoint: Endpoint,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
) {
    let mut path = connection.remote_address();
    loop {
        let read = recv.read_chunk(READ_CHUNK, true).await;
        let now = connection.remote_address();
        if now != path {
            metrics.quic_migrations.inc();
            info!(from = %path, to = %now, "QUIC client migrated to a new address");
            path = now;
        }
        let event = match read {
            Ok(Some(chunk)) => Event::Data { endpoint, bytes: chunk.bytes },
            Ok(None) | Err(_) => Event::Ended { endpoint, error: None },
        };
        let ended = matches!(event, Event::Ended { .. });
        if events.send(event).await.is_err() || ended {
            return;
        }
    }
}
