//! A worker's relay links to the shards, sans-IO: the bytes each link has to send, what the
//! bytes it received say, heartbeats and silence. The worker's event loop moves the bytes
//! (on its own ring or epoll set); the core decides what they mean.
//!
//! A link is connected (and its TLS handshake done) by a task beside the workers, which
//! hands the worker the socket and the TLS session in a `LinkUp` mail (the shell's), then waits for the
//! worker to let it go ([`Uplink::gone`] dropped) before it connects again. Everything
//! after that (every batch each way) is the worker's alone.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

use meridian_rpc::link::{next_frame, put_frame, put_heartbeat, FrameTooLong, HEARTBEAT, SILENCE};
use meridian_rpc::pb::{Delivery, GatewayBatch, PlayerInput, ShardBatch};
use prost::Message;

use crate::routing::ShardLink;

/// Bytes a link may have waiting to be sent (queued and in flight) before a worker's
/// inputs for that shard wait in the core instead (see `STALLED_LIMIT`).
pub const UPLINK_BUFFER: usize = 4 * 1024 * 1024;
/// Plaintext a TLS session may hold, received but not yet taken: far over what one read
/// brings, so it never limits a link that keeps up.
const TLS_PLAINTEXT_LIMIT: usize = 16 * 1024 * 1024;

