//! `--transport ws`: the bots' WebSocket client (plain `ws://`, the gateway's `--ws`
//! front). Each binary message carries exactly one protobuf message body with no length
//! prefix, in both directions.
//!
//! The bot code speaks the protocol as TCP's byte stream of length-prefixed frames, so this
//! module adapts a WebSocket to it, inline in the bot's own task (no extra task, channel or
//! lock per message): the write half turns every whole frame it is given into one masked
//! binary WebSocket frame and writes them all with one `write`; the read half reads the
//! socket in large chunks, as the TCP bots do, and hands back every whole binary message in
//! them with its prefix put in front. It is written for the load test, lean on purpose: a
//! general WebSocket library (tungstenite, as the first version used) cost the bots about
//! twice the CPU per message of the TCP ones, and on a 2-core machine shared with the
//! servers that showed up as the gateway's delay. It speaks only what the gateway sends:
//! unfragmented binary messages, pings (answered), the close.
//!
//! The HTTP upgrade runs over a TCP connection the bot opened itself (its source address,
//! no Nagle).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use meridian_protocol::{next_frame, DEFAULT_MAX_FRAME};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Bytes read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;
/// The upgrade's answer at most.
const MAX_RESPONSE: usize = 8 * 1024;
/// Any 16 bytes in base64 will do for a load test's key.
const KEY: &str = "bWVyaWRpYW4tYm90cy0xNg==";

/// Upgrades `stream` to a WebSocket on `ws://{host}/` and splits it into the byte-stream
/// halves the bot reads and writes.
pub async fn upgrade(mut stream: TcpStream, host: &str) -> io::Result<(WsRead, WsWrite)> {
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: meridian.v1\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::with_capacity(256);
    let end = loop {
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during the upgrade"));
        }
        response.extend_from_slice(&chunk[..n]);
        if let Some(at) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if response.len() > MAX_RESPONSE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "upgrade answer too long"));
        }
    };
    let head = String::from_utf8_lossy(&response[..end]);
    if !head.starts_with("HTTP/1.1 101 ")
        || !head.to_ascii_lowercase().contains("sec-websocket-accept:")
    {
        let status = head.lines().next().unwrap_or("").to_owned();
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("upgrade refused: {status}"),
        ));
    }
    let (read, write) = stream.into_split();
    // Whatever followed the answer is the start of the first messages.
    let rest = &response[end..];
    let mut raw = vec![0u8; READ_CHUNK.max(rest.len())];
    raw[..rest.len()].copy_from_slice(rest);
    let reader = WsRead {
        socket: read,
        raw,
        used: 0,
        filled: rest.len(),
        out: Vec::new(),
        out_from: 0,
        ended: false,
    };
    let writer = WsWrite {
        socket: write,
        partial: Vec::new(),
        out: Vec::new(),
        written: 0,
        mask: 0x9e37_79b9,
    };
    Ok((reader, writer))
}

/// The read half: binary messages out as length-prefixed frames.
pub struct WsRead {
    socket: OwnedReadHalf,
    /// The read buffer: bytes up to `filled` are read from the socket, those before `used`
    /// handled.
    raw: Vec<u8>,
    used: usize,
    filled: usize,
    /// Prefixed frames ready for the bot; those before `out_from` are taken.
    out: Vec<u8>,
    out_from: usize,
    /// The server closed (a close frame, or the stream ended): end of file from now on.
    ended: bool,
}

