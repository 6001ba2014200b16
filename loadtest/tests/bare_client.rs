//! Runs the real `bare-client` binary against a small in-process fake server and checks
//! its JSON against what the server knows it did.
//!
//! The server speaks the protocol through `meridian-protocol` (the server's own codec),
//! so this also checks the client's hand-written frames against it end to end. It answers
//! `Login` with `LoginOk` and one `Entered`; every `Move` with the mover's own ack and a
//! neighbour's `Moved`, or (as `Behaviour` says) with `RATE_LIMITED` carrying the move's
//! `client_time`, or not at all; it can refuse one bot's login and cut one bot's
//! connection; and it closes the connection after `Logout`.

use std::net::SocketAddr;
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meridian_protocol::pb::{client_message, server_message, ClientMessage, ErrorCode, LoginOk};
use meridian_protocol::pb::{Position, ServerMessage};
use meridian_protocol::{encode_frame, server, FrameReader, DEFAULT_MAX_FRAME};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A player id no bot gets, for the neighbour's notifications.
const NEIGHBOUR: u64 = 1_000_000;
/// No run here should take anywhere near this long; past it the test fails, not hangs.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone)]
struct Behaviour {
    /// Leave every n-th move of a connection unanswered.
    drop_every: Option<u64>,
    /// Answer every n-th move (unless dropped) with `RATE_LIMITED`.
    error_every: Option<u64>,
    /// Refuse the login of the bot with this name.
    reject_login: Option<String>,
    /// Close this bot's connection when its n-th move arrives, without answering it.
    cut: Option<(String, u64)>,
}

#[derive(Debug, Default)]
struct Counts {
    logins: AtomicU64,
    moves_received: AtomicU64,
    moves_acked: AtomicU64,
    moves_errored: AtomicU64,
    moves_unanswered: AtomicU64,
    notifications_sent: AtomicU64,
    logouts: AtomicU64,
    spawns: Mutex<Vec<Position>>,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

async fn start_fake_server(behaviour: Behaviour) -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind an ephemeral port");
    let addr = listener.local_addr().expect("listener address");
    let counts = Arc::new(Counts::default());
    let server_counts = Arc::clone(&counts);
    let behaviour = Arc::new(behaviour);
    tokio::spawn(async move {
        let mut player_id = 0;
        while let Ok((stream, _)) = listener.accept().await {
            player_id += 1;
            let (behaviour, counts) = (Arc::clone(&behaviour), Arc::clone(&server_counts));
            tokio::spawn(serve(stream, player_id, behaviour, counts));
        }
    });
    (addr, counts)
}

async fn serve(
    mut stream: TcpStream,
    player_id: u64,
    behaviour: Arc<Behaviour>,
    counts: Arc<Counts>,
) {
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::new();
    let mut name = String::new();
    let mut moves = 0u64;
    'connection: loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        frames.extend(&buf[..n]);
        out.clear();
        let mut reply = |message: ServerMessage| encode_frame(&message, &mut out);
        while let Some(message) =
            frames.next_message::<ClientMessage>().expect("the client sends valid frames")
        {
            match message.kind.expect("the client always sets a kind") {
                client_message::Kind::Login(login) => {
                    name = login.name;
                    counts.spawns.lock().unwrap().extend(login.spawn);
                    if behaviour.reject_login.as_deref() == Some(name.as_str()) {
                        reply(server::error(ErrorCode::Unavailable, "no shard for you", 0));
                        continue;
                    }
                    add(&counts.logins);
                    let ok = LoginOk { player_id, position: login.spawn, ..Default::default() };
                    reply(ServerMessage { kind: Some(server_message::Kind::LoginOk(ok)) });
                    reply(server::entered(NEIGHBOUR, 2, 2, "neighbour"));
                    add(&counts.notifications_sent);
                }
                client_message::Kind::Move(step) => {
                    add(&counts.moves_received);
                    moves += 1;
                    let nth = |every: Option<u64>| every.is_some_and(|n| moves.is_multiple_of(n));
                    if behaviour.cut.as_ref().is_some_and(|(who, at)| *who == name && *at == moves)
                    {
                        add(&counts.moves_unanswered);
                        break 'connection;
                    } else if nth(behaviour.drop_every) {
                        add(&counts.moves_unanswered);
                    } else if nth(behaviour.error_every) {
                        add(&counts.moves_errored);
                        reply(server::error(ErrorCode::RateLimited, "slow down", step.client_time));
                    } else {
                        add(&counts.moves_acked);
                        reply(server::moved(player_id, 1, 1, step.client_time));
                        reply(server::moved(NEIGHBOUR, 2, 3, 0));
                        add(&counts.notifications_sent);
                    }
                }
                client_message::Kind::Logout(_) => {
                    add(&counts.logouts);
                    let _ = stream.write_all(&out).await;
                    break 'connection;
                }
                other => panic!("the client sent an unexpected {other:?}"),
            }
        }
        if stream.write_all(&out).await.is_err() {
            break;
        }
    }
    let _ = stream.shutdown().await;
}

async fn run_client(args: &[&str]) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_bare-client"))
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(RUN_DEADLINE, run)
        .await
        .unwrap_or_else(|_| panic!("bare-client {args:?} did not finish within {RUN_DEADLINE:?}"))
        .expect("the bare-client binary runs")
}

