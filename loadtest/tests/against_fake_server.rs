//! Runs the real `loadtest` binary against a small in-process fake server and checks its
//! JSON against what the server knows it did: which moves it acknowledged, refused with an
//! error or left unanswered, which login it refused and which connection it cut.
//!
//! The fake server speaks the client protocol through `meridian-protocol` and nothing
//! else: `LoginOk` (plus one `Entered` of a fake neighbour), then for every `Move` either
//! its own `Moved` ack with the `client_time` echoed, a `RATE_LIMITED` error carrying it,
//! or silence, as the test's `Behaviour` says. It listens on TCP, or on QUIC (quinn, a
//! self-signed certificate, ALPN `meridian/1`) for `--transport quic`, or on WebSocket for
//! `--transport ws`, where it checks that every binary message is exactly one bare
//! `ClientMessage` body (no length prefix, no second message) and sends its answers the
//! same way. For
//! `--actions-per-second` it plays a tiny wolf game: two wolves in sight that move and
//! leave as the bot's actions come in, `ActionDone` for an action aimed at anyone,
//! `REJECTED` for one aimed at no one.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use meridian_protocol::pb::{client_message, ClientMessage, ErrorCode, LoginOk, ServerMessage};
use meridian_protocol::{encode_frame, server, FrameReader, DEFAULT_MAX_FRAME};
use prost::Message as _;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tokio_tungstenite::tungstenite::Message;

/// A player id no bot gets, used for the fake neighbour's notifications.
const NEIGHBOUR: u64 = 1_000_000;
/// The fake game's wolves (entity kind 1): one near the bot's cell (1,1), one far.
const NEAR_WOLF: u64 = 2_000_000;
const FAR_WOLF: u64 = 2_000_001;
const WOLF_KIND: u32 = 1;
/// No run here should take anywhere near this long; past it the test fails, not hangs.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// What the fake server does with each bot.
#[derive(Debug, Default, Clone)]
struct Behaviour {
    /// Leave every n-th move of a connection unanswered.
    drop_every: Option<u64>,
    /// Answer every n-th move (unless dropped) with `RATE_LIMITED`.
    error_every: Option<u64>,
    /// Answer this late.
    reply_delay: Duration,
    /// Refuse this bot's login with `UNAVAILABLE`.
    reject_login: Option<String>,
    /// Close this bot's connection on its n-th move, without answering it.
    cut: Option<(String, u64)>,
    /// Show two wolves at login and move them as actions come in (see `wolf_script`).
    wolves: bool,
    /// Leave every n-th action of a connection unanswered.
    drop_action_every: Option<u64>,
    /// Send a `ViewReset` just before answering every n-th move: the move crossed the
    /// reset on the wire (a shard failure's restore), and its ack comes after it.
    reset_every: Option<u64>,
    /// After answering a connection's n-th move, say `SHUTTING_DOWN` and close (a gateway
    /// stopping); moves read after that go unanswered. A `Resume` is answered `ViewReset`.
    goodbye_after: Option<u64>,
}

/// What the fake server did, to compare with what the load test reports.
#[derive(Debug, Default)]
struct Counts {
    logins: AtomicU64,
    moves_received: AtomicU64,
    moves_acked: AtomicU64,
    moves_errored: AtomicU64,
    moves_unanswered: AtomicU64,
    notifications_sent: AtomicU64,
    logouts: AtomicU64,
    spawns: Mutex<Vec<(u32, u32)>>,
    actions_received: AtomicU64,
    actions_done: AtomicU64,
    actions_rejected: AtomicU64,
    actions_unanswered: AtomicU64,
    view_resets: AtomicU64,
    goodbyes: AtomicU64,
    resumes: AtomicU64,
    /// Per player, the target of each action in the order received.
    action_targets: Mutex<std::collections::BTreeMap<u64, Vec<u64>>>,
    peers: Mutex<BTreeSet<std::net::IpAddr>>,
    /// WebSocket mode: binary messages received, and messages that were not exactly one
    /// bare `ClientMessage` body (a text message, a prefix, two messages in one).
    ws_messages: AtomicU64,
    ws_misframed: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

async fn start_fake_server(behaviour: Behaviour) -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind an ephemeral port");
    let addr = listener.local_addr().expect("listener address");
    let counts = Arc::new(Counts::default());
    let behaviour = Arc::new(behaviour);
    let server_counts = Arc::clone(&counts);
    tokio::spawn(async move {
        let mut next_player_id = 1;
        while let Ok((stream, peer)) = listener.accept().await {
            server_counts.peers.lock().unwrap().insert(peer.ip());
            let player_id = next_player_id;
            next_player_id += 1;
            let (read_half, write_half) = stream.into_split();
            tokio::spawn(serve_connection(
                Box::new(read_half),
                Box::new(write_half),
                player_id,
                Arc::clone(&behaviour),
                Arc::clone(&server_counts),
            ));
        }
    });
    (addr, counts)
}

