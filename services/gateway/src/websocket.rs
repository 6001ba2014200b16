//! The WebSocket port's listener; the WebSocket protocol itself (upgrade, frames, budgets)
//! is the core's (`meridian_gateway_core::websocket`, re-exported).

use std::io;
use std::net::SocketAddr;

pub use meridian_gateway_core::websocket::*;

/// A bound WebSocket listener (`--ws`), made before the gateway starts so a taken port is
/// reported at start-up. Every worker accepts on it (SO_REUSEPORT, like the game port).
pub struct WsFront {
    pub(crate) listener: std::net::TcpListener,
}

impl WsFront {
    pub fn bind(addr: SocketAddr) -> io::Result<WsFront> {
        Ok(WsFront { listener: crate::sockets::bind_game_listener(addr)? })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}
