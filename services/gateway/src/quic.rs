//! The QUIC front: the public protocol over one bidirectional QUIC stream per session.
//!
//! It is one more worker, driven like the io_uring and epoll loops: a thread owns a
//! `Core<QuicConn, QuicLink>` and feeds it the bytes each session's stream delivers, so framing,
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
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info};

use crate::core::{Closing, Core, LINGER};
use crate::quic_tls::{server_config, PresentedCert, QuicCert, QuicSetupError, QuicTimeouts, ALPN};
use crate::shared::{report_exit, Inbox, Shared};
use crate::uplink::LinkFailure;
use crate::GatewayMetrics;

/// Events from the accept and reader tasks waiting for the core task. When it is full,
/// readers wait, and QUIC flow control slows the clients down.
const EVENTS: usize = 1024;
/// Largest chunk a reader hands over at once.
const READ_CHUNK: usize = 64 * 1024;
/// How often lingering closes and pending resumes are checked, as in the other loops.
const TICK: Duration = Duration::from_millis(250);
/// How long the TLS handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How long a connected client may take to open its session stream.
const STREAM_WITHIN: Duration = Duration::from_secs(10);
/// Handshakes in flight beyond which a client must first prove its address (a QUIC Retry
/// round trip), so a flood of spoofed Initial packets costs the gateway one packet each.
const HANDSHAKES_BEFORE_RETRY: usize = 256;
/// Handshakes in flight beyond which new clients are refused outright.
const HANDSHAKES_MAX: usize = 4096;

/// Application close codes (QUIC CONNECTION_CLOSE), for clients' logs.
const CLOSE_DONE: u32 = 0;
const CLOSE_NO_ALPN: u32 = 1;
const CLOSE_NO_STREAM: u32 = 2;

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

/// A session's I/O state in the core.
pub struct QuicConn {
    connection: quinn::Connection,
    send: quinn::SendStream,
    /// Bytes of the core's output buffer already handed to quinn.
    written: usize,
    /// Our side of the stream is finished (after a closing error or a logout).
    finished: bool,
    /// Listed in the core task's `blocked`: the stream took less than there was to send.
    blocked: bool,
}

/// A relay link's I/O state in the core: the QUIC front is a tokio task, so its links are
/// tokio sockets, read by a task each and written from the core task.
pub struct QuicLink {
    write: tokio::net::tcp::OwnedWriteHalf,
    /// Bytes of the link's `out` already written.
    written: usize,
    reader: Option<tokio::task::JoinHandle<()>>,
    blocked: bool,
}

impl Drop for QuicLink {
    fn drop(&mut self) {
        if let Some(reader) = &self.reader {
            reader.abort();
        }
    }
}

enum Event {
    LinkData {
        index: u32,
        generation: u32,
        bytes: Vec<u8>,
    },
    LinkEnded {
        index: u32,
        generation: u32,
        error: Option<io::Error>,
    },
    Opened {
        connection: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    },
    Data {
        slot: u32,
        generation: u32,
        bytes: Bytes,
    },
    /// The client finished its side of the stream, reset it, or the connection ended
    /// (closed by the client, idle timeout, or a TLS/transport error).
    Ended {
        slot: u32,
        generation: u32,
    },
}

pub type WakeFn = Arc<dyn Fn() + Send + Sync>;

/// Starts the QUIC worker thread. `index` is its worker number in session ids.
pub fn spawn(
    index: usize,
    front: QuicFront,
    shared: Arc<Shared>,
    mail: Inbox,
) -> io::Result<(WakeFn, JoinHandle<()>)> {
    let notify = Arc::new(Notify::new());
    let waker = Arc::clone(&notify);
    let thread = std::thread::Builder::new().name("gw-quic".into()).spawn(move || {
        let on_exit = Arc::clone(&shared);
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .and_then(|runtime| runtime.block_on(serve(index, front, shared, mail, notify)));
        report_exit(index, &on_exit, result)
    })?;
    Ok((Arc::new(move || waker.notify_one()), thread))
}