/// The fake server on QUIC: returns its address, the counts, and its self-signed
/// certificate in PEM (for `--ca`).
async fn start_fake_quic_server(behaviour: Behaviour) -> (SocketAddr, Arc<Counts>, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![made.cert.der().clone()], key.into())
        .unwrap();
    tls.alpn_protocols = vec![b"meridian/1".to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let behaviour = Arc::new(behaviour);
    let server_counts = Arc::clone(&counts);
    tokio::spawn(async move {
        let mut next_player_id = 1;
        while let Some(incoming) = endpoint.accept().await {
            let player_id = next_player_id;
            next_player_id += 1;
            let (behaviour, counts) = (Arc::clone(&behaviour), Arc::clone(&server_counts));
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else { return };
                counts.peers.lock().unwrap().insert(connection.remote_address().ip());
                let Ok((send, recv)) = connection.accept_bi().await else { return };
                serve_connection(Box::new(recv), Box::new(send), player_id, behaviour, counts)
                    .await;
                // Let the bot read the end of the stream before the connection goes.
                let _ = tokio::time::timeout(Duration::from_secs(2), connection.closed()).await;
            });
        }
    });
    (addr, counts, made.cert.pem())
}

/// The fake server on WebSocket. Each connection is bridged to `serve_connection` through
/// an in-memory pipe: an inbound pump checks each binary message and writes it on as a
/// prefixed frame, an outbound pump sends each frame's body as one binary message.
async fn start_fake_ws_server(behaviour: Behaviour) -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind an ephemeral port");
    let addr = listener.local_addr().expect("listener address");
    let counts = Arc::new(Counts::default());
    let behaviour = Arc::new(behaviour);
    let server_counts = Arc::clone(&counts);
    tokio::spawn(async move {
        let mut next_player_id = 1;
        while let Ok((stream, peer)) = listener.accept().await {
            server_counts.peers.lock().unwrap().insert(peer.ip());
            let player_id = next_player_id;
            next_player_id += 1;
            let (behaviour, counts) = (Arc::clone(&behaviour), Arc::clone(&server_counts));
            tokio::spawn(async move {
                let Ok(socket) = tokio_tungstenite::accept_async(stream).await else { return };
                let (sink, messages) = socket.split();
                let (core_side, pump_side) = tokio::io::duplex(64 * 1024);
                let (core_read, core_write) = tokio::io::split(core_side);
                let (pump_read, pump_write) = tokio::io::split(pump_side);
                let inbound = tokio::spawn(ws_inbound(messages, pump_write, Arc::clone(&counts)));
                let outbound = tokio::spawn(ws_outbound(pump_read, sink));
                serve_connection(
                    Box::new(core_read),
                    Box::new(core_write),
                    player_id,
                    behaviour,
                    counts,
                )
                .await;
                let _ = outbound.await;
                inbound.abort();
            });
        }
    });
    (addr, counts)
}

