//! Mutual TLS on the links between Meridian's nodes (gateway to shard, shard to shard).
//!
//! Every node has a certificate from the cluster's CA whose subject alternative name names
//! it (`gateway-3`, `shard-7`) and trusts only that CA. A shard's listener asks every client
//! for its certificate ([`incoming`]) and its handlers check that the name matches what the
//! stream says it is ([`presented_as`]); a client checks the shard's certificate names the
//! shard it dialled (`ClientTlsConfig::domain_name` for gRPC, the `ServerName` given with
//! [`NodeTls::relay_client_config`] for a relay link). One port serves both: the client's
//! ALPN says which (`h2` for gRPC, `meridian_rpc::link::ALPN` for a relay link).
//!
//! The files are read again when they change (cert-manager renews certificates in place):
//! each new connection, in either direction, uses the files as they are then, so
//! rotation drops no stream and no player. A change that does not load (a half-written
//! file, a key that does not match) keeps the last good set, says so in the log and is
//! counted (`meridian_tls_reload_failures_total`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use meridian_observe::{Cut, Gate, GateLimits, Pass};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
pub use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

/// What a relay link's client names in its handshake (gRPC's is `h2`).
const RELAY_ALPN: &[u8] = meridian_rpc::link::ALPN;

/// How long a client may take over its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How long a new connection to a node's gRPC port may stay silent: every genuine client
/// (a relay link, a peer stream, a health check) speaks first, within a round trip.
pub const FIRST_BYTE_WITHIN: Duration = Duration::from_secs(1);
/// Connections to a node's gRPC port not yet past their handshake (or, plain, not yet
/// sorted): at most 256 in all, a newcomer past it taking the place of the oldest; at most
/// 32 from one address, more closed at once. See `meridian_observe::gate`.
pub const UNTRUSTED: GateLimits = GateLimits { per_address: 32, max: 256 };

/// Where a node's CA, certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA's certificate (PEM): the only one trusted for peers.
    pub ca: PathBuf,
    /// This node's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// This node's private key (PEM).
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {source}")]
    Pem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("cannot use the CA in {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot make a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// One loaded set of files.
struct Loaded {
    stamps: [Option<(SystemTime, u64)>; 3],
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    server: Arc<ServerConfig>,
    relay_client: Arc<ClientConfig>,
}

/// A node's TLS material, read again when its files change.
pub struct NodeTls {
    files: TlsFiles,
    loaded: Mutex<Arc<Loaded>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").field("files", &self.files).finish_non_exhaustive()
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Loaded {
    fn read(files: &TlsFiles) -> Result<Loaded, TlsError> {
        // Stamps first: a file replaced while it is read shows as changed next time.
        let stamps = [stamp(&files.ca), stamp(&files.cert), stamp(&files.key)];
        let (ca_pem, cert_pem, key_pem) = (read(&files.ca)?, read(&files.cert)?, read(&files.key)?);
        let certs = |pem: &[u8], path: &Path| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| TlsError::Pem { path: path.into(), source })?;
            if certs.is_empty() {
                return Err(TlsError::NoCertificate { path: path.into() });
            }
            Ok(certs)
        };
        let mut roots = RootCertStore::empty();
        for ca in certs(&ca_pem, &files.ca)? {
            roots
                .add(ca)
                .map_err(|e| TlsError::Ca { path: files.ca.clone(), reason: e.to_string() })?;
        }
        let roots = Arc::new(roots);
        let chain = certs(&cert_pem, &files.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|source| TlsError::Pem { path: files.key.clone(), source })?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| TlsError::Ca { path: files.ca.clone(), reason: e.to_string() })?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        server.alpn_protocols = vec![b"h2".to_vec(), RELAY_ALPN.to_vec()];
        // The default (webpki) server verifier checks the shard's certificate against the
        // cluster CA and the `ServerName` the caller connects with (`shard-7`).
        let mut relay_client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        relay_client.alpn_protocols = vec![RELAY_ALPN.to_vec()];
        Ok(Loaded {
            stamps,
            ca_pem,
            cert_pem,
            key_pem,
            server: Arc::new(server),
            relay_client: Arc::new(relay_client),
        })
    }
}