async fn serve(
    index: usize,
    front: QuicFront,
    shared: Arc<Shared>,
    mail: Inbox,
    notify: Arc<Notify>,
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
    let accepting =
        tokio::spawn(accept_loop(endpoint.clone(), events_in.clone(), Arc::clone(&metrics)));
    let mut core: Core<QuicConn, QuicLink> = Core::new(index, Arc::clone(&shared), mail);
    let mut links = Vec::new();
    let mut blocked_links: Vec<u32> = Vec::new();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = Vec::new();
    let mut blocked: Vec<u32> = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    info!(worker = index, %addr, idle_timeout = ?front.timeouts.idle, keep_alive = ?front.timeouts.keep_alive, "QUIC front started");
    loop {
        // The branches' futures are dropped before a handler runs, so handlers may use
        // `core` and `blocked` that the write branch borrows.
        tokio::select! {
            event = events.recv() => {
                if let Some(event) = event {
                    on_event(&mut core, event, &events_in, &metrics);
                }
                // Take what else is queued, bounded so mail and output are not starved.
                for _ in 0..EVENTS {
                    match events.try_recv() {
                        Ok(event) => on_event(&mut core, event, &events_in, &metrics),
                        Err(_) => break,
                    }
                }
            }
            () = notify.notified() => {}
            () = poll_fn(|cx| {
                let sessions = poll_blocked(cx, &mut core, &mut blocked);
                let links = poll_blocked_links(cx, &mut core, &mut blocked_links);
                if sessions.is_ready() || links.is_ready() { Poll::Ready(()) } else { Poll::Pending }
            }) => {}
            _ = ticker.tick() => {
                core.tick(Instant::now());
                for slot in core.lingering_too_long() {
                    finish(&mut core, slot, &metrics);
                }
            }
        }
        core.process_mail(Instant::now());
        open_links(&mut core, &events_in);
        core.flush_inputs();
        if shared.stopping.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            accepting.abort();
            endpoint.set_server_config(None);
            core.shut_down_all();
        }
        core.take_dirty(&mut dirty);
        if !dirty.is_empty() {
            poll_fn(|cx| {
                for &slot in &dirty {
                    write_out(cx, &mut core, slot, &mut blocked, &metrics);
                }
                Poll::Ready(())
            })
            .await;
        }
        core.take_dirty_uplinks(&mut links);
        if !links.is_empty() {
            poll_fn(|cx| {
                for &index in &links {
                    write_link(cx, &mut core, index, &mut blocked_links);
                }
                Poll::Ready(())
            })
            .await;
        }
        if let Some(since) = stopping_since {
            if core.open_connections() == 0 || since.elapsed() > LINGER {
                break;
            }
        }
    }
    endpoint.close(CLOSE_DONE.into(), b"gateway stopped");
    let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    info!(worker = index, "QUIC front stopped");
    Ok(())
}

/// Takes the sockets of links connected for this worker: a reader task each.
fn open_links(core: &mut Core<QuicConn, QuicLink>, events: &mpsc::Sender<Event>) {
    for up in core.take_link_ups() {
        let (stream, connected) = up.split();
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else { continue };
        let (read, write) = stream.into_split();
        let io = QuicLink { write, written: 0, reader: None, blocked: false };
        let Ok(index) = core.open_uplink(connected, io, Instant::now()) else { continue };
        let generation = core.uplink_generation(index);
        let reader = tokio::spawn(read_link(read, index, generation, events.clone()));
        if let Some(uplink) = core.uplink_mut(index) {
            uplink.io.reader = Some(reader);
        }
    }
}

/// Hands a relay link's bytes to the core task.
async fn read_link(
    mut read: tokio::net::tcp::OwnedReadHalf,
    index: u32,
    generation: u32,
    events: mpsc::Sender<Event>,
) {
    use tokio::io::AsyncReadExt;
    loop {
        let mut bytes = Vec::with_capacity(READ_CHUNK);
        let event = match read.read_buf(&mut bytes).await {
            Ok(0) => Event::LinkEnded { index, generation, error: None },
            Ok(_) => Event::LinkData { index, generation, bytes },
            Err(error) => Event::LinkEnded { index, generation, error: Some(error) },
        };
        let ended = matches!(event, Event::LinkEnded { .. });
        if events.send(event).await.is_err() || ended {
            return;
        }
    }
}