impl WsRead {
    /// Turns every whole frame in `raw` into prefixed frames in `out`.
    fn decode(&mut self) -> io::Result<()> {
        loop {
            let rest = &self.raw[self.used..self.filled];
            let [first, second, ..] = *rest else { return Ok(()) };
            if second & 0x80 != 0 {
                return Err(invalid("a masked frame from the server"));
            }
            let (len, at) = match second & 0x7f {
                126 if rest.len() >= 4 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
                127 if rest.len() >= 10 => {
                    let len = u64::from_be_bytes(rest[2..10].try_into().expect("8 bytes"));
                    (usize::try_from(len).unwrap_or(usize::MAX), 10)
                }
                126 | 127 => return Ok(()),
                short => (usize::from(short), 2),
            };
            if len > DEFAULT_MAX_FRAME * 4 {
                return Err(invalid("a message far over the frame limit"));
            }
            if rest.len() < at + len {
                return Ok(());
            }
            let payload = &rest[at..at + len];
            match (first & 0x80 != 0, first & 0x0f) {
                (true, 0x2) => {
                    prost::encoding::encode_varint(len as u64, &mut self.out);
                    self.out.extend_from_slice(payload);
                }
                (_, 0x8) => self.ended = true,
                (_, 0x9 | 0xa) => {} // A ping needs no answer for the gateway's sake.
                (_, 0x1) => {
                    return Err(invalid(
                        "the server sent a text message; the protocol is binary messages only",
                    ))
                }
                _ => return Err(invalid("a fragmented or unknown frame")),
            }
            self.used += at + len;
            if self.ended {
                return Ok(());
            }
        }
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl AsyncRead for WsRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_from < this.out.len() {
                let rest = &this.out[this.out_from..];
                let n = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..n]);
                this.out_from += n;
                if this.out_from == this.out.len() {
                    this.out.clear();
                    this.out_from = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.ended || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            this.decode()?;
            if !this.out.is_empty() || this.ended {
                continue;
            }
            // Move the unhandled tail to the front, then read more behind it.
            this.raw.copy_within(this.used..this.filled, 0);
            this.filled -= this.used;
            this.used = 0;
            if this.filled == this.raw.len() {
                this.raw.resize(this.raw.len() * 2, 0); // a frame larger than the buffer
            }
            let mut into = ReadBuf::new(&mut this.raw[this.filled..]);
            ready!(Pin::new(&mut this.socket).poll_read(cx, &mut into))?;
            let n = into.filled().len();
            this.filled += n;
            if n == 0 {
                this.ended = true;
            }
        }
    }
}

/// The write half: length-prefixed frames in, one masked binary frame per frame body out,
/// written together at the flush.
pub struct WsWrite {
    socket: OwnedWriteHalf,
    /// The start of a frame not yet whole (a write cut inside a frame).
    partial: Vec<u8>,
    /// WebSocket frames to write; those before `written` are written.
    out: Vec<u8>,
    written: usize,
    /// The state of the masks' generator (a Weyl sequence: a load test needs no secrecy).
    mask: u32,
}

impl WsWrite {
    fn frame(&mut self, body: &[u8]) {
        self.out.push(0x82);
        match body.len() {
            n if n < 126 => self.out.push(0x80 | n as u8),
            n if n <= 0xffff => {
                self.out.push(0x80 | 126);
                self.out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                self.out.push(0x80 | 127);
                self.out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        self.mask = self.mask.wrapping_add(0x9e37_79b9);
        let mask = self.mask.to_be_bytes();
        self.out.extend_from_slice(&mask);
        self.out.extend(body.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    }

    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut self.socket).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.out.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WsWrite {
    /// Takes every byte: each frame they complete becomes a WebSocket frame, written at the
    /// next flush.
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let too_large = |error| io::Error::new(io::ErrorKind::InvalidInput, error);
        let mut pending = std::mem::take(&mut this.partial);
        let data: &[u8] = if pending.is_empty() {
            bytes
        } else {
            pending.extend_from_slice(bytes);
            &pending
        };
        let mut at = 0;
        while let Some(header) = next_frame(&data[at..], DEFAULT_MAX_FRAME).map_err(too_large)? {
            this.frame(header.body(&data[at..]));
            at += header.total_len();
        }
        let tail = data[at..].to_vec();
        this.partial = tail;
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.socket).poll_flush(cx)
    }

    /// Sends a close frame (and flushes): the WebSocket's end of stream.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.out.is_empty() {
            let mask = [0u8; 4];
            this.out.extend_from_slice(&[0x88, 0x82]);
            this.out.extend_from_slice(&mask);
            this.out.extend_from_slice(&1000u16.to_be_bytes());
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.socket).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use meridian_protocol::pb::{client_message, ClientMessage, ServerMessage};
    use tokio_tungstenite::tungstenite::Message;