impl NodeTls {
    /// Reads the files; an error names the file that is wrong.
    pub fn load(files: TlsFiles) -> Result<Arc<NodeTls>, TlsError> {
        let loaded = Loaded::read(&files)?;
        info!(ca = %files.ca.display(), cert = %files.cert.display(), "mutual TLS on every gRPC link");
        Ok(Arc::new(NodeTls {
            files,
            loaded: Mutex::new(Arc::new(loaded)),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }))
    }

    /// The files as they are now: read again if any changed since they were last read.
    fn current(&self) -> Arc<Loaded> {
        let mut loaded = self.loaded.lock().expect("invariant: not poisoned");
        let now = [stamp(&self.files.ca), stamp(&self.files.cert), stamp(&self.files.key)];
        if now != loaded.stamps {
            match Loaded::read(&self.files) {
                Ok(fresh) => {
                    info!(cert = %self.files.cert.display(), "TLS files changed; new connections use them");
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                    *loaded = Arc::new(fresh);
                }
                Err(error) => {
                    // Tried again when the files change again (a writer still at work).
                    warn!(%error, "TLS files changed but do not load; keeping the last good ones");
                    self.reload_failures.fetch_add(1, Ordering::Relaxed);
                    let mut kept = Loaded::clone_of(&loaded);
                    kept.stamps = now;
                    *loaded = Arc::new(kept);
                }
            }
        }
        Arc::clone(&loaded)
    }

    /// The SHA-256 fingerprints (lowercase hex, of the DER) of the CA certificates this
    /// node trusts, as its `--tls-ca` holds them now: what the cluster compares to tell
    /// whether a joining node trusts the same CA as its members.
    pub fn ca_sha256(&self) -> Vec<String> {
        use sha2::Digest as _;
        let loaded = self.current();
        CertificateDer::pem_slice_iter(&loaded.ca_pem)
            .filter_map(Result::ok)
            .map(|der| {
                let digest = sha2::Sha256::digest(der.as_ref());
                digest.iter().map(|b| format!("{b:02x}")).collect()
            })
            .collect()
    }

    /// The server side of a new connection: this node's certificate, and a client
    /// certificate from the cluster CA required.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current().server)
    }

    /// The client side of a new relay link (a gateway's, to a shard): the cluster CA
    /// trusted, this node's own certificate presented, TLS 1.3 only, ALPN
    /// `meridian_rpc::link::ALPN` alone. Connect with the shard's name (`shard-7`) as the
    /// `ServerName`: the shard's certificate must name it. The files as they are now.
    pub fn relay_client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.current().relay_client)
    }

    /// The client side of a new connection to the node named `peer` (`shard-7`): the
    /// cluster CA trusted, the server's certificate must name `peer`, this node's own
    /// certificate presented.
    pub fn client_config(&self, peer: &str) -> tonic::transport::ClientTlsConfig {
        let loaded = self.current();
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&loaded.ca_pem))
            .identity(tonic::transport::Identity::from_pem(&loaded.cert_pem, &loaded.key_pem))
            .domain_name(peer)
    }

    /// Counts a connection refused for its certificate (or its name).
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The TLS counters, labelled `labels`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &meridian_observe::Registry,
        labels: &[(&str, &str)],
    ) {
        let tls = Arc::clone(self);
        registry.counter_fn(
            "meridian_tls_reloads_total",
            "Times the node's TLS files changed and were read again (new connections use them).",
            labels,
            move || tls.reloads.load(Ordering::Relaxed),
        );
        let tls = Arc::clone(self);
        registry.counter_fn(
            "meridian_tls_reload_failures_total",
            "Times the node's TLS files changed but did not load (the last good ones stay).",
            labels,
            move || tls.reload_failures.load(Ordering::Relaxed),
        );
        let tls = Arc::clone(self);
        registry.counter_fn(
            "meridian_tls_refused_total",
            "Connections, streams or relay links refused on the gRPC port: a failed handshake \
             (no certificate, or one not from the cluster CA) or a certificate naming another \
             node than the stream or link claims.",
            labels,
            move || tls.refused.load(Ordering::Relaxed),
        );
    }
}