/// Writes what a relay link has queued as far as its socket takes it; a link that takes
/// less waits in `blocked` and tokio wakes the core task when it has room. Closes a link
/// the core let go.
fn write_link(
    cx: &mut Context<'_>,
    core: &mut Core<QuicConn, QuicLink>,
    index: u32,
    blocked: &mut Vec<u32>,
) {
    use tokio::io::AsyncWrite;
    let Some(uplink) = core.uplink_mut(index) else { return };
    if uplink.failed {
        core.remove_uplink(index);
        return;
    }
    while uplink.io.written < uplink.out.len() {
        match Pin::new(&mut uplink.io.write).poll_write(cx, &uplink.out[uplink.io.written..]) {
            Poll::Ready(Ok(n)) => uplink.io.written += n,
            Poll::Ready(Err(error)) => {
                core.on_link_lost(index, LinkFailure::Socket(error));
                core.remove_uplink(index);
                return;
            }
            Poll::Pending => break,
        }
    }
    if uplink.io.written == uplink.out.len() {
        uplink.out.clear();
        uplink.io.written = 0;
    } else if !uplink.io.blocked {
        uplink.io.blocked = true;
        blocked.push(index);
    }
}

/// Retries the links whose socket was full; ready when any of them moved.
fn poll_blocked_links(
    cx: &mut Context<'_>,
    core: &mut Core<QuicConn, QuicLink>,
    blocked: &mut Vec<u32>,
) -> Poll<()> {
    if blocked.is_empty() {
        return Poll::Pending;
    }
    let mut moved = false;
    for index in std::mem::take(blocked) {
        let Some(uplink) = core.uplink_mut(index) else {
            moved = true;
            continue;
        };
        uplink.io.blocked = false;
        let unsent = uplink.out.len() - uplink.io.written;
        write_link(cx, core, index, blocked);
        let still = core.uplink_mut(index).map(|u| u.out.len() - u.io.written);
        moved |= still != Some(unsent);
    }
    if moved {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

fn on_event(
    core: &mut Core<QuicConn, QuicLink>,
    event: Event,
    events: &mpsc::Sender<Event>,
    metrics: &Arc<GatewayMetrics>,
) {
    match event {
        Event::LinkData { index, generation, bytes } => {
            if core.uplink_generation(index) == generation {
                core.on_link_data(index, &bytes, Instant::now());
            }
        }
        Event::LinkEnded { index, generation, error } => {
            if core.uplink_generation(index) == generation {
                let failure = error.map_or(LinkFailure::Closed, LinkFailure::Socket);
                core.on_link_lost(index, failure);
            }
        }
        Event::Opened { connection, send, recv } => {
            let reader = connection.clone();
            let peer = connection.remote_address().ip();
            let conn = QuicConn { connection, send, written: 0, finished: false, blocked: false };
            let slot = match core.insert(conn, Some(peer), Instant::now()) {
                Ok(slot) => slot,
                Err((mut conn, refusal)) => {
                    // Told why, then closed once the client had time to read it.
                    tokio::spawn(async move {
                        let _ = conn.send.write_all(&refusal.frame()).await;
                        let _ = conn.send.finish();
                        let _ = tokio::time::timeout(LINGER, conn.connection.closed()).await;
                        conn.connection.close(CLOSE_DONE.into(), b"refused");
                    });
                    return;
                }
            };
            let generation = core.generation(slot);
            metrics.quic_connections.add(1);
            tokio::spawn(read_stream(
                recv,
                reader,
                slot,
                generation,
                events.clone(),
                Arc::clone(metrics),
            ));
        }
        Event::Data { slot, generation, bytes } => {
            if core.generation(slot) == generation {
                core.on_data(slot, &bytes, Instant::now());
            }
        }
        Event::Ended { slot, generation } => {
            if core.generation(slot) != generation {
                return;
            }
            let Some(conn) = core.get_mut(slot) else { return };
            if conn.closing == Closing::No {
                core.on_peer_closed(slot);
            } else {
                // The client read our close and ended too: finish now.
                conn.closing = Closing::Abort;
                core.mark_dirty(slot);
            }
        }
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
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
        let (events, metrics) = (events.clone(), Arc::clone(&metrics));
        tokio::spawn(async move {
            handshake(incoming, events, metrics).await;
            drop(guard);
        });
    }
}

/// One handshake counted as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client's handshake, on its own task so a slow or failing one disturbs nobody.
async fn handshake(
    incoming: quinn::Incoming,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
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
    match tokio::time::timeout(STREAM_WITHIN, connection.accept_bi()).await {
        Ok(Ok((send, recv))) => {
            let _ = events.send(Event::Opened { connection, send, recv }).await;
        }
        Ok(Err(error)) => debug!(%remote, %error, "QUIC client left before opening its stream"),
        Err(_) => {
            debug!(%remote, "QUIC client opened no stream in time");
            connection.close(CLOSE_NO_STREAM.into(), b"open one bidirectional stream");
        }
    }
}

/// Hands a session's stream bytes to the core task, and notices path changes.
async fn read_stream(
    mut recv: quinn::RecvStream,
    connection: quinn::Connection,
    slot: u32,
    generation: u32,
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
            Ok(Some(chunk)) => Event::Data { slot, generation, bytes: chunk.bytes },
            Ok(None) | Err(_) => Event::Ended { slot, generation },
        };
        let ended = matches!(event, Event::Ended { .. });
        if events.send(event).await.is_err() || ended {
            return;
        }
    }
}

