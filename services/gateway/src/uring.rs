//! The io_uring event loop: the gateway's default.
//!
//! Per worker: one ring, one multishot accept on the worker's listener, one multishot
//! recv per connection drawing from a provided buffer ring (no buffer is tied up by an idle
//! connection), sends straight from the connection's reusable output buffer, and one
//! `io_uring_enter` per loop iteration that both submits everything queued and waits.
//! The worker's relay links to the shards are endpoints like the clients (one id space,
//! [`Endpoint`]), with one read path and one write path for both: a multishot recv each
//! from the same buffer ring, and sends from the endpoint's reusable output buffer. The
//! loop keeps only sockets and what is in flight on them; what the bytes mean is the
//! core's ([`Core`]'s door). Mail (a
//! newly connected link, a dead shard's restore, a player store answer) wakes the loop
//! through an eventfd read that is always armed.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use io_uring::types::BufRingEntry;
use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};
use tracing::{debug, info, warn};

use crate::core::{Closing, Core, Endpoint, Front, Refused, GOODBYE_GRACE, LINGER, TICK};
use crate::shared::{report_exit, Inbox, WorkerStart};
use crate::shell;
use crate::sockets::{configure_client_socket, is_resource_exhaustion, peer_ip, refuse_raw};
use crate::uplink::LinkUp;

const RING_ENTRIES: u32 = 4096;
const BUFFER_GROUP: u16 = 0;
const BUFFER_COUNT: u16 = 2048;
const BUFFER_SIZE: usize = 4096;

const OP_ACCEPT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;
const OP_WAKE: u64 = 4;
const OP_TICK: u64 = 5;
/// Completions of cancellations this loop asks for: nothing to do.
const OP_CANCEL: u64 = 6;
/// Accepts on the WebSocket listener.
const OP_ACCEPT_WS: u64 = 7;
/// A one-off timer while stopping: the core's goodbyes close after their grace, not at the
/// next tick.
const OP_GRACE: u64 = 8;

fn user_data(op: u64, slot: u32, generation: u32) -> u64 {
    (op << 56) | (u64::from(slot & 0x00ff_ffff) << 32) | u64::from(generation)
}

fn parse_user_data(data: u64) -> (u64, u32, u32) {
    (data >> 56, ((data >> 32) & 0x00ff_ffff) as u32, data as u32)
}

/// Checks that this kernel (and sandbox) lets us create a ring with what we use.
pub fn probe() -> io::Result<()> {
    let ring = IoUring::new(8)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [(opcode::RecvMulti::CODE, "recv"), (opcode::AcceptMulti::CODE, "accept")] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("no io_uring {name}")));
        }
    }
    drop(ring);
    let ring = restricted_ring(8)?;
    let buffers = BufRing::new(&ring, 8, 64)?;
    drop(ring);
    drop(buffers);
    Ok(())
}

/// `io_uring_register` opcodes a worker uses once its ring runs (the kernel's ABI numbers):
/// registering and unregistering its provided-buffer ring.
const IORING_REGISTER_PBUF_RING: u8 = 22;
const IORING_UNREGISTER_PBUF_RING: u8 = 23;

/// A worker's ring, created disabled and enabled only once restricted to the operations
/// the worker submits (accept, recv, send, the eventfd read, the tick's timeout and
/// cancellations, with buffer selection) and the registrations it makes (its buffer
/// ring): a bug, or code that got hold of the ring, cannot open files, connect, or do
/// anything else io_uring can. Any other operation completes with `EACCES`.
pub(crate) fn restricted_ring(entries: u32) -> io::Result<IoUring> {
    use io_uring::register::Restriction;
    let ring = IoUring::builder()
        .setup_coop_taskrun()
        .setup_single_issuer()
        .setup_r_disabled()
        .build(entries)?;
    let mut allowed = [
        Restriction::sqe_op(opcode::AcceptMulti::CODE),
        Restriction::sqe_op(opcode::Recv::CODE),
        Restriction::sqe_op(opcode::Send::CODE),
        Restriction::sqe_op(opcode::Read::CODE),
        Restriction::sqe_op(opcode::Timeout::CODE),
        Restriction::sqe_op(opcode::AsyncCancel::CODE),
        Restriction::sqe_flags_allowed(squeue::Flags::BUFFER_SELECT.bits()),
        Restriction::register_op(IORING_REGISTER_PBUF_RING),
        Restriction::register_op(IORING_UNREGISTER_PBUF_RING),
    ];
    ring.submitter().register_restrictions(&mut allowed)?;
    ring.submitter().register_enable_rings()?;
    Ok(ring)
}

