//! The io_uring event loop: the gateway's default.
//!
//! Per worker: one ring, one multishot accept on the worker's listener, one multishot
//! recv per connection drawing from a provided buffer ring (no buffer is tied up by an idle
//! connection), sends straight from the connection's reusable output buffer, and one
//! `io_uring_enter` per loop iteration that both submits everything queued and waits.
//! The worker's relay links to the shards are driven the same way: a multishot recv each
//! from the same buffer ring, and sends from the link's reusable output buffer. Mail (a
//! newly connected link, a dead shard's restore, a player store answer) wakes the loop
//! through an eventfd read that is always armed.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::types::BufRingEntry;
use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};
use tracing::{debug, info, warn};

use crate::core::{Closing, Core, LINGER};
use crate::shared::{report_exit, WorkerStart};
use crate::sockets::{configure_client_socket, is_resource_exhaustion, peer_ip, refuse_raw};
use crate::uplink::LinkFailure;

const RING_ENTRIES: u32 = 4096;
const BUFFER_GROUP: u16 = 0;
const BUFFER_COUNT: u16 = 2048;
const BUFFER_SIZE: usize = 4096;
const TICK: Duration = Duration::from_millis(250);

const OP_ACCEPT: u64 = 1;
const OP_RECV: u64 = 2;
const OP_SEND: u64 = 3;
const OP_WAKE: u64 = 4;
const OP_TICK: u64 = 5;
/// Completions of cancellations this loop asks for: nothing to do.
const OP_CANCEL: u64 = 6;
/// Accepts on the WebSocket listener.
const OP_ACCEPT_WS: u64 = 7;
/// Receives and sends on a relay link to a shard (the slot is the link's).
const OP_LINK_RECV: u64 = 8;
const OP_LINK_SEND: u64 = 9;

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

