//! `--transport ws`: the bots' WebSocket client (plain `ws://`, the gateway's `--ws`
//! front). Each binary message carries exactly one protobuf message body with no length
//! prefix, in both directions.
//!
//! The bot code speaks the protocol as TCP's byte stream of length-prefixed frames, so this
//! module adapts a WebSocket to it: the write half cuts what it is given at frame borders
//! and sends each body as one binary message (the prefix dropped), and the read half hands
//! each binary message back with its prefix put in front. Both work inline, in the bot's
//! own task, with no extra task or channel per message: the delay a WebSocket bot measures
//! is the gateway's and the WebSocket framing's, not a hop inside the load test.
//!
//! The HTTP upgrade runs over a TCP connection the bot opened itself (its source address,
//! no Nagle), through `tokio_tungstenite::client_async`, so only the `handshake` feature is
//! needed.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use meridian_protocol::{next_frame, DEFAULT_MAX_FRAME};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

type Stream = WebSocketStream<TcpStream>;

/// Upgrades `stream` to a WebSocket on `ws://{host}/` and splits it into the byte-stream
/// halves the bot reads and writes.
pub async fn upgrade(stream: TcpStream, host: &str) -> io::Result<(WsRead, WsWrite)> {
    let url = format!("ws://{host}/");
    let mut config = WebSocketConfig::default();
    // The gateway's own limits are what matters; these only keep a broken server from
    // making a bot buffer without bound.
    config.max_message_size = Some(DEFAULT_MAX_FRAME * 4);
    config.max_frame_size = Some(DEFAULT_MAX_FRAME * 4);
    let (socket, _response) =
        tokio_tungstenite::client_async_with_config(url, stream, Some(config))
            .await
            .map_err(to_io)?;
    let (sink, stream) = socket.split();
    let reader = WsRead { stream, pending: Vec::new(), read_from: 0, ended: false };
    Ok((reader, WsWrite { sink, partial: Vec::new() }))
}

/// The read half: binary messages out as length-prefixed frames.
pub struct WsRead {
    stream: SplitStream<Stream>,
    /// The current message with its prefix; `read_from` is how much is already read.
    pending: Vec<u8>,
    read_from: usize,
    /// The server closed (a close message, or the stream ended): end of file from now on.
    ended: bool,
}

impl AsyncRead for WsRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.read_from < this.pending.len() {
                let rest = &this.pending[this.read_from..];
                let n = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..n]);
                this.read_from += n;
                return Poll::Ready(Ok(()));
            }
            if this.ended || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.stream.poll_next_unpin(cx)) {
                Some(Ok(Message::Binary(body))) => {
                    this.pending.clear();
                    this.read_from = 0;
                    prost::encoding::encode_varint(body.len() as u64, &mut this.pending);
                    this.pending.extend_from_slice(&body);
                }
                Some(Ok(Message::Close(_))) | None => this.ended = true,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the server sent a text message; the protocol is binary messages only",
                    )));
                }
                // Pings are answered by tungstenite itself; pongs and raw frames carry
                // nothing for the bot.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Err(error)) => return Poll::Ready(Err(to_io(error))),
            }
        }
    }
}

/// The write half: length-prefixed frames in, one binary message per frame body out. The
/// bot flushes after every frame; a frame sits in tungstenite's buffer until then.
pub struct WsWrite {
    sink: SplitSink<Stream, Message>,
    /// The start of a frame not yet whole (a write cut inside a frame).
    partial: Vec<u8>,
}

impl AsyncWrite for WsWrite {
    /// Takes bytes up to the end of the first frame they complete (that frame is then
    /// sent), or all of them when they complete none.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.sink.poll_ready_unpin(cx)).map_err(to_io)?;
        let too_large = |error| io::Error::new(io::ErrorKind::InvalidInput, error);
        let (body, taken) = if this.partial.is_empty() {
            // The usual case: the bot writes one whole frame at a time.
            match next_frame(bytes, DEFAULT_MAX_FRAME).map_err(too_large)? {
                Some(header) => (Bytes::copy_from_slice(header.body(bytes)), header.total_len()),
                None => {
                    this.partial.extend_from_slice(bytes);
                    return Poll::Ready(Ok(bytes.len()));
                }
            }
        } else {
            let had = this.partial.len();
            this.partial.extend_from_slice(bytes);
            match next_frame(&this.partial, DEFAULT_MAX_FRAME).map_err(too_large)? {
                Some(header) => {
                    let body = Bytes::copy_from_slice(header.body(&this.partial));
                    this.partial.clear();
                    (body, header.total_len() - had)
                }
                None => return Poll::Ready(Ok(bytes.len())),
            }
        };
        this.sink.start_send_unpin(Message::Binary(body)).map_err(to_io)?;
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().sink.poll_flush_unpin(cx).map_err(to_io)
    }

    /// Sends a close message (and flushes): the WebSocket's end of stream.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().sink.poll_close_unpin(cx).map_err(to_io)
    }
}

fn to_io(error: WsError) -> io::Error {
    match error {
        WsError::Io(error) => error,
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, error)
        }
        other => io::Error::other(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::pb::{client_message, ClientMessage, ServerMessage};
    use meridian_protocol::{encode_frame, server, FrameReader};
    use prost::Message as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
