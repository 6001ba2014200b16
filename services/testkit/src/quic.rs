//! A blocking QUIC client for test bots: one connection with one bidirectional stream, as
//! the protocol has it, on its own small tokio runtime (one worker thread) so quinn keeps
//! answering the gateway while the test thread does something else.
//!
//! Besides the stream it can do what only a QUIC client can: move to a new UDP socket mid
//! session ([`QuicClient::rebind`], connection migration), and disappear without a word
//! ([`QuicClient::vanish`]) so the gateway can only notice by its idle timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::wait::DEFAULT_WAIT;

/// The protocol's ALPN.
pub const ALPN: &[u8] = b"meridian/1";
/// The name the dev certificate is issued to.
pub const DEV_SERVER_NAME: &str = "localhost";
/// A quiet client sends a PING this often, so the gateway never times it out.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// A gateway's QUIC address and the certificate to trust there (the dev cluster's
/// self-signed one). `Copy`, like a `SocketAddr`, so scenarios pass it around freely: the
/// certificate is leaked once per cluster, which is fine in a test process.
#[derive(Debug, Clone, Copy)]
pub struct QuicTarget {
    pub addr: SocketAddr,
    pub cert_der: &'static [u8],
}

impl QuicTarget {
    /// From the address and the PEM certificate a gateway's ready file gives.
    pub fn from_pem(addr: SocketAddr, pem: &str) -> anyhow::Result<QuicTarget> {
        let der = CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| anyhow!("the gateway's QUIC certificate is not PEM: {e}"))?;
        Ok(QuicTarget { addr, cert_der: Box::leak(der.as_ref().to_vec().into_boxed_slice()) })
    }
}

/// How a client sets up its connection; the default is what a good client does.
#[derive(Debug, Clone)]
pub struct QuicOptions {
    pub alpn: Vec<Vec<u8>>,
    pub server_name: String,
    /// Bytes the gateway may send on the stream ahead of what this client has read
    /// (quinn's default when `None`); small for a client that is slow on purpose.
    pub receive_window: Option<u32>,
}

impl Default for QuicOptions {
    fn default() -> Self {
        QuicOptions {
            alpn: vec![ALPN.to_vec()],
            server_name: DEV_SERVER_NAME.to_string(),
            receive_window: None,
        }
    }
}

/// What a read produced.
pub enum QuicRead {
    Data(usize),
    /// The gateway finished the stream or the connection ended.
    Closed,
    TimedOut,
}

pub struct QuicClient {
    // Declared first so it is dropped last: the connection's close goes out before.
    endpoint: quinn::Endpoint,
    connection: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    /// How long the handshake took.
    pub handshake: Duration,
    runtime: Option<tokio::runtime::Runtime>,
}

impl QuicClient {
    /// Connects, completes the handshake and opens the session stream.
    pub fn connect(target: &QuicTarget) -> anyhow::Result<QuicClient> {
        QuicClient::connect_with(target, &QuicOptions::default())
    }

