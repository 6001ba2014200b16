//! The QUIC front's TLS: TLS 1.3 only, rustls with the `ring` provider, ALPN `meridian/1`,
//! a certificate from PEM files in production or a self-signed one made at start in dev mode.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

/// The application protocol a client must offer; anything else fails the handshake.
pub const ALPN: &[u8] = b"meridian/1";

/// Where the QUIC front's certificate comes from.
#[derive(Debug, Clone)]
pub enum QuicCert {
    /// PEM files: the certificate chain (leaf first) and its private key.
    Files { cert: PathBuf, key: PathBuf },
    /// Dev mode: a self-signed certificate for these names (DNS names or IP addresses),
    /// generated at start and never written to disk by the gateway.
    SelfSigned { names: Vec<String> },
}

/// How a QUIC connection notices a dead peer.
#[derive(Debug, Clone, Copy)]
pub struct QuicTimeouts {
    /// No packet from the client for this long closes the connection; its player leaves
    /// the world like a TCP client that disconnected.
    pub idle: Duration,
    /// The gateway sends a PING after this much silence, so a live but quiet client keeps
    /// answering and is never mistaken for a dead one.
    pub keep_alive: Duration,
}

impl Default for QuicTimeouts {
    fn default() -> Self {
        QuicTimeouts { idle: Duration::from_secs(10), keep_alive: Duration::from_secs(3) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QuicSetupError {
    #[error("cannot read the QUIC certificate {path}: {source}")]
    Cert { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("the QUIC certificate file {0} holds no certificate")]
    NoCert(PathBuf),
    #[error("cannot read the QUIC private key {path}: {source}")]
    Key { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration refused: {0}")]
    Tls(#[from] rustls::Error),
    #[error("QUIC cannot use this TLS configuration: {0}")]
    Quic(String),
    #[error("invalid QUIC transport setting: {0}")]
    Transport(String),
    /// The io error is the source, not part of the message: a report that prints the
    /// chain would say it twice.
    #[error("cannot bind the QUIC socket on {addr}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
}

/// The certificate the front presents, as operators and dev clients need to see it.
#[derive(Debug, Clone)]
pub struct PresentedCert {
    /// SHA-256 of the leaf certificate's DER, lowercase hex.
    pub sha256: String,
    /// The self-signed certificate in PEM (dev mode; clients trust it with `--ca`).
    pub pem: Option<String>,
}

/// Loads or makes the certificate and builds quinn's server configuration.
pub fn server_config(
    cert: &QuicCert,
    timeouts: QuicTimeouts,
) -> Result<(quinn::ServerConfig, PresentedCert), QuicSetupError> {
    let mut pem = None;
    let (chain, key) = match cert {
        QuicCert::Files { cert, key } => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|source| QuicSetupError::Cert { path: cert.clone(), source })?;
            if chain.is_empty() {
                return Err(QuicSetupError::NoCert(cert.clone()));
            }
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|source| QuicSetupError::Key { path: key.clone(), source })?;
            (chain, key)
        }
        QuicCert::SelfSigned { names } => {
            let made = rcgen::generate_simple_self_signed(names.clone())?;
            let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
            pem = Some(made.cert.pem());
            (vec![made.cert.der().clone()], PrivateKeyDer::Pkcs8(key))
        }
    };
    let presented = PresentedCert { sha256: sha256_hex(&chain[0]), pem };

    // One explicit provider: no process-wide default is needed or installed.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // No 0-RTT: early data is replayable, and a replayed Move would be applied twice.
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| QuicSetupError::Quic(e.to_string()))?;

    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(timeouts.idle)
        .map_err(|e| QuicSetupError::Transport(format!("idle timeout: {e}")))?;
    transport
        .max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(timeouts.keep_alive))
        // One bidirectional stream per session; clients open no other streams.
        .max_concurrent_bidi_streams(1u32.into())
        .max_concurrent_uni_streams(0u32.into())
        .datagram_receive_buffer_size(None);
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport));
    // Connection migration (a client's address changing mid-session) is on; sessions are
    // keyed by connection, never by the peer's address.
    server.migration(true);
    Ok((server, presented))
}

fn sha256_hex(der: &CertificateDer<'_>) -> String {
    Sha256::digest(der.as_ref()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pem_reads_back_as_the_same_certificate() {
        let cert = QuicCert::SelfSigned { names: vec!["localhost".into(), "127.0.0.1".into()] };
        let (_, presented) = server_config(&cert, QuicTimeouts::default()).expect("config");
        let back = CertificateDer::from_pem_slice(presented.pem.expect("dev pem").as_bytes())
            .expect("pem");
        assert_eq!(sha256_hex(&back), presented.sha256);
        assert_eq!(presented.sha256.len(), 64);
    }

    #[test]
    fn missing_files_are_reported_with_their_path() {
        let cert =
            QuicCert::Files { cert: "/nonexistent/c.pem".into(), key: "/nonexistent/k".into() };
        let error = server_config(&cert, QuicTimeouts::default()).expect_err("must fail");
        assert!(error.to_string().contains("/nonexistent/c.pem"), "{error}");
    }
}