pub struct UringConn {
    fd: RawFd,
    /// The buffer owned by an in-flight send; swapped with the core's `out` when idle.
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

impl UringConn {
    fn new(fd: RawFd) -> UringConn {
        UringConn {
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
    let shared = Arc::clone(&start.shared);
    let thread = std::thread::Builder::new()
        .name(format!("gw-uring-{index}"))
        .spawn(move || report_exit(index, &shared, run(start, loop_fd.as_raw_fd())))?;
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
    core: Core<UringConn>,
    /// The game listener, then the WebSocket listener if there is one.
    listeners: [Option<Listening>; 2],
    eventfd: RawFd,
    wake_buf: Box<u64>,
    tick: Box<types::Timespec>,
    stopping_since: Option<Instant>,
    /// The time of the current iteration's completions.
    now: Instant,
}

/// A listener the loop accepts on.
struct Listening {
    fd: RawFd,
    /// Its connections speak WebSocket.
    ws: bool,
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
            // a connection's `sending`) or by the buffer ring, and outlives the operation.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn arm_accept(&mut self, which: usize) -> io::Result<()> {
        let Some(listening) = self.listeners[which].as_mut() else { return Ok(()) };
        listening.armed = true;
        let op = if listening.ws { OP_ACCEPT_WS } else { OP_ACCEPT };
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

    fn arm_recv(&mut self, slot: u32) -> io::Result<()> {
        let generation = self.core.generation(slot);
        let Some(conn) = self.core.get_mut(slot) else {
            return Ok(());
        };
        conn.io.recv_armed = true;
        let entry = if conn.io.one_buffer_at_a_time {
            opcode::Recv::new(types::Fd(conn.io.fd), std::ptr::null_mut(), BUFFER_SIZE as u32)
                .buf_group(BUFFER_GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        } else {
            opcode::RecvMulti::new(types::Fd(conn.io.fd), BUFFER_GROUP).build()
        };
        self.push(entry.user_data(user_data(OP_RECV, slot, generation)))
    }

    fn cancel(&mut self, target: u64) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(target).build().user_data(user_data(OP_CANCEL, 0, 0));
        self.push(entry)
    }

    fn on_accept(&mut self, which: usize, result: i32, flags: u32) -> io::Result<()> {
        let more = cqueue::more(flags);
        let Some(listening) = self.listeners[which].as_mut() else { return Ok(()) };
        let ws = listening.ws;
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
                    let op = if ws { OP_ACCEPT_WS } else { OP_ACCEPT };
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
        let conn = UringConn::new(fd);
        if ws {
            return match self.core.insert_ws(conn, peer_ip(fd), self.now) {
                Ok(slot) => self.arm_recv(slot),
                Err(conn) => {
                    // SAFETY: closing the fd just accepted, which nothing else has.
                    unsafe { libc::close(conn.fd) };
                    Ok(())
                }
            };
        }
        match self.core.insert(conn, peer_ip(fd), self.now) {
            Ok(slot) => self.arm_recv(slot),
            Err((conn, refusal)) => {
                refuse_raw(conn.fd, refusal);
                Ok(())
            }
        }
    }

    fn on_recv(
        &mut self,
        slot: u32,
        generation: u32,
        result: i32,
        flags: u32,
        buffers: &mut BufRing,
    ) -> io::Result<()> {
        let buffer = cqueue::buffer_select(flags);
        let current = self.core.generation(slot) == generation;
        if current && result > 0 {
            if let Some(bid) = buffer {
                let data = buffers.bytes(bid, result as usize);
                self.core.on_data(slot, data, self.now);
            }
        }
        if let Some(bid) = buffer {
            buffers.give_back(bid);
        }
        if !current {
            return Ok(());
        }
        let more = cqueue::more(flags);
        let Some(conn) = self.core.get_mut(slot) else {
            return Ok(());
        };
        if !more {
            conn.io.recv_armed = false;
            conn.io.recv_cancelling = false;
        }
        if conn.read_paused {
            conn.io.one_buffer_at_a_time = true;
        }
        if conn.read_paused && conn.io.recv_armed && !conn.io.recv_cancelling {
            // Over its input budget: stop reading; `drive` re-arms once the core resumes.
            conn.io.recv_cancelling = true;
            self.cancel(user_data(OP_RECV, slot, generation))?;
        }
        let Some(conn) = self.core.get_mut(slot) else {
            return Ok(());
        };
        match result {
            n if n > 0 || n == -libc::ENOBUFS || n == -libc::ECANCELED => {
                // Out of buffers (or the kernel ended the multishot): arm again unless closing
                // or paused.
                if !more
                    && conn.closing != Closing::Abort
                    && !conn.io.read_shut
                    && !conn.read_paused
                {
                    self.arm_recv(slot)?;
                }
            }
            _ => {
                // EOF or error: the peer is gone, or it has read our close and closed too.
                if conn.closing == Closing::No {
                    self.core.on_peer_closed(slot);
                } else {
                    conn.closing = Closing::Abort;
                    self.core.mark_dirty(slot);
                }
            }
        }
        self.core.mark_dirty(slot);
        Ok(())
    }

    fn on_send(&mut self, slot: u32, generation: u32, result: i32) {
        if self.core.generation(slot) != generation {
            return;
        }
        let metrics = Arc::clone(&self.core.shared().metrics);
        let Some(conn) = self.core.get_mut(slot) else {
            return;
        };
        conn.io.send_in_flight = false;
        if result < 0 {
            self.core.on_peer_closed(slot);
        } else {
            metrics.bytes_out.add(result as u64);
            conn.io.sent += result as usize;
            if conn.io.sent >= conn.io.sending.len() {
                conn.io.sending.clear();
                conn.io.sent = 0;
            }
        }
        self.core.mark_dirty(slot);
    }

    /// Moves a connection forward: start a send if idle, or take the next closing step.
    fn drive(&mut self, slot: u32) -> io::Result<()> {
        let generation = self.core.generation(slot);
        let Some(conn) = self.core.get_mut(slot) else {
            return Ok(());
        };
        let io = &mut conn.io;
        conn.sending = io.sending.len() - io.sent;
        if conn.closing == Closing::Abort {
            if !io.read_shut {
                io.read_shut = true;
                // SAFETY: shutdown on our own open fd; this ends the multishot recv.
                unsafe { libc::shutdown(io.fd, libc::SHUT_RDWR) };
            }
            if !io.recv_armed && !io.send_in_flight {
                let fd = io.fd;
                self.core.remove(slot);
                // SAFETY: no operation on `fd` is in flight any more, and the slot is gone.
                unsafe { libc::close(fd) };
            }
            return Ok(());
        }
        if conn.closing == Closing::No && !conn.read_paused && !io.recv_armed && !io.read_shut {
            // Reading resumes after a pause for the input budget.
            self.arm_recv(slot)?;
            return self.drive(slot);
        }
        if !io.send_in_flight {
            if io.sending.is_empty() && !conn.out.is_empty() {
                std::mem::swap(&mut io.sending, &mut conn.out);
                io.sent = 0;
                conn.sending = io.sending.len();
            }
            if io.sent < io.sending.len() {
                let pending = &io.sending[io.sent..];
                let entry =
                    opcode::Send::new(types::Fd(io.fd), pending.as_ptr(), pending.len() as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(user_data(OP_SEND, slot, generation));
                io.send_in_flight = true;
                return self.push(entry);
            }
        }
        if conn.closing == Closing::AfterFlush
            && !io.send_in_flight
            && io.sending.is_empty()
            && conn.out.is_empty()
            && !io.write_shut
        {
            if self.core.end_of_output(slot) {
                // A WebSocket close frame goes out first.
                return self.drive(slot);
            }
            let Some(conn) = self.core.get_mut(slot) else { return Ok(()) };
            let io = &mut conn.io;
            io.write_shut = true;
            // SAFETY: shutdown on our own open fd. The client reads what we sent, then EOF;
            // its own close ends our recv and the connection.
            unsafe { libc::shutdown(io.fd, libc::SHUT_WR) };
        }
        Ok(())
    }

    /// Takes the sockets of links connected for this worker.
    fn open_links(&mut self) -> io::Result<()> {
        for up in self.core.take_link_ups() {
            let (stream, connected) = up.split();
            let fd = std::os::fd::IntoRawFd::into_raw_fd(stream);
            match self.core.open_uplink(connected, UringConn::new(fd), self.now) {
                Ok(index) => self.arm_link_recv(index)?,
                // SAFETY: the fd was just taken from its stream; nothing else has it.
                Err(io) => unsafe {
                    libc::close(io.fd);
                },
            }
        }
        Ok(())
    }

    fn arm_link_recv(&mut self, index: u32) -> io::Result<()> {
        let generation = self.core.uplink_generation(index);
        let Some(uplink) = self.core.uplink_mut(index) else { return Ok(()) };
        uplink.io.recv_armed = true;
        let entry = opcode::RecvMulti::new(types::Fd(uplink.io.fd), BUFFER_GROUP).build();
        self.push(entry.user_data(user_data(OP_LINK_RECV, index, generation)))
    }

    fn on_link_recv(
        &mut self,
        index: u32,
        generation: u32,
        result: i32,
        flags: u32,
        buffers: &mut BufRing,
    ) -> io::Result<()> {
        let buffer = cqueue::buffer_select(flags);
        let current = self.core.uplink_generation(index) == generation;
        if current && result > 0 {
            if let Some(bid) = buffer {
                self.core.on_link_data(index, buffers.bytes(bid, result as usize), self.now);
            }
        }
        if let Some(bid) = buffer {
            buffers.give_back(bid);
        }
        if !current {
            return Ok(());
        }
        let more = cqueue::more(flags);
        let Some(uplink) = self.core.uplink_mut(index) else { return Ok(()) };
        if !more {
            uplink.io.recv_armed = false;
        }
        let failed = uplink.failed;
        match result {
            n if n > 0 || n == -libc::ENOBUFS || n == -libc::ECANCELED => {
                if !more && !failed {
                    self.arm_link_recv(index)?;
                }
            }
            0 => self.core.on_link_lost(index, LinkFailure::Closed),
            n => {
                self.core.on_link_lost(index, LinkFailure::Socket(io::Error::from_raw_os_error(-n)))
            }
        }
        self.drive_link(index)
    }

    fn on_link_send(&mut self, index: u32, generation: u32, result: i32) -> io::Result<()> {
        if self.core.uplink_generation(index) != generation {
            return Ok(());
        }
        let Some(uplink) = self.core.uplink_mut(index) else { return Ok(()) };
        uplink.io.send_in_flight = false;
        if result < 0 {
            let error = io::Error::from_raw_os_error(-result);
            self.core.on_link_lost(index, LinkFailure::Socket(error));
        } else {
            uplink.io.sent += result as usize;
            if uplink.io.sent >= uplink.io.sending.len() {
                uplink.io.sending.clear();
                uplink.io.sent = 0;
            }
        }
        self.drive_link(index)
    }

    /// Moves a link forward: start a send if idle, or close it once let go and idle.
    fn drive_link(&mut self, index: u32) -> io::Result<()> {
        let generation = self.core.uplink_generation(index);
        let Some(uplink) = self.core.uplink_mut(index) else { return Ok(()) };
        let io = &mut uplink.io;
        if uplink.failed {
            if !io.read_shut {
                io.read_shut = true;
                // SAFETY: shutdown on our own open fd; this ends the multishot recv.
                unsafe { libc::shutdown(io.fd, libc::SHUT_RDWR) };
            }
            if !io.recv_armed && !io.send_in_flight {
                if let Some(io) = self.core.remove_uplink(index) {
                    // SAFETY: nothing is in flight on the fd any more, and the link is gone.
                    unsafe { libc::close(io.fd) };
                }
            }
            return Ok(());
        }
        if !io.send_in_flight {
            if io.sending.is_empty() && !uplink.out.is_empty() {
                std::mem::swap(&mut io.sending, &mut uplink.out);
                io.sent = 0;
            }
            if io.sent < io.sending.len() {
                let pending = &io.sending[io.sent..];
                let entry =
                    opcode::Send::new(types::Fd(io.fd), pending.as_ptr(), pending.len() as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                        .user_data(user_data(OP_LINK_SEND, index, generation));
                io.send_in_flight = true;
                uplink.sending = io.sending.len() - io.sent;
                return self.push(entry);
            }
        }
        uplink.sending = io.sending.len() - io.sent;
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
        self.core.tick(self.now);
        for slot in self.core.lingering_too_long() {
            if let Some(conn) = self.core.get_mut(slot) {
                conn.closing = Closing::Abort;
            }
            self.core.mark_dirty(slot);
        }
        self.arm_tick()
    }
}

fn run(start: WorkerStart, eventfd: RawFd) -> io::Result<()> {
    let WorkerStart { index, listener, ws_listener, shared, mail } = start;
    let ring = restricted_ring(RING_ENTRIES)?;
    let mut buffers = BufRing::new(&ring, BUFFER_COUNT, BUFFER_SIZE)?;
    let listening = |fd, ws| Listening { fd, ws, armed: false, backoff: false };
    let mut this = Loop {
        ring,
        core: Core::new(index, Arc::clone(&shared), mail),
        listeners: [
            Some(listening(listener.as_raw_fd(), false)),
            ws_listener.as_ref().map(|l| listening(l.as_raw_fd(), true)),
        ],
        eventfd,
        wake_buf: Box::new(0),
        tick: Box::new(types::Timespec::new().nsec(TICK.as_nanos() as u32)),
        stopping_since: None,
        now: Instant::now(),
    };
    this.arm_accept(0)?;
    this.arm_accept(1)?;
    this.arm_wake()?;
    this.arm_tick()?;
    info!(worker = index, "io_uring worker started");
    let mut completions: Vec<(u64, i32, u32)> = Vec::with_capacity(RING_ENTRIES as usize);
    let mut dirty = Vec::new();
    let mut links = Vec::new();
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
            let (op, slot, generation) = parse_user_data(data);
            step = match op {
                OP_ACCEPT => this.on_accept(0, result, flags),
                OP_ACCEPT_WS => this.on_accept(1, result, flags),
                OP_RECV => this.on_recv(slot, generation, result, flags, &mut buffers),
                OP_SEND => {
                    this.on_send(slot, generation, result);
                    Ok(())
                }
                OP_LINK_RECV => this.on_link_recv(slot, generation, result, flags, &mut buffers),
                OP_LINK_SEND => this.on_link_send(slot, generation, result),
                OP_WAKE => this.arm_wake(),
                OP_TICK => this.on_tick(),
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
        this.core.process_mail(Instant::now());
        if let Err(error) = this.open_links() {
            break Err(error);
        }
        this.core.flush_inputs();
        if shared.stopping.load(Ordering::Relaxed) && this.stopping_since.is_none() {
            this.stopping_since = Some(Instant::now());
            this.core.shut_down_all();
        }
        this.core.take_dirty(&mut dirty);
        let mut step = Ok(());
        for &slot in &dirty {
            step = this.drive(slot);
            if step.is_err() {
                break;
            }
        }
        if let Err(error) = step {
            break Err(error);
        }
        // Every link with bytes to send: one send each, submitted with everything else.
        this.core.take_dirty_uplinks(&mut links);
        for &index in &links {
            step = this.drive_link(index);
            if step.is_err() {
                break;
            }
        }
        if let Err(error) = step {
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
        this.core.abandon_all();
    }
    let open: Vec<u32> = this.core.slots().collect();
    let mut fds: Vec<RawFd> =
        open.iter().filter_map(|&s| this.core.get_mut(s).map(|c| c.io.fd)).collect();
    fds.extend(this.core.uplink_fds(|io| io.fd));
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
