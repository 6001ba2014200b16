//! The shard's side of a relay link (`meridian_rpc::link`): one gateway lane's inputs in,
//! that lane's output out, as length-prefixed protobuf frames on one connection (plain TCP,
//! or TLS when the cluster has mutual TLS). `port.rs` finds the links among the
//! connections of the gRPC port and hands each to [`Links::serve`].
//!
//! A link starts with the magic and a hello (`GatewayBatch` naming the gateway and lane)
//! within [`HELLO_WITHIN`]; with TLS the client certificate must name that gateway. Then
//! two halves run until either ends:
//! - the reader reads into one reused buffer, takes whole frames and hands each batch's
//!   inputs to the world task, awaiting its queue (the backpressure: TCP flow control slows
//!   the gateway; nothing is dropped); it takes the link for dead after [`SILENCE`] without
//!   a byte (a gateway sends a heartbeat each [`HEARTBEAT`] it has nothing to say);
//! - the writer takes what the world task queued for the link, everything ready at once,
//!   and writes it as one buffer of frames; a heartbeat when it wrote nothing for
//!   [`HEARTBEAT`]. The world task cuts a link whose queue is full (`command::LINK_QUEUE`).
//!
//! Whatever ends the link (the gateway hanging up, silence, an error, the world task, the
//! shard stopping), the world task is told once (`Command::Closed`). Bytes the gateway got
//! wrong (the magic, an over-long or undecodable frame, no hello, a certificate naming
//! another gateway) are refused: one `ShardBatch { refused }` saying why, then the close.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meridian_rpc::link::{self, HEARTBEAT, MAGIC, SILENCE};
use meridian_rpc::pb::{GatewayBatch, ShardBatch};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;
use tonic::transport::CertificateDer;
use tonic::Status;
use tracing::{info, warn};

use crate::command::{frame_bytes, Command, LinkOut, LinkRefused, LINK_QUEUE};
use crate::types::LinkId;
use crate::ShardMetrics;

/// How long a new connection may take to show what it is, and a relay link to send its
/// magic and hello.
pub(crate) const HELLO_WITHIN: Duration = Duration::from_secs(10);
/// Room asked of the read buffer before each read.
const READ_CHUNK: usize = 64 * 1024;
/// Output gathered into one write at most: what is left goes in the next one.
const WRITE_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// A buffer grown past this (for one very large frame) is let go once it is empty.
const KEEP_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// How long a closing link waits for its refusal to be written and for the gateway to hang
/// up (unread bytes at the close would reset the connection, losing the refusal).
const CLOSE_WITHIN: Duration = Duration::from_secs(1);
/// Bytes a closing link reads and drops at most while waiting for the gateway to hang up.
const CLOSE_DRAIN_BYTES: usize = 1024 * 1024;

/// How a link ended.
#[derive(Debug)]
enum LinkEnd {
    /// The gateway hung up.
    HungUp,
    /// Nothing from the gateway for [`SILENCE`], or it took nothing written for as long.
    Silent,
    Failed(io::Error),
    Refused(LinkRefused),
    /// The world task let the link go (it cut it, or closed it), or is gone.
    DroppedByShard,
    /// The shard is stopping.
    Stopping,
}

/// What every link of a shard shares: where inputs go, link numbers, metrics, the stop
/// signal and, with mutual TLS, the node's TLS (for the refusal counter).
pub(crate) struct Links {
    commands: mpsc::Sender<Command>,
    next_link: AtomicU32,
    metrics: Arc<ShardMetrics>,
    /// Becomes true when the shard stops serving: every link then ends, so the shard's exit
    /// does not wait for gateways to hang up.
    stopping: watch::Receiver<bool>,
    tls: Option<Arc<meridian_tls::NodeTls>>,
    /// [`HELLO_WITHIN`], but in tests.
    hello_within: Duration,
}

