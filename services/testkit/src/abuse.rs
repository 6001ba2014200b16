//! Tools for the abuse tests: a raw client that can bind its own source address, shrink its
//! receive buffer and write whatever bytes it likes; what a process costs (`/proc`); the
//! labelled counters of a node's `/metrics`; and a process stopped with SIGSTOP that is
//! always continued again.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use meridian_protocol::pb::{
    server_message::Kind as S, ClientMessage, ErrorCode, LoginOk, ServerMessage,
};
use meridian_protocol::{encode_frame, FrameReader, DEFAULT_MAX_FRAME};

use crate::bot::expect_login_ok;
use crate::http::http_get;
use crate::msg;
use crate::process::signal;
use crate::prometheus::Exposition;
use crate::wait::{deadline, wait_until, DEFAULT_WAIT};

/// How a [`RawClient`] sets up its socket before connecting.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawOptions {
    /// Bind to this source address first (e.g. 127.0.0.2, to be another address).
    pub local_ip: Option<IpAddr>,
    /// `SO_RCVBUF` before connecting: a small one keeps the kernel from buffering much of
    /// what a client does not read, so the server's own queue fills.
    pub receive_buffer: Option<usize>,
    /// Give up connecting after this long (`SO_SNDTIMEO`, which Linux applies to a blocking
    /// `connect`): a server whose accept queue is full leaves a connect hanging otherwise.
    pub connect_within: Option<Duration>,
}

/// What one read from a [`RawClient`] gave.
#[derive(Debug, Clone, PartialEq)]
pub enum RawRead {
    Message(ServerMessage),
    /// End of stream, or a reset.
    Closed,
    TimedOut,
}

/// Whether a gateway took a connection: a Ping sent on it came back as a Pong, or the
/// gateway said why not (`UNAVAILABLE` with a detail) and closed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    Yes,
    Refused(String),
}

/// A client on a plain TCP socket with none of [`crate::Bot`]'s checks: for clients that
/// misbehave (write floods, never read, stall mid-frame) and for those that need a socket
/// option or a source address a `Bot` does not set.
pub struct RawClient {
    label: String,
    stream: TcpStream,
    reader: FrameReader,
    next_ping: u64,
}

impl RawClient {
    pub fn connect(addr: SocketAddr) -> anyhow::Result<RawClient> {
        RawClient::connect_with(addr, RawOptions::default())
    }

    pub fn connect_with(addr: SocketAddr, options: RawOptions) -> anyhow::Result<RawClient> {
        let stream = connect_socket(addr, options)
            .with_context(|| format!("raw client connecting to {addr} with {options:?}"))?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(DEFAULT_WAIT))?;
        let label = match options.local_ip {
            Some(ip) => format!("raw client from {ip}"),
            None => "raw client".to_string(),
        };
        Ok(RawClient {
            label,
            stream,
            reader: FrameReader::new(DEFAULT_MAX_FRAME),
            next_ping: 1 << 40,
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// A second handle on the socket, for a writer thread while this one reads.
    pub fn try_clone_stream(&self) -> anyhow::Result<TcpStream> {
        Ok(self.stream.try_clone()?)
    }

    pub fn send(&mut self, message: &ClientMessage) -> anyhow::Result<()> {
        let mut wire = Vec::new();
        encode_frame(message, &mut wire);
        self.send_raw(&wire)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stream
            .write_all(bytes)
            .with_context(|| format!("{} writing {} bytes", self.label, bytes.len()))
    }

    /// The next message, the close, or the deadline passing. Undecodable frames are errors.
    pub fn read(&mut self, deadline: Instant) -> anyhow::Result<RawRead> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.reader.next_message::<ServerMessage>() {
                Ok(Some(message)) => return Ok(RawRead::Message(message)),
                Ok(None) => {}
                Err(e) => bail!("{}: undecodable frame from the server: {e}", self.label),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(RawRead::TimedOut);
            }
            self.stream.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(RawRead::Closed),
                Ok(n) => self.reader.extend(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(RawRead::Closed),
                Err(e) => return Err(anyhow!(e).context(format!("{} reading", self.label))),
            }
        }
    }

    /// The next message; the close or the deadline passing is an error.
    pub fn recv(&mut self, deadline: Instant) -> anyhow::Result<ServerMessage> {
        match self.read(deadline)? {
            RawRead::Message(message) => Ok(message),
            RawRead::Closed => bail!("{}: the server closed the connection", self.label),
            RawRead::TimedOut => bail!("{}: timed out waiting for a message", self.label),
        }
    }