/// The loop's part of one endpoint (a client connection or a relay link): its socket and
/// what is in flight on it. Kept by the endpoint's index; the core keeps the rest.
struct Io {
    endpoint: Endpoint,
    fd: RawFd,
    /// The buffer owned by an in-flight send; swapped with the core's output when idle.
    sending: Vec<u8>,
    sent: usize,
    send_in_flight: bool,
    recv_armed: bool,
    /// A cancellation of the multishot recv is on its way (reading paused by the budget).
    recv_cancelling: bool,
    /// The connection has spent its input budget before: it is read one buffer per
    /// receive from now on, so reading stops where the budget does. A multishot receive
    /// drains the socket as fast as the client fills it until its cancellation lands.
    one_buffer_at_a_time: bool,
    write_shut: bool,
    read_shut: bool,
}

impl Io {
    fn new(endpoint: Endpoint, fd: RawFd) -> Io {
        Io {
            endpoint,
            fd,
            sending: Vec::new(),
            sent: 0,
            send_in_flight: false,
            recv_armed: false,
            recv_cancelling: false,
            one_buffer_at_a_time: false,
            write_shut: false,
            read_shut: false,
        }
    }
}

type WakeFn = Arc<dyn Fn() + Send + Sync>;

pub fn spawn(start: WorkerStart) -> io::Result<(WakeFn, JoinHandle<()>)> {
    // SAFETY: plain syscall; the returned fd is owned by the OwnedFd below.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, valid fd that nothing else owns.
    let eventfd =
        Arc::new(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) });
    let index = start.index;
    let loop_fd = Arc::clone(&eventfd);
    let failed = Arc::clone(&start.failed);
    let thread = std::thread::Builder::new()
        .name(format!("gw-uring-{index}"))
        .spawn(move || report_exit(index, &failed, run(start, loop_fd.as_raw_fd())))?;
    let waker: WakeFn = Arc::new(move || {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we keep open via the Arc.
        unsafe { libc::write(eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    });
    Ok((waker, thread))
}

/// A provided-buffer ring: the kernel picks a free buffer for each multishot recv
/// completion, and we hand it back once the bytes are consumed.
struct BufRing {
    entries: *mut BufRingEntry,
    ring_bytes: usize,
    buffers: Vec<u8>,
    count: u16,
    size: usize,
    tail: u16,
}

impl BufRing {
    fn new(ring: &IoUring, count: u16, size: usize) -> io::Result<BufRing> {
        let ring_bytes = usize::from(count) * std::mem::size_of::<BufRingEntry>();
        // SAFETY: anonymous private mapping; checked for failure below. Page alignment, which
        // the kernel requires of a buffer ring, comes with mmap.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_ANONYMOUS | libc::MAP_PRIVATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut buffers = BufRing {
            entries: ptr.cast(),
            ring_bytes,
            buffers: vec![0; usize::from(count) * size],
            count,
            size,
            tail: 0,
        };
        // SAFETY: the mapping lives until `buffers` is dropped, which happens after the ring
        // is dropped (the caller keeps that order) so the kernel never sees freed memory.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(ptr as u64, count, BUFFER_GROUP, 0)?;
        }
        for bid in 0..count {
            buffers.give_back(bid);
        }
        buffers.publish();
        Ok(buffers)
    }

    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = usize::from(bid) * self.size;
        &self.buffers[start..start + len.min(self.size)]
    }

    /// Queues a buffer for reuse; visible to the kernel at the next `publish`.
    fn give_back(&mut self, bid: u16) {
        if bid >= self.count {
            return;
        }
        let index = usize::from(self.tail & (self.count - 1));
        // SAFETY: `index < count` entries fit in the mapping; the entry at the tail is not
        // visible to the kernel until the tail moves past it in `publish`.
        let entry = unsafe { &mut *self.entries.add(index) };
        entry.set_addr(self.buffers[usize::from(bid) * self.size..].as_ptr() as u64);
        entry.set_len(self.size as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the tail field lives inside the first entry of our mapping and the kernel
        // reads it atomically; a release store orders the entries written before it.
        unsafe {
            let tail = BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`.
        unsafe { libc::munmap(self.entries.cast(), self.ring_bytes) };
    }
}

struct Loop {
    ring: IoUring,
    core: Core,
    /// Each endpoint's socket, by the endpoint's index.
    ios: Vec<Option<Io>>,
    /// The game listener, then the WebSocket listener if there is one.
    listeners: [Option<Listening>; 2],
    eventfd: RawFd,
    wake_buf: Box<u64>,
    tick: Box<types::Timespec>,
    /// [`OP_GRACE`]'s time; lives as long as the loop, as the kernel reads it.
    grace: Box<types::Timespec>,
    stopping_since: Option<Instant>,
    /// The time of the current iteration's completions.
    now: Instant,
    /// Endpoints whose completions came this iteration, driven at its end.
    touched: Vec<Endpoint>,
}

/// A listener the loop accepts on.
struct Listening {
    fd: RawFd,
    front: Front,
    /// The multishot accept is armed (its last completion had the MORE flag).
    armed: bool,
    /// Accepting stopped after running out of descriptors or memory; the next tick re-arms.
    backoff: bool,
}

impl Loop {
    /// Queues a submission, flushing the queue to the kernel first if it is full.
    fn push(&mut self, entry: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an entry points to is owned by `self` (wake_buf, tick,
            // an endpoint's `sending`) or by the buffer ring, and outlives the operation.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn io(&mut self, endpoint: Endpoint) -> Option<&mut Io> {
        let io = self.ios.get_mut(endpoint.index() as usize)?.as_mut()?;
        (io.endpoint == endpoint).then_some(io)
    }

    fn arm_accept(&mut self, which: usize) -> io::Result<()> {
        let Some(listening) = self.listeners[which].as_mut() else { return Ok(()) };
        listening.armed = true;
        let op = if which == 0 { OP_ACCEPT } else { OP_ACCEPT_WS };
        let entry = opcode::AcceptMulti::new(types::Fd(listening.fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(op, 0, 0));
        self.push(entry)
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let buf: *mut u64 = &mut *self.wake_buf;
        let entry = opcode::Read::new(types::Fd(self.eventfd), buf.cast(), 8)
            .build()
            .user_data(user_data(OP_WAKE, 0, 0));
        self.push(entry)
    }

    fn arm_tick(&mut self) -> io::Result<()> {
        let entry = opcode::Timeout::new(&*self.tick).build().user_data(user_data(OP_TICK, 0, 0));
        self.push(entry)
    }

    fn arm_recv(&mut self, endpoint: Endpoint) -> io::Result<()> {
        let Some(io) = self.io(endpoint) else { return Ok(()) };
        io.recv_armed = true;
        let entry = if io.one_buffer_at_a_time {
            opcode::Recv::new(types::Fd(io.fd), std::ptr::null_mut(), BUFFER_SIZE as u32)
                .buf_group(BUFFER_GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            opcode::RecvMulti::new(types::Fd(io.fd), BUFFER_GROUP).build()
        };
        let data = user_data(OP_RECV, endpoint.index(), endpoint.generation());
        self.push(entry.user_data(data))
    }

    fn cancel(&mut self, target: u64) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(target).build().user_data(user_data(OP_CANCEL, 0, 0));
        self.push(entry)
    }

    /// Starts driving an endpoint's socket, with its recv armed.
    fn open(&mut self, endpoint: Endpoint, fd: RawFd) -> io::Result<()> {
        let index = endpoint.index() as usize;
        if self.ios.len() <= index {
            self.ios.resize_with(index + 1, || None);
        }
        self.ios[index] = Some(Io::new(endpoint, fd));
        self.arm_recv(endpoint)
    }

    fn on_accept(&mut self, which: usize, result: i32, flags: u32) -> io::Result<()> {
        let more = cqueue::more(flags);
        let Some(listening) = self.listeners[which].as_mut() else { return Ok(()) };
        let front = listening.front;
        if !more {
            listening.armed = false;
        }
        if result < 0 {
            let error = io::Error::from_raw_os_error(-result);
            if is_resource_exhaustion(&error) {
                // Out of descriptors or memory: re-arming at once would spin on the same
                // error. Stop accepting until the next tick; connections wait in the backlog.
                if !listening.backoff {
                    warn!(%error, "accept failed; pausing accepts for a tick");
                    self.core.shared().metrics.accept_backoffs.inc();
                }
                listening.backoff = true;
                if more {
                    let op = if which == 0 { OP_ACCEPT } else { OP_ACCEPT_WS };
                    self.cancel(user_data(op, 0, 0))?;
                }
                return Ok(());
            }
            debug!(%error, "accept failed");
        }
        if !more && !listening.backoff && self.stopping_since.is_none() {
            self.arm_accept(which)?;
        }
        if result < 0 {
            return Ok(());
        }
        let fd = result;
        if self.stopping_since.is_some() {
            // SAFETY: closing the fd the kernel just gave us and nobody else has.
            unsafe { libc::close(fd) };
            return Ok(());
        }
        configure_client_socket(fd);
        match self.core.accept(self.now, peer_ip(fd), front) {
            Ok(endpoint) => self.open(endpoint, fd),
            Err(Refused::Tell(refusal)) => {
                refuse_raw(fd, refusal);
                Ok(())
            }
            Err(Refused::Close) => {
                // SAFETY: closing the fd just accepted, which nothing else has.
                unsafe { libc::close(fd) };
                Ok(())
            }
        }
    }

    /// A connected relay link: its socket joins the loop's endpoints.
    fn open_link(&mut self, up: LinkUp) -> io::Result<()> {
        let (stream, connected) = up.split();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(stream);
        match self.core.link_connected(self.now, connected) {
            Some(endpoint) => self.open(endpoint, fd),
            None => {
                // SAFETY: the fd was just taken from its stream; nothing else has it.
                unsafe { libc::close(fd) };
                Ok(())
            }
        }
    }

    /// A receive on any endpoint completed (one buffer of it, for a multishot receive).
    fn on_recv(
        &mut self,
        endpoint: Endpoint,
        result: i32,
        flags: u32,
        buffers: &mut BufRing,
    ) -> io::Result<()> {
        let buffer = cqueue::buffer_select(flags);
        let current = self.io(endpoint).is_some();
        if current && result > 0 {
            if let Some(bid) = buffer {
                self.core.handle_read(self.now, endpoint, buffers.bytes(bid, result as usize));
            }
        }
        if let Some(bid) = buffer {
            buffers.give_back(bid);
        }
        if !current {
            return Ok(());
        }
        self.touched.push(endpoint);
        let more = cqueue::more(flags);
        let state = self.core.state(endpoint);
        let Some(io) = self.io(endpoint) else { return Ok(()) };
        if !more {
            io.recv_armed = false;
            io.recv_cancelling = false;
        }
        let paused = state.is_some_and(|s| s.paused);
        if paused {
            io.one_buffer_at_a_time = true;
        }
        if paused && io.recv_armed && !io.recv_cancelling {
            // Over its input budget: stop reading; `drive` re-arms once the core resumes.
            io.recv_cancelling = true;
            self.cancel(user_data(OP_RECV, endpoint.index(), endpoint.generation()))?;
        }
        let read_shut = self.io(endpoint).is_some_and(|io| io.read_shut);
        match result {
            n if n > 0 || n == -libc::ENOBUFS || n == -libc::ECANCELED => {
                // Out of buffers (or the kernel ended the multishot): arm again unless closing
                // or paused.
                let readable = state.is_some_and(|s| s.closing != Closing::Abort && !s.paused);
                if !more && readable && !read_shut {
                    self.arm_recv(endpoint)?;
                }
            }
            // EOF: the peer is gone, or it has read our close and closed too.
            0 => self.core.handle_closed(self.now, endpoint, None),
            n => {
                let error = io::Error::from_raw_os_error(-n);
                self.core.handle_closed(self.now, endpoint, Some(error));
            }
        }
        Ok(())
    }

    fn on_send(&mut self, endpoint: Endpoint, result: i32) {
        let Some(io) = self.io(endpoint) else { return };
        io.send_in_flight = false;
        if result < 0 {
            let error = io::Error::from_raw_os_error(-result);
            self.core.handle_closed(self.now, endpoint, Some(error));
        } else {
            io.sent += result as usize;
            if io.sent >= io.sending.len() {
                io.sending.clear();
                io.sent = 0;
            }
            self.core.handle_sent(endpoint, result as usize);
        }
        self.touched.push(endpoint);
    }

    /// Moves an endpoint forward: re-arm its recv after a pause, start a send if idle, or
    /// take the next closing step (the last one releases it).
    fn drive(&mut self, endpoint: Endpoint) -> io::Result<()> {
        let Some(state) = self.core.state(endpoint) else { return Ok(()) };
        let slot = self.ios.get_mut(endpoint.index() as usize).and_then(Option::as_mut);
        let Some(io) = slot.filter(|io| io.endpoint == endpoint) else { return Ok(()) };
        if state.closing == Closing::Abort {
            if !io.read_shut {
                io.read_shut = true;
                // SAFETY: shutdown on our own open fd; this ends the multishot recv.
                unsafe { libc::shutdown(io.fd, libc::SHUT_RDWR) };
            }
            if !io.recv_armed && !io.send_in_flight {
                let fd = io.fd;
                self.ios[endpoint.index() as usize] = None;
                self.core.release(endpoint);
                // SAFETY: no operation on `fd` is in flight any more, and the endpoint is gone.
                unsafe { libc::close(fd) };
            }
            return Ok(());
        }
        if state.closing == Closing::No && !state.paused && !io.recv_armed && !io.read_shut {
            // Reading resumes after a pause for the input budget.
            self.arm_recv(endpoint)?;
            return self.drive(endpoint);
        }
        if !io.send_in_flight {
            if io.sending.is_empty() && state.output > 0 {
                self.core.take_output(endpoint, &mut io.sending);
                io.sent = 0;
            }
            if io.sent < io.sending.len() {
                let pending = &io.sending[io.sent..];
                let data = user_data(OP_SEND, endpoint.index(), endpoint.generation());
                let entry =
                    opcode::Send::new(types::Fd(io.fd), pending.as_ptr(), pending.len() as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(data);
                io.send_in_flight = true;
                return self.push(entry);
            }
        }
        if state.closing == Closing::AfterFlush
            && !io.send_in_flight
            && io.sending.is_empty()
            && state.output == 0
            && !io.write_shut
        {
            if self.core.finish_output(endpoint) {
                // A WebSocket close frame goes out first.
                return self.drive(endpoint);
            }
            let Some(io) = self.io(endpoint) else { return Ok(()) };
            io.write_shut = true;
            // SAFETY: shutdown on our own open fd. The client reads what we sent, then EOF;
            // its own close ends our recv and the connection.
            unsafe { libc::shutdown(io.fd, libc::SHUT_WR) };
        }
        Ok(())
    }

    fn on_tick(&mut self) -> io::Result<()> {
        for which in 0..self.listeners.len() {
            let Some(listening) = self.listeners[which].as_mut() else { continue };
            if listening.backoff && self.stopping_since.is_none() {
                listening.backoff = false;
                if !listening.armed {
                    self.arm_accept(which)?;
                }
            }
        }
        self.core.handle_timeout(self.now);
        self.arm_tick()
    }

    /// The end of an iteration: mail, the core's turn, then every endpoint with news.
    fn end_iteration(&mut self, mail: &Inbox, dirty: &mut Vec<Endpoint>) -> io::Result<()> {
        let mut opened = Ok(());
        let mut ups = Vec::new();
        shell::take_mail(&mut self.core, mail, self.now, |up| ups.push(up));
        for up in ups {
            opened = opened.and(self.open_link(up));
        }
        opened?;
        self.core.end_turn(self.now);
        shell::send_account_requests(&mut self.core, mail, self.now);
        if self.core.shared().stopping.load(Ordering::Relaxed) && self.stopping_since.is_none() {
            self.stopping_since = Some(self.now);
            self.core.shut_down(self.now);
            let grace =
                opcode::Timeout::new(&*self.grace).build().user_data(user_data(OP_GRACE, 0, 0));
            self.push(grace)?;
        }
        self.core.poll_dirty(dirty);
        dirty.append(&mut self.touched);
        for &endpoint in dirty.iter() {
            self.drive(endpoint)?;
        }
        Ok(())
    }
}

fn run(start: WorkerStart, eventfd: RawFd) -> io::Result<()> {
    let WorkerStart { index, listener, ws_listener, shared, mail, .. } = start;
    let ring = restricted_ring(RING_ENTRIES)?;
    let mut buffers = BufRing::new(&ring, BUFFER_COUNT, BUFFER_SIZE)?;
    let listening = |fd, front| Listening { fd, front, armed: false, backoff: false };
    let now = Instant::now();
    let mut this = Loop {
        ring,
        core: Core::new(index, Arc::clone(&shared), now),
        ios: Vec::new(),
        listeners: [
            Some(listening(listener.as_raw_fd(), Front::Stream)),
            ws_listener.as_ref().map(|l| listening(l.as_raw_fd(), Front::WebSocket)),
        ],
        eventfd,
        wake_buf: Box::new(0),
        tick: Box::new(types::Timespec::new().nsec(TICK.as_nanos() as u32)),
        grace: Box::new(types::Timespec::new().nsec(GOODBYE_GRACE.as_nanos() as u32)),
        stopping_since: None,
        now,
        touched: Vec::new(),
    };
    this.arm_accept(0)?;
    this.arm_accept(1)?;
    this.arm_wake()?;
    this.arm_tick()?;
    info!(worker = index, "io_uring worker started");
    let mut completions: Vec<(u64, i32, u32)> = Vec::with_capacity(RING_ENTRIES as usize);
    let mut dirty = Vec::new();
    let result = loop {
        // The one system call of an iteration: submit all queued work, wait for one event.
        match this.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {}
            Err(error) => break Err(error),
        }
        completions.clear();
        completions.extend(this.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
        this.now = Instant::now();
        let mut step = Ok(());
        for &(data, result, flags) in &completions {
            let (op, index, generation) = parse_user_data(data);
            let endpoint = Endpoint::new(index, generation);
            step = match op {
                OP_ACCEPT => this.on_accept(0, result, flags),
                OP_ACCEPT_WS => this.on_accept(1, result, flags),
                OP_RECV => this.on_recv(endpoint, result, flags, &mut buffers),
                OP_SEND => {
                    this.on_send(endpoint, result);
                    Ok(())
                }
                OP_WAKE => this.arm_wake(),
                OP_TICK => this.on_tick(),
                OP_GRACE => {
                    this.core.handle_timeout(this.now);
                    Ok(())
                }
                _ => Ok(()),
            };
            if step.is_err() {
                break;
            }
        }
        if let Err(error) = step {
            break Err(error);
        }
        buffers.publish();
        this.now = Instant::now();
        if let Err(error) = this.end_iteration(&mail, &mut dirty) {
            break Err(error);
        }
        if let Some(since) = this.stopping_since {
            if this.core.open_connections() == 0 || since.elapsed() > LINGER {
                break Ok(());
            }
        }
    };
    if let Err(error) = &result {
        warn!(worker = index, %error, "io_uring worker failed; its players leave the world");
        // Observers must not keep seeing frozen players: each leaves (parked on its shard
        // for the resume window), and the clients are cut so that they resume elsewhere.
        this.core.abandon_all(Instant::now());
    }
    let fds: Vec<RawFd> = this.ios.iter().flatten().map(|io| io.fd).collect();
    // The ring goes first: no operation may outlive the buffers it points into.
    drop(this);
    drop(buffers);
    for fd in fds {
        // SAFETY: the ring is gone, so nothing else uses these fds.
        unsafe { libc::close(fd) };
    }
    drop(listener);
    drop(ws_listener);
    info!(worker = index, "io_uring worker stopped");
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Submits one entry and returns its completion's result.
    fn outcome(ring: &mut IoUring, entry: squeue::Entry) -> i32 {
        // SAFETY: the entries submitted here point at nothing that outlives this call
        // (a Nop, a timeout on a local that is waited for, an openat of a static path).
        unsafe { ring.submission().push(&entry.user_data(7)).expect("room in the ring") };
        ring.submit_and_wait(1).expect("submitted");
        let result = ring.completion().next().expect("a completion").result();
        result
    }

    /// The worker's ring takes what the worker submits and refuses everything else
    /// (`EACCES`), registrations included.
    #[test]
    fn a_workers_ring_refuses_every_operation_it_does_not_use() {
        let mut ring = restricted_ring(8).expect("a restricted ring on this kernel");
        let tick = types::Timespec::new().nsec(1_000);
        let timeout = opcode::Timeout::new(&tick).build();
        assert_eq!(outcome(&mut ring, timeout), -libc::ETIME, "its tick's timeout runs");
        let buffers = BufRing::new(&ring, 8, 64).expect("its buffer ring registers");
        let nop = opcode::Nop::new().build();
        assert_eq!(outcome(&mut ring, nop), -libc::EACCES, "a no-op is refused");
        let path = c"/etc/hostname";
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr()).build();
        assert_eq!(outcome(&mut ring, open), -libc::EACCES, "opening a file is refused");
        let drain = opcode::AsyncCancel::new(0).build().flags(squeue::Flags::IO_DRAIN);
        assert_eq!(outcome(&mut ring, drain), -libc::EACCES, "a flag it does not use is refused");
        let mut probe = Probe::new();
        let registered = ring.submitter().register_probe(&mut probe);
        assert_eq!(registered.map_err(|e| e.raw_os_error()), Err(Some(libc::EACCES)));
        drop(ring);
        drop(buffers);
    }
}