impl Links {
    pub(crate) fn new(
        commands: mpsc::Sender<Command>,
        metrics: Arc<ShardMetrics>,
        stopping: watch::Receiver<bool>,
        tls: Option<Arc<meridian_tls::NodeTls>>,
    ) -> Links {
        let hello_within = HELLO_WITHIN;
        Links { commands, next_link: AtomicU32::new(1), metrics, stopping, tls, hello_within }
    }

    /// The same, giving connections `hello_within` to show what they are and links as long
    /// to say hello (tests that must not wait 10 s).
    #[cfg(test)]
    pub(crate) fn with_hello_within(self, hello_within: Duration) -> Links {
        Links { hello_within, ..self }
    }

    pub(crate) fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// How long a new connection may take to show what it is, and a link to say hello.
    pub(crate) fn hello_within(&self) -> Duration {
        self.hello_within
    }

    /// Serves one relay link until it ends. `stream` starts with the magic (for a plain
    /// connection, `port.rs` only peeked at it); `certs` is the client's certificate chain
    /// when the link is inside TLS, which must then name the gateway of the hello.
    pub(crate) async fn serve<S>(
        self: Arc<Self>,
        stream: S,
        certs: Option<Vec<CertificateDer<'static>>>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (reader, mut writer) = tokio::io::split(stream);
        let mut frames = Frames::new(reader);
        let mut out = Vec::new();
        let mut stopping = self.stopping.clone();
        let hello = tokio::select! {
            hello = timeout(self.hello_within, frames.hello(self.hello_within)) => {
                hello.unwrap_or(Err(LinkRefused::NoHello))
            }
            _ = stopping.wait_for(|stop| *stop) => return,
        };
        let hello = match hello {
            Ok(hello) => hello,
            Err(refused) => return self.refuse(frames, writer, &mut out, refused).await,
        };
        let (gateway, lane) = (hello.gateway_id, hello.lane);
        if let Some(tls) = &self.tls {
            if !meridian_tls::presented_as(certs.as_deref(), &format!("gateway-{gateway}")) {
                tls.refused();
                let refused = LinkRefused::NotThatGateway(gateway);
                return self.refuse(frames, writer, &mut out, refused).await;
            }
        }
        let link = LinkId(self.next_link.fetch_add(1, Ordering::Relaxed));
        let (batches, mut queued) = mpsc::channel(LINK_QUEUE);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let out_queue = LinkOut { batches, queued_bytes: Arc::clone(&queued_bytes) };
        let open = Command::Open { link, gateway, lane, out: out_queue };
        if self.commands.send(open).await.is_err() {
            return;
        }
        info!(link = link.0, gateway, lane, "gateway relay link opened");
        let first = hello.inputs;
        let taken = first.is_empty()
            || self.commands.send(Command::Inputs { link, inputs: first }).await.is_ok();
        // Whether the writer was stopped in the middle of a write: then nothing more can be
        // framed on the link, not even a refusal.
        let mut mid_write = false;
        let end = if taken {
            tokio::select! {
                end = read_in(&mut frames, link, &self.commands) => end,
                end = write_out(&mut writer, (&mut queued, &queued_bytes), &mut out, &mut mid_write) => end,
                _ = stopping.wait_for(|stop| *stop) => LinkEnd::Stopping,
            }
        } else {
            LinkEnd::DroppedByShard
        };
        let _ = self.commands.send(Command::Closed { link }).await;
        match end {
            LinkEnd::Refused(refused) if mid_write => {
                self.count_refusal(&refused);
                close(frames, writer, &[]).await;
            }
            LinkEnd::Refused(refused) => self.refuse(frames, writer, &mut out, refused).await,
            LinkEnd::Silent => {
                self.metrics.relay_links_silent.inc();
                warn!(
                    link = link.0,
                    gateway, lane, "gateway relay link silent for {SILENCE:?}; closed"
                );
                close(frames, writer, &[]).await;
            }
            LinkEnd::Failed(error) => {
                info!(link = link.0, gateway, lane, %error, "gateway relay link failed");
            }
            end @ (LinkEnd::HungUp | LinkEnd::DroppedByShard | LinkEnd::Stopping) => {
                info!(link = link.0, gateway, lane, ?end, "gateway relay link closed");
                close(frames, writer, &[]).await;
            }
        }
    }

