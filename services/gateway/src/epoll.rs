//! The epoll event loop (through mio): the fallback where io_uring is unavailable, and the
//! baseline the io_uring loop is measured against. Readiness-based: one `read` per
//! readable socket until it would block, one `write` per connection with output. The
//! worker's relay links to the shards are sockets of the same epoll set.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, info, warn};

use crate::core::{Closing, Core, LINGER};
use crate::shared::{report_exit, WorkerStart};
use crate::sockets::{configure_client_socket, is_resource_exhaustion, refuse_raw};
use crate::uplink::LinkFailure;

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);
/// The WebSocket listener's token: past every connection's (a 24-bit generation).
const WS_LISTENER: Token = Token(usize::MAX);
const READ_CHUNK: usize = 64 * 1024;
/// Bytes read from one connection per loop iteration: a client that sends without pause
/// cannot keep its worker from serving everyone else.
const READ_PER_ITERATION: usize = 2 * READ_CHUNK;
const TICK: Duration = Duration::from_millis(250);

pub struct EpollConn {
    stream: TcpStream,
    /// Bytes of `out` already written.
    written: usize,
    wants_write: bool,
    write_shut: bool,
    /// Reading stopped for the input budget with bytes possibly left in the kernel.
    read_stopped: bool,
}

type WakeFn = Arc<dyn Fn() + Send + Sync>;

pub fn spawn(start: WorkerStart) -> io::Result<(WakeFn, JoinHandle<()>)> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let index = start.index;
    let shared = Arc::clone(&start.shared);
    let thread = std::thread::Builder::new()
        .name(format!("gw-epoll-{index}"))
        .spawn(move || report_exit(index, &shared, run(poll, start)))?;
    Ok((Arc::new(move || drop(waker.wake())), thread))
}

fn token(slot: u32, generation: u32) -> Token {
    Token(2 + ((generation as usize) << 32 | slot as usize))
}

/// Relay links' tokens: bit 62 set (a connection's never has it; the WebSocket listener's
/// is matched first).
const LINK_BIT: usize = 1 << 62;

fn link_token(index: u32, generation: u32) -> Token {
    Token(LINK_BIT | ((generation as usize & 0x00ff_ffff) << 32) | index as usize)
}

fn unlink_token(token: Token) -> Option<(u32, u32)> {
    (token.0 & LINK_BIT != 0 && token != WS_LISTENER)
        .then_some(((token.0 & 0xffff_ffff) as u32, ((token.0 >> 32) & 0x00ff_ffff) as u32))
}

fn untoken(token: Token) -> (u32, u32) {
    let raw = token.0 - 2;
    ((raw & 0xffff_ffff) as u32, (raw >> 32) as u32)
}