type WsStream = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Client to server: each binary message must decode as one `ClientMessage` that encodes
/// back to exactly the same bytes; anything else is counted and ends the connection.
async fn ws_inbound(
    mut messages: futures_util::stream::SplitStream<WsStream>,
    mut pipe: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    counts: Arc<Counts>,
) {
    let mut frame = Vec::new();
    while let Some(Ok(message)) = messages.next().await {
        let body = match message {
            Message::Binary(body) => body,
            Message::Close(_) => break,
            Message::Ping(_) | Message::Pong(_) => continue,
            _ => {
                add(&counts.ws_misframed);
                break;
            }
        };
        add(&counts.ws_messages);
        let Ok(decoded) = ClientMessage::decode(&body[..]) else {
            add(&counts.ws_misframed);
            break;
        };
        if decoded.encode_to_vec() != body[..] {
            add(&counts.ws_misframed);
            break;
        }
        frame.clear();
        encode_frame(&decoded, &mut frame);
        if pipe.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = pipe.shutdown().await;
}

/// Server to client: one binary message per answer, its bare body; a close at the end.
async fn ws_outbound(
    mut pipe: tokio::io::ReadHalf<tokio::io::DuplexStream>,
    mut sink: futures_util::stream::SplitSink<WsStream, Message>,
) {
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    while let Ok(n @ 1..) = pipe.read(&mut buf).await {
        frames.extend(&buf[..n]);
        while let Some(message) =
            frames.next_message::<ServerMessage>().expect("the fake server writes valid frames")
        {
            if sink.send(Message::binary(message.encode_to_vec())).await.is_err() {
                return;
            }
        }
    }
    let _ = sink.close().await;
}

/// Writes queued answers, each no earlier than its due time (the queue is in due order).
async fn write_answers(
    mut write_half: WriteHalf,
    mut queue: mpsc::UnboundedReceiver<(Instant, ServerMessage)>,
) {
    let mut encoded = Vec::new();
    while let Some((due, message)) = queue.recv().await {
        sleep_until(due).await;
        encoded.clear();
        encode_frame(&message, &mut encoded);
        if write_half.write_all(&encoded).await.is_err() {
            return;
        }
    }
    let _ = write_half.shutdown().await;
}

async fn serve_connection(
    mut read_half: ReadHalf,
    write_half: WriteHalf,
    mut player_id: u64,
    behaviour: Arc<Behaviour>,
    counts: Arc<Counts>,
) {
    let (answers, queue) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_answers(write_half, queue));
    // Only move answers are held back; the login is answered at once.
    let reply_now = |message: ServerMessage| {
        let _ = answers.send((Instant::now(), message));
    };
    let reply = |message: ServerMessage| {
        let _ = answers.send((Instant::now() + behaviour.reply_delay, message));
    };
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    let mut name = String::new();
    let mut moves = 0u64;
    let mut actions = 0u64;
    'connection: loop {
        let n = match read_half.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        frames.extend(&buf[..n]);
        while let Some(message) =
            frames.next_message::<ClientMessage>().expect("bots send valid frames")
        {
            match message.kind.expect("bots always set a kind") {
                client_message::Kind::Login(login) => {
                    name = login.name;
                    if behaviour.reject_login.as_deref() == Some(name.as_str()) {
                        reply_now(server::error(ErrorCode::Unavailable, "no shard for you", 0));
                        continue;
                    }
                    add(&counts.logins);
                    if let Some(spawn) = login.spawn {
                        counts.spawns.lock().unwrap().push((spawn.x, spawn.y));
                    }
                    let ok = LoginOk {
                        player_id,
                        position: server::position(1, 1),
                        resume_token: player_id.to_le_bytes().to_vec(),
                        ..Default::default()
                    };
                    reply_now(ServerMessage {
                        kind: Some(meridian_protocol::pb::server_message::Kind::LoginOk(ok)),
                    });
                    reply_now(server::entered(NEIGHBOUR, 2, 2, "neighbour"));
                    add(&counts.notifications_sent);
                    if behaviour.wolves {
                        reply_now(server::entered_as(NEAR_WOLF, 3, 3, "", WOLF_KIND, b""));
                        reply_now(server::entered_as(FAR_WOLF, 30, 30, "", WOLF_KIND, b""));
                        add(&counts.notifications_sent);
                        add(&counts.notifications_sent);
                    }
                }
                client_message::Kind::Action(action) => {
                    add(&counts.actions_received);
                    actions += 1;
                    counts
                        .action_targets
                        .lock()
                        .unwrap()
                        .entry(player_id)
                        .or_default()
                        .push(action.target);
                    if behaviour.drop_action_every.is_some_and(|n| actions.is_multiple_of(n)) {
                        add(&counts.actions_unanswered);
                    } else if action.target == 0 {
                        add(&counts.actions_rejected);
                        let detail = "no target";
                        reply(server::error(ErrorCode::Rejected, detail, action.client_time));
                    } else {
                        add(&counts.actions_done);
                        reply(server::action_done(action.client_time, b"{\"hp\":6}"));
                    }
                    if behaviour.wolves {
                        if let Some(news) = wolf_script(actions) {
                            reply(news);
                            add(&counts.notifications_sent);
                        }
                    }
                }
                client_message::Kind::Move(mv) => {
                    add(&counts.moves_received);
                    moves += 1;
                    let is_nth =
                        |every: Option<u64>| every.is_some_and(|n| moves.checked_rem(n) == Some(0));
                    if behaviour
                        .cut
                        .as_ref()
                        .is_some_and(|(cut_name, at)| *cut_name == name && *at == moves)
                    {
                        add(&counts.moves_unanswered);
                        break 'connection;
                    } else if is_nth(behaviour.drop_every) {
                        add(&counts.moves_unanswered);
                    } else if is_nth(behaviour.error_every) {
                        add(&counts.moves_errored);
                        reply(server::error(ErrorCode::RateLimited, "slow down", mv.client_time));
                    } else {
                        if is_nth(behaviour.reset_every) {
                            add(&counts.view_resets);
                            reply(server::view_reset(player_id, 1, 1));
                        }
                        add(&counts.moves_acked);
                        reply(server::moved(player_id, 1, 1, mv.client_time));
                        reply(server::moved(NEIGHBOUR, 2, 2, 0));
                        add(&counts.notifications_sent);
                        if behaviour.goodbye_after == Some(moves) {
                            add(&counts.goodbyes);
                            reply(server::error(ErrorCode::ShuttingDown, "bye", 0));
                            break 'connection;
                        }
                    }
                }
                client_message::Kind::Resume(resume) => {
                    // The token is the player id its LoginOk gave (see below).
                    add(&counts.resumes);
                    let token: [u8; 8] = resume.token.try_into().expect("a token we gave");
                    player_id = u64::from_le_bytes(token);
                    reply_now(server::view_reset(player_id, 1, 1));
                }
                client_message::Kind::Logout(_) => {
                    add(&counts.logouts);
                    reply(server::left(NEIGHBOUR));
                    break 'connection;
                }
                other => panic!("the load test sent an unexpected {other:?}"),
            }
        }
    }
    // Answers already queued still go out; then the write half closes with a FIN.
    drop(answers);
    let _ = writer.await;
    if behaviour.goodbye_after.is_some() {
        // After the goodbye: whatever moves still come are read and never answered.
        loop {
            match read_half.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => frames.extend(&buf[..n]),
            }
            while let Ok(Some(message)) = frames.next_message::<ClientMessage>() {
                if matches!(message.kind, Some(client_message::Kind::Move(_))) {
                    add(&counts.moves_unanswered);
                }
            }
        }
    }
}

