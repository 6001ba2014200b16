//! The epoll event loop (through mio): the fallback where io_uring is unavailable, and the
//! baseline the io_uring loop is measured against. Readiness-based: one `read` per
//! readable socket until it would block, one `write` per endpoint with output. The
//! worker's relay links to the shards are endpoints like the clients (one id space), with
//! one read path and one write path for both; what the bytes mean is the core's.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, info, warn};

use crate::core::{Closing, Core, Endpoint, Front, Refused, LINGER, TICK};
use crate::shared::{report_exit, WorkerStart};
use crate::shell;
use crate::sockets::{configure_client_socket, is_resource_exhaustion, refuse_raw};
use crate::uplink::LinkUp;

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);
/// The WebSocket listener's token: past every endpoint's (a 24-bit generation).
const WS_LISTENER: Token = Token(usize::MAX);
const READ_CHUNK: usize = 64 * 1024;
/// Bytes read from one connection per loop iteration: a client that sends without pause
/// cannot keep its worker from serving everyone else.
const READ_PER_ITERATION: usize = 2 * READ_CHUNK;

/// The loop's part of one endpoint: its socket, and the output it took from the core.
struct Io {
    endpoint: Endpoint,
    stream: TcpStream,
    /// A relay link's socket: read until it would block (a shard's output is never left in
    /// the kernel), where a client's is read a bounded amount per iteration.
    link: bool,
    /// Output taken from the core, and how much of it is written.
    out: Vec<u8>,
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
    let failed = Arc::clone(&start.failed);
    let thread = std::thread::Builder::new()
        .name(format!("gw-epoll-{index}"))
        .spawn(move || report_exit(index, &failed, run(poll, start)))?;
    Ok((Arc::new(move || drop(waker.wake())), thread))
}

fn token(endpoint: Endpoint) -> Token {
    Token(2 + ((endpoint.generation() as usize) << 32 | endpoint.index() as usize))
}

fn untoken(token: Token) -> Endpoint {
    let raw = token.0 - 2;
    Endpoint::new((raw & 0xffff_ffff) as u32, (raw >> 32) as u32)
}

/// A worker's epoll loop: its poll set, its core, and each endpoint's socket.
struct Loop {
    poll: Poll,
    core: Core,
    /// Each endpoint's socket, by the endpoint's index.
    ios: Vec<Option<Io>>,
    buf: Vec<u8>,
}

fn run(poll: Poll, start: WorkerStart) -> io::Result<()> {
    let WorkerStart { index, listener, ws_listener, shared, mail, .. } = start;
    let mut listener = TcpListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut ws_listener = ws_listener.map(TcpListener::from_std);
    if let Some(ws_listener) = ws_listener.as_mut() {
        poll.registry().register(ws_listener, WS_LISTENER, Interest::READABLE)?;
    }
    let now = Instant::now();
    let mut this = Loop {
        poll,
        core: Core::new(index, Arc::clone(&shared), now),
        ios: Vec::new(),
        buf: vec![0u8; READ_CHUNK],
    };
    let mut events = Events::with_capacity(1024);
    let mut dirty = Vec::new();
    // Endpoints whose socket became writable: the core does not know, so they are written
    // along with the ones it lists.
    let mut writable = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    // Endpoints with bytes left unread (edge-triggered readiness will not report them
    // again): read on the next iterations, in turn, a bounded amount each.
    let mut unread: Vec<Endpoint> = Vec::new();
    let mut reading: Vec<Endpoint> = Vec::new();
    let mut accept_backoff = false;
    info!(worker = index, "epoll worker started");
    loop {
        let due = this.core.poll_timeout().saturating_duration_since(Instant::now());
        let timeout = if unread.is_empty() { due.min(TICK) } else { Duration::ZERO };
        match this.poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                this.core.abandon_all(Instant::now());
                return Err(error);
            }
        }
        let now = Instant::now();
        reading.clear();
        reading.append(&mut unread);
        for event in events.iter() {
            match event.token() {
                LISTENER if !accept_backoff => {
                    accept_backoff = this.accept_all(&listener, Front::Stream, now)
                }
                WS_LISTENER if !accept_backoff => {
                    if let Some(ws_listener) = &ws_listener {
                        accept_backoff = this.accept_all(ws_listener, Front::WebSocket, now)
                    }
                }
                LISTENER | WS_LISTENER | WAKE => {}
                token => {
                    let endpoint = untoken(token);
                    if this.io(endpoint).is_none() {
                        continue;
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        reading.push(endpoint);
                    }
                    if event.is_writable() {
                        writable.push(endpoint);
                    }
                }
            }
        }
        reading.sort_unstable_by_key(|e| (e.index(), e.generation()));
        reading.dedup();
        for &endpoint in &reading {
            if this.read(endpoint, now) {
                unread.push(endpoint);
            }
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
            let _ = this.poll.registry().deregister(&mut listener);
            if let Some(ws_listener) = ws_listener.as_mut() {
                let _ = this.poll.registry().deregister(ws_listener);
            }
            this.core.shut_down(now);
        }
        if now >= this.core.poll_timeout() {
            this.core.handle_timeout(now);
            if accept_backoff && stopping_since.is_none() {
                accept_backoff = this.accept_all(&listener, Front::Stream, now);
                if let Some(ws_listener) = ws_listener.as_ref().filter(|_| !accept_backoff) {
                    accept_backoff = this.accept_all(ws_listener, Front::WebSocket, now);
                }
            }
        }
        this.core.poll_dirty(&mut dirty);
        dirty.append(&mut writable);
        for &endpoint in &dirty {
            // Reading resumed after a pause for the input budget: what the kernel holds
            // was never reported again, so it is read now.
            let paused = this.core.state(endpoint).is_some_and(|s| s.paused);
            if let Some(io) = this.io(endpoint).filter(|io| io.read_stopped && !paused) {
                io.read_stopped = false;
                unread.push(endpoint);
            }
            this.write(endpoint);
        }
        if let Some(since) = stopping_since {
            if this.core.open_connections() == 0 || since.elapsed() > LINGER {
                info!(worker = index, "epoll worker stopped");
                return Ok(());
            }
        }
    }
}

