//! Strangers at the doors before trust (issue 31, items 5 and 6, and the QUIC front's wait
//! for a stream): swarms of connections that never say who they are, and the genuine
//! handshakes and probes they must not keep out. Everything here sends to the address it
//! is given, which the tests make a loopback one, and is bounded in connections.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rustls::pki_types::ServerName;

use crate::abuse::{connect_socket, RawOptions};
use crate::quic::{client_config, QuicOptions, QuicTarget};
use crate::wait::DEFAULT_WAIT;

/// What a [`Swarm`] does.
#[derive(Debug, Clone)]
pub struct SwarmOptions {
    /// The source addresses (loopback ones: 127.0.0.2 and up are this host too).
    pub addresses: Vec<IpAddr>,
    /// Connections the swarm keeps open from each address.
    pub per_address: usize,
    /// What each connection sends once connected (nothing, or half a request head), and
    /// then nothing more.
    pub opening: &'static [u8],
    /// How often the swarm looks for connections the server closed and opens them again.
    pub reopen_every: Duration,
}

/// What a swarm saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct SwarmReport {
    /// Connections opened (the first ones and every replacement).
    pub opened: u64,
    /// Connections the server closed (refused at once, evicted or past a deadline).
    pub closed_by_server: u64,
    /// Connects that failed or did not finish within 250 ms (a full accept queue).
    pub failed_connects: u64,
}

/// Connections held open by a thread, each replaced when the server closes it, until
/// [`Swarm::stop`]: a slow-loris client (with half a request head as its opening) or a
/// flood of idle TCP connections (with none).
pub struct Swarm {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    thread: Option<JoinHandle<anyhow::Result<SwarmReport>>>,
}

impl Swarm {
    /// Starts the swarm against `addr`; the first connections are opened on its thread.
    pub fn start(addr: SocketAddr, options: SwarmOptions) -> anyhow::Result<Swarm> {
        let (stop, open) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let thread = {
            let (stop, open) = (Arc::clone(&stop), Arc::clone(&open));
            std::thread::Builder::new()
                .name("swarm".into())
                .spawn(move || swarm(addr, &options, &stop, &open))?
        };
        Ok(Swarm { stop, open, thread: Some(thread) })
    }

    /// Connections the swarm holds open now, as far as it has seen.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn stop(mut self) -> anyhow::Result<SwarmReport> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("invariant: stopped once");
        thread.join().map_err(|_| anyhow!("the swarm thread panicked"))?
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn swarm(
    addr: SocketAddr,
    options: &SwarmOptions,
    stop: &AtomicBool,
    open: &AtomicUsize,
) -> anyhow::Result<SwarmReport> {
    let mut report = SwarmReport::default();
    let mut slots: Vec<(IpAddr, Option<TcpStream>)> = options
        .addresses
        .iter()
        .flat_map(|&ip| std::iter::repeat_n(ip, options.per_address))
        .map(|ip| (ip, None))
        .collect();
    let mut scratch = [0u8; 4096];
    let opening = options.opening;
    while !stop.load(Ordering::Relaxed) {
        for (ip, slot) in &mut slots {
            if let Some(stream) = slot {
                let closed = match stream.read(&mut scratch) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                    Err(_) => true,
                };
                if closed {
                    report.closed_by_server += 1;
                    *slot = None;
                }
                continue;
            }
            let raw = RawOptions {
                local_ip: Some(*ip),
                connect_within: Some(Duration::from_millis(250)),
                ..RawOptions::default()
            };
            let Ok(mut stream) = connect_socket(addr, raw) else {
                report.failed_connects += 1;
                continue;
            };
            report.opened += 1;
            // A write to a connection the server already closed fails: it is opened again
            // on the next pass.
            let opened = stream.write_all(opening).is_ok();
            if opened && stream.set_nonblocking(true).is_ok() {
                *slot = Some(stream);
            }
        }
        open.store(slots.iter().filter(|(_, s)| s.is_some()).count(), Ordering::Relaxed);
        std::thread::sleep(options.reopen_every);
    }
    Ok(report)
}