    fn count_refusal(&self, refused: &LinkRefused) {
        self.metrics.relay_links_refused.inc(refused.label());
        warn!(%refused, "gateway relay link refused");
    }

    /// Tells the gateway why its link is refused, counts it, and closes the link.
    async fn refuse<S: AsyncRead + AsyncWrite>(
        &self,
        frames: Frames<ReadHalf<S>>,
        writer: WriteHalf<S>,
        out: &mut Vec<u8>,
        refused: LinkRefused,
    ) {
        self.count_refusal(&refused);
        out.clear();
        link::put_frame(out, &ShardBatch { deliveries: Vec::new(), refused: refused.to_string() });
        close(frames, writer, out).await;
    }
}

/// Writes `last` (a refusal, or nothing), ends this side of the link, and waits a little for
/// the gateway to hang up, dropping what it still sends: closing a socket with unread bytes
/// resets the connection, and the gateway could lose the last frame with it.
async fn close<S: AsyncRead + AsyncWrite>(
    mut frames: Frames<ReadHalf<S>>,
    mut writer: WriteHalf<S>,
    last: &[u8],
) {
    let _ = timeout(CLOSE_WITHIN, async {
        writer.write_all(last).await?;
        writer.shutdown().await?;
        let mut dropped = 0;
        frames.buf.clear();
        while dropped < CLOSE_DRAIN_BYTES {
            frames.buf.reserve(READ_CHUNK);
            match frames.reader.read_buf(&mut frames.buf).await? {
                0 => break,
                n => dropped += n,
            }
            frames.buf.clear();
        }
        Ok::<_, io::Error>(())
    })
    .await;
}

/// The read side: one buffer, reused, from which whole frames are taken.
struct Frames<R> {
    reader: R,
    buf: Vec<u8>,
    /// Where the bytes not taken yet start in `buf`.
    start: usize,
}

impl<R: AsyncRead + Unpin> Frames<R> {
    fn new(reader: R) -> Frames<R> {
        Frames { reader, buf: Vec::with_capacity(READ_CHUNK), start: 0 }
    }

    /// Reads once more into the buffer (after moving what is not taken yet to its front);
    /// `Ok(false)` at the end of the stream. Nothing read for `silence`: [`LinkEnd::Silent`].
    async fn fill(&mut self, silence: Duration) -> Result<bool, LinkEnd> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = Vec::with_capacity(READ_CHUNK);
        }
        self.buf.reserve(READ_CHUNK);
        match timeout(silence, self.reader.read_buf(&mut self.buf)).await {
            Err(_) => Err(LinkEnd::Silent),
            Ok(Err(error)) => Err(LinkEnd::Failed(error)),
            Ok(Ok(n)) => Ok(n > 0),
        }
    }

    /// Where in the buffer the next frame's body is (empty: a heartbeat); `None` once the
    /// gateway hung up.
    async fn next(&mut self, silence: Duration) -> Result<Option<Range<usize>>, LinkEnd> {
        loop {
            let found = link::next_frame(&self.buf[self.start..])
                .map_err(|too_long| LinkEnd::Refused(too_long.into()))?;
            if let Some((used, body)) = found {
                let body_start = self.start + used - body.len();
                self.start += used;
                return Ok(Some(body_start..self.start));
            }
            if !self.fill(silence).await? {
                return Ok(None);
            }
        }
    }

    /// The magic, then the hello frame, neither silent for longer than `within`.
    async fn hello(&mut self, within: Duration) -> Result<GatewayBatch, LinkRefused> {
        let refused = |end: LinkEnd| match end {
            LinkEnd::Refused(refused) => refused,
            LinkEnd::Silent => LinkRefused::NoHello,
            _ => LinkRefused::EndedBeforeHello,
        };
        while self.buf.len() - self.start < MAGIC.len() {
            match self.fill(within).await {
                Ok(true) => {}
                Ok(false) => return Err(LinkRefused::EndedBeforeHello),
                Err(end) => return Err(refused(end)),
            }
        }
        if self.buf[self.start..self.start + MAGIC.len()] != MAGIC[..] {
            return Err(LinkRefused::WrongMagic);
        }
        self.start += MAGIC.len();
        match self.next(within).await {
            Ok(Some(body)) => Ok(GatewayBatch::decode(&self.buf[body])?),
            Ok(None) => Err(LinkRefused::EndedBeforeHello),
            Err(end) => Err(refused(end)),
        }
    }
}