    /// The other end: tungstenite's server, an independent implementation.
    type Stream = tokio_tungstenite::WebSocketStream<TcpStream>;
    use meridian_protocol::{encode_frame, server, FrameReader};
    use prost::Message as _;
    use tokio::net::TcpListener;

    /// A client upgraded against a tungstenite server on loopback; returns both ends.
    async fn pair() -> ((WsRead, WsWrite), Stream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepting = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            tokio_tungstenite::accept_async(stream).await.unwrap()
        });
        let host = addr.to_string();
        let client = upgrade(TcpStream::connect(addr).await.unwrap(), &host).await.unwrap();
        (client, accepting.await.unwrap())
    }

    fn frame(message: &ClientMessage) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(message, &mut out);
        out
    }

    fn moving(client_time: u64) -> ClientMessage {
        let mv = meridian_protocol::pb::Move { direction: 1, client_time };
        ClientMessage { kind: Some(client_message::Kind::Move(mv)) }
    }

    async fn next_binary(server: &mut Stream) -> Vec<u8> {
        match server.next().await.expect("a message").expect("no error") {
            Message::Binary(body) => body.to_vec(),
            other => panic!("expected a binary message, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn each_frame_becomes_one_bare_binary_message_however_it_is_written() {
        let ((_, mut write), mut server) = pair().await;
        let (first, second, third) = (moving(1), moving(300), moving(u64::MAX));
        // Two whole frames in one write, then one written a byte at a time.
        let mut two = frame(&first);
        two.extend(frame(&second));
        write.write_all(&two).await.unwrap();
        write.flush().await.unwrap();
        for byte in frame(&third) {
            write.write_all(&[byte]).await.unwrap();
        }
        write.flush().await.unwrap();
        for expected in [&first, &second, &third] {
            let body = next_binary(&mut server).await;
            assert_eq!(body, expected.encode_to_vec(), "the body alone, no prefix");
        }
    }

    #[tokio::test]
    async fn binary_messages_read_back_as_prefixed_frames() {
        let ((mut read, _write), mut server) = pair().await;
        let long = server::error(meridian_protocol::pb::ErrorCode::Malformed, "x".repeat(300), 9);
        let sent = [server::moved(7, 1, 2, 42), long, server::left(7)];
        for message in &sent {
            server.send(Message::binary(message.encode_to_vec())).await.unwrap();
        }
        server.close(None).await.unwrap();
        // Small reads, so a message is split across reads as a socket would split it.
        let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
        let mut got = Vec::new();
        let mut buf = [0u8; 7];
        loop {
            let n = read.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            frames.extend(&buf[..n]);
            while let Some(message) = frames.next_message::<ServerMessage>().unwrap() {
                got.push(message);
            }
        }
        assert_eq!(got, sent, "every message, in order, then end of stream at the close");
        assert_eq!(read.read(&mut buf).await.unwrap(), 0, "still the end");
    }

    #[tokio::test]
    async fn a_text_message_is_a_read_error() {
        let ((mut read, _write), mut server) = pair().await;
        server.send(Message::text("hello")).await.unwrap();
        let error = read.read(&mut [0u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_before_it_is_sent() {
        let ((_, mut write), _server) = pair().await;
        let mut prefix = Vec::new();
        prost::encoding::encode_varint(DEFAULT_MAX_FRAME as u64 + 1, &mut prefix);
        let error = write.write_all(&prefix).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    }
}