    /// Reads until the server closes the connection; returns what came before. Still open
    /// at `deadline` is an error.
    pub fn expect_closed(&mut self, deadline: Instant) -> anyhow::Result<Vec<ServerMessage>> {
        let mut got = Vec::new();
        loop {
            match self.read(deadline)? {
                RawRead::Message(message) => got.push(message),
                RawRead::Closed => return Ok(got),
                RawRead::TimedOut => bail!(
                    "{}: expected the server to close the connection; received {got:?}",
                    self.label
                ),
            }
        }
    }

    /// The next message is `Error{code}` with client_time 0 and then the connection closes;
    /// returns the error's detail.
    pub fn expect_error_then_close(&mut self, code: ErrorCode) -> anyhow::Result<String> {
        let until = deadline(DEFAULT_WAIT);
        let message = self
            .recv(until)
            .with_context(|| format!("{} waiting for Error {}", self.label, code.as_str_name()))?;
        let detail = match &message.kind {
            Some(S::Error(e)) if e.code == code as i32 && e.client_time == 0 => e.detail.clone(),
            _ => bail!(
                "{}: expected Error {} (client_time 0), got {message:?}",
                self.label,
                code.as_str_name()
            ),
        };
        let rest = self.expect_closed(until)?;
        if !rest.is_empty() {
            bail!("{}: after Error {detail:?} expected the close, got {rest:?}", self.label);
        }
        Ok(detail)
    }

    /// Sends Login and waits for LoginOk (anything else before it is an error), then puts a
    /// Ping/Pong barrier behind it; returns the LoginOk and what came before the Pong.
    pub fn login(
        &mut self,
        name: &str,
        spawn: Option<(u32, u32)>,
    ) -> anyhow::Result<(LoginOk, Vec<ServerMessage>)> {
        self.send(&msg::login(name, spawn))?;
        let message = self.recv(deadline(DEFAULT_WAIT)).with_context(|| {
            format!("{} waiting for LoginOk as {name:?} at {spawn:?}", self.label)
        })?;
        let ok = expect_login_ok(&self.label, name, spawn, message)?;
        self.label = name.to_string();
        let after = self.ping_barrier()?;
        Ok((ok, after))
    }

    /// Sends a Ping and returns everything received before its Pong.
    pub fn ping_barrier(&mut self) -> anyhow::Result<Vec<ServerMessage>> {
        self.next_ping += 1;
        let t = self.next_ping;
        self.send(&msg::ping(t))?;
        let until = deadline(DEFAULT_WAIT);
        let mut got = Vec::new();
        loop {
            let message = self
                .recv(until)
                .with_context(|| format!("{} waiting for Pong {t}; got {got:?}", self.label))?;
            if matches!(&message.kind, Some(S::Pong(p)) if p.client_time == t) {
                return Ok(got);
            }
            got.push(message);
        }
    }

    /// Whether the gateway took this connection: a Ping answered with Pong, or an
    /// `UNAVAILABLE` error (client_time 0) followed by the close. Anything else is an error.
    pub fn admitted(&mut self) -> anyhow::Result<Admitted> {
        self.next_ping += 1;
        let t = self.next_ping;
        // A refused connection may be closed before the Ping arrives: the write can fail,
        // and the answer is read all the same.
        let _ = self.send(&msg::ping(t));
        let until = deadline(DEFAULT_WAIT);
        let message = self.recv(until).with_context(|| {
            format!("{} waiting for Pong {t} or UNAVAILABLE after connecting", self.label)
        })?;
        match &message.kind {
            Some(S::Pong(p)) if p.client_time == t => Ok(Admitted::Yes),
            Some(S::Error(e)) if e.code == ErrorCode::Unavailable as i32 && e.client_time == 0 => {
                let detail = e.detail.clone();
                let rest = self.expect_closed(until).with_context(|| {
                    format!("{}: the close after UNAVAILABLE {detail:?}", self.label)
                })?;
                if !rest.is_empty() {
                    bail!(
                        "{}: after UNAVAILABLE {detail:?} expected the close, got {rest:?}",
                        self.label
                    );
                }
                Ok(Admitted::Refused(detail))
            }
            _ => bail!(
                "{}: expected Pong {t} or Error UNAVAILABLE after connecting, got {message:?}",
                self.label
            ),
        }
    }

