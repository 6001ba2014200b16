//! Relay links over real sockets: the shard's port (`port::serve`, with its tonic router) on
//! `127.0.0.1:0`, test gateways writing the wire format by hand (`meridian_rpc::link`), and
//! the test playing the world task (it reads the commands the links send).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use meridian_cluster::{ClusterView, EpochCell, ShardId};
use meridian_rpc::link::{self, MAGIC, MAX_FRAME_BYTES, SILENCE};
use meridian_rpc::pb::shard_client::ShardClient;
use meridian_rpc::pb::shard_server::ShardServer;
use meridian_rpc::pb::{GatewayBatch, PeerBatch, PlayerInput, ShardBatch};
use meridian_rpc::{MAX_BATCH_BYTES, MAX_DELIVERIES_PER_BATCH, MAX_GRPC_MESSAGE_BYTES};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::Links;
use crate::command::{frame_bytes, Command, LinkOut};
use crate::service::ShardService;
use crate::types::LinkId;
use crate::ShardMetrics;
use meridian_shard_core::testing::{big_round, drained, Outbox};

/// How long a test waits for what it expects before it fails.
const WITHIN: Duration = Duration::from_secs(20);
/// The bound on a connection showing what it is, and on a hello, in these tests.
const HELLO_WITHIN: Duration = Duration::from_millis(500);