    pub fn connect_with(target: &QuicTarget, options: &QuicOptions) -> anyhow::Result<QuicClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("quic-bot")
            .enable_all()
            .build()?;
        let config = client_config(target.cert_der, options)?;
        let server_name = options.server_name.clone();
        let addr = target.addr;
        let (endpoint, connection, send, recv, handshake) = runtime.block_on(async move {
            let bind: SocketAddr = if addr.is_ipv4() {
                "127.0.0.1:0".parse().expect("invariant: literal address")
            } else {
                "[::1]:0".parse().expect("invariant: literal address")
            };
            let mut endpoint = quinn::Endpoint::client(bind)?;
            endpoint.set_default_client_config(config);
            let started = Instant::now();
            let connecting = endpoint.connect(addr, &server_name)?;
            let connection = tokio::time::timeout(DEFAULT_WAIT, connecting)
                .await
                .map_err(|_| anyhow!("QUIC handshake with {addr} timed out"))?
                .with_context(|| format!("QUIC handshake with {addr}"))?;
            let handshake = started.elapsed();
            let (send, recv) = connection.open_bi().await.context("opening the stream")?;
            anyhow::Ok((endpoint, connection, send, recv, handshake))
        })?;
        Ok(QuicClient { endpoint, connection, send, recv, handshake, runtime: Some(runtime) })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("invariant: the runtime lives as long as the client")
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let runtime = self.runtime.as_ref().expect("invariant: runtime present");
        let send = &mut self.send;
        runtime
            .block_on(async { tokio::time::timeout(DEFAULT_WAIT, send.write_all(bytes)).await })
            .map_err(|_| anyhow!("writing to the QUIC stream timed out"))??;
        Ok(())
    }

    /// Reads what has arrived, waiting at most until `deadline`.
    pub fn read(&mut self, buf: &mut [u8], deadline: Instant) -> anyhow::Result<QuicRead> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let runtime = self.runtime.as_ref().expect("invariant: runtime present");
        let recv = &mut self.recv;
        match runtime.block_on(async { tokio::time::timeout(wait, recv.read(buf)).await }) {
            Err(_) => Ok(QuicRead::TimedOut),
            Ok(Ok(Some(n))) => Ok(QuicRead::Data(n)),
            Ok(Ok(None)) => {
                // The gateway finished its side: finish ours, as a TCP client closes after
                // reading the end of the stream.
                let _ = self.send.finish();
                Ok(QuicRead::Closed)
            }
            Ok(Err(quinn::ReadError::ConnectionLost(_) | quinn::ReadError::Reset(_))) => {
                Ok(QuicRead::Closed)
            }
            Ok(Err(error)) => bail!("QUIC read failed: {error}"),
        }
    }

    /// Moves the connection to a fresh UDP socket (a new local port): what a phone does
    /// when it changes networks. Returns the new local address.
    pub fn rebind(&mut self) -> anyhow::Result<SocketAddr> {
        let ip = self.endpoint.local_addr()?.ip();
        let socket = std::net::UdpSocket::bind(SocketAddr::new(ip, 0))?;
        let _inside = self.runtime().enter();
        self.endpoint.rebind(socket).context("rebinding the QUIC endpoint")?;
        Ok(self.endpoint.local_addr()?)
    }

    /// A clean close: our stream finished, CONNECTION_CLOSE with code 0.
    pub fn close(mut self) {
        let _ = self.send.finish();
        self.connection.close(0u32.into(), b"bye");
        self.drain();
    }

    /// An abortive close, as a client that gives up: the stream reset and CONNECTION_CLOSE
    /// with an error code (the QUIC counterpart of a TCP reset).
    pub fn abort(mut self) {
        let _ = self.send.reset(1u32.into());
        self.connection.close(1u32.into(), b"aborted");
        self.drain();
    }

    /// Disappears without sending anything more, as a crashed device or a dead network
    /// would: the gateway only notices by its idle timeout.
    pub fn vanish(mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Stops quinn's driver task before any handle is dropped, so no
            // CONNECTION_CLOSE is ever sent.
            runtime.shutdown_background();
        }
    }

    /// Waits (briefly) until the close has gone out.
    fn drain(&mut self) {
        if let Some(runtime) = &self.runtime {
            let endpoint = self.endpoint.clone();
            runtime.block_on(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
            });
        }
    }
}

impl Drop for QuicClient {
    fn drop(&mut self) {
        if self.runtime.is_some() {
            self.connection.close(0u32.into(), b"dropped");
            self.drain();
        }
    }
}

/// TLS 1.3 with rustls+ring, trusting exactly `cert_der`, offering the options' ALPN.
pub(crate) fn client_config(
    cert_der: &[u8],
    options: &QuicOptions,
) -> anyhow::Result<quinn::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(cert_der.to_vec()))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = options.alpn.clone();
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE));
    if let Some(window) = options.receive_window {
        transport.stream_receive_window(window.into()).receive_window(window.into());
    }
    config.transport_config(Arc::new(transport));
    Ok(config)
}