fn run(mut poll: Poll, start: WorkerStart) -> io::Result<()> {
    let WorkerStart { index, listener, ws_listener, shared, mail } = start;
    let mut listener = TcpListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut ws_listener = ws_listener.map(TcpListener::from_std);
    if let Some(ws_listener) = ws_listener.as_mut() {
        poll.registry().register(ws_listener, WS_LISTENER, Interest::READABLE)?;
    }
    let mut core: Core<EpollConn> = Core::new(index, Arc::clone(&shared), mail);
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut dirty = Vec::new();
    let mut links = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    let mut last_tick = Instant::now();
    // Connections with bytes left unread (edge-triggered readiness will not report them
    // again): read on the next iterations, in turn, a bounded amount each.
    let mut unread: Vec<(u32, u32)> = Vec::new();
    let mut reading: Vec<(u32, u32)> = Vec::new();
    let mut accept_backoff = false;
    info!(worker = index, "epoll worker started");
    loop {
        let timeout = if unread.is_empty() { TICK } else { Duration::ZERO };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                core.abandon_all();
                return Err(error);
            }
        }
        let now = Instant::now();
        reading.clear();
        reading.append(&mut unread);
        for event in events.iter() {
            match event.token() {
                LISTENER if !accept_backoff => {
                    accept_backoff = accept_all(&mut poll, &listener, false, &mut core, now)
                }
                WS_LISTENER if !accept_backoff => {
                    if let Some(ws_listener) = &ws_listener {
                        accept_backoff = accept_all(&mut poll, ws_listener, true, &mut core, now)
                    }
                }
                LISTENER | WS_LISTENER | WAKE => {}
                token if unlink_token(token).is_some() => {
                    let (index, generation) = unlink_token(token).expect("a link's token");
                    if core.uplink_generation(index) & 0x00ff_ffff != generation {
                        continue;
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        read_link(&mut core, index, &mut buf, now);
                    }
                    write_link(&mut poll, &mut core, index);
                }
                token => {
                    let (slot, generation) = untoken(token);
                    if core.generation(slot) != generation {
                        continue;
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        reading.push((slot, generation));
                    }
                    if event.is_writable() {
                        core.mark_dirty(slot);
                    }
                }
            }
        }
        reading.sort_unstable();
        reading.dedup();
        for &(slot, generation) in &reading {
            if core.generation(slot) == generation && read_some(&mut core, slot, &mut buf, now) {
                unread.push((slot, generation));
            }
        }
        core.process_mail(Instant::now());
        for up in core.take_link_ups() {
            let (stream, connected) = up.split();
            let io = EpollConn {
                stream: TcpStream::from_std(stream),
                written: 0,
                wants_write: false,
                write_shut: false,
                read_stopped: false,
            };
            if let Ok(index) = core.open_uplink(connected, io, Instant::now()) {
                let token = link_token(index, core.uplink_generation(index));
                let uplink = core.uplink_mut(index).expect("invariant: just opened");
                let interest = Interest::READABLE | Interest::WRITABLE;
                if let Err(error) = poll.registry().register(&mut uplink.io.stream, token, interest)
                {
                    core.on_link_lost(index, LinkFailure::Socket(error));
                    write_link(&mut poll, &mut core, index);
                }
            }
        }
        core.flush_inputs();
        if shared.stopping.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            let _ = poll.registry().deregister(&mut listener);
            if let Some(ws_listener) = ws_listener.as_mut() {
                let _ = poll.registry().deregister(ws_listener);
            }
            core.shut_down_all();
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            core.tick(last_tick);
            for slot in core.lingering_too_long() {
                finish(&mut poll, &mut core, slot);
            }
            if accept_backoff && stopping_since.is_none() {
                accept_backoff = accept_all(&mut poll, &listener, false, &mut core, last_tick);
                if let Some(ws_listener) = ws_listener.as_ref().filter(|_| !accept_backoff) {
                    accept_backoff = accept_all(&mut poll, ws_listener, true, &mut core, last_tick);
                }
            }
        }
        core.take_dirty(&mut dirty);
        for &slot in &dirty {
            // Reading resumed after a pause for the input budget: what the kernel holds
            // was never reported again, so it is read now.
            if core.get_mut(slot).is_some_and(|c| c.io.read_stopped && !c.read_paused) {
                if let Some(conn) = core.get_mut(slot) {
                    conn.io.read_stopped = false;
                }
                unread.push((slot, core.generation(slot)));
            }
            write_out(&mut poll, &mut core, slot);
        }
        core.take_dirty_uplinks(&mut links);
        for &index in &links {
            write_link(&mut poll, &mut core, index);
        }
        if let Some(since) = stopping_since {
            if core.open_connections() == 0 || since.elapsed() > LINGER {
                info!(worker = index, "epoll worker stopped");
                return Ok(());
            }
        }
    }
}

/// Accepts every waiting connection (WebSocket ones if `ws`); returns true if accepting
/// must pause (out of descriptors or memory) until the next tick.
fn accept_all(
    poll: &mut Poll,
    listener: &TcpListener,
    ws: bool,
    core: &mut Core<EpollConn>,
    now: Instant,
) -> bool {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                configure_client_socket(stream.as_raw_fd());
                let conn = EpollConn {
                    stream,
                    written: 0,
                    wants_write: false,
                    write_shut: false,
                    read_stopped: false,
                };
                let inserted = if ws {
                    // A refused WebSocket connection comes back only past the bound on
                    // those kept to be told: dropping it closes it.
                    core.insert_ws(conn, Some(peer.ip()), now).map_err(|_| None)
                } else {
                    core.insert(conn, Some(peer.ip()), now).map_err(Some)
                };
                let slot = match inserted {
                    Ok(slot) => slot,
                    Err(Some((conn, refusal))) => {
                        refuse_raw(conn.stream.into_raw_fd(), refusal);
                        continue;
                    }
                    Err(None) => continue,
                };
                let generation = core.generation(slot);
                let conn = core.get_mut(slot).expect("invariant: just inserted");
                if let Err(error) = poll.registry().register(
                    &mut conn.io.stream,
                    token(slot, generation),
                    Interest::READABLE,
                ) {
                    debug!(%error, "cannot register a new connection");
                    core.remove(slot);
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return false,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) if is_resource_exhaustion(&error) => {
                // The connection stays in the backlog; accepting again before descriptors
                // are freed would fail the same way.
                warn!(%error, "accept failed; pausing accepts for a tick");
                core.shared().metrics.accept_backoffs.inc();
                return true;
            }
            Err(error) => {
                debug!(%error, "accept failed");
                return false;
            }
        }
    }
}

