//! A blocking WebSocket link for test bots: one binary message per protobuf body, no length
//! prefix (DESIGN.md section 2b). Bots hand it the same length-delimited bytes they write
//! to TCP; it sends each whole frame as one message, so every scenario written for TCP runs
//! over WebSocket unchanged (a prefix that claims more than the frame limit is sent as an
//! oversized message at once, as the gateway refuses it from the prefix alone).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use meridian_protocol::{next_frame, FrameError, DEFAULT_MAX_FRAME};
use tungstenite::{Message, WebSocket};

pub struct WsClient {
    socket: WebSocket<TcpStream>,
    /// Bytes of a frame not yet whole.
    pending: Vec<u8>,
}

pub enum WsRead {
    /// A message's body, with its length prefix put back.
    Data(Vec<u8>),
    Closed,
    TimedOut,
}

impl WsClient {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> anyhow::Result<WsClient> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_read_timeout(Some(timeout))?;
        let url = format!("ws://{addr}/play");
        let (socket, _response) =
            tungstenite::client(url.as_str(), stream).context("WebSocket upgrade")?;
        Ok(WsClient { socket, pending: Vec::new() })
    }

    /// Sends every whole length-delimited frame in `bytes` (after what was pending) as one
    /// binary message each.
    pub fn write_all(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.pending.extend_from_slice(bytes);
        loop {
            match next_frame(&self.pending, usize::MAX) {
                Ok(Some(header)) => {
                    let body = header.body(&self.pending).to_vec();
                    let used = header.total_len();
                    self.socket.send(Message::Binary(body.into()))?;
                    self.pending.drain(..used);
                }
                Ok(None) => {
                    if let Some(claimed) = claimed_length(&self.pending) {
                        if claimed > DEFAULT_MAX_FRAME {
                            // Refused from the prefix alone over TCP: the same here.
                            let oversized = vec![0u8; DEFAULT_MAX_FRAME + 1];
                            self.socket.send(Message::Binary(oversized.into()))?;
                            self.pending.clear();
                        }
                    }
                    return Ok(());
                }
                Err(FrameError::BadPrefix) | Err(_) => {
                    // Not a frame at all: sent as it is, for the gateway to judge.
                    let raw = std::mem::take(&mut self.pending);
                    self.socket.send(Message::Binary(raw.into()))?;
                    return Ok(());
                }
            }
        }
    }

    pub fn read(&mut self, deadline: Instant) -> anyhow::Result<WsRead> {
        let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        self.socket.get_mut().set_read_timeout(Some(wait))?;
        match self.socket.read() {
            Ok(Message::Binary(body)) => {
                let mut framed = Vec::with_capacity(body.len() + 3);
                prost::encoding::encode_varint(body.len() as u64, &mut framed);
                framed.extend_from_slice(&body);
                Ok(WsRead::Data(framed))
            }
            Ok(Message::Close(_)) => Ok(WsRead::Closed),
            Ok(_) => Ok(WsRead::TimedOut),
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                Ok(WsRead::TimedOut)
            }
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                Ok(WsRead::Closed)
            }
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::ConnectionReset => {
                Ok(WsRead::Closed)
            }
            Err(tungstenite::Error::Protocol(_)) => Ok(WsRead::Closed),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends a text message (not a protocol message: the gateway refuses it).
    pub fn send_text(&mut self, text: &str) -> anyhow::Result<()> {
        self.socket.send(Message::Text(text.into()))?;
        Ok(())
    }

    pub fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.socket.get_ref().local_addr()?)
    }

    /// The TCP socket under it (a duplicate handle; the WebSocket's own is closed), for a
    /// test that resets the connection.
    pub fn into_stream(self) -> TcpStream {
        let stream =
            self.socket.get_ref().try_clone().expect("invariant: the socket can be duplicated");
        drop(self.socket);
        stream
    }
}

/// The length a complete varint prefix at the start of `bytes` claims.
fn claimed_length(bytes: &[u8]) -> Option<usize> {
    let mut value: u64 = 0;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return usize::try_from(value).ok();
        }
    }
    None
}