/// A shard's port with the test as its world task.
struct Port {
    addr: SocketAddr,
    world: mpsc::Receiver<Command>,
    metrics: Arc<ShardMetrics>,
    stop: watch::Sender<bool>,
    stop_server: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Port {
    async fn start(tls: Option<Arc<meridian_tls::NodeTls>>) -> Port {
        let (commands, world) = mpsc::channel(16);
        let (_view_sender, changes) = watch::channel(ClusterView::default());
        let view = Arc::new(EpochCell::new(ClusterView::default()));
        let registry = meridian_observe::Registry::default();
        let metrics = Arc::new(ShardMetrics::new(&registry, ShardId(1)));
        let (stop, stopping) = watch::channel(false);
        let links =
            Links::new(commands.clone(), Arc::clone(&metrics), stopping.clone(), tls.clone())
                .with_hello_within(HELLO_WITHIN);
        let service =
            ShardService::new(commands, view, changes, Arc::clone(&metrics), stopping, tls.clone());
        let (_, health) = tonic_health::server::health_reporter();
        let router = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(ShardServer::new(service));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("a bound address");
        let (stop_server, server_stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = server_stopped.await;
        };
        let gate = meridian_observe::Gate::new("grpc", meridian_tls::UNTRUSTED, &registry);
        let server = crate::port::serve(listener, router, Arc::new(links), tls, gate, stopped);
        Port { addr, world, metrics, stop, stop_server: Some(stop_server), server }
    }

    /// The next command a link or stream sent the world task.
    async fn command(&mut self) -> Command {
        tokio::time::timeout(WITHIN, self.world.recv())
            .await
            .expect("a command in time")
            .expect("the links are up")
    }

    /// Expects the next command to open a link for `gateway`'s `lane`; its id and output.
    async fn opened(&mut self, gateway: u32, lane: u32) -> (LinkId, LinkOut) {
        match self.command().await {
            Command::Open { link, gateway: g, lane: l, out } => {
                assert_eq!((g, l), (gateway, lane), "the hello's gateway and lane");
                (link, out)
            }
            _ => panic!("expected the link of gateway {gateway} lane {lane} to open"),
        }
    }

    /// A gateway connected in the clear and said hello as `gateway`'s `lane` (with inputs
    /// `seqs`), and the link opened: the gateway's end, the link's id and its output.
    async fn linked(
        &mut self,
        gateway: u32,
        lane: u32,
        seqs: &[u64],
    ) -> (Gateway<TcpStream>, LinkId, LinkOut) {
        let mut end = Gateway::connect(self.addr).await;
        end.hello(gateway, lane, seqs).await;
        let (link, out) = self.opened(gateway, lane).await;
        (end, link, out)
    }

    /// An HTTP/2 channel to the port, in the clear.
    async fn channel(&self) -> tonic::transport::Channel {
        meridian_tls::endpoint(&self.addr.to_string(), None, "shard-1")
            .expect("an endpoint")
            .connect()
            .await
            .expect("an HTTP/2 connection")
    }

    /// Expects the next command to be inputs of `link`; their seqs.
    async fn inputs(&mut self, link: LinkId) -> Vec<u64> {
        match self.command().await {
            Command::Inputs { link: from, inputs } if from == link => {
                inputs.iter().map(|input| input.seq).collect()
            }
            _ => panic!("expected inputs of link {}", link.0),
        }
    }

    /// Expects the next command to close `link`.
    async fn closed(&mut self, link: LinkId) {
        match self.command().await {
            Command::Closed { link: closed } => assert_eq!(closed, link),
            _ => panic!("expected link {} to close", link.0),
        }
    }

    fn refused(&self, reason: &str) -> u64 {
        self.metrics.relay_links_refused.get(reason)
    }
}

/// A test gateway's end of a link.
struct Gateway<S> {
    stream: S,
    buf: Vec<u8>,
}

/// What a gateway hears next on its link.
#[derive(Debug, PartialEq)]
enum Heard {
    Batch(ShardBatch),
    Heartbeat,
    /// The shard closed the link (or reset it).
    Closed,
}

impl Gateway<TcpStream> {
    async fn connect(addr: SocketAddr) -> Gateway<TcpStream> {
        let stream = TcpStream::connect(addr).await.expect("connects");
        Gateway { stream, buf: Vec::new() }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Gateway<S> {
    async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("writes");
        self.stream.flush().await.expect("flushes");
    }

    async fn send(&mut self, batch: &GatewayBatch) {
        let mut frame = Vec::new();
        link::put_frame(&mut frame, batch);
        self.write(&frame).await;
    }

    /// The magic and a hello for `gateway`'s `lane` carrying inputs `seqs`.
    async fn hello(&mut self, gateway: u32, lane: u32, seqs: &[u64]) {
        let mut bytes = MAGIC.to_vec();
        link::put_frame(&mut bytes, &batch(gateway, lane, seqs));
        self.write(&bytes).await;
    }

    async fn hear(&mut self) -> Heard {
        loop {
            if let Some((used, body)) = link::next_frame(&self.buf).expect("a frame within limits")
            {
                let heard = if body.is_empty() {
                    Heard::Heartbeat
                } else {
                    Heard::Batch(ShardBatch::decode(body).expect("a ShardBatch"))
                };
                self.buf.drain(..used);
                return heard;
            }
            self.buf.reserve(64 * 1024);
            let read = tokio::time::timeout(WITHIN, self.stream.read_buf(&mut self.buf));
            match read.await.expect("the shard says something in time") {
                Ok(0) | Err(_) => return Heard::Closed,
                Ok(_) => {}
            }
        }
    }

    /// Expects the far end to hang up, whatever it says first (not necessarily frames).
    async fn hung_up(&mut self) {
        let mut dropped = Vec::with_capacity(4096);
        loop {
            dropped.clear();
            let read = tokio::time::timeout(WITHIN, self.stream.read_buf(&mut dropped));
            match read.await.expect("a hang-up in time") {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// The next batch, past heartbeats.
    async fn batch(&mut self) -> Option<ShardBatch> {
        loop {
            match self.hear().await {
                Heard::Heartbeat => continue,
                Heard::Batch(batch) => return Some(batch),
                Heard::Closed => return None,
            }
        }
    }

    /// Expects the shard to refuse the link; its reason.
    async fn refusal(&mut self) -> String {
        let refusal = self.batch().await.expect("a refusal before the close");
        assert!(refusal.deliveries.is_empty());
        assert_eq!(self.hear().await, Heard::Closed, "the close after the refusal");
        refusal.refused
    }
}

fn batch(gateway: u32, lane: u32, seqs: &[u64]) -> GatewayBatch {
    let inputs =
        seqs.iter().map(|&seq| PlayerInput { session: 1, player_id: 2, seq, kind: None }).collect();
    GatewayBatch { gateway_id: gateway, lane, inputs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_go_in_and_output_comes_out_over_a_real_socket() {
    let mut port = Port::start(None).await;
    let (mut gateway, link, out) = port.linked(3, 2, &[1]).await;
    assert_eq!(port.inputs(link).await, vec![1], "the hello's inputs are the first");
    let mut heartbeat = Vec::new();
    link::put_heartbeat(&mut heartbeat);
    gateway.write(&heartbeat).await;
    gateway.send(&batch(0, 0, &[])).await;
    gateway.send(&batch(0, 0, &[2, 3])).await;
    assert_eq!(port.inputs(link).await, vec![2, 3], "heartbeats and empty batches carry none");

    let answers: Vec<ShardBatch> =
        (1..=3).map(|n| ShardBatch { refused: String::new(), deliveries: delivery(n) }).collect();
    for answer in &answers {
        // As the world task does: the bytes counted before the batch is queued.
        out.queued_bytes.fetch_add(frame_bytes(answer), Ordering::Relaxed);
        out.batches.send(Ok(answer.clone())).await.expect("the link takes output");
    }
    for answer in &answers {
        assert_eq!(gateway.batch().await.as_ref(), Some(answer), "in order");
    }
    assert!(frame_bytes(&answers[0]) > 0);
    assert_eq!(
        out.queued_bytes.load(Ordering::Relaxed),
        0,
        "what the writer took is no longer counted as waiting"
    );
    gateway.stream.shutdown().await.expect("hangs up");
    port.closed(link).await;
    assert_eq!(gateway.hear().await, Heard::Closed);
}

/// The world task ending a link with an error: the gateway is told why, after what was
/// queued before it, and the link closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_the_world_task_ends_with_an_error_is_refused_with_its_reason() {
    let mut port = Port::start(None).await;
    let (mut gateway, link, out) = port.linked(3, 0, &[]).await;
    let first = ShardBatch { deliveries: delivery(1), refused: String::new() };
    out.batches.send(Ok(first.clone())).await.expect("the link takes output");
    out.batches
        .send(Err(tonic::Status::unavailable("the shard's lease expired")))
        .await
        .expect("taken");
    assert_eq!(gateway.batch().await, Some(first), "what came before the error");
    assert_eq!(gateway.refusal().await, "the shard's lease expired");
    port.closed(link).await;
    assert_eq!(port.refused("shard"), 1);
}

fn delivery(session: u64) -> Vec<meridian_rpc::pb::Delivery> {
    let frames = bytes::Bytes::from(vec![session as u8; 10]);
    vec![meridian_rpc::pb::Delivery { session, frames, ..Default::default() }]
}

/// A round's output for one gateway bigger than the gRPC message limit (and than a batch's
/// byte budget per connection) goes through a real link whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_bigger_than_the_grpc_limit_reaches_the_gateway() {
    const SESSIONS: u64 = 64;
    const CHATS: u64 = 4200;
    let mut outbox = Outbox::default();
    let mut expected = Vec::new();
    for session in 1..=SESSIONS {
        expected.push(big_round(&mut outbox, session, CHATS));
    }
    let total: usize = expected.iter().map(Vec::len).sum();
    assert!(total > MAX_GRPC_MESSAGE_BYTES, "the round is over the limit: {total} bytes");
    assert!(expected[0].len() > MAX_BATCH_BYTES, "so is one connection's part of it");
    let batches = drained(&mut outbox);

    let mut port = Port::start(None).await;
    let (mut gateway, _, out) = port.linked(1, 0, &[]).await;
    tokio::spawn(async move {
        for batch in batches {
            let _ = out.batches.send(Ok(batch)).await;
        }
        // The world task keeps the link's sender while the link is open.
        std::future::pending::<()>().await;
    });

    let mut received: Vec<Vec<u8>> = vec![Vec::new(); SESSIONS as usize];
    let mut move_answers = vec![0u32; SESSIONS as usize];
    let mut positions = vec![None; SESSIONS as usize];
    let mut got = 0;
    while got < total {
        let batch = gateway.batch().await.expect("the link carries the whole round");
        assert!(batch.encoded_len() <= MAX_BATCH_BYTES, "a batch within the byte budget");
        assert!(batch.deliveries.len() <= MAX_DELIVERIES_PER_BATCH, "and the count");
        for delivery in batch.deliveries {
            let index = delivery.session as usize - 1;
            got += delivery.frames.len();
            received[index].extend_from_slice(&delivery.frames);
            move_answers[index] += delivery.move_answers;
            if delivery.position.is_some() {
                positions[index] = delivery.position;
            }
        }
    }
    for (index, frames) in received.iter().enumerate() {
        assert!(*frames == expected[index], "session {}: every frame, in order", index + 1);
        assert_eq!(move_answers[index], (CHATS / 16) as u32, "every move answer counted");
        let last = (CHATS / 16 * 16) as u32;
        assert_eq!(positions[index], Some(meridian_protocol::pb::Position { x: last, y: 0 }));
    }
}

/// A peer's gRPC stream and the health service work on the port the links use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_still_works_on_the_links_port() {
    let mut port = Port::start(None).await;
    let (_gateway, _link, _out) = port.linked(1, 0, &[]).await;

    let channel = port.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    let status = health.check(request).await.expect("the health service answers");
    assert_eq!(status.into_inner().status, 1, "SERVING");
    let batch = PeerBatch { from_shard: 2, epoch: 0, seq: 1, incarnation: 1, messages: Vec::new() };
    let mut acks = ShardClient::new(channel)
        .peer(tokio_stream::iter(vec![batch]))
        .await
        .expect("a peer stream")
        .into_inner();
    assert!(matches!(port.command().await, Command::Peer { .. }), "the batch reached the world");
    let ack = acks.message().await.expect("an ack").expect("the stream is open");
    assert_eq!(ack.applied_seq, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_openings_are_refused_and_the_shard_stays_up() {
    let mut port = Port::start(None).await;

    // Not the magic: that is for tonic, which hangs up on what is not HTTP/2.
    let mut stranger = Gateway::connect(port.addr).await;
    stranger.write(b"GET / HTTP/1.1\r\nHost: shard\r\n\r\n").await;
    stranger.hung_up().await;

    // A hello that is not a GatewayBatch.
    let mut garbage = Gateway::connect(port.addr).await;
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(&[0xff; 5]);
    garbage.write(&bytes).await;
    let refused = garbage.refusal().await;
    assert!(refused.contains("not a GatewayBatch"), "{refused}");
    assert_eq!(port.refused("undecodable"), 1);

    // A frame longer than any end writes, refused on its length alone.
    let mut too_long = Gateway::connect(port.addr).await;
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes());
    too_long.write(&bytes).await;
    let refused = too_long.refusal().await;
    assert!(refused.contains("relay frame of"), "{refused}");
    assert_eq!(port.refused("frame too long"), 1);

    // The magic, then nothing: no hello in time.
    let mut mute = Gateway::connect(port.addr).await;
    mute.write(MAGIC).await;
    assert!(mute.refusal().await.contains("no hello"));
    // The magic, then the end.
    let mut short = Gateway::connect(port.addr).await;
    short.write(MAGIC).await;
    short.stream.shutdown().await.expect("hangs up");
    assert!(short.refusal().await.contains("ended before its hello"));
    assert_eq!(port.refused("no hello"), 2);

    // Nothing at all: dropped once it had its time, and counted.
    let mut silent = Gateway::connect(port.addr).await;
    assert_eq!(silent.hear().await, Heard::Closed);
    assert_eq!(port.metrics.connections_silent.get(), 1);

    // A link whose hello was good, then a frame over the limit: refused, and closed for
    // the world task.
    let (mut gateway, link, _out) = port.linked(4, 0, &[]).await;
    gateway.write(&(MAX_FRAME_BYTES as u32 + 1).to_le_bytes()).await;
    port.closed(link).await;
    assert!(gateway.refusal().await.contains("relay frame of"));
    assert_eq!(port.refused("frame too long"), 2);

    // Through all that the shard stayed up.
    let (_gateway, link, _out) = port.linked(5, 1, &[7]).await;
    assert_eq!(port.inputs(link).await, vec![7]);
}

/// A gateway that says nothing, not even a heartbeat, for `SILENCE` is taken for dead: the
/// world task is told, the link closed and counted. The shard sends heartbeats meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_link_is_closed_and_the_world_task_told() {
    let mut port = Port::start(None).await;
    let (mut gateway, link, _out) = port.linked(3, 0, &[]).await;
    let started = std::time::Instant::now();
    assert_eq!(gateway.hear().await, Heard::Heartbeat, "the shard's heartbeat");
    port.closed(link).await;
    assert!(started.elapsed() >= SILENCE - Duration::from_millis(100), "not before the silence");
    while gateway.hear().await != Heard::Closed {}
    assert_eq!(port.metrics.relay_links_silent.get(), 1);
}

/// With mutual TLS a link is taken only from the gateway its client certificate names, and
/// gRPC clients share the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_link_is_taken_only_from_the_gateway_its_certificate_names() {
    let dir = std::env::temp_dir().join(format!("meridian-shard-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = meridian_tls::DevCa::open_or_create(&dir).expect("a CA");
    let shard = meridian_tls::NodeTls::load(ca.issue("shard-1").expect("issued")).expect("loads");
    let mut port = Port::start(Some(Arc::clone(&shard))).await;
    let gateway_7 =
        meridian_tls::NodeTls::load(ca.issue("gateway-7").expect("issued")).expect("ok");
    let addr = port.addr;
    let connect = |tls: Arc<meridian_tls::NodeTls>| async move {
        let tcp = TcpStream::connect(addr).await.expect("connects");
        let connector = tokio_rustls::TlsConnector::from(tls.relay_client_config());
        let name =
            tokio_rustls::rustls::pki_types::ServerName::try_from("shard-1").expect("a name");
        let stream = connector.connect(name, tcp).await.expect("a handshake");
        Gateway { stream, buf: Vec::new() }
    };

    let mut named = connect(Arc::clone(&gateway_7)).await;
    named.hello(7, 3, &[1]).await;
    let (link, out) = port.opened(7, 3).await;
    assert_eq!(port.inputs(link).await, vec![1]);
    let answer = ShardBatch { deliveries: delivery(1), refused: String::new() };
    out.batches.send(Ok(answer.clone())).await.expect("the link takes output");
    assert_eq!(named.batch().await, Some(answer), "output inside TLS");

    let mut impostor = connect(Arc::clone(&gateway_7)).await;
    impostor.hello(1, 0, &[]).await;
    let refused = impostor.refusal().await;
    assert!(refused.contains("does not name gateway-1"), "{refused}");
    assert_eq!(port.refused("certificate"), 1);
    let mut wrong_magic = connect(Arc::clone(&gateway_7)).await;
    wrong_magic.write(b"PRI * HTTP/2.0\r\n").await;
    assert!(wrong_magic.refusal().await.contains("relay magic"));
    assert_eq!(port.refused("wrong magic"), 1);

    // A peer's gRPC stream on the same TLS port (ALPN h2).
    let shard_2 = meridian_tls::NodeTls::load(ca.issue("shard-2").expect("issued")).expect("ok");
    let endpoint = meridian_tls::endpoint(&port.addr.to_string(), Some(&shard_2), "shard-1");
    let channel = endpoint.expect("an endpoint").connect().await.expect("an h2 connection");
    let batch = PeerBatch { from_shard: 2, epoch: 0, seq: 1, incarnation: 1, messages: Vec::new() };
    let mut acks = ShardClient::new(channel)
        .peer(tokio_stream::iter(vec![batch]))
        .await
        .expect("a peer stream")
        .into_inner();
    assert!(matches!(port.command().await, Command::Peer { .. }));
    assert_eq!(acks.message().await.expect("an ack").expect("open").applied_seq, 1);
    drop(named);
    port.closed(link).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peers and gateways that keep their streams and links open and never hang up do not hold
/// the shard's exit: once it stops, it ends every one itself and the server's graceful
/// shutdown completes (found by the etcd-stall test: a shard whose peers' etcd watch lagged
/// waited for them until `meridian up` killed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_links_and_streams_do_not_hold_a_stopping_shard() {
    let mut port = Port::start(None).await;
    let (mut gateway, link, _out) = port.linked(1, 0, &[]).await;
    let channel = port.channel().await;
    let (peer, peer_rx) = mpsc::channel(1);
    let batch = PeerBatch { from_shard: 2, epoch: 0, seq: 1, incarnation: 1, messages: Vec::new() };
    peer.send(batch).await.expect("a batch");
    let mut client = ShardClient::new(channel);
    let acks = client.peer(tokio_stream::wrappers::ReceiverStream::new(peer_rx));
    let mut acks = acks.await.expect("peer").into_inner();
    assert!(matches!(port.command().await, Command::Peer { .. }));
    assert!(acks.message().await.expect("an ack").is_some());

    let _ = port.stop.send(true);
    let _ = port.stop_server.take().expect("running").send(());
    port.closed(link).await;
    let stopped = tokio::time::timeout(WITHIN, &mut port.server).await;
    assert!(
        stopped.is_ok(),
        "the server stopped with a link and a stream still open at the far end"
    );
    // The shard ended both while their far ends still had them open.
    while gateway.hear().await != Heard::Closed {}
    assert!(!matches!(acks.message().await, Ok(Some(_))), "the peer stream ended");
    drop(peer);
}