impl Loop {
    fn io(&mut self, endpoint: Endpoint) -> Option<&mut Io> {
        let io = self.ios.get_mut(endpoint.index() as usize)?.as_mut()?;
        (io.endpoint == endpoint).then_some(io)
    }

    /// Registers an endpoint's socket for reading; false (and the socket dropped) if the
    /// poll set refused it.
    fn open(&mut self, endpoint: Endpoint, mut stream: TcpStream, link: bool) -> io::Result<()> {
        self.poll.registry().register(&mut stream, token(endpoint), Interest::READABLE)?;
        let index = endpoint.index() as usize;
        if self.ios.len() <= index {
            self.ios.resize_with(index + 1, || None);
        }
        let io = Io {
            endpoint,
            stream,
            link,
            out: Vec::new(),
            written: 0,
            wants_write: false,
            write_shut: false,
            read_stopped: false,
        };
        self.ios[index] = Some(io);
        Ok(())
    }

    /// Accepts every waiting connection; returns true if accepting must pause (out of
    /// descriptors or memory) until the next tick.
    fn accept_all(&mut self, listener: &TcpListener, front: Front, now: Instant) -> bool {
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    configure_client_socket(stream.as_raw_fd());
                    let endpoint = match self.core.accept(now, Some(peer.ip()), front) {
                        Ok(endpoint) => endpoint,
                        Err(Refused::Tell(refusal)) => {
                            refuse_raw(stream.into_raw_fd(), refusal);
                            continue;
                        }
                        // Dropping it closes it.
                        Err(Refused::Close) => continue,
                    };
                    if let Err(error) = self.open(endpoint, stream, false) {
                        debug!(%error, "cannot register a new connection");
                        self.core.handle_closed(now, endpoint, Some(error));
                        self.core.release(endpoint);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return false,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) if is_resource_exhaustion(&error) => {
                    // The connection stays in the backlog; accepting again before
                    // descriptors are freed would fail the same way.
                    warn!(%error, "accept failed; pausing accepts for a tick");
                    self.core.shared().metrics.accept_backoffs.inc();
                    return true;
                }
                Err(error) => {
                    debug!(%error, "accept failed");
                    return false;
                }
            }
        }
    }

    /// A connected relay link: its socket joins the poll set.
    fn open_link(&mut self, up: LinkUp, now: Instant) {
        let (stream, connected) = up.split();
        let Some(endpoint) = self.core.link_connected(now, connected) else { return };
        if let Err(error) = self.open(endpoint, TcpStream::from_std(stream), true) {
            self.core.handle_closed(now, endpoint, Some(error));
            self.core.release(endpoint);
        }
    }

    /// Reads what the endpoint's budget allows (a client at most [`READ_PER_ITERATION`]
    /// bytes); returns true if bytes may be left in the kernel (read again next iteration).
    fn read(&mut self, endpoint: Endpoint, now: Instant) -> bool {
        let mut read = 0;
        loop {
            let Some(state) = self.core.state(endpoint) else { return false };
            let Some(io) = self.ios.get_mut(endpoint.index() as usize).and_then(Option::as_mut)
            else {
                return false;
            };
            if state.closing == Closing::Abort {
                return false;
            }
            if state.paused && state.closing == Closing::No {
                // Over its input budget: leave the bytes to TCP flow control; reading goes
                // on once the core resumes it.
                io.read_stopped = true;
                return false;
            }
            if !io.link && read >= READ_PER_ITERATION {
                return true;
            }
            match io.stream.read(&mut self.buf) {
                Ok(0) => {
                    self.core.handle_closed(now, endpoint, None);
                    return false;
                }
                Ok(n) => {
                    read += n;
                    self.core.handle_read(now, endpoint, &self.buf[..n]);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return false,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    self.core.handle_closed(now, endpoint, Some(error));
                    return false;
                }
            }
        }
    }

    /// Writes what the core has for the endpoint until the socket takes no more, and takes
    /// the next closing step; an endpoint aborted is closed and released.
    fn write(&mut self, endpoint: Endpoint) {
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
            match io.stream.write(unsent) {
                Ok(n) => {
                    io.written += n;
                    self.core.handle_sent(endpoint, n);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    self.core.handle_closed(Instant::now(), endpoint, Some(error));
                    return self.finish(endpoint);
                }
            }
        }
        let drained = io.written == io.out.len();
        if drained == io.wants_write {
            io.wants_write = !drained;
            let interest =
                if drained { Interest::READABLE } else { Interest::READABLE | Interest::WRITABLE };
            let _ = self.poll.registry().reregister(&mut io.stream, token(endpoint), interest);
        }
        if drained && state.closing == Closing::AfterFlush && !io.write_shut {
            if self.core.finish_output(endpoint) {
                // A WebSocket close frame goes out first.
                return self.write(endpoint);
            }
            // Half-close: the client reads everything we sent, then its EOF reaches us.
            io.write_shut = true;
            let _ = io.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    fn finish(&mut self, endpoint: Endpoint) {
        if let Some(mut io) = self.ios[endpoint.index() as usize].take() {
            let _ = self.poll.registry().deregister(&mut io.stream);
            // Dropping the stream closes the socket.
        }
        self.core.release(endpoint);
    }
}