/// A relay link's TLS handshake as a gateway makes it (its certificate from `tls`, ALPN
/// `meridian-relay/1`), to the shard named `shard` (`shard-1`) at `addr`; how long it
/// took, or an error if it did not finish within `within` (the gateway's connect deadline
/// is 2 s).
pub fn relay_handshake(
    tls: &meridian_tls::NodeTls,
    addr: SocketAddr,
    shard: &str,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut tcp = TcpStream::connect_timeout(&addr, within)
        .with_context(|| format!("connecting to {shard} at {addr}"))?;
    let name = ServerName::try_from(shard.to_string())?;
    let mut session = rustls::ClientConnection::new(tls.relay_client_config(), name)?;
    while session.is_handshaking() {
        let left = within.checked_sub(started.elapsed()).filter(|left| !left.is_zero());
        let Some(left) = left else {
            bail!("the relay handshake with {shard} did not finish within {within:?}");
        };
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        match session.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                bail!("the relay handshake with {shard} did not finish within {within:?}")
            }
            Err(e) => return Err(e).with_context(|| format!("relay handshake with {shard}")),
        }
    }
    let took = started.elapsed();
    // Write what was left (the client's Finished) so the shard does not count a failure.
    let _ = session.complete_io(&mut tcp);
    let _ = tcp.flush();
    Ok(took)
}

/// QUIC connections from one address that finish their handshake and never open a stream.
pub struct QuicWithoutStream {
    connections: Vec<quinn::Connection>,
    // Dropped after the connections: their closes go out first.
    _endpoint: quinn::Endpoint,
    runtime: tokio::runtime::Runtime,
    /// How long the last handshake took to finish, counted from the first's start.
    pub handshakes_took: Duration,
}

impl QuicWithoutStream {
    /// `n` connections from `from` (a loopback address) to `target`, all handshakes at once.
    pub fn connect(target: &QuicTarget, from: IpAddr, n: usize) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quic-strangers")
            .enable_all()
            .build()?;
        let config = client_config(target.cert_der, &QuicOptions::default())?;
        let addr = target.addr;
        let (endpoint, connections, took) = runtime.block_on(async move {
            let mut endpoint = quinn::Endpoint::client(SocketAddr::new(from, 0))?;
            endpoint.set_default_client_config(config);
            let started = Instant::now();
            let mut handshakes = tokio::task::JoinSet::new();
            for _ in 0..n {
                let connecting = endpoint.connect(addr, crate::quic::DEV_SERVER_NAME)?;
                handshakes.spawn(tokio::time::timeout(DEFAULT_WAIT, connecting));
            }
            let mut connections = Vec::with_capacity(n);
            while let Some(done) = handshakes.join_next().await {
                let connection = done?
                    .map_err(|_| anyhow!("a QUIC handshake from {from} timed out"))?
                    .with_context(|| format!("a QUIC handshake from {from}"))?;
                connections.push(connection);
            }
            anyhow::Ok((endpoint, connections, started.elapsed()))
        })?;
        Ok(QuicWithoutStream { connections, _endpoint: endpoint, runtime, handshakes_took: took })
    }

    /// Waits up to `within` for the gateway to close every connection; the application
    /// close code of each (None: still open, or closed without one).
    pub fn closes(&self, within: Duration) -> Vec<Option<u64>> {
        let connections = self.connections.clone();
        let until = tokio::time::Instant::now() + within;
        self.runtime.block_on(async move {
            let mut codes = Vec::with_capacity(connections.len());
            for connection in connections {
                let code = match tokio::time::timeout_at(until, connection.closed()).await {
                    Ok(quinn::ConnectionError::ApplicationClosed(close)) => {
                        Some(close.error_code.into_inner())
                    }
                    _ => None,
                };
                codes.push(code);
            }
            codes
        })
    }
}