impl Loaded {
    fn clone_of(other: &Loaded) -> Loaded {
        Loaded {
            stamps: other.stamps,
            ca_pem: other.ca_pem.clone(),
            cert_pem: other.cert_pem.clone(),
            key_pem: other.key_pem.clone(),
            server: Arc::clone(&other.server),
            relay_client: Arc::clone(&other.relay_client),
        }
    }
}

/// A gRPC endpoint for the node `peer` (`shard-7`) at `addr`: `https` with this node's
/// TLS when there is some (the files as they are now), plain `http` otherwise.
pub fn endpoint(
    addr: &str,
    tls: Option<&NodeTls>,
    peer: &str,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    match tls {
        None => tonic::transport::Endpoint::from_shared(format!("http://{addr}")),
        Some(tls) => tonic::transport::Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(tls.client_config(peer)),
    }
}

/// The connections of `listener` once their TLS handshake is done: those whose client chose
/// the relay link's ALPN (`meridian_rpc::link::ALPN`) go to `relay_links`, the others (gRPC,
/// `h2`) come out of the returned stream, for tonic's `serve_with_incoming`. Until then each
/// holds a pass at `gate` ([`accept_gated`]) and must send its first byte within
/// [`FIRST_BYTE_WITHIN`] and finish within 10 s. A failed, silent or slow handshake is
/// logged, counted and dropped, never handed on. Ends when the returned stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<NodeTls>,
    gate: Arc<Gate>,
    relay_links: mpsc::Sender<TlsStream<TcpStream>>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, io::Error>> {
    let (done, streams) = mpsc::channel(64);
    tokio::spawn(async move {
        accept_gated(&listener, &gate, done.closed(), "gRPC", |tcp, from, pass| {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
            let (done, tls, relay_links) = (done.clone(), Arc::clone(&tls), relay_links.clone());
            tokio::spawn(async move {
                let handshake = async {
                    first_byte(&tcp, &pass).await?;
                    pass.within(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await.map_err(Early::Cut)
                };
                let stream = match handshake.await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tls.refused();
                        return debug!(%from, %error, "gRPC TLS handshake refused");
                    }
                    Err(early) => return debug!(%from, ?early, "gRPC TLS handshake cut"),
                };
                // Past the handshake: the client showed a certificate from the cluster CA.
                drop(pass);
                if stream.get_ref().1.alpn_protocol() == Some(RELAY_ALPN) {
                    let _ = relay_links.send(stream).await;
                } else {
                    let _ = done.send(Ok(stream)).await;
                }
            });
        })
        .await;
    });
    ReceiverStream::new(streams)
}

/// Why a connection ended before it showed what it is.
#[derive(Debug)]
pub enum Early {
    /// It hung up (or failed) before its first byte.
    Gone(Option<io::Error>),
    /// Evicted by a newcomer, or past a deadline (counted by the gate).
    Cut(Cut),
}

/// Waits, within [`FIRST_BYTE_WITHIN`], until `tcp` has a byte to read (left unread), and
/// marks the pass as having spoken (silent connections are evicted first).
pub async fn first_byte(tcp: &TcpStream, pass: &Pass) -> Result<(), Early> {
    let mut first = [0u8; 1];
    match pass.within(FIRST_BYTE_WITHIN, tcp.peek(&mut first)).await {
        Ok(Ok(0)) => Err(Early::Gone(None)),
        Ok(Ok(_)) => {
            pass.spoke();
            Ok(())
        }
        Ok(Err(error)) => Err(Early::Gone(Some(error))),
        Err(cut) => Err(Early::Cut(cut)),
    }
}

/// Accepts connections on `listener` until `stop` resolves, each at once (so none waits in
/// the kernel's queue behind strangers): each gets a pass at `gate` and goes to `each` with
/// `TCP_NODELAY` set; one whose address holds its share of the gate, or finds every place
/// busy, is closed at once (the gate counts it). `each` drops the pass once the connection
/// showed what it is, and closes it if the pass is evicted ([`Pass::within`]). A failed
/// accept (out of descriptors or memory) is logged as `what`'s and retried 100 ms later
/// rather than in a spin. The shard's plain port and [`incoming`] both accept this way.
pub async fn accept_gated(
    listener: &TcpListener,
    gate: &Arc<Gate>,
    stop: impl std::future::Future<Output = ()>,
    what: &'static str,
    mut each: impl FnMut(TcpStream, std::net::SocketAddr, Pass),
) {
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => return,
        };
        let (tcp, from) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, port = what, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(pass) = gate.admit(from.ip()) else {
            debug!(%from, port = what, "connection refused: its address holds its share");
            continue;
        };
        // Both protocols on these ports carry small batches both ways: without this every
        // one waits for the peer's delayed ACK.
        let _ = tcp.set_nodelay(true);
        each(tcp, from, pass);
    }
}