    /// Closes both directions (a FIN; a reset if unread data is left).
    pub fn close(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn socket_address(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// A blocking TCP connection to `addr` with `options` applied before the handshake (the
/// receive buffer must be set before it to bound the window the peer is offered).
pub(crate) fn connect_socket(addr: SocketAddr, options: RawOptions) -> std::io::Result<TcpStream> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(bytes) = options.receive_buffer {
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: a valid pointer to a c_int and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some(within) = options.connect_within {
        let value = libc::timeval {
            tv_sec: libc::time_t::try_from(within.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_usec: libc::suseconds_t::from(within.subsec_micros()),
        };
        // SAFETY: a valid pointer to a timeval and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDTIMEO,
                (&value as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some(ip) = options.local_ip {
        let (local, len) = socket_address(SocketAddr::new(ip, 0));
        // SAFETY: a valid sockaddr of `len` bytes.
        let rc = unsafe { libc::bind(fd, (&local as *const libc::sockaddr_storage).cast(), len) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let (remote, len) = socket_address(addr);
    loop {
        // SAFETY: a valid sockaddr of `len` bytes.
        let rc =
            unsafe { libc::connect(fd, (&remote as *const libc::sockaddr_storage).cast(), len) };
        if rc == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok(TcpStream::from(owned))
}

/// The resident set of a process (`VmRSS` in `/proc/<pid>/status`), in bytes.
pub fn rss_bytes(pid: i32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .with_context(|| format!("no VmRSS in {path}"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("{path}: {line:?}"))?;
    Ok(kib * 1024)
}

/// The CPU time a process has used so far, every thread's user and system time
/// (`utime + stime` of `/proc/<pid>/stat`).
pub fn cpu_time(pid: i32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The fields after the command name, which is in parentheses and may hold spaces:
    // state is field 3 of stat(5), so utime (14) and stime (15) are at 11 and 12 here.
    let (_, rest) = stat.rsplit_once(')').with_context(|| format!("{path}: {stat:?}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("{path}: no field {} in {stat:?}", index + 3))
    };
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(total * 1_000_000_000 / per_second))
}

/// The CPU time `pid` uses over the next `over` (measured, so it takes that long).
pub fn cpu_used_over(pid: i32, over: Duration) -> anyhow::Result<Duration> {
    let before = cpu_time(pid)?;
    std::thread::sleep(over);
    Ok(cpu_time(pid)?.saturating_sub(before))
}

/// A node's `/metrics`, parsed strictly.
pub fn scrape(admin: SocketAddr) -> anyhow::Result<Exposition> {
    let (code, body) = http_get(admin, "/metrics")?;
    if code != 200 {
        bail!("GET /metrics on {admin} answered {code}");
    }
    Exposition::parse(&body).with_context(|| format!("parsing /metrics of {admin}"))
}

/// The sum of the samples named `name` whose labels include every `(key, value)` of
/// `labels`; an error if the node serves no sample of that name at all.
pub fn sample_value(
    exposition: &Exposition,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<f64> {
    let samples: Vec<_> = exposition
        .families
        .values()
        .flat_map(|family| &family.samples)
        .filter(|sample| sample.name == name)
        .collect();
    if samples.is_empty() {
        bail!("no sample named {name} is served");
    }
    Ok(samples
        .iter()
        .filter(|sample| {
            labels
                .iter()
                .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(value))
        })
        .map(|sample| sample.value)
        .sum())
}

/// [`sample_value`] on a fresh scrape of `admin`.
pub fn metric_value(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    sample_value(&scrape(admin)?, name, labels)
}

/// A process this test stopped with SIGSTOP; it is continued (SIGCONT) when this is
/// dropped, so a failing test never leaves a node frozen.
pub struct StoppedProcess {
    pid: i32,
    continued: bool,
}

impl StoppedProcess {
    /// Stops `pid` (a process the test started) and waits until the kernel says it is
    /// stopped.
    pub fn stop(pid: i32) -> anyhow::Result<StoppedProcess> {
        signal(pid, libc::SIGSTOP).with_context(|| format!("SIGSTOP to pid {pid}"))?;
        let stopped = StoppedProcess { pid, continued: false };
        wait_until(deadline(DEFAULT_WAIT), &format!("pid {pid} to stop"), || {
            process_state(pid) == Some('T')
        })?;
        Ok(stopped)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Continues the process now.
    pub fn resume(mut self) -> anyhow::Result<()> {
        self.continued = true;
        signal(self.pid, libc::SIGCONT).with_context(|| format!("SIGCONT to pid {}", self.pid))
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        if !self.continued {
            let _ = signal(self.pid, libc::SIGCONT);
        }
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T` for stopped, `Z`, ...).
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}
