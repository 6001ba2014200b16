//! End-to-end tests of the gateway's WebSocket front (issue 14): the world, protocol and
//! failure scenarios of the `e2e` target run unchanged over WebSocket (one binary message per
//! protobuf body, no length prefix), TCP and WebSocket players share one world, and what the
//! protocol does not allow over WebSocket (a text message) is refused like a bad frame.
//!
//! Every test starts its own `meridian up` (its gateways always run a WebSocket front).

#[path = "../e2e/common.rs"]
#[macro_use]
mod common;
#[path = "../e2e/errors.rs"]
mod errors;
#[path = "../e2e/failover.rs"]
mod failover;
#[path = "../e2e/shard_failure.rs"]
mod shard_failure;
#[path = "../e2e/stale_epoch.rs"]
mod stale_epoch;
#[path = "../e2e/world.rs"]
mod world;

pub use common::*;

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::pb::{Direction, ErrorCode};
use meridian_testkit::{deadline, Bot, ClusterOptions, Front, Io};

/// Instantiates each e2e scenario `fn(Front)` as a test over WebSocket.
macro_rules! over_ws {
    ($($module:ident :: $scenario:ident),* $(,)?) => {
        mod suite {
            $(#[test]
            fn $scenario() {
                crate::$module::$scenario(meridian_testkit::Front::ws(meridian_testkit::Io::Uring))
            })*
        }
    };
}

transport_scenarios!(over_ws);

#[test]
fn tcp_and_websocket_players_share_one_world_and_text_is_refused() {
    one_world_and_text_refused(Io::Uring);
}

/// WebSocket sessions run on the event loops, so the epoll backend serves them too.
#[test]
fn tcp_and_websocket_players_share_one_world_on_epoll_too() {
    one_world_and_text_refused(Io::Epoll);
}

fn one_world_and_text_refused(io: Io) {
    with_cluster(ClusterOptions::new(Front::ws(io)), |cluster| {
        let (tcp, ws) = (cluster.game_addr(0), cluster.ws_addr(0));
        let status = cluster.status_json()?;
        let published = &status["gateways"][0]["ws"];
        ensure!(*published == ws.to_string(), "etcd publishes the WebSocket front: {status}");
        let mut tina = Bot::connect(tcp)?;
        tina.login("tina", Some((100, 100)))?;
        let mut wendy = Bot::connect(cluster.client_addr(0))?;
        ensure!(wendy.is_ws() && !tina.is_ws(), "one bot per transport");
        let login = wendy.login("wendy", Some((105, 100)))?;
        ensure!(login.entered_ids() == [tina.id()].into(), "wendy sees tina: {login:?}");
        tina.expect_messages(&[entered(&wendy, 105, 100)])?;
        ensure!(wendy.move_ok(Direction::Right, 1)? == (106, 100));
        tina.expect_messages(&[seen_moving(&wendy, 106, 100)])?;
        ensure!(tina.move_ok(Direction::Left, 2)? == (99, 100));
        wendy.expect_messages(&[seen_moving(&tina, 99, 100)])?;
        wendy.chat("over websocket")?;
        tina.expect_messages(&[chat_from(&wendy, "over websocket")])?;

        // A text message is no protocol message: MALFORMED, then the close; tina sees
        // wendy leave.
        wendy.send_text("{\"move\": \"up\"}")?;
        let rest = wendy.expect_closed(deadline(Duration::from_secs(5)))?;
        let refused = rest.iter().any(|m| {
            matches!(&m.kind, Some(meridian_testkit::pb::server_message::Kind::Error(e))
                if e.code == ErrorCode::Malformed as i32)
        });
        ensure!(refused, "MALFORMED before the close: {rest:?}");
        tina.expect_messages(&[left(&wendy)]).context("wendy left the world")?;
        Ok(())
    })
}

/// A WebSocket client past a connection cap is told why in a binary message once upgraded
/// (`UNAVAILABLE` with the detail, as over TCP: DESIGN 2b), then closed; one that is no
/// WebSocket client at all gets an HTTP error; a ping frame is answered; the players in
/// are not disturbed.
#[test]
fn refusals_and_bad_upgrades_over_websocket() {
    let opts = ClusterOptions::new(Front::ws(Io::Uring))
        .arg("--limit-exempt")
        .arg("")
        .env("MERIDIAN_MAX_CONNECTIONS_PER_ADDRESS", "2")
        .env("MERIDIAN_CONNECT_RATE", "1000");
    with_cluster(opts, |cluster| {
        use meridian_testkit::ws::{WsClient, WsRead};
        use std::io::{Read, Write};
        let ws = cluster.ws_addr(0);
        let mut wendy = Bot::connect(cluster.client_addr(0))?;
        ensure!(wendy.is_ws());
        wendy.login("wendy", Some((100, 100)))?;
        let _second = WsClient::connect(ws, Duration::from_secs(5))?;
        let mut third = WsClient::connect(ws, Duration::from_secs(5)).context("upgraded")?;
        let until = deadline(Duration::from_secs(5));
        let WsRead::Data(frame) = third.read(until)? else { anyhow::bail!("no refusal") };
        let header = meridian_protocol::next_frame(&frame, 4096)?.context("a whole frame")?;
        let message: meridian_testkit::pb::ServerMessage =
            meridian_protocol::decode_body(header.body(&frame))?;
        let refused = matches!(&message.kind,
            Some(meridian_testkit::pb::server_message::Kind::Error(e))
                if e.code == ErrorCode::Unavailable as i32
                    && e.detail == "too many connections from your address");
        ensure!(refused, "the third connection is told why: {message:?}");
        ensure!(matches!(third.read(until)?, WsRead::Closed), "then closed");

        // Not a WebSocket upgrade: an HTTP error, then the close.
        let mut plain = std::net::TcpStream::connect(ws)?;
        plain.set_read_timeout(Some(Duration::from_secs(5)))?;
        plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut answer = String::new();
        plain.read_to_string(&mut answer)?;
        ensure!(answer.starts_with("HTTP/1.1 400 "), "a plain GET: {answer}");
        ensure!(wendy.ping_barrier()?.is_empty(), "wendy still plays");
        Ok(())
    })
}
