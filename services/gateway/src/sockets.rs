//! Socket options and descriptor limits shared by the event loops.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;

use socket2::{Domain, Protocol, Socket, Type};

use crate::limits::Refusal;

/// Seconds of silence before the kernel probes a client, between probes, and how many
/// unanswered probes end it; with `TCP_USER_TIMEOUT` (unacknowledged data) a peer that
/// vanished (power cut, NAT dropped the mapping) is noticed within about a minute, where
/// the kernel's defaults would take more than two hours.
const KEEPALIVE_IDLE_SECS: libc::c_int = 30;
const KEEPALIVE_INTERVAL_SECS: libc::c_int = 10;
const KEEPALIVE_PROBES: libc::c_int = 3;
const USER_TIMEOUT_MS: libc::c_int = 60_000;

/// Send buffer asked for on every accepted client socket (game port and WebSocket port,
/// io_uring and epoll alike). Setting it turns off the kernel's autotuning, which would
/// otherwise let a client that never reads hold up to `tcp_wmem`'s maximum (4 MiB here)
/// of kernel memory that the output budgets never see. Linux doubles the value for its
/// bookkeeping, so a client's worst case is its output budget plus 128 KiB.
pub const CLIENT_SEND_BUFFER_BYTES: libc::c_int = 64 * 1024;

/// Binds the first listener on a client port (game or WebSocket) and listens on it.
///
/// The bind itself is exclusive (SO_REUSEADDR, so sockets left in TIME_WAIT do not block
/// a restart, but no SO_REUSEPORT yet): a port that anything else listens on, another
/// gateway's SO_REUSEPORT group included, fails here with `AddrInUse` instead of being
/// shared, which would split the players between two clusters. SO_REUSEPORT is set after
/// the bind and before `listen`, so the listener founds a group that only this gateway's
/// workers join ([`bind_worker_listener`]); another gateway trying the port later fails
/// its own exclusive bind the same way.
pub fn bind_game_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.set_reuse_port(true)?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Binds one more listener into the SO_REUSEPORT group a [`bind_game_listener`] listener
/// founded on `addr` (a concrete address: the first listener's), for another worker.
pub(crate) fn bind_worker_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

fn set(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: setsockopt with a valid pointer to a c_int and its size; a failure only
    // leaves the option at its default.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// No Nagle delay, keep-alive probes, a bound on unacknowledged output, and a fixed
/// send buffer ([`CLIENT_SEND_BUFFER_BYTES`]).
pub fn configure_client_socket(fd: RawFd) {
    set(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, CLIENT_SEND_BUFFER_BYTES);
    set(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_SECS);
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECS);
    set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES);
    set(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS);
}

/// The peer's address of a connected socket.
pub fn peer_ip(fd: RawFd) -> Option<IpAddr> {
    // SAFETY: sockaddr_storage is plain data; getpeername writes at most `len` bytes into it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid pointers to storage and its length.
    let rc = unsafe {
        libc::getpeername(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len)
    };
    if rc != 0 {
        return None;
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let addr = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let addr = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(IpAddr::V6(Ipv6Addr::from(addr.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// Tells a refused client why (one small write that fits any socket buffer, never
/// waiting) and closes the socket: a refused connection costs no slot and no linger.
pub fn refuse_raw(fd: RawFd, refusal: Refusal) {
    let frame = refusal.frame();
    // SAFETY: sends from a live buffer of the given length on our own fd, then closes the
    // fd, which nothing else owns.
    unsafe {
        libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::close(fd);
    }
}

/// Errors that mean the process (or the system) is out of descriptors or memory: accepting
/// again at once would fail the same way.
pub fn is_resource_exhaustion(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Raises the soft limit on open files to the hard limit (the default soft limit, often
/// 1024, is far below what a gateway serves); returns the soft limit in force.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(io::Error::last_os_error());
            }
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn send_buffer(fd: RawFd) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid pointers to a c_int and its length.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt(SO_SNDBUF): {}", io::Error::last_os_error());
        value
    }

    #[test]
    fn a_port_another_listener_holds_is_refused_even_with_reuseport() {
        // Another gateway (another cluster): its first listener and a worker's.
        let other = bind_game_listener("127.0.0.1:0".parse().unwrap()).expect("bind loopback");
        let addr = other.local_addr().expect("local addr");
        let _other_worker = bind_worker_listener(addr).expect("the other gateway's worker joins");
        let error = bind_game_listener(addr).expect_err("a taken port must not be shared");
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
        // The wildcard address overlaps loopback: taken as well.
        let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
        let error = bind_game_listener(any).expect_err("0.0.0.0 overlaps the taken port");
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
        // A plain listener (anything else on the machine) as well.
        let plain = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let error = bind_game_listener(plain.local_addr().unwrap()).expect_err("taken");
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse, "{error}");
    }

    #[test]
    fn the_workers_listeners_share_the_first_ones_port_and_its_connections() {
        let first = bind_game_listener("127.0.0.1:0".parse().unwrap()).expect("bind loopback");
        let addr = first.local_addr().expect("local addr");
        let second = bind_worker_listener(addr).expect("a worker joins the group");
        for listener in [&first, &second] {
            listener.set_nonblocking(true).expect("nonblocking");
        }
        // The kernel spreads connections by a hash of the client's address and port: among
        // 64 connections, both listeners get some (the chance that one gets none is 2^-63).
        let clients: Vec<_> = (0..64)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect loopback"))
            .collect();
        let mut accepted = [0usize; 2];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while accepted.iter().sum::<usize>() < clients.len() {
            assert!(std::time::Instant::now() < deadline, "accepted only {accepted:?} of 64");
            for (count, listener) in accepted.iter_mut().zip([&first, &second]) {
                match listener.accept() {
                    Ok(_) => *count += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }
        assert!(accepted.iter().all(|&n| n > 0), "both workers accept: {accepted:?}");
    }

    #[test]
    fn an_accepted_client_socket_gets_the_fixed_send_buffer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let _client = std::net::TcpStream::connect(listener.local_addr().expect("local addr"))
            .expect("connect loopback");
        let (accepted, _) = listener.accept().expect("accept");
        configure_client_socket(accepted.as_raw_fd());
        // Linux reports twice what was asked (its bookkeeping share).
        assert_eq!(send_buffer(accepted.as_raw_fd()), 2 * CLIENT_SEND_BUFFER_BYTES);
    }
}