/// What the wolves do after a connection's n-th action: the far wolf comes next to the bot
/// (1,1) after the 3rd, leaves after the 6th, the near one leaves after the 9th. A bot that
/// aims at the nearest wolf thus aims near x3, far x3, near x3, then at no one.
fn wolf_script(actions: u64) -> Option<ServerMessage> {
    match actions {
        3 => Some(server::moved(FAR_WOLF, 2, 1, 0)),
        6 => Some(server::left(FAR_WOLF)),
        9 => Some(server::left(NEAR_WOLF)),
        _ => None,
    }
}

fn json_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("loadtest-{test}-{}.json", std::process::id()))
}

async fn run_loadtest(args: &[&str]) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(RUN_DEADLINE, run)
        .await
        .unwrap_or_else(|_| panic!("loadtest {args:?} did not finish within {RUN_DEADLINE:?}"))
        .expect("loadtest binary runs")
}

/// Runs the binary, checks it succeeded, that `--json` holds the summary and that stdout
/// then holds only its gist, naming the file (issue 32: it printed the whole summary).
async fn run_ok(test: &str, args: &[&str]) -> Value {
    let path = json_path(test);
    let mut all_args = args.to_vec();
    let path_arg = path.to_str().expect("temp path is UTF-8").to_owned();
    all_args.extend(["--json", &path_arg]);
    let output = run_loadtest(&all_args).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "loadtest {all_args:?} failed: {stderr}");
    let from_file: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("--json file written"))
            .expect("--json file is JSON");
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.lines().count() <= 3, "the gist, not the summary, on stdout: {stdout}");
    assert!(stdout.contains(&path_arg), "stdout names the --json file: {stdout}");
    let sent = format!("{} sent", n(&from_file, "moves_sent"));
    assert!(stdout.contains(&sent), "the gist says {sent:?}: {stdout}");
    assert!(stderr.contains("bots"), "expected progress lines on stderr, got: {stderr}");
    from_file
}

/// Without `--json` the summary itself is stdout (for a pipe into `jq`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_json_the_summary_is_stdout() {
    let (addr, _counts) = start_fake_server(Behaviour::default()).await;
    let addr = addr.to_string();
    let args = ["--addr", &addr, "--bots", "2", "--duration", "1s", "--move-interval", "100ms"];
    let output = run_loadtest(&args).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).expect("stdout is the JSON");
    assert_eq!(n(&summary, "bots_target"), 2);
}

fn n(summary: &Value, field: &str) -> u64 {
    summary[field].as_u64().unwrap_or_else(|| panic!("{field} missing or not a count: {summary}"))
}

