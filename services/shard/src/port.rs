//! The shard's one port, two protocols: gRPC (peer streams, health) for tonic, and the
//! gateways' relay links (`link.rs`).
//!
//! Plain, a connection is told by its first 8 bytes: `meridian_rpc::link::MAGIC` makes it a
//! relay link; anything else (an HTTP/2 preface) goes to tonic. With mutual TLS, by the
//! protocol its client chose in the handshake (ALPN, `meridian_tls::incoming`). Either way
//! a connection is accepted at once and holds a pass at the port's gate until it is sorted
//! (or past its handshake): at most 32 from one address (more are closed at once), 256 in
//! all (past it a newcomer takes the place of the oldest), and one that sends no byte within
//! `meridian_tls::FIRST_BYTE_WITHIN` (1 s) or shows nothing within `link::HELLO_WITHIN`
//! (10 s) is dropped and counted (`meridian_untrusted_connections_closed_total{port="grpc"}`,
//! `meridian_shard_connections_silent_total`). So strangers holding connections open cannot
//! keep a gateway's relay link or a peer's stream out (issue 31, item 5).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use meridian_observe::{Cut, Gate, Pass};
use meridian_rpc::link::MAGIC;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Router;
use tracing::debug;

use meridian_tls::Early;

use crate::link::Links;

/// Connections sorted and waiting for tonic to take them.
const FOR_TONIC: usize = 64;

/// Serves `router` and the relay links on `listener` until `stopped` resolves (the links end
/// on the shard's own stop signal, see `Links`).
pub(crate) fn serve(
    listener: TcpListener,
    router: Router,
    links: Arc<Links>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
    gate: Arc<Gate>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    match tls {
        Some(tls) => {
            let (relay_links, relayed) = mpsc::channel(FOR_TONIC);
            tokio::spawn(serve_tls_links(links, relayed));
            let incoming = meridian_tls::incoming(listener, tls, gate, relay_links);
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
        None => {
            let incoming = sort_plain(listener, links, gate);
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
    }
}

/// Serves each relay link `meridian_tls::incoming` found, with its client's certificates.
async fn serve_tls_links(
    links: Arc<Links>,
    mut relayed: mpsc::Receiver<meridian_tls::TlsStream<TcpStream>>,
) {
    while let Some(stream) = relayed.recv().await {
        let certs = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
        tokio::spawn(Arc::clone(&links).serve(stream, certs));
    }
}

/// What a plain connection's first bytes say it is.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    Relay,
    Other,
    /// It hung up before saying.
    Nothing,
}

/// Peeks at a connection's first bytes until they are the relay magic, or cannot be.
async fn opening(tcp: &TcpStream) -> io::Result<Opening> {
    let mut first = [0u8; MAGIC.len()];
    let mut pause = Duration::from_millis(1);
    loop {
        let n = tcp.peek(&mut first).await?;
        if n == 0 {
            return Ok(Opening::Nothing);
        }
        if first[..n] != MAGIC[..n] {
            return Ok(Opening::Other);
        }
        if n == MAGIC.len() {
            return Ok(Opening::Relay);
        }
        // The start of the magic only. A peek returns at once while those bytes are unread,
        // so look again a little later rather than spin.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The plain connections of `listener` that are not relay links, for tonic's
/// `serve_with_incoming`; relay links are served here. Ends when the returned stream is
/// dropped.
fn sort_plain(
    listener: TcpListener,
    links: Arc<Links>,
    gate: Arc<Gate>,
) -> ReceiverStream<io::Result<TcpStream>> {
    let (grpc, streams) = mpsc::channel(FOR_TONIC);
    tokio::spawn(async move {
        let sorting = |tcp: TcpStream, from, pass: Pass| {
            let (grpc, links) = (grpc.clone(), Arc::clone(&links));
            tokio::spawn(async move {
                let sorted = async {
                    meridian_tls::first_byte(&tcp, &pass).await?;
                    pass.within(links.hello_within(), opening(&tcp)).await.map_err(Early::Cut)
                };
                match sorted.await {
                    Ok(Ok(Opening::Relay)) => {
                        drop(pass);
                        links.serve(tcp, None).await;
                    }
                    Ok(Ok(Opening::Other)) => {
                        drop(pass);
                        let _ = grpc.send(Ok(tcp)).await;
                    }
                    Ok(Ok(Opening::Nothing)) | Err(Early::Gone(None)) => {
                        debug!(%from, "connection closed before a byte")
                    }
                    Ok(Err(error)) | Err(Early::Gone(Some(error))) => {
                        debug!(%from, %error, "connection failed before a byte")
                    }
                    Err(Early::Cut(Cut::Deadline)) => {
                        links.metrics().connections_silent.inc();
                        debug!(%from, "connection showed nothing in time; dropped");
                    }
                    Err(Early::Cut(Cut::Evicted)) => {
                        debug!(%from, "connection evicted by a newer one before it showed anything")
                    }
                }
            });
        };
        meridian_tls::accept_gated(&listener, &gate, grpc.closed(), "gRPC", sorting).await;
    });
    ReceiverStream::new(streams)
}
