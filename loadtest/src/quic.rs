//! `--transport quic`: the bots' QUIC client. TLS 1.3 with rustls+ring, ALPN `meridian/1`,
//! trusting either the certificates of `--ca FILE` or, with `--insecure`, any certificate
//! (a dev cluster's self-signed one); signatures are checked either way.
//!
//! Bots share a few client endpoints (UDP sockets), each driving many connections, so a
//! large run neither needs a socket per bot nor funnels every bot through one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The protocol's ALPN.
const ALPN: &[u8] = b"meridian/1";
/// Bots per client endpoint (UDP socket), about.
const BOTS_PER_ENDPOINT: u32 = 512;
/// Longest run of silence before a bot pings the gateway (it moves far more often).
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Which certificates a QUIC bot trusts.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Any certificate: for a dev cluster's self-signed one. Never against production.
    Insecure,
    /// The certificates in this PEM file.
    Ca(std::path::PathBuf),
}

/// The client side every QUIC bot of a run shares.
pub struct QuicClients {
    endpoints: Vec<quinn::Endpoint>,
    pub server_name: String,
}

impl std::fmt::Debug for QuicClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicClients")
            .field("endpoints", &self.endpoints.len())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl QuicClients {
    /// One endpoint per source address, more for large runs; endpoint `i` is bound to
    /// source address `i % source_ips`, so bot `b` uses an endpoint on its own address.
    pub fn new(
        trust: &Trust,
        server_name: String,
        bots: u32,
        source_ip: impl Fn(u32) -> std::net::IpAddr,
        source_ips: u32,
    ) -> anyhow::Result<QuicClients> {
        let config = client_config(trust)?;
        let per_ip = bots.div_ceil(BOTS_PER_ENDPOINT * source_ips.max(1)).clamp(1, 64);
        let count = source_ips.max(1) * per_ip;
        let mut endpoints = Vec::with_capacity(count as usize);
        for i in 0..count {
            let bind = std::net::SocketAddr::new(source_ip(i), 0);
            let mut endpoint = quinn::Endpoint::client(bind)
                .with_context(|| format!("binding a QUIC client socket on {bind}"))?;
            endpoint.set_default_client_config(config.clone());
            endpoints.push(endpoint);
        }
        Ok(QuicClients { endpoints, server_name })
    }

    /// The endpoint bot `index` connects through.
    pub fn endpoint(&self, index: u32) -> &quinn::Endpoint {
        &self.endpoints[index as usize % self.endpoints.len()]
    }
}

fn client_config(trust: &Trust) -> anyhow::Result<quinn::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut tls = match trust {
        Trust::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
        Trust::Ca(path) => builder.with_root_certificates(roots(path)?).with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

fn roots(path: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow!("reading --ca {}: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("--ca {} holds no certificate", path.display());
    }
    for cert in certs {
        roots
            .add(cert)
            .with_context(|| format!("--ca {}: unusable certificate", path.display()))?;
    }
    Ok(roots)
}

/// `--insecure`: any certificate is accepted, but the handshake signatures are still
/// verified, so the connection is encrypted to whoever holds the presented key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
