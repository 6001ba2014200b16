//! The WebSocket front: the public protocol for browsers (and anything that can only speak
//! WebSocket), one binary WebSocket message per protobuf message body, with no length
//! prefix (DESIGN.md section 2b).
//!
//! It is one more worker, shaped like the QUIC front: a thread owns a `Core<WsConn>` and
//! runs a single-threaded tokio runtime with an accept task, a handshake task per incoming
//! connection (the HTTP upgrade, bounded in time), one reader task per session and the core
//! task that owns every session. A reader turns each binary message back into the
//! length-delimited frame the core reads from TCP (a varint prefix and the body), so
//! framing limits, error codes, routing and the relay are the very same code, and TCP, QUIC
//! and WebSocket players share one world; the core task cuts the core's output (frames
//! with their prefix) into one binary message per frame. A text message is not a protocol
//! message: it reaches the core as an undecodable body (`MALFORMED`, then the close); one
//! larger than the frame limit gets `FRAME_TOO_LARGE`, then the close, as over TCP.
//!
//! Behind a TLS-terminating ingress (`wss://`), the ingress speaks TLS and this front plain
//! WebSocket; any request path is accepted, and the subprotocol `meridian.v1` is agreed to
//! when a client offers it.

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{Sink, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, info};

use crate::core::{Closing, Core, LINGER};
use crate::shared::{report_exit, Inbox, Shared};
use crate::GatewayMetrics;

/// The subprotocol agreed to when a client offers it.
pub const SUBPROTOCOL: &str = "meridian.v1";
/// Events from the accept and reader tasks waiting for the core task; when it is full,
/// readers wait and TCP flow control slows the clients down.
const EVENTS: usize = 1024;
/// How often lingering closes and pending resumes are checked, as in the other loops.
const TICK: Duration = Duration::from_millis(250);
/// How long the HTTP upgrade may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Upgrades in flight at most; past it new connections are closed at once.
const HANDSHAKES_MAX: usize = 4096;
/// What a text message becomes for the core: a frame whose one-byte body (`0xff`, a field
/// of the reserved wire type 7) no protobuf decoder takes, so it is refused `MALFORMED`.
const UNDECODABLE: [u8; 2] = [1, 0xff];

/// A bound WebSocket listener, made before the gateway starts so a taken port is reported
/// at start-up.
pub struct WsFront {
    listener: std::net::TcpListener,
}

impl WsFront {
    pub fn bind(addr: SocketAddr) -> io::Result<WsFront> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(WsFront { listener })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

type Stream = WebSocketStream<TcpStream>;

/// A session's I/O state in the core.
pub struct WsConn {
    sink: SplitSink<Stream, Message>,
    /// Bytes of the core's output buffer already handed to the sink (whole frames).
    taken: usize,
    /// The close frame is sent (after a closing error or a logout).
    finished: bool,
    /// Listed in the core task's `blocked`: the sink took less than there was to send.
    blocked: bool,
}

enum Event {
    Opened {
        stream: Box<Stream>,
        peer: SocketAddr,
    },
    Data {
        slot: u32,
        generation: u32,
        bytes: Bytes,
    },
    /// The client closed, or the connection failed.
    Ended {
        slot: u32,
        generation: u32,
    },
}

pub type WakeFn = Arc<dyn Fn() + Send + Sync>;

/// Starts the WebSocket worker thread. `index` is its worker number in session ids.
pub fn spawn(
    index: usize,
    front: WsFront,
    shared: Arc<Shared>,
    mail: Inbox,
) -> io::Result<(WakeFn, JoinHandle<()>)> {
    let notify = Arc::new(Notify::new());
    let waker = Arc::clone(&notify);
    let thread = std::thread::Builder::new().name("gw-ws".into()).spawn(move || {
        let on_exit = Arc::clone(&shared);
        let result = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .and_then(|runtime| runtime.block_on(serve(index, front, shared, mail, notify)));
        report_exit(index, &on_exit, result)
    })?;
    Ok((Arc::new(move || waker.notify_one()), thread))
}

/// The limits tungstenite enforces below the core's: a message may be somewhat larger than
/// the frame limit (the core then refuses it with `FRAME_TOO_LARGE`, as over TCP), and what
/// waits to be written to one client is bounded like the core's output per client.
fn ws_config(shared: &Shared) -> WebSocketConfig {
    let max_frame = shared.config.max_frame;
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(max_frame * 2 + 64);
    config.max_frame_size = Some(max_frame * 2 + 64);
    config.max_write_buffer_size = shared.config.max_output_bytes.max(64 * 1024);
    config.write_buffer_size = 16 * 1024;
    config
}

async fn serve(
    index: usize,
    front: WsFront,
    shared: Arc<Shared>,
    mail: Inbox,
    notify: Arc<Notify>,
) -> io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(front.listener)?;
    let addr = listener.local_addr()?;
    let (events_in, mut events) = mpsc::channel(EVENTS);
    let metrics = Arc::clone(&shared.metrics);
    let config = ws_config(&shared);
    let accepting =
        tokio::spawn(accept_loop(listener, events_in.clone(), Arc::clone(&metrics), config));
    let mut core: Core<WsConn> = Core::new(index, Arc::clone(&shared), mail);
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = Vec::new();
    let mut blocked: Vec<u32> = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    info!(worker = index, %addr, "WebSocket front started");
    loop {
        tokio::select! {
            event = events.recv() => {
                if let Some(event) = event {
                    on_event(&mut core, event, &events_in, &metrics);
                }
                for _ in 0..EVENTS {
                    match events.try_recv() {
                        Ok(event) => on_event(&mut core, event, &events_in, &metrics),
                        Err(_) => break,
                    }
                }
            }
            () = notify.notified() => {}
            () = poll_fn(|cx| poll_blocked(cx, &mut core, &mut blocked)) => {}
            _ = ticker.tick() => {
                core.tick(Instant::now());
                for slot in core.lingering_too_long() {
                    finish(&mut core, slot, &metrics);
                }
            }
        }
        core.process_mail(Instant::now());
        core.flush_inputs();
        if shared.stopping.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            accepting.abort();
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
        if let Some(since) = stopping_since {
            if core.open_connections() == 0 || since.elapsed() > LINGER {
                break;
            }
        }
    }
    info!(worker = index, "WebSocket front stopped");
    Ok(())
}

