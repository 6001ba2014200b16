//! A connected relay link on its way to its worker; the link's framing and TLS session,
//! which the core drives, are the core's (`meridian_gateway_core::uplink`, re-exported).

use std::sync::Arc;

pub use meridian_gateway_core::uplink::*;

use crate::routing::ShardLink;

/// A connected link, on its way to the worker that is to drive it.
pub struct LinkUp {
    pub link: Arc<ShardLink>,
    pub stream: std::net::TcpStream,
    /// The TLS session, handshake done (with the cluster's mutual TLS).
    pub tls: Option<Box<rustls::ClientConnection>>,
    /// Dropped when the worker lets the link go: the connecting task then connects again.
    pub gone: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Debug for LinkUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkUp").field("shard", &self.link.id).finish_non_exhaustive()
    }
}

impl LinkUp {
    /// The socket, and the rest for the core.
    pub fn split(self) -> (std::net::TcpStream, Connected) {
        (self.stream, Connected { link: self.link, tls: self.tls, gone: Box::new(self.gone) })
    }
}