fn per_second_sum(summary: &Value, field: &str) -> u64 {
    summary["per_second"]
        .as_array()
        .expect("per_second is a list")
        .iter()
        .map(|second| second[field].as_u64().expect("per-second counts"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_move_is_acked_errored_or_lost_and_the_json_says_which() {
    let behaviour = Behaviour {
        drop_every: Some(5),
        error_every: Some(7),
        reply_delay: Duration::ZERO,
        reject_login: Some("bot-3".to_owned()),
        cut: Some(("bot-4".to_owned(), 3)),
        ..Behaviour::default()
    };
    let (addr, counts) = start_fake_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "accounting",
        &[
            "--addr",
            &addr,
            "--bots",
            "8",
            "--duration",
            "2s",
            "--move-interval",
            "50ms",
            "--drain",
            "1s",
            "--seed",
            "42",
        ],
    )
    .await;

    assert_eq!(n(&summary, "bots_target"), 8);
    assert_eq!(n(&summary, "bots_connected"), 7, "bot-3's login was refused");
    assert_eq!(n(&summary, "login_failures"), 1);
    assert_eq!(n(&summary, "disconnects"), 1, "bot-4's connection was cut");
    assert_eq!(n(&summary, "seed"), 42);
    assert_eq!(n(&summary, "connect_failures"), 0);
    assert_eq!(n(&summary, "acks_unmatched"), 0);

    let (sent, acked, errored, lost) = (
        n(&summary, "moves_sent"),
        n(&summary, "moves_acked"),
        n(&summary, "moves_errored"),
        n(&summary, "moves_lost"),
    );
    assert_eq!(sent, acked + errored + lost, "every move has exactly one fate: {summary}");
    assert_eq!(acked, get(&counts.moves_acked), "acks the server sent");
    assert_eq!(errored, get(&counts.moves_errored), "errors the server sent");
    // A move the cut bot wrote after the server stopped reading is lost too.
    let never_read = sent - get(&counts.moves_received);
    assert!(never_read <= 1, "{never_read} moves never reached the server");
    assert_eq!(lost, get(&counts.moves_unanswered) + never_read, "unanswered moves are lost");
    assert!(lost >= 6 && errored >= 6, "the run was too short to test anything: {summary}");
    // About 2 s / 50 ms = 40 moves per bot, fewer for the one that was cut.
    assert!(sent >= 6 * 30, "expected about 40 moves per bot: {summary}");

    assert_eq!(summary["errors_by_code"]["RATE_LIMITED"].as_u64(), Some(errored));
    assert_eq!(summary["errors_by_code"]["UNAVAILABLE"].as_u64(), Some(1));
    assert_eq!(get(&counts.logouts), 6, "every bot still connected logs out");
    assert_eq!(get(&counts.actions_received), 0, "no actions unless asked for");
    assert!(summary.get("actions").is_none(), "no actions in the summary: {summary}");

    let notifications = n(&summary, "notifications");
    assert!(notifications >= 7, "at least each bot's Entered: {summary}");
    assert!(notifications <= get(&counts.notifications_sent));
    let delay = &summary["delay_ms"];
    for field in ["p50", "p90", "p99", "p999", "max", "mean"] {
        assert!(delay[field].as_f64().is_some_and(|ms| ms >= 0.0), "delay_ms.{field}: {delay}");
    }
    assert!(delay["p50"].as_f64() <= delay["p99"].as_f64());
    assert!(delay["p99"].as_f64() <= delay["max"].as_f64());

    assert_eq!(per_second_sum(&summary, "acked"), acked, "per_second covers every ack");
    assert_eq!(per_second_sum(&summary, "sent"), sent, "per_second covers every move");
    // Every error answer, the refused login's UNAVAILABLE too.
    assert_eq!(per_second_sum(&summary, "errors"), errored + 1, "per_second covers every error");
    assert!(summary["per_second"].as_array().unwrap().len() >= 2);
    assert_eq!(summary["duration_s"].as_f64(), Some(2.0));
    assert_eq!(summary["move_interval_ms"].as_f64(), Some(50.0));
}

/// `--disperse-after`: the share of the crowd that leaves stops moving then, has its moves
/// answered and logs out; the rest play on to the end. Nothing is lost or disconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispersing_crowd_leaves_with_its_moves_answered_and_the_rest_play_on() {
    let reply_delay = Duration::from_millis(20);
    let (addr, counts) = start_fake_server(Behaviour { reply_delay, ..Behaviour::default() }).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "disperse",
        &[
            "--addr",
            &addr,
            "--bots",
            "8",
            "--connect-interval",
            "0ms",
            "--duration",
            "3s",
            "--move-interval",
            "100ms",
            "--spawn-area",
            "10,10,29,29",
            "--battle",
            "--disperse-after",
            "1s",
            "--disperse-share",
            "0.5",
        ],
    )
    .await;

    let (sent, acked) = (n(&summary, "moves_sent"), n(&summary, "moves_acked"));
    assert_eq!(n(&summary, "moves_lost"), 0, "the leavers' moves were answered: {summary}");
    assert_eq!(n(&summary, "disconnects"), 0, "{summary}");
    assert_eq!(sent, acked, "{summary}");
    // Four bots move for 1 s and four for 3 s, 10 moves a second: about 160, not 240.
    assert!((130..=190).contains(&sent), "expected about 160 moves: {summary}");
    assert_eq!(get(&counts.logouts), 8, "the leavers logged out, the others at the end");
    let seconds = summary["per_second"].as_array().expect("per_second");
    let late = seconds.iter().filter(|s| s["t"].as_f64().is_some_and(|t| (1.6..2.9).contains(&t)));
    for second in late {
        assert_eq!(second["bots"].as_u64(), Some(4), "half the crowd left: {summary}");
    }
}

/// A move in flight when a `ViewReset` arrives and acked after it (it crossed the reset on
/// the wire, as after a shard failure: docs/protocol.md, "ViewReset") was answered, not
/// lost: it counts as acked, and in `moves_answered_after_reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_acked_after_a_view_reset_is_acked_not_lost() {
    let behaviour = Behaviour { reset_every: Some(6), ..Behaviour::default() };
    let (addr, counts) = start_fake_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "across-reset",
        &["--addr", &addr, "--bots", "3", "--duration", "1s", "--move-interval", "50ms"],
    )
    .await;
    let resets = get(&counts.view_resets);
    assert!(resets >= 6, "the run was too short to test anything: {summary}");
    assert_eq!(n(&summary, "view_resets"), resets);
    assert_eq!(n(&summary, "moves_answered_after_reset"), resets, "{summary}");
    assert_eq!(n(&summary, "moves_lost"), 0, "{summary}");
    assert_eq!(n(&summary, "acks_unmatched"), 0, "{summary}");
    assert_eq!(n(&summary, "moves_acked"), get(&counts.moves_acked));
    assert_eq!(n(&summary, "moves_sent"), n(&summary, "moves_acked"));
}