/// Why a link is let go.
#[derive(Debug, thiserror::Error)]
pub enum LinkFailure {
    #[error("the shard closed the link")]
    Closed,
    #[error("socket error: {0}")]
    Socket(std::io::Error),
    #[error("nothing heard for {0:?}")]
    Silent(std::time::Duration),
    #[error("{0}")]
    TooLong(#[from] FrameTooLong),
    #[error("undecodable batch: {0}")]
    Undecodable(#[from] prost::DecodeError),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("the shard refused the link: {0}")]
    Refused(String),
    #[error("the shard left the routing table")]
    Unrouted,
}

/// One link, as its worker's core keeps it (the socket is the event loop's).
pub struct Uplink {
    pub link: Arc<ShardLink>,
    tls: Option<Box<rustls::ClientConnection>>,
    /// Frames not yet sealed into TLS records (with TLS only).
    plain: Vec<u8>,
    /// Bytes for the socket, after whatever the event loop has in flight.
    pub out: Vec<u8>,
    /// Bytes the event loop has taken from `out` and not yet seen sent.
    pub sending: usize,
    /// Received bytes not yet a whole frame.
    inbuf: Vec<u8>,
    heard: Instant,
    said: Instant,
    gone: Option<GoneToken>,
    /// Bytes it may have unsent before inputs wait ([`UPLINK_BUFFER`]).
    pub(crate) room: usize,
    /// Let go: the event loop closes its socket once nothing is in flight on it.
    pub failed: bool,
    /// Something was queued since the last seal.
    pub(crate) dirty: bool,
    /// Sealed (or failed) since the event loop last looked: it is to write or close it.
    pub(crate) ready: bool,
}

/// What the connecting task waits on: dropped when the worker lets the link go. Opaque to
/// the core (it is a channel's sending half, which the core only drops).
pub type GoneToken = Box<dyn std::any::Any + Send>;

/// A connected link without its socket, which the event loop has made its own (the
/// shell's `LinkUp::split`).
pub struct Connected {
    pub link: Arc<ShardLink>,
    pub tls: Option<Box<rustls::ClientConnection>>,
    pub gone: GoneToken,
}

impl Uplink {
    pub fn new(up: Connected, now: Instant) -> Uplink {
        Uplink {
            link: up.link,
            tls: up.tls,
            plain: Vec::new(),
            out: Vec::new(),
            sending: 0,
            inbuf: Vec::new(),
            heard: now,
            said: now,
            gone: Some(up.gone),
            room: UPLINK_BUFFER,
            failed: false,
            dirty: true,
            ready: false,
        }
    }

    /// Whether more may be queued now.
    pub fn has_room(&self) -> bool {
        self.plain.len() + self.out.len() + self.sending < self.room
    }

    /// Queues `inputs` as one or more batches (within the batch limits, in order).
    pub fn queue(&mut self, inputs: Vec<PlayerInput>) -> usize {
        let mut batches = 0;
        for inputs in meridian_rpc::split_entries(inputs, meridian_rpc::GATEWAY_BATCH) {
            let batch = GatewayBatch { gateway_id: 0, lane: 0, inputs };
            put_frame(self.frames(), &batch);
            batches += 1;
        }
        batches
    }

    fn frames(&mut self) -> &mut Vec<u8> {
        self.dirty = true;
        if self.tls.is_some() {
            &mut self.plain
        } else {
            &mut self.out
        }
    }

    /// Seals what is queued into TLS records in `out` (nothing to do without TLS), and
    /// queues a heartbeat if nothing was sent for a while. Call before taking `out`.
    pub fn seal(&mut self, now: Instant) -> Result<(), LinkFailure> {
        if now.duration_since(self.said) >= HEARTBEAT
            && self.plain.is_empty()
            && self.out.is_empty()
        {
            put_heartbeat(self.frames());
        }
        if let Some(tls) = self.tls.as_mut() {
            // rustls takes only as much plaintext as its send buffer holds (64 KiB), so a
            // burst goes in turns: take what it takes, move its records into `out`, again.
            let mut taken = 0;
            loop {
                while taken < self.plain.len() {
                    match tls.writer().write(&self.plain[taken..]).map_err(LinkFailure::Socket)? {
                        0 => break,
                        n => taken += n,
                    }
                }
                while tls.wants_write() {
                    tls.write_tls(&mut self.out).map_err(LinkFailure::Socket)?;
                }
                if taken == self.plain.len() {
                    break;
                }
            }
            self.plain.clear();
        }
        if !self.out.is_empty() {
            self.said = now;
        }
        Ok(())
    }

    /// Takes received bytes: every whole batch goes to `deliver`, in order.
    pub fn received(
        &mut self,
        mut data: &[u8],
        now: Instant,
        mut deliver: impl FnMut(Vec<Delivery>),
    ) -> Result<(), LinkFailure> {
        self.heard = now;
        match self.tls.as_mut() {
            None => self.inbuf.extend_from_slice(data),
            Some(tls) => {
                while !data.is_empty() {
                    tls.read_tls(&mut data).map_err(LinkFailure::Socket)?;
                    let state = tls.process_new_packets()?;
                    let mut plaintext = state.plaintext_bytes_to_read();
                    if plaintext > TLS_PLAINTEXT_LIMIT {
                        return Err(LinkFailure::TooLong(FrameTooLong(plaintext)));
                    }
                    let start = self.inbuf.len();
                    self.inbuf.resize(start + plaintext, 0);
                    while plaintext > 0 {
                        let end = self.inbuf.len();
                        let read = tls
                            .reader()
                            .read(&mut self.inbuf[end - plaintext..])
                            .map_err(LinkFailure::Socket)?;
                        if read == 0 {
                            break;
                        }
                        plaintext -= read;
                    }
                    let filled = self.inbuf.len() - plaintext;
                    self.inbuf.truncate(filled);
                    if tls.wants_write() {
                        // Handshake messages after the handshake (key updates) are answered.
                        self.dirty = true;
                    }
                }
            }
        }
        let mut used = 0;
        while let Some((len, body)) = next_frame(&self.inbuf[used..])? {
            used += len;
            if body.is_empty() {
                continue;
            }
            let batch = ShardBatch::decode(body)?;
            if !batch.refused.is_empty() {
                return Err(LinkFailure::Refused(batch.refused));
            }
            deliver(batch.deliveries);
        }
        self.inbuf.drain(..used);
        Ok(())
    }

    /// Whether the link has been silent too long to be alive.
    pub fn silent(&self, now: Instant) -> bool {
        now.duration_since(self.heard) > SILENCE
    }

    /// Lets the link go: its connecting task may connect again.
    pub fn let_go(&mut self) {
        self.failed = true;
        self.gone = None;
        self.plain = Vec::new();
        self.inbuf = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use meridian_cluster::ShardId;
    use meridian_rpc::link::put_frame;
    use meridian_rpc::pb::player_input::Kind;

    use super::*;

    fn uplink() -> (Uplink, std::sync::mpsc::Receiver<()>) {
        uplink_at(Instant::now())
    }

    fn uplink_at(now: Instant) -> (Uplink, std::sync::mpsc::Receiver<()>) {
        let link = Arc::new(ShardLink::registered(ShardId(1), 0, Default::default()));
        let (gone, released) = std::sync::mpsc::channel();
        (Uplink::new(Connected { link, tls: None, gone: Box::new(gone) }, now), released)
    }

    fn delivery(session: u64) -> Delivery {
        Delivery { session, frames: vec![1, 2, 3].into(), ..Default::default() }
    }

    /// Pings 1..=count from one player, as a worker would queue them.
    fn pings(count: u64) -> Vec<PlayerInput> {
        (1..=count)
            .map(|seq| PlayerInput {
                session: 1,
                player_id: 2,
                seq,
                kind: Some(Kind::Ping(meridian_protocol::pb::Ping { client_time: seq })),
            })
            .collect()
    }

    /// The seqs of every input in the batches framed in `wire`, in order.
    fn seqs_in(wire: &[u8]) -> Vec<u64> {
        let mut seqs = Vec::new();
        let mut rest = wire;
        while let Some((len, body)) = next_frame(rest).expect("frame") {
            seqs.extend(GatewayBatch::decode(body).expect("batch").inputs.iter().map(|i| i.seq));
            rest = &rest[len..];
        }
        seqs
    }

    #[test]
    fn batches_arrive_whole_and_in_order_however_the_bytes_are_cut() {
        let mut wire = Vec::new();
        for session in 1..=3 {
            let batch = ShardBatch { deliveries: vec![delivery(session)], refused: String::new() };
            put_frame(&mut wire, &batch);
            put_heartbeat(&mut wire);
        }
        for cut in 0..wire.len() {
            let (mut link, _released) = uplink();
            let mut sessions = Vec::new();
            let now = Instant::now();
            for part in [&wire[..cut], &wire[cut..]] {
                link.received(part, now, |d| sessions.extend(d.iter().map(|d| d.session)))
                    .expect("good frames");
            }
            assert_eq!(sessions, [1, 2, 3], "cut at {cut}");
        }
    }

    #[test]
    fn a_refusal_or_a_bad_frame_fails_the_link() {
        let (mut link, _released) = uplink();
        let mut wire = Vec::new();
        put_frame(&mut wire, &ShardBatch { deliveries: vec![], refused: "wrong gateway".into() });
        let failed = link.received(&wire, Instant::now(), |_| panic!("nothing delivered"));
        assert!(matches!(failed, Err(LinkFailure::Refused(why)) if why == "wrong gateway"));
        let (mut link, _released) = uplink();
        let failed = link.received(&[3, 0, 0, 0, 0xff, 0xff, 0xff], Instant::now(), |_| {});
        assert!(matches!(failed, Err(LinkFailure::Undecodable(_))));
        let (mut link, _released) = uplink();
        let failed = link.received(&u32::MAX.to_le_bytes(), Instant::now(), |_| {});
        assert!(matches!(failed, Err(LinkFailure::TooLong(_))));
    }

    #[test]
    fn inputs_go_as_batches_within_the_limits_and_heartbeats_fill_silence() {
        let start = Instant::now();
        let (mut link, released) = uplink_at(start);
        let inputs = pings(5000);
        assert_eq!(link.queue(inputs), 2, "over the count limit: two batches");
        link.seal(start).expect("plain");
        assert_eq!(seqs_in(&link.out), (1..=5000).collect::<Vec<_>>());
        link.out.clear();
        link.seal(start + HEARTBEAT / 2).expect("plain");
        assert!(link.out.is_empty(), "no heartbeat while the link spoke lately");
        link.seal(start + HEARTBEAT).expect("plain");
        assert_eq!(link.out, [0, 0, 0, 0], "a heartbeat after a quiet second");
        assert!(!link.silent(start + SILENCE));
        assert!(link.silent(start + SILENCE + HEARTBEAT));
        assert!(released.try_recv().is_err(), "held while the link lives");
        link.let_go();
        assert!(matches!(released.try_recv(), Err(std::sync::mpsc::TryRecvError::Disconnected)));
    }

    /// Passes the records in `wire` to the TLS peer `to`, reading its plaintext into
    /// `plain`.
    fn pass<S: rustls::SideData>(
        wire: &mut Vec<u8>,
        to: &mut rustls::ConnectionCommon<S>,
        plain: &mut Vec<u8>,
    ) {
        let mut rest = &wire[..];
        while !rest.is_empty() {
            to.read_tls(&mut rest).expect("reads from a slice");
            to.process_new_packets().expect("good records");
            let read = std::io::Read::read_to_end(&mut to.reader(), plain);
            assert_eq!(read.expect_err("open").kind(), std::io::ErrorKind::WouldBlock);
        }
        wire.clear();
    }

    /// More than rustls buffers by default (64 KiB) sealed at once: everything goes out as
    /// records and the shard reads every batch back (a real link failed "failed to write
    /// whole buffer" when a burst outgrew rustls's send buffer).
    #[test]
    fn a_burst_larger_than_rustls_buffers_is_sealed_whole() {
        let dir = std::env::temp_dir().join(format!("meridian-uplink-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ca = meridian_tls::DevCa::open_or_create(&dir).expect("a CA");
        let shard =
            meridian_tls::NodeTls::load(ca.issue("shard-1").expect("issued")).expect("loads");
        let gateway =
            meridian_tls::NodeTls::load(ca.issue("gateway-1").expect("issued")).expect("loads");
        let name = rustls::pki_types::ServerName::try_from("shard-1").expect("a name");
        let mut client =
            rustls::ClientConnection::new(gateway.relay_client_config(), name).expect("a client");
        let mut server = rustls::ServerConnection::new(shard.server_config()).expect("a server");
        let mut wire = Vec::new();
        while client.is_handshaking() || server.is_handshaking() || client.wants_write() {
            while client.wants_write() {
                client.write_tls(&mut wire).expect("writes to a Vec");
            }
            pass(&mut wire, &mut server, &mut Vec::new());
            while server.wants_write() {
                server.write_tls(&mut wire).expect("writes to a Vec");
            }
            pass(&mut wire, &mut client, &mut Vec::new());
        }
        let link = Arc::new(ShardLink::registered(ShardId(1), 0, Default::default()));
        let (gone, _released) = std::sync::mpsc::channel::<()>();
        let now = Instant::now();
        let connected = Connected { link, tls: Some(Box::new(client)), gone: Box::new(gone) };
        let mut link = Uplink::new(connected, now);
        let inputs = pings(20_000);
        link.queue(inputs);
        assert!(link.plain.len() > 64 * 1024, "more than rustls's default buffer");
        link.seal(now).expect("sealed whole");
        assert!(link.plain.is_empty());
        let mut plain = Vec::new();
        pass(&mut link.out, &mut server, &mut plain);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(seqs_in(&plain), (1..=20_000).collect::<Vec<_>>());
    }
}