fn on_event(
    core: &mut Core<WsConn>,
    event: Event,
    events: &mpsc::Sender<Event>,
    metrics: &Arc<GatewayMetrics>,
) {
    match event {
        Event::Opened { stream, peer } => {
            let (sink, source) = (*stream).split();
            let conn = WsConn { sink, taken: 0, finished: false, blocked: false };
            let slot = match core.insert(conn, Some(peer.ip()), Instant::now()) {
                Ok(slot) => slot,
                Err((conn, refusal)) => {
                    // Told why (the frame's body as one message), then closed.
                    tokio::spawn(refuse(conn.sink, refusal.frame()));
                    return;
                }
            };
            let generation = core.generation(slot);
            metrics.ws_connections.add(1);
            tokio::spawn(read_messages(source, slot, generation, events.clone()));
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
                conn.closing = Closing::Abort;
                core.mark_dirty(slot);
            }
        }
    }
}

/// Sends a refusal (a length-delimited frame) as one message and closes.
async fn refuse(mut sink: SplitSink<Stream, Message>, frame: Vec<u8>) {
    use futures_util::SinkExt;
    let body = match meridian_protocol::next_frame(&frame, usize::MAX) {
        Ok(Some(header)) => Bytes::copy_from_slice(header.body(&frame)),
        _ => return,
    };
    let _ = tokio::time::timeout(LINGER, async {
        let _ = sink.send(Message::Binary(body)).await;
        let _ = sink.close().await;
    })
    .await;
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    events: mpsc::Sender<Event>,
    metrics: Arc<GatewayMetrics>,
    config: WebSocketConfig,
) {
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors or memory: back off as the TCP loops do.
                debug!(%error, "WebSocket accept failed; backing off");
                metrics.accept_backoffs.inc();
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        if in_flight.load(Ordering::Relaxed) >= HANDSHAKES_MAX {
            metrics.ws_handshake_failures.inc();
            continue;
        }
        let _ = stream.set_nodelay(true);
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (events, metrics, in_flight) =
            (events.clone(), Arc::clone(&metrics), Arc::clone(&in_flight));
        tokio::spawn(async move {
            handshake(stream, peer, events, &metrics, config).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// One client's HTTP upgrade, on its own task so a slow or failing one disturbs nobody.
// (The callback's error type is tungstenite's HTTP response, large by its design.)
#[allow(clippy::result_large_err)]
async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    events: mpsc::Sender<Event>,
    metrics: &GatewayMetrics,
    config: WebSocketConfig,
) {
    let agree = |request: &Request, mut response: Response| {
        let offered = request
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == SUBPROTOCOL);
        if offered {
            response
                .headers_mut()
                .insert("sec-websocket-protocol", HeaderValue::from_static(SUBPROTOCOL));
        }
        Ok(response)
    };
    let upgrade = tokio_tungstenite::accept_hdr_async_with_config(stream, agree, Some(config));
    match tokio::time::timeout(HANDSHAKE_WITHIN, upgrade).await {
        Ok(Ok(stream)) => {
            metrics.ws_handshakes.inc();
            let _ = events.send(Event::Opened { stream: Box::new(stream), peer }).await;
        }
        Ok(Err(error)) => {
            metrics.ws_handshake_failures.inc();
            debug!(%peer, %error, "WebSocket upgrade failed");
        }
        Err(_) => {
            metrics.ws_handshake_failures.inc();
            debug!(%peer, "WebSocket upgrade timed out");
        }
    }
}

/// Turns a session's messages into the core's length-delimited frames.
async fn read_messages(
    mut source: SplitStream<Stream>,
    slot: u32,
    generation: u32,
    events: mpsc::Sender<Event>,
) {
    loop {
        let event = match source.next().await {
            Some(Ok(Message::Binary(body))) => {
                Event::Data { slot, generation, bytes: delimited(&body) }
            }
            Some(Ok(Message::Text(_))) => {
                Event::Data { slot, generation, bytes: Bytes::from_static(&UNDECODABLE) }
            }
            // Pings are answered by tungstenite; pongs and raw frames carry nothing.
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            Some(Err(WsError::Capacity(_))) => {
                // Larger than even tungstenite's bound: only the length matters to the core.
                let mut prefix = Vec::with_capacity(10);
                prost::encoding::encode_varint(1 << 30, &mut prefix);
                let _ = events.send(Event::Data { slot, generation, bytes: prefix.into() }).await;
                Event::Ended { slot, generation }
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => Event::Ended { slot, generation },
        };
        let ended = matches!(event, Event::Ended { .. });
        if events.send(event).await.is_err() || ended {
            return;
        }
    }
}

/// `varint(len) || body`.
fn delimited(body: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 3);
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out.into()
}

/// Retries the sessions whose sink was full; ready when any of them moved.
fn poll_blocked(cx: &mut Context<'_>, core: &mut Core<WsConn>, blocked: &mut Vec<u32>) -> Poll<()> {
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
        let unsent = conn.out.len() - conn.io.taken;
        write_out(cx, core, slot, blocked, &metrics);
        let still = core.get_mut(slot).map(|conn| conn.out.len() - conn.io.taken);
        moved |= still != Some(unsent) || !blocked.contains(&slot);
    }
    if moved {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// Hands the sink every whole frame of the core's output, one binary message each, and
/// flushes. A sink that takes less stays in `blocked`; tungstenite wakes the core task when
/// it can take more.
fn write_out(
    cx: &mut Context<'_>,
    core: &mut Core<WsConn>,
    slot: u32,
    blocked: &mut Vec<u32>,
    metrics: &Arc<GatewayMetrics>,
) {
    let Some(conn) = core.get_mut(slot) else { return };
    if conn.closing == Closing::Abort {
        return finish(core, slot, metrics);
    }
    let mut pending = false;
    while conn.io.taken < conn.out.len() {
        let rest = &conn.out[conn.io.taken..];
        let Ok(Some(header)) = meridian_protocol::next_frame(rest, usize::MAX) else { break };
        match Pin::new(&mut conn.io.sink).poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => {
                core.on_peer_closed(slot);
                return finish(core, slot, metrics);
            }
            Poll::Pending => {
                pending = true;
                break;
            }
        }
        let body = Bytes::copy_from_slice(header.body(rest));
        metrics.bytes_out.add(body.len() as u64);
        if Pin::new(&mut conn.io.sink).start_send(Message::Binary(body)).is_err() {
            core.on_peer_closed(slot);
            return finish(core, slot, metrics);
        }
        conn.io.taken += header.total_len();
    }
    let drained = conn.io.taken == conn.out.len();
    if drained {
        conn.out.clear();
        conn.io.taken = 0;
        if conn.closing == Closing::AfterFlush && !conn.io.finished {
            // The client reads everything, then the close frame, and closes the socket.
            // (The split sink holds one message until `poll_ready` hands it on: sending
            // without it would replace the last frame.)
            match Pin::new(&mut conn.io.sink).poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    conn.io.finished = true;
                    let _ = Pin::new(&mut conn.io.sink).start_send(Message::Close(None));
                }
                Poll::Ready(Err(_)) => conn.io.finished = true,
                Poll::Pending => pending = true,
            }
        }
    }
    match Pin::new(&mut conn.io.sink).poll_flush(cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(_)) if conn.io.finished => {}
        Poll::Ready(Err(_)) => {
            core.on_peer_closed(slot);
            return finish(core, slot, metrics);
        }
        Poll::Pending => pending = true,
    }
    if (pending || !drained) && !conn.io.blocked {
        conn.io.blocked = true;
        blocked.push(slot);
    }
}

fn finish(core: &mut Core<WsConn>, slot: u32, metrics: &Arc<GatewayMetrics>) {
    if let Some(conn) = core.remove(slot) {
        metrics.ws_connections.add(-1);
        let mut sink = conn.io.sink;
        tokio::spawn(async move {
            use futures_util::SinkExt;
            let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_becomes_the_frame_tcp_would_carry() {
        let body = vec![7u8; 300];
        let framed = delimited(&body);
        let header = meridian_protocol::next_frame(&framed, 4096).unwrap().unwrap();
        assert_eq!(header.body(&framed), &body[..]);
        assert_eq!(header.total_len(), framed.len());
        let header = meridian_protocol::next_frame(&UNDECODABLE, 4096).unwrap().unwrap();
        assert!(meridian_protocol::decode_body::<meridian_protocol::pb::ClientMessage>(
            header.body(&UNDECODABLE)
        )
        .is_err());
    }
}