/// With `--resume-addr`, a bot whose gateway says `SHUTTING_DOWN` and closes resumes on
/// the next gateway with its token and plays on there: counted in `resumes`, not in
/// `disconnects`, and every move it sent has its answer (but any it sent after the goodbye
/// was on its way, which the gateway never read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_told_shutting_down_resumes_on_the_next_gateway() {
    let stopping = Behaviour { goodbye_after: Some(5), ..Behaviour::default() };
    let (first, first_counts) = start_fake_server(stopping).await;
    let (second, second_counts) = start_fake_server(Behaviour::default()).await;
    let (first, second) = (first.to_string(), second.to_string());
    let summary = run_ok(
        "resume",
        &[
            "--addr",
            &first,
            "--resume-addr",
            &second,
            "--bots",
            "3",
            "--duration",
            "1s",
            "--move-interval",
            "50ms",
        ],
    )
    .await;
    assert_eq!(get(&first_counts.goodbyes), 3, "{summary}");
    assert_eq!(get(&second_counts.resumes), 3, "{summary}");
    assert_eq!(n(&summary, "resumes"), 3, "{summary}");
    assert_eq!(n(&summary, "resume_failures"), 0, "{summary}");
    assert_eq!(n(&summary, "disconnects"), 0, "{summary}");
    assert_eq!(n(&summary, "view_resets"), 3, "{summary}");
    let acked = get(&first_counts.moves_acked) + get(&second_counts.moves_acked);
    assert_eq!(n(&summary, "moves_acked"), acked, "{summary}");
    assert!(get(&second_counts.moves_acked) > 0, "they played on there: {summary}");
    let unread = get(&first_counts.moves_unanswered);
    assert_eq!(n(&summary, "moves_lost"), unread, "only moves sent after the goodbye: {summary}");
    assert_eq!(n(&summary, "moves_sent"), acked + unread, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_does_not_slow_the_send_schedule() {
    let reply_delay = Duration::from_millis(300);
    let (addr, counts) = start_fake_server(Behaviour { reply_delay, ..Behaviour::default() }).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "open-loop",
        &[
            "--addr",
            &addr,
            "--bots",
            "4",
            "--duration",
            "2s",
            "--move-interval",
            "100ms",
            "--drain",
            "2s",
            "--spawn-area",
            "10,20,30,40",
            "--source-ips",
            "2",
            "--name-prefix",
            "slow",
        ],
    )
    .await;

    // Closed loop would manage 2 s / 300 ms = 7 moves per bot; the schedule asks for 20.
    let sent = n(&summary, "moves_sent");
    assert!(sent >= 4 * 15, "the send schedule waited for acks: {sent} moves sent");
    assert_eq!(n(&summary, "moves_acked"), sent, "all answered within the drain: {summary}");
    assert_eq!(n(&summary, "moves_lost"), 0);
    let p50 = summary["delay_ms"]["p50"].as_f64().expect("delays measured");
    assert!(p50 >= 300.0, "every answer was held 300 ms, yet p50 is {p50} ms");

    let spawns = counts.spawns.lock().unwrap().clone();
    assert_eq!(spawns.len(), 4, "each bot asked for a spawn cell");
    for (x, y) in spawns {
        assert!((10..=30).contains(&x) && (20..=40).contains(&y), "spawn ({x},{y}) outside");
    }
    let peers = counts.peers.lock().unwrap().clone();
    let expected: BTreeSet<std::net::IpAddr> =
        ["127.0.0.1", "127.0.0.2"].iter().map(|ip| ip.parse().unwrap()).collect();
    assert_eq!(peers, expected, "bots are spread over both source addresses");
}

#[tokio::test]
async fn an_unreachable_address_fails_with_a_clear_message() {
    // Bind and release a port, so nothing listens on it.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let output = run_loadtest(&["--addr", &addr, "--bots", "3", "--duration", "1s"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "an unreachable address fails the run: {stderr}");
    assert!(stderr.contains("cannot connect") && stderr.contains(&addr), "stderr: {stderr}");
    assert!(output.stdout.is_empty(), "no summary for a run that never started");
}

