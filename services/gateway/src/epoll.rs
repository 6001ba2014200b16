//! The epoll event loop (through mio): the fallback where io_uring is unavailable, and the
//! baseline the io_uring loop is measured against. Readiness-based: one `read` per
//! readable socket until it would block, one `write` per connection with output.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tracing::{debug, info};

use crate::core::{Closing, Core, LINGER};
use crate::worker::{report_exit, WorkerStart};

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);
const READ_CHUNK: usize = 64 * 1024;
const TICK: Duration = Duration::from_millis(250);

pub struct EpollConn {
    stream: TcpStream,
    /// Bytes of `out` already written.
    written: usize,
    wants_write: bool,
    write_shut: bool,
}

type WakeFn = Arc<dyn Fn() + Send + Sync>;

pub fn spawn(start: WorkerStart) -> io::Result<(WakeFn, JoinHandle<()>)> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let index = start.index;
    let thread = std::thread::Builder::new()
        .name(format!("gw-epoll-{index}"))
        .spawn(move || report_exit(index, run(poll, start)))?;
    Ok((Arc::new(move || drop(waker.wake())), thread))
}

fn token(slot: u32, generation: u32) -> Token {
    Token(2 + ((generation as usize) << 32 | slot as usize))
}

fn untoken(token: Token) -> (u32, u32) {
    let raw = token.0 - 2;
    ((raw & 0xffff_ffff) as u32, (raw >> 32) as u32)
}

fn run(mut poll: Poll, start: WorkerStart) -> io::Result<()> {
    let WorkerStart { index, listener, shared, mail } = start;
    let mut listener = TcpListener::from_std(listener);
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut core: Core<EpollConn> = Core::new(index, Arc::clone(&shared), mail);
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut dirty = Vec::new();
    let mut stopping_since: Option<Instant> = None;
    let mut last_tick = Instant::now();
    info!(worker = index, "epoll worker started");
    loop {
        match poll.poll(&mut events, Some(TICK)) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => accept_all(&mut poll, &listener, &mut core),
                WAKE => {}
                token => {
                    let (slot, generation) = untoken(token);
                    if core.generation(slot) != generation {
                        continue;
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        read_all(&mut core, slot, &mut buf);
                    }
                    if event.is_writable() {
                        core.mark_dirty(slot);
                    }
                }
            }
        }
        core.process_mail();
        core.flush_inputs();
        if shared.stopping.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
            let _ = poll.registry().deregister(&mut listener);
            core.shut_down_all();
        }
        core.take_dirty(&mut dirty);
        for &slot in &dirty {
            write_out(&mut poll, &mut core, slot);
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            core.tick();
            for slot in core.lingering_too_long() {
                finish(&mut poll, &mut core, slot);
            }
        }
        if let Some(since) = stopping_since {
            if core.open_connections() == 0 || since.elapsed() > LINGER {
                info!(worker = index, "epoll worker stopped");
                return Ok(());
            }
        }
    }
}

fn accept_all(poll: &mut Poll, listener: &TcpListener, core: &mut Core<EpollConn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                let slot = core.insert(EpollConn {
                    stream,
                    written: 0,
                    wants_write: false,
                    write_shut: false,
                });
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
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                // EMFILE and friends: the connection stays in the backlog; try next round.
                debug!(%error, "accept failed");
                return;
            }
        }
    }
}

fn read_all(core: &mut Core<EpollConn>, slot: u32, buf: &mut [u8]) {
    loop {
        let Some(conn) = core.get_mut(slot) else {
            return;
        };
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
                return;
            }
            Ok(n) => core.on_data(slot, &buf[..n]),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                core.on_peer_closed(slot);
                return;
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
        // Half-close: the client reads everything we sent, then its EOF reaches us.
        conn.io.write_shut = true;
        let _ = conn.io.stream.shutdown(std::net::Shutdown::Write);
    }
}

fn finish(poll: &mut Poll, core: &mut Core<EpollConn>, slot: u32) {
    if let Some(mut conn) = core.remove(slot) {
        let _ = poll.registry().deregister(&mut conn.io.stream);
        // Dropping the stream closes the socket.
    }
}
