//! Real handshakes over loopback (a listener from [`incoming`], clients made by hand), and
//! the relay link's client and server configurations talking in memory.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;

use super::*;

fn client_config(ca: &Path, identity: Option<&TlsFiles>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("ca") {
        roots.add(cert.expect("a certificate")).expect("a CA");
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let config = match identity {
        Some(files) => {
            let chain = CertificateDer::pem_file_iter(&files.cert)
                .expect("cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("certs");
            let key = PrivateKeyDer::from_pem_file(&files.key).expect("key");
            builder.with_client_auth_cert(chain, key).expect("a client certificate")
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// Connects to `addr` as a TLS client expecting the server to be `server`, writes a byte
/// and reads one back; the server's certificate chain if that worked.
async fn talk(
    addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
    server: &str,
) -> Option<Vec<CertificateDer<'static>>> {
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = ServerName::try_from(server.to_string()).expect("a name");
    let mut stream = connector.connect(name, tcp).await.ok()?;
    stream.write_all(b"?").await.ok()?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte).await.ok()?;
    stream.get_ref().1.peer_certificates().map(|c| c.to_vec())
}

/// A gate for a test listener, with its own registry.
fn gate(limits: GateLimits) -> Arc<Gate> {
    Gate::new("grpc", limits, &meridian_observe::Registry::default())
}

/// A shard's listener in a temporary directory: (its CA, the shard's TLS, its address,
/// and the names each accepted connection's client certificate was checked against).
struct Server {
    ca: DevCa,
    dir: PathBuf,
    tls: Arc<NodeTls>,
    addr: std::net::SocketAddr,
    seen: tokio::sync::mpsc::Receiver<Option<Vec<CertificateDer<'static>>>>,
}

async fn server(name: &str) -> Server {
    let dir = std::env::temp_dir().join(format!("meridian-tls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = DevCa::open_or_create(&dir).expect("a CA");
    let tls = NodeTls::load(ca.issue("shard-1").expect("issued")).expect("loads");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    // Relay links are not served here (see `relay_links_and_grpc_share_the_listener`).
    let (relay_links, _) = tokio::sync::mpsc::channel(1);
    let mut streams = incoming(listener, Arc::clone(&tls), gate(UNTRUSTED), relay_links);
    let (seen_tx, seen) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(Ok(mut stream)) = streams.next().await {
            let certs = stream.get_ref().1.peer_certificates().map(|c| c.to_vec());
            let mut byte = [0u8; 1];
            if stream.read_exact(&mut byte).await.is_ok() {
                let _ = stream.write_all(&byte).await;
                let _ = stream.flush().await;
            }
            let _ = seen_tx.send(certs).await;
            // Kept open until the test ends, like a gRPC connection.
            tokio::spawn(async move {
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    Server { ca, dir, tls, addr, seen }
}

#[tokio::test]
async fn a_client_with_a_certificate_from_the_cluster_ca_gets_in_and_is_known_by_name() {
    let mut s = server("named").await;
    let gateway = s.ca.issue("gateway-3").expect("issued");
    let config = client_config(&s.dir.join("ca.pem"), Some(&gateway));
    assert!(talk(s.addr, config, "shard-1").await.is_some(), "handshake and a byte each way");
    let certs = s.seen.recv().await.expect("the server saw it").expect("a client certificate");
    assert!(presented_as(Some(&certs), "gateway-3"));
    assert!(!presented_as(Some(&certs), "gateway-4"), "another gateway's name is not this one");
    assert!(!presented_as(Some(&certs), "shard-3"));
    assert!(!presented_as(None, "gateway-3"), "no certificate names nobody");
}

#[tokio::test]
async fn a_client_without_a_certificate_or_from_another_ca_is_refused() {
    let s = server("refused").await;
    let anonymous = client_config(&s.dir.join("ca.pem"), None);
    assert!(talk(s.addr, anonymous, "shard-1").await.is_none(), "no client certificate");
    let other_dir = s.dir.join("other");
    let other = DevCa::open_or_create(&other_dir).expect("another CA");
    let stranger = other.issue("gateway-3").expect("issued by the other CA");
    let config = client_config(&s.dir.join("ca.pem"), Some(&stranger));
    assert!(talk(s.addr, config, "shard-1").await.is_none(), "a certificate from another CA");
    // Refusals are counted once the server side has seen them fail.
    for _ in 0..100 {
        if s.tls.refused.load(Ordering::Relaxed) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.tls.refused.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_client_checks_the_server_is_the_shard_it_dialled() {
    let s = server("dialled").await;
    let gateway = s.ca.issue("gateway-1").expect("issued");
    let config = client_config(&s.dir.join("ca.pem"), Some(&gateway));
    assert!(
        talk(s.addr, config, "shard-2").await.is_none(),
        "shard-1's certificate is not shard-2's"
    );
}

#[tokio::test]
async fn renewed_files_are_used_by_new_connections() {
    let mut s = server("renewed").await;
    let gateway = s.ca.issue("gateway-1").expect("issued");
    let config = client_config(&s.dir.join("ca.pem"), Some(&gateway));
    let before = talk(s.addr, Arc::clone(&config), "shard-1").await.expect("connects");
    s.seen.recv().await.expect("seen");
    // cert-manager writes a new certificate and key in place.
    s.ca.issue("shard-1").expect("renewed");
    let after = talk(s.addr, Arc::clone(&config), "shard-1").await.expect("connects");
    assert_ne!(before[0], after[0], "the new connection got the renewed certificate");
    assert_eq!(s.tls.reloads.load(Ordering::Relaxed), 1);
    // A file that does not load keeps the last good set.
    std::fs::write(s.dir.join("shard-1-key.pem"), b"half written").expect("writes");
    let kept = talk(s.addr, config, "shard-1").await.expect("still connects");
    assert_eq!(kept[0], after[0]);
    assert_eq!(s.tls.reload_failures.load(Ordering::Relaxed), 1);
}

/// Runs a handshake between `client` and `server` in memory, passing the bytes each writes
/// to the other; the first error either side finds.
fn handshake(
    client: &mut rustls::ClientConnection,
    server: &mut rustls::ServerConnection,
) -> Result<(), rustls::Error> {
    let mut wire = Vec::new();
    for _ in 0..20 {
        if !client.is_handshaking() && !server.is_handshaking() && !client.wants_write() {
            return Ok(());
        }
        wire.clear();
        while client.wants_write() {
            client.write_tls(&mut wire).expect("writes to a Vec");
        }
        server.read_tls(&mut &wire[..]).expect("reads from a slice");
        server.process_new_packets()?;
        wire.clear();
        while server.wants_write() {
            server.write_tls(&mut wire).expect("writes to a Vec");
        }
        client.read_tls(&mut &wire[..]).expect("reads from a slice");
        client.process_new_packets()?;
    }
    panic!("the handshake did not finish in 20 round trips");
}

fn in_memory(dir_name: &str) -> (PathBuf, DevCa, Arc<NodeTls>) {
    let dir = std::env::temp_dir().join(format!("meridian-tls-{}-{dir_name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = DevCa::open_or_create(&dir).expect("a CA");
    let shard = NodeTls::load(ca.issue("shard-1").expect("issued")).expect("loads");
    (dir, ca, shard)
}

#[test]
fn a_relay_client_and_a_shard_agree_on_the_relay_alpn_and_the_shard_knows_the_gateway() {
    let (_dir, ca, shard) = in_memory("relay-alpn");
    let gateway = NodeTls::load(ca.issue("gateway-3").expect("issued")).expect("loads");
    let config = gateway.relay_client_config();
    assert_eq!(config.alpn_protocols, vec![meridian_rpc::link::ALPN.to_vec()]);
    let name = ServerName::try_from("shard-1").expect("a name");
    let mut client = rustls::ClientConnection::new(config, name).expect("a client");
    let mut server = rustls::ServerConnection::new(shard.server_config()).expect("a server");
    handshake(&mut client, &mut server).expect("the handshake completes");
    assert_eq!(server.alpn_protocol(), Some(meridian_rpc::link::ALPN));
    assert_eq!(client.alpn_protocol(), Some(meridian_rpc::link::ALPN));
    assert!(presented_as(server.peer_certificates(), "gateway-3"));
    assert!(!presented_as(server.peer_certificates(), "gateway-4"));
}

#[test]
fn a_relay_client_checks_the_shard_is_the_one_it_dialled() {
    let (_dir, ca, shard) = in_memory("relay-dialled");
    let gateway = NodeTls::load(ca.issue("gateway-3").expect("issued")).expect("loads");
    let name = ServerName::try_from("shard-2").expect("a name");
    let mut client =
        rustls::ClientConnection::new(gateway.relay_client_config(), name).expect("a client");
    let mut server = rustls::ServerConnection::new(shard.server_config()).expect("a server");
    let refused = handshake(&mut client, &mut server);
    assert!(
        matches!(refused, Err(rustls::Error::InvalidCertificate(_))),
        "shard-1's certificate is not shard-2's: {refused:?}"
    );
}

#[test]
fn a_relay_client_certificate_from_another_ca_is_refused() {
    let (dir, _ca, shard) = in_memory("relay-stranger");
    let other = DevCa::open_or_create(&dir.join("other")).expect("another CA");
    let stranger = other.issue("gateway-3").expect("issued by the other CA");
    // It trusts the cluster's CA (so the shard passes its check) but presents a
    // certificate the cluster's CA did not issue.
    let stranger = NodeTls::load(TlsFiles { ca: dir.join("ca.pem"), ..stranger }).expect("loads");
    let name = ServerName::try_from("shard-1").expect("a name");
    let mut client =
        rustls::ClientConnection::new(stranger.relay_client_config(), name).expect("a client");
    let mut server = rustls::ServerConnection::new(shard.server_config()).expect("a server");
    let refused = handshake(&mut client, &mut server);
    assert!(
        matches!(refused, Err(rustls::Error::InvalidCertificate(_))),
        "the shard refuses the certificate: {refused:?}"
    );
}

#[test]
fn the_relay_client_config_follows_renewed_files() {
    let (_dir, ca, _shard) = in_memory("relay-renewed");
    let gateway = NodeTls::load(ca.issue("gateway-3").expect("issued")).expect("loads");
    let before = gateway.relay_client_config();
    assert!(Arc::ptr_eq(&before, &gateway.relay_client_config()), "cached while unchanged");
    ca.issue("gateway-3").expect("renewed");
    assert!(!Arc::ptr_eq(&before, &gateway.relay_client_config()), "built again");
}

/// One listener, two protocols: a client offering the relay ALPN is handed to the relay
/// links, one offering `h2` to the stream tonic serves.
#[tokio::test]
async fn relay_links_and_grpc_share_the_listener() {
    let (dir, ca, shard) = in_memory("relay-demux");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    let (relay_links, mut relayed) = tokio::sync::mpsc::channel(4);
    let mut grpc = incoming(listener, Arc::clone(&shard), gate(UNTRUSTED), relay_links);
    let gateway = NodeTls::load(ca.issue("gateway-3").expect("issued")).expect("loads");
    let name = ServerName::try_from("shard-1").expect("a name");

    let tcp = TcpStream::connect(addr).await.expect("connects");
    let connector = tokio_rustls::TlsConnector::from(gateway.relay_client_config());
    let mut link = connector.connect(name.clone(), tcp).await.expect("a relay handshake");
    link.write_all(meridian_rpc::link::MAGIC).await.expect("writes");
    let mut served = relayed.recv().await.expect("handed to the relay links");
    let certs = served.get_ref().1.peer_certificates().map(<[_]>::to_vec);
    assert!(presented_as(certs.as_deref(), "gateway-3"));
    let mut magic = [0u8; 8];
    served.read_exact(&mut magic).await.expect("reads inside TLS");
    assert_eq!(&magic, meridian_rpc::link::MAGIC);

    let mut h2 =
        (*client_config(&dir.join("ca.pem"), Some(&ca.issue("gateway-4").expect("issued"))))
            .clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(h2));
    let _h2 = connector.connect(name, tcp).await.expect("an h2 handshake");
    let served = grpc.next().await.expect("handed to tonic").expect("a stream");
    assert_eq!(served.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert!(relayed.try_recv().is_err(), "not a relay link");
}

/// A connection from `ip` (any 127.x.y.z is this host).
async fn connect_from(addr: std::net::SocketAddr, ip: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind(format!("{ip}:0").parse().expect("an address")).expect("binds");
    socket.connect(addr).await.expect("connects")
}

/// Whether the server closes `tcp` (within 5 s) without a byte.
async fn closed(tcp: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Strangers holding silent connections (one address past its share, and others filling
/// every place) keep no relay handshake out: the extra one from the full address is closed
/// at once, a genuine client takes the place of the oldest silent one, and a silent
/// connection that is left alone is closed after `FIRST_BYTE_WITHIN`.
#[tokio::test]
async fn silent_strangers_keep_no_genuine_handshake_out() {
    let (_dir, ca, shard) = in_memory("strangers");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("an address");
    let (relay_links, mut relayed) = tokio::sync::mpsc::channel(4);
    let gate = gate(GateLimits { per_address: 4, max: 8 });
    let _grpc = incoming(listener, Arc::clone(&shard), Arc::clone(&gate), relay_links);
    let mut silent = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..4 {
            silent.push(connect_from(addr, ip).await);
        }
    }
    let started = std::time::Instant::now();
    let mut fifth = connect_from(addr, "127.0.0.2").await;
    assert!(closed(&mut fifth).await, "a fifth from one address is closed at once");
    assert!(started.elapsed() < FIRST_BYTE_WITHIN, "closed at once, not at the deadline");
    assert_eq!(gate.closed("per_address"), 1);

    let gateway = NodeTls::load(ca.issue("gateway-3").expect("issued")).expect("loads");
    let connector = tokio_rustls::TlsConnector::from(gateway.relay_client_config());
    let name = ServerName::try_from("shard-1").expect("a name");
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let mut link = connector.connect(name, tcp).await.expect("a relay handshake");
    link.write_all(meridian_rpc::link::MAGIC).await.expect("writes");
    relayed.recv().await.expect("handed to the relay links");
    assert!(closed(&mut silent[0]).await, "the oldest silent one made room");
    assert_eq!(gate.closed("evicted"), 1);
    // The rest go at their first-byte deadline.
    for (n, tcp) in silent.iter_mut().enumerate().skip(1) {
        assert!(closed(tcp).await, "silent connection {n}");
    }
    assert!(started.elapsed() >= FIRST_BYTE_WITHIN);
    assert_eq!(gate.closed("deadline"), 7);
    assert_eq!(gate.waiting(), 0);
}