/// Retries the sessions whose stream was full; ready when any of them moved.
fn poll_blocked(
    cx: &mut Context<'_>,
    core: &mut Core<QuicConn, QuicLink>,
    blocked: &mut Vec<u32>,
) -> Poll<()> {
    if blocked.is_empty() {
        return Poll::Pending;
    }
    let metrics = Arc::clone(&core.shared().metrics);
    let slots = std::mem::take(blocked);
    let mut moved = false;
    for &slot in &slots {
        let Some(conn) = core.get_mut(slot) else {
            moved = true;
            continue;
        };
        conn.io.blocked = false;
        let unsent = conn.out.len() - conn.io.written;
        write_out(cx, core, slot, blocked, &metrics);
        let still = core.get_mut(slot).map(|conn| conn.out.len() - conn.io.written);
        moved |= still != Some(unsent);
    }
    if moved {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// Writes what the stream takes now. A stream that takes less stays in `blocked`, and
/// quinn wakes the core task when it has room again.
fn write_out(
    cx: &mut Context<'_>,
    core: &mut Core<QuicConn, QuicLink>,
    slot: u32,
    blocked: &mut Vec<u32>,
    metrics: &Arc<GatewayMetrics>,
) {
    let Some(conn) = core.get_mut(slot) else { return };
    if conn.closing == Closing::Abort {
        return finish(core, slot, metrics);
    }
    while conn.io.written < conn.out.len() {
        match Pin::new(&mut conn.io.send).poll_write(cx, &conn.out[conn.io.written..]) {
            Poll::Ready(Ok(n)) => {
                conn.io.written += n;
                metrics.bytes_out.add(n as u64);
            }
            Poll::Ready(Err(_)) => {
                core.on_peer_closed(slot);
                return finish(core, slot, metrics);
            }
            Poll::Pending => break,
        }
    }
    let drained = conn.io.written == conn.out.len();
    if drained {
        conn.out.clear();
        conn.io.written = 0;
        if conn.closing == Closing::AfterFlush && !conn.io.finished {
            // Like TCP's half-close: the client reads everything, then sees the end of the
            // stream, and closes the connection.
            conn.io.finished = true;
            let _ = conn.io.send.finish();
        }
    } else if !conn.io.blocked {
        conn.io.blocked = true;
        blocked.push(slot);
    }
}

fn finish(core: &mut Core<QuicConn, QuicLink>, slot: u32, metrics: &Arc<GatewayMetrics>) {
    if let Some(conn) = core.remove(slot) {
        metrics.quic_connections.add(-1);
        conn.io.connection.close(CLOSE_DONE.into(), b"closed");
    }
}