/// Reads what the connection's budget allows, at most [`READ_PER_ITERATION`] bytes;
/// returns true if bytes may be left in the kernel (read again next iteration).
fn read_some(core: &mut Core<EpollConn>, slot: u32, buf: &mut [u8], now: Instant) -> bool {
    let mut read = 0;
    loop {
        let Some(conn) = core.get_mut(slot) else {
            return false;
        };
        if conn.read_paused && conn.closing == Closing::No {
            // Over its input budget: leave the bytes to TCP flow control; reading goes on
            // once the core resumes it.
            conn.io.read_stopped = true;
            return false;
        }
        if read >= READ_PER_ITERATION {
            return true;
        }
        let lingering = conn.closing != Closing::No;
        match conn.io.stream.read(buf) {
            Ok(0) => {
                if lingering {
                    // The client saw our close and closed too: finish now.
                    conn.closing = Closing::Abort;
                    core.mark_dirty(slot);
                } else {
                    core.on_peer_closed(slot);
                }
                return false;
            }
            Ok(n) => {
                read += n;
                core.on_data(slot, &buf[..n], now);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return false,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                core.on_peer_closed(slot);
                return false;
            }
        }
    }
}

fn write_out(poll: &mut Poll, core: &mut Core<EpollConn>, slot: u32) {
    let metrics = Arc::clone(&core.shared().metrics);
    let Some(conn) = core.get_mut(slot) else {
        return;
    };
    if conn.closing == Closing::Abort {
        return finish(poll, core, slot);
    }
    while conn.io.written < conn.out.len() {
        match conn.io.stream.write(&conn.out[conn.io.written..]) {
            Ok(n) => {
                conn.io.written += n;
                metrics.bytes_out.add(n as u64);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                core.on_peer_closed(slot);
                return finish(poll, core, slot);
            }
        }
    }
    let drained = conn.io.written == conn.out.len();
    if drained {
        conn.out.clear();
        conn.io.written = 0;
    }
    if drained == conn.io.wants_write {
        conn.io.wants_write = !drained;
        let interest =
            if drained { Interest::READABLE } else { Interest::READABLE | Interest::WRITABLE };
        let generation = core.generation(slot);
        let conn = core.get_mut(slot).expect("invariant: present above");
        let _ = poll.registry().reregister(&mut conn.io.stream, token(slot, generation), interest);
    }
    let conn = core.get_mut(slot).expect("invariant: present above");
    if drained && conn.closing == Closing::AfterFlush && !conn.io.write_shut {
        if core.end_of_output(slot) {
            // A WebSocket close frame goes out first.
            return write_out(poll, core, slot);
        }
        let conn = core.get_mut(slot).expect("invariant: present above");
        // Half-close: the client reads everything we sent, then its EOF reaches us.
        conn.io.write_shut = true;
        let _ = conn.io.stream.shutdown(std::net::Shutdown::Write);
    }
}

/// Reads everything a relay link has for the worker (the shard's output is never left
/// in the kernel: edge-triggered readiness would not report it again).
fn read_link(core: &mut Core<EpollConn>, index: u32, buf: &mut [u8], now: Instant) {
    loop {
        let Some(uplink) = core.uplink_mut(index).filter(|u| !u.failed) else { return };
        match uplink.io.stream.read(buf) {
            Ok(0) => return core.on_link_lost(index, LinkFailure::Closed),
            Ok(n) => core.on_link_data(index, &buf[..n], now),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return core.on_link_lost(index, LinkFailure::Socket(error)),
        }
    }
}

/// Writes what a relay link has queued until the socket takes no more; closes a link the
/// core let go.
fn write_link(poll: &mut Poll, core: &mut Core<EpollConn>, index: u32) {
    let Some(uplink) = core.uplink_mut(index) else { return };
    if !uplink.failed {
        while uplink.io.written < uplink.out.len() {
            match uplink.io.stream.write(&uplink.out[uplink.io.written..]) {
                Ok(n) => uplink.io.written += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    core.on_link_lost(index, LinkFailure::Socket(error));
                    break;
                }
            }
        }
    }
    let Some(uplink) = core.uplink_mut(index) else { return };
    if uplink.failed {
        let _ = poll.registry().deregister(&mut uplink.io.stream);
        // Dropping the stream closes the socket.
        core.remove_uplink(index);
        return;
    }
    if uplink.io.written == uplink.out.len() {
        uplink.out.clear();
        uplink.io.written = 0;
    }
    // What is written from `out` in place is not in flight elsewhere.
    uplink.sending = 0;
}

fn finish(poll: &mut Poll, core: &mut Core<EpollConn>, slot: u32) {
    if let Some(mut conn) = core.remove(slot) {
        let _ = poll.registry().deregister(&mut conn.io.stream);
        // Dropping the stream closes the socket.
    }
}