#[tokio::test]
async fn a_bad_command_line_lists_every_problem() {
    let output =
        run_loadtest(&["--addr", "nowhere", "--bots", "0", "--move-interval", "0ms"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "a usage error exits 2: {stderr}");
    for problem in ["--addr", "--bots", "--move-interval"] {
        assert!(stderr.contains(problem), "{problem} not reported: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_against_a_quick_server_passes_every_step_and_writes_a_report() {
    let (addr, counts) = start_fake_server(Behaviour::default()).await;
    let addr = addr.to_string();
    let html = std::env::temp_dir().join(format!("loadtest-ramp-{}.html", std::process::id()));
    let html_arg = html.to_str().expect("temp path is UTF-8").to_owned();
    let summary = run_ok(
        "ramp-pass",
        &[
            "--addr",
            &addr,
            "--bots",
            "9",
            "--ramp",
            "--ramp-step",
            "3",
            "--ramp-step-duration",
            "1s",
            "--max-p99",
            "200ms",
            "--move-interval",
            "100ms",
            "--duration",
            "30s",
            "--drain",
            "1s",
            "--html",
            &html_arg,
            "--label",
            "quick",
            // With no wolves every action is REJECTED: an answer, not a failed step.
            "--actions-per-second",
            "2",
        ],
    )
    .await;
    let ramp = &summary["ramp"];
    let targets: Vec<u64> = ramp["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bots_target"].as_u64().unwrap())
        .collect();
    assert_eq!(targets, [3, 6, 9], "three steps of three bots: {ramp}");
    assert_eq!(ramp["largest_passing"].as_u64(), Some(9), "{ramp}");
    assert!(ramp["stopped_because"].as_str().unwrap().contains("reached"), "{ramp}");
    assert_eq!(get(&counts.logins), 9);
    let elapsed = summary["elapsed_s"].as_f64().unwrap();
    assert!(elapsed < 15.0, "the ramp ends sending when it is over, not at --duration: {elapsed}");
    assert_eq!(n(&summary, "moves_lost"), 0);
    assert_eq!(n(&summary, "moves_acked"), n(&summary, "moves_sent"));
    assert_eq!(summary["label"].as_str(), Some("quick"));
    assert!(summary["delay_cdf"].as_array().is_some_and(|cdf| !cdf.is_empty()));
    assert!(summary["delay_box_ms"]["p50"].as_f64().is_some());
    assert!(summary["per_second"][0].get("p50_ms").is_some());
    let actions = &summary["actions"];
    assert!(n(actions, "rejected") > 0, "bots acted at no one and were refused: {actions}");
    assert_eq!(n(actions, "rejected"), get(&counts.actions_rejected), "{actions}");

    let page = std::fs::read_to_string(&html).expect("--html written");
    let _ = std::fs::remove_file(&html);
    assert!(page.contains("<svg") && page.contains("quick"), "the report has plots of the run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_stops_at_the_first_step_over_max_p99() {
    let reply_delay = Duration::from_millis(120);
    let (addr, _) = start_fake_server(Behaviour { reply_delay, ..Behaviour::default() }).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "ramp-fail",
        &[
            "--addr",
            &addr,
            "--bots",
            "20",
            "--ramp",
            "--ramp-step",
            "2",
            "--ramp-step-duration",
            "1s",
            "--max-p99",
            "50ms",
            "--move-interval",
            "100ms",
            "--duration",
            "30s",
            "--drain",
            "1s",
        ],
    )
    .await;
    let ramp = &summary["ramp"];
    let steps = ramp["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "the first step is already too slow: {ramp}");
    assert_eq!(steps[0]["passed"].as_bool(), Some(false));
    assert!(steps[0]["p99_ms"].as_f64().unwrap() >= 120.0, "{ramp}");
    assert!(ramp["largest_passing"].is_null(), "nothing passed: {ramp}");
    assert_eq!(n(&summary, "bots_connected"), 2, "no bots beyond the failed step");
    // Open loop holds in ramp mode too: ~10 moves/s per bot, answered 120 ms late.
    assert!(n(&summary, "moves_sent") >= 2 * 9, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_bots_are_counted_like_tcp_bots() {
    let behaviour = Behaviour { error_every: Some(4), ..Default::default() };
    let (addr, counts, pem) = start_fake_quic_server(behaviour).await;
    let ca = std::env::temp_dir().join(format!("loadtest-quic-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, pem).unwrap();
    let (addr, ca_arg) = (addr.to_string(), ca.to_str().unwrap().to_owned());
    let args = ["--addr", &addr, "--transport", "quic", "--bots", "4", "--duration", "1s"];
    let timing = ["--move-interval", "50ms", "--drain", "1s"];
    let verified =
        run_ok("quic-ca", &[&args[..], &timing[..], &["--ca", &ca_arg][..]].concat()).await;
    let insecure =
        run_ok("quic-insecure", &[&args[..], &timing[..], &["--insecure"]].concat()).await;
    let _ = std::fs::remove_file(&ca);
    for summary in [&verified, &insecure] {
        assert_eq!(n(summary, "bots_connected"), 4, "{summary}");
        assert_eq!(n(summary, "disconnects"), 0, "{summary}");
        assert_eq!(n(summary, "moves_lost"), 0, "{summary}");
        let (sent, acked, errored) =
            (n(summary, "moves_sent"), n(summary, "moves_acked"), n(summary, "moves_errored"));
        assert_eq!(sent, acked + errored, "every move answered: {summary}");
        assert!(sent >= 4 * 15, "expected about 20 moves per bot: {summary}");
        assert!(errored > 0, "every 4th move is refused: {summary}");
    }
    let answered = n(&verified, "moves_acked") + n(&insecure, "moves_acked");
    assert_eq!(answered, get(&counts.moves_acked), "acks the server sent");
    assert_eq!(get(&counts.logouts), 8, "every bot of both runs logs out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_bots_send_one_bare_message_per_binary_frame_and_are_counted_like_tcp() {
    let behaviour = Behaviour {
        drop_every: Some(5),
        error_every: Some(4),
        reject_login: Some("bot-2".to_owned()),
        cut: Some(("bot-3".to_owned(), 3)),
        ..Behaviour::default()
    };
    let (addr, counts) = start_fake_ws_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "ws",
        &[
            "--addr",
            &addr,
            "--transport",
            "ws",
            "--bots",
            "6",
            "--duration",
            "1500ms",
            "--move-interval",
            "50ms",
            "--drain",
            "1s",
        ],
    )
    .await;
    assert_eq!(get(&counts.ws_misframed), 0, "a message that was not one bare body");
    assert_eq!(n(&summary, "bots_connected"), 5, "bot-2's login was refused: {summary}");
    assert_eq!(n(&summary, "login_failures"), 1);
    assert_eq!(n(&summary, "disconnects"), 1, "bot-3's connection was cut: {summary}");
    assert_eq!(n(&summary, "acks_unmatched"), 0);
    let (sent, acked, errored, lost) = (
        n(&summary, "moves_sent"),
        n(&summary, "moves_acked"),
        n(&summary, "moves_errored"),
        n(&summary, "moves_lost"),
    );
    assert_eq!(sent, acked + errored + lost, "every move has exactly one fate: {summary}");
    assert_eq!(acked, get(&counts.moves_acked), "acks the server sent");
    assert_eq!(errored, get(&counts.moves_errored), "errors the server sent");
    let never_read = sent - get(&counts.moves_received);
    assert!(never_read <= 1, "{never_read} moves never reached the server");
    assert_eq!(lost, get(&counts.moves_unanswered) + never_read, "unanswered moves are lost");
    assert!(sent >= 4 * 20 && errored >= 4 && lost >= 4, "too short to test anything: {summary}");
    assert_eq!(summary["errors_by_code"]["UNAVAILABLE"].as_u64(), Some(1));
    assert_eq!(get(&counts.logouts), 4, "every bot still connected logs out");
    assert!(n(&summary, "notifications") >= 5, "at least each bot's Entered: {summary}");
    // One binary message per client message: six logins, the moves read, the logouts, and
    // perhaps one move of the cut bot that came in after its connection stopped reading.
    let client_messages = 6 + get(&counts.moves_received) + get(&counts.logouts);
    let ws_messages = get(&counts.ws_messages);
    assert!(
        (client_messages..=client_messages + 1).contains(&ws_messages),
        "{ws_messages} binary messages for {client_messages} protocol messages"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_refuses_a_server_it_does_not_trust() {
    let (addr, counts, _pem) = start_fake_quic_server(Behaviour::default()).await;
    // Another certificate than the server's: the handshake must fail.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let ca = std::env::temp_dir().join(format!("loadtest-other-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, other.cert.pem()).unwrap();
    let addr = addr.to_string();
    let output = run_loadtest(&[
        "--addr",
        &addr,
        "--transport",
        "quic",
        "--ca",
        ca.to_str().unwrap(),
        "--bots",
        "1",
        "--duration",
        "1s",
    ])
    .await;
    let _ = std::fs::remove_file(&ca);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "an untrusted certificate was accepted: {stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert_eq!(get(&counts.logins), 0, "nobody logged in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_aim_at_the_nearest_wolf_and_each_fate_is_counted_apart_from_moves() {
    let behaviour = Behaviour {
        wolves: true,
        drop_action_every: Some(7),
        error_every: Some(5),
        ..Behaviour::default()
    };
    let (addr, counts) = start_fake_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "actions",
        &[
            "--addr",
            &addr,
            "--bots",
            "3",
            "--duration",
            "2500ms",
            "--move-interval",
            "50ms",
            "--actions-per-second",
            "10",
            "--drain",
            "1s",
            "--seed",
            "7",
        ],
    )
    .await;
    let actions = &summary["actions"];
    assert_eq!(actions["per_second_per_bot"].as_f64(), Some(10.0), "{actions}");
    let (sent, answered, rejected, errored, lost) = (
        n(actions, "sent"),
        n(actions, "answered"),
        n(actions, "rejected"),
        n(actions, "errored"),
        n(actions, "lost"),
    );
    assert_eq!(sent, get(&counts.actions_received), "every action reached the server");
    assert_eq!(answered, get(&counts.actions_done), "ActionDone the server sent");
    assert_eq!(rejected, get(&counts.actions_rejected), "REJECTED the server sent");
    assert_eq!(lost, get(&counts.actions_unanswered), "unanswered actions are lost");
    assert_eq!(errored, 0);
    assert_eq!(sent, answered + rejected + lost, "every action has one fate: {actions}");
    assert_eq!(n(actions, "unmatched"), 0);
    // About 2.5 s x 10/s = 25 actions per bot: 9 aimed at wolves, the rest at no one.
    assert!(sent >= 3 * 20, "expected about 25 actions per bot: {actions}");
    assert!(lost >= 3 && rejected >= 3 * 8, "the run was too short to test anything");
    for field in ["p50", "p99", "max"] {
        assert!(actions["delay_ms"][field].as_f64().is_some(), "delay_ms.{field}: {actions}");
    }

    // Moves are counted as before, apart from the actions.
    let (moves, acked, moves_errored) =
        (n(&summary, "moves_sent"), n(&summary, "moves_acked"), n(&summary, "moves_errored"));
    assert_eq!(moves, get(&counts.moves_received));
    assert_eq!(moves, acked + moves_errored + n(&summary, "moves_lost"), "{summary}");
    assert_eq!(acked, get(&counts.moves_acked));
    assert_eq!(moves_errored, get(&counts.moves_errored), "RATE_LIMITED went to the moves");
    // A REJECTED answer is the game's answer to an action, not an error.
    assert_eq!(summary["errors_by_code"].get("REJECTED"), None, "{summary}");
    assert_eq!(n(&summary, "acks_unmatched"), 0);

    let targets = counts.action_targets.lock().unwrap().clone();
    assert_eq!(targets.len(), 3, "every bot acted: {targets:?}");
    let script = [NEAR_WOLF, NEAR_WOLF, NEAR_WOLF, FAR_WOLF, FAR_WOLF, FAR_WOLF];
    for (player, aimed) in &targets {
        assert_eq!(aimed[..6], script, "player {player} aimed: {aimed:?}");
        assert_eq!(aimed[6..9], [NEAR_WOLF; 3], "player {player} aimed: {aimed:?}");
        assert!(aimed[9..].iter().all(|&t| t == 0), "no wolf left: {aimed:?}");
    }
}