/// The reader half: each batch's inputs to the world task, in order, until the link ends.
async fn read_in<R: AsyncRead + Unpin>(
    frames: &mut Frames<R>,
    link: LinkId,
    commands: &mpsc::Sender<Command>,
) -> LinkEnd {
    loop {
        let body = match frames.next(SILENCE).await {
            Ok(Some(body)) => body,
            Ok(None) => return LinkEnd::HungUp,
            Err(end) => return end,
        };
        // An empty frame is a heartbeat: heard, nothing to do.
        if body.is_empty() {
            continue;
        }
        let batch = match GatewayBatch::decode(&frames.buf[body]) {
            Ok(batch) => batch,
            Err(error) => return LinkEnd::Refused(error.into()),
        };
        if batch.inputs.is_empty() {
            continue;
        }
        // Awaiting here is the backpressure policy: a full world queue stops this read, and
        // TCP flow control slows the gateway. Nothing is dropped.
        let inputs = batch.inputs;
        if commands.send(Command::Inputs { link, inputs }).await.is_err() {
            return LinkEnd::DroppedByShard;
        }
    }
}

/// The writer half: everything the world task has queued for the link, as one write of
/// frames each time; a heartbeat when nothing was written for [`HEARTBEAT`].
async fn write_out<W: AsyncWrite + Unpin>(
    writer: &mut W,
    (queued, queued_bytes): (&mut mpsc::Receiver<Result<ShardBatch, Status>>, &AtomicUsize),
    out: &mut Vec<u8>,
    mid_write: &mut bool,
) -> LinkEnd {
    loop {
        out.clear();
        if out.capacity() > KEEP_BUFFER_BYTES {
            *out = Vec::new();
        }
        let refused = match timeout(HEARTBEAT, queued.recv()).await {
            Err(_) => {
                link::put_heartbeat(out);
                None
            }
            Ok(None) => return LinkEnd::DroppedByShard,
            Ok(Some(first)) => gather(first, (queued, queued_bytes), out),
        };
        // A gateway that takes nothing for as long as it may stay silent is as dead.
        *mid_write = true;
        let written = timeout(SILENCE, async {
            writer.write_all(out).await?;
            writer.flush().await
        });
        match written.await {
            Err(_) => return LinkEnd::Silent,
            Ok(Err(error)) => return LinkEnd::Failed(error),
            Ok(Ok(())) => *mid_write = false,
        }
        if let Some(reason) = refused {
            out.clear();
            return LinkEnd::Refused(LinkRefused::ByShard(reason));
        }
    }
}

/// Frames `first` and whatever else is queued already into `out`, up to
/// [`WRITE_BATCH_BYTES`], taking each batch's bytes off `queued_bytes`. An error from the
/// world task ends the gathering: the reason it gives, for the refusal that ends the link
/// after what was gathered.
fn gather(
    first: Result<ShardBatch, Status>,
    (queued, queued_bytes): (&mut mpsc::Receiver<Result<ShardBatch, Status>>, &AtomicUsize),
    out: &mut Vec<u8>,
) -> Option<String> {
    let mut next = Some(first);
    while let Some(batch) = next {
        match batch {
            Ok(batch) => {
                queued_bytes.fetch_sub(frame_bytes(&batch), Ordering::Relaxed);
                link::put_frame(out, &batch)
            }
            Err(status) => return Some(status.message().to_string()),
        }
        if out.len() >= WRITE_BATCH_BYTES {
            break;
        }
        next = queued.try_recv().ok();
    }
    None
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