/// Whether the client certificate of a request (tonic's `Request::peer_certs`) names
/// `name` (`gateway-3`) among its DNS subject alternative names. The chain itself was
/// verified against the cluster CA in the handshake.
pub fn presented_as(certs: Option<&[CertificateDer<'static>]>, name: &str) -> bool {
    let Some(leaf) = certs.and_then(|certs| certs.first()) else { return false };
    let Ok(name) = ServerName::try_from(name) else { return false };
    webpki::EndEntityCert::try_from(leaf)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

/// A cluster CA for development and tests (`meridian up`): its certificate and key live in
/// a directory, and it issues node certificates into it.
pub struct DevCa {
    dir: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl DevCa {
    /// The CA in `dir` (`ca.pem`, `ca-key.pem`), made there if it is not.
    pub fn open_or_create(dir: &Path) -> Result<DevCa, TlsError> {
        let (cert, key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        // The CA's parameters are fixed: reopened, its key and these make the same issuer
        // (name and key identifier) as the certificate on disk, without parsing it.
        let params = || -> Result<rcgen::CertificateParams, TlsError> {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, "Meridian development CA");
            params.key_usages =
                vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
            Ok(params)
        };
        if !cert.exists() || !key.exists() {
            std::fs::create_dir_all(dir)
                .map_err(|source| TlsError::Read { path: dir.into(), source })?;
            let signing = rcgen::KeyPair::generate()?;
            let made = params()?.self_signed(&signing)?;
            write_private(&key, signing.serialize_pem().as_bytes())?;
            std::fs::write(&cert, made.pem())
                .map_err(|source| TlsError::Read { path: cert.clone(), source })?;
        }
        let key_pem = String::from_utf8_lossy(&read(&key)?).into_owned();
        let signing = rcgen::KeyPair::from_pem(&key_pem)?;
        let issuer = rcgen::Issuer::new(params()?, signing);
        Ok(DevCa { dir: dir.into(), issuer })
    }

    /// A certificate naming `name` (`shard-3`), usable as a server's and as a client's,
    /// written as `<name>.pem` and `<name>-key.pem` next to the CA (made again if there).
    pub fn issue(&self, name: &str) -> Result<TlsFiles, TlsError> {
        self.issue_as(name, name, None)
    }

    /// A certificate naming `name` that expired at the end of 2021 (for tests of refusal),
    /// written as `<name>-expired.pem` and `<name>-expired-key.pem`.
    pub fn issue_expired(&self, name: &str) -> Result<TlsFiles, TlsError> {
        self.issue_as(name, &format!("{name}-expired"), Some((2020, 2021)))
    }

    fn issue_as(
        &self,
        name: &str,
        stem: &str,
        // Valid from the start of the first year to the end of the second.
        validity: Option<(i32, i32)>,
    ) -> Result<TlsFiles, TlsError> {
        let signing = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        if let Some((from, until)) = validity {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(until, 12, 31);
        }
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let made = params.signed_by(&signing, &self.issuer)?;
        let files = TlsFiles {
            ca: self.dir.join("ca.pem"),
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}-key.pem")),
        };
        write_private(&files.key, signing.serialize_pem().as_bytes())?;
        std::fs::write(&files.cert, made.pem())
            .map_err(|source| TlsError::Read { path: files.cert.clone(), source })?;
        Ok(files)
    }
}

/// Writes a key readable by its owner only.
fn write_private(path: &Path, pem: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |source| TlsError::Read { path: path.into(), source };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.write_all(pem).map_err(fail)
}

#[cfg(test)]
mod tests;