/// Runs the client to success; checks stdout and `--json` hold the same summary.
async fn run_ok(test: &str, args: &[&str]) -> Value {
    let path = std::env::temp_dir().join(format!("bare-client-{test}-{}.json", std::process::id()));
    let path_arg = path.to_str().expect("temp path is UTF-8").to_owned();
    let mut all_args = args.to_vec();
    all_args.extend(["--json", &path_arg]);
    let output = run_client(&all_args).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bare-client {all_args:?} failed: {stderr}");
    let from_stdout: Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    let written = std::fs::read_to_string(&path).expect("--json file written");
    let _ = std::fs::remove_file(&path);
    let from_file: Value = serde_json::from_str(&written).expect("--json file is JSON");
    assert_eq!(from_stdout, from_file, "stdout and --json differ");
    from_stdout
}

fn n(summary: &Value, key: &str) -> u64 {
    summary[key].as_u64().unwrap_or_else(|| panic!("{key} is not a count in {summary:#}"))
}

#[tokio::test]
async fn every_move_is_counted_once_as_acked_errored_or_lost() {
    let behaviour = Behaviour { drop_every: Some(7), error_every: Some(5), ..Default::default() };
    let (addr, counts) = start_fake_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "accounting",
        &[
            "--addr",
            &addr,
            "--bots",
            "6",
            "--duration",
            "2s",
            "--move-interval",
            "40ms",
            "--drain",
            "400ms",
            "--spawn-area",
            "10,20,12,25",
            "--label",
            "fake",
        ],
    )
    .await;

    assert_eq!(summary["client"], "bare-client");
    assert_eq!(summary["label"], "fake");
    assert_eq!((n(&summary, "bots_target"), n(&summary, "bots_connected")), (6, 6));
    assert_eq!(get(&counts.logins), 6);
    assert_eq!(get(&counts.logouts), 6, "every bot logs out at the end");
    assert_eq!(n(&summary, "moves_sent"), get(&counts.moves_received));
    assert_eq!(n(&summary, "moves_acked"), get(&counts.moves_acked));
    assert_eq!(n(&summary, "moves_errored"), get(&counts.moves_errored));
    assert_eq!(n(&summary, "moves_lost"), get(&counts.moves_unanswered));
    assert_eq!(summary["errors_by_code"]["RATE_LIMITED"], get(&counts.moves_errored));
    // About 2 s / 40 ms = 50 moves per bot; the phase and the connects take a few.
    let sent = n(&summary, "moves_sent");
    assert!((6 * 40..=6 * 51).contains(&sent), "{sent} moves sent");
    assert!(get(&counts.moves_unanswered) >= 6 * 5, "every 7th move was dropped");
    // Notifications count only while moves are sent, so at most what the server sent.
    let notifications = n(&summary, "notifications");
    assert!(notifications <= get(&counts.notifications_sent));
    assert!(notifications >= get(&counts.moves_acked) * 9 / 10, "{notifications}");
    assert_eq!(n(&summary, "acks_unmatched"), 0);
    assert_eq!(n(&summary, "disconnects"), 0);
    for spawn in counts.spawns.lock().unwrap().iter() {
        assert!((10..=12).contains(&spawn.x) && (20..=25).contains(&spawn.y), "{spawn:?}");
    }
    let delay = &summary["delay_ms"];
    assert!(delay["p50"].as_f64().is_some_and(|p50| p50 < 100.0), "{delay}");
    assert!(delay["p99"].as_f64() >= delay["p50"].as_f64());
    assert_eq!(
        summary["delay_cdf"].as_array().and_then(|c| c.last()).map(|p| &p[1]),
        Some(&1.0.into())
    );
    // Its own accounting: a read per readiness, never a read that finds nothing.
    let io = &summary["client_io"];
    assert!(io["reads"].as_u64() > Some(0));
    assert_eq!(io["reads_empty"], 0, "{io}");
    assert!(summary["client_usage"]["voluntary_switches"].as_u64().is_some());
}

#[tokio::test]
async fn refused_logins_and_cut_connections_are_counted_apart() {
    let behaviour = Behaviour {
        reject_login: Some("bare-1".to_owned()),
        cut: Some(("bare-2".to_owned(), 4)),
        ..Default::default()
    };
    let (addr, counts) = start_fake_server(behaviour).await;
    let addr = addr.to_string();
    let summary = run_ok(
        "failures",
        &[
            "--addr",
            &addr,
            "--bots",
            "4",
            "--duration",
            "1s",
            "--move-interval",
            "50ms",
            "--drain",
            "300ms",
        ],
    )
    .await;
    assert_eq!(n(&summary, "bots_connected"), 3);
    assert_eq!(n(&summary, "login_failures"), 1);
    assert_eq!(summary["errors_by_code"]["UNAVAILABLE"], 1);
    assert_eq!(n(&summary, "disconnects"), 1);
    assert_eq!(get(&counts.logouts), 2, "the two bots left standing log out");
    // The cut bot's unanswered move is lost; so is any it sent before it saw the close.
    assert!(n(&summary, "moves_lost") >= 1);
    assert_eq!(
        n(&summary, "moves_acked") + n(&summary, "moves_lost"),
        n(&summary, "moves_sent"),
        "no errors here: every move is acked or lost"
    );
}

#[tokio::test]
async fn an_unreachable_address_fails_the_run() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let output = run_client(&["--addr", &addr, "--bots", "2", "--duration", "200ms"]).await;
    assert!(!output.status.success());
    let summary: Value = serde_json::from_slice(&output.stdout).expect("a summary all the same");
    assert_eq!(n(&summary, "connect_failures"), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("no bot logged in"));
}
