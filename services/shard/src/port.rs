//! The shard's one port, two protocols: gRPC (peer streams, health) for tonic, and the
//! gateways' relay links (`link.rs`).
//!
//! Plain, a connection is told by its first 8 bytes: `meridian_rpc::link::MAGIC` makes it a
//! relay link; anything else (an HTTP/2 preface) goes to tonic. With mutual TLS, by the
//! protocol its client chose in the handshake (ALPN, `meridian_tls::incoming`). Either way
//! at most [`SORTING_MAX`] connections are being sorted (or shaking hands) at once (both
//! accept through `meridian_tls::accept_bounded`: past it, new ones wait in the kernel's
//! accept queue), and one that shows nothing within `link::HELLO_WITHIN` (10 s) is dropped
//! and counted.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use meridian_rpc::link::MAGIC;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Router;
use tracing::debug;

use crate::link::Links;

/// Connections being sorted at most (as many as TLS handshakes in flight).
const SORTING_MAX: usize = 256;
/// Connections sorted and waiting for tonic to take them.
const FOR_TONIC: usize = 64;

/// Serves `router` and the relay links on `listener` until `stopped` resolves (the links end
/// on the shard's own stop signal, see `Links`).
pub(crate) fn serve(
    listener: TcpListener,
    router: Router,
    links: Arc<Links>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    match tls {
        Some(tls) => {
            let (relay_links, relayed) = mpsc::channel(FOR_TONIC);
            tokio::spawn(serve_tls_links(links, relayed));
            let incoming = meridian_tls::incoming(listener, tls, relay_links);
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
        }
        None => {
            let incoming = sort_plain(listener, links);
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
fn sort_plain(listener: TcpListener, links: Arc<Links>) -> ReceiverStream<io::Result<TcpStream>> {
    let (grpc, streams) = mpsc::channel(FOR_TONIC);
    tokio::spawn(async move {
        let sorting = |tcp: TcpStream, from, permit: OwnedSemaphorePermit| {
            let (grpc, links) = (grpc.clone(), Arc::clone(&links));
            tokio::spawn(async move {
                match tokio::time::timeout(links.hello_within(), opening(&tcp)).await {
                    Ok(Ok(Opening::Relay)) => {
                        drop(permit);
                        links.serve(tcp, None).await;
                    }
                    Ok(Ok(Opening::Other)) => {
                        let _ = grpc.send(Ok(tcp)).await;
                        drop(permit);
                    }
                    Ok(Ok(Opening::Nothing)) => debug!(%from, "connection closed before a byte"),
                    Ok(Err(error)) => debug!(%from, %error, "connection failed before a byte"),
                    Err(_) => {
                        links.metrics().connections_silent.inc();
                        debug!(%from, "connection showed nothing in time; dropped");
                    }
                }
            });
        };
        meridian_tls::accept_bounded(&listener, SORTING_MAX, grpc.closed(), "gRPC", sorting).await;
    });
    ReceiverStream::new(streams)
}
