//! The system calls this client makes beyond `read` and `write`: a level-triggered epoll
//! set, non-blocking connects, the open-file limit and the process's own resource usage.
//! Every `unsafe` block of the client is here.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use serde::Serialize;

/// A level-triggered epoll set whose entries carry a `u64` token (the bot's index).
///
/// Level-triggered on purpose: a socket with bytes left after one read is reported again
/// by the next `epoll_wait`, so one read per readiness is enough and nothing is lost.
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

/// What one readiness event says about a socket.
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    pub token: u64,
    pub readable: bool,
    pub writable: bool,
    /// Hang-up or error: a read or `SO_ERROR` tells which.
    pub broken: bool,
}

impl Epoll {
    /// An epoll set returning at most `capacity` events per wait.
    pub fn new(capacity: usize) -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd, events: vec![libc::epoll_event { events: 0, u64: 0 }; capacity] })
    }

    fn control(&self, op: i32, fd: RawFd, token: u64, writable: bool) -> io::Result<()> {
        let mut interest = libc::EPOLLIN as u32;
        if writable {
            interest |= libc::EPOLLOUT as u32;
        }
        let mut event = libc::epoll_event { events: interest, u64: token };
        // SAFETY: `event` is a valid epoll_event for the duration of the call.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut event) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for reading, and for writing too if `writable`.
    pub fn add(&self, fd: RawFd, token: u64, writable: bool) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_ADD, fd, token, writable)
    }

    /// Changes whether `fd` is also watched for writing.
    pub fn modify(&self, fd: RawFd, token: u64, writable: bool) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_MOD, fd, token, writable)
    }

    /// Waits up to `timeout` (rounded up to the millisecond, as `epoll_wait` counts) and
    /// returns the ready sockets; an interrupted wait returns none.
    pub fn wait(&mut self, timeout: Duration, ready: &mut Vec<Ready>) -> io::Result<()> {
        ready.clear();
        let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let capacity = self.events.len() as i32;
        // SAFETY: the kernel writes at most `capacity` events into our buffer of that size.
        let n = unsafe {
            libc::epoll_wait(self.fd.as_raw_fd(), self.events.as_mut_ptr(), capacity, millis)
        };
        if n < 0 {
            let error = io::Error::last_os_error();
            return if error.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(error) };
        }
        for event in &self.events[..n as usize] {
            // Copies out of the (packed) struct before use.
            let (bits, token) = (event.events, event.u64);
            ready.push(Ready {
                token,
                readable: bits & libc::EPOLLIN as u32 != 0,
                writable: bits & libc::EPOLLOUT as u32 != 0,
                broken: bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0,
            });
        }
        Ok(())
    }
}

/// Starts a non-blocking TCP connect to an IPv4 `target`. The socket turns writable when
/// the connect is done; `TcpStream::take_error` then says whether it worked.
pub fn start_connect(target: SocketAddr) -> io::Result<TcpStream> {
    let SocketAddr::V4(target) = target else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "only IPv4 targets"));
    };
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket takes no pointers; a non-negative result is a new fd we own.
    let fd = unsafe { libc::socket(libc::AF_INET, flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: target.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(target.ip().octets()) },
        sin_zero: [0; 8],
    };
    // SAFETY: `address` is a valid sockaddr_in and its exact size is passed with it.
    let connected = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if connected < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(error);
        }
    }
    Ok(TcpStream::from(socket))
}

/// Raises the open-file soft limit towards `needed` (at most to the hard limit); returns
/// the limit in force afterwards.
pub fn raise_fd_limit(needed: u64) -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    if limit.rlim_cur < needed {
        let wanted =
            libc::rlimit { rlim_cur: needed.min(limit.rlim_max), rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads one rlimit through a valid pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            return wanted.rlim_cur;
        }
    }
    limit.rlim_cur
}

/// This process's CPU time and context switches so far (`getrusage(RUSAGE_SELF)`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    pub user_s: f64,
    pub system_s: f64,
    /// Times the process gave up the CPU to wait (here: blocked in `epoll_wait`, then was
    /// woken up by a timer or by a peer's write).
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

pub fn usage() -> Usage {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Usage::default();
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Usage {
        user_s: seconds(usage.ru_utime),
        system_s: seconds(usage.ru_stime),
        voluntary_switches: usage.ru_nvcsw as u64,
        involuntary_switches: usage.ru_nivcsw as u64,
    }
}
