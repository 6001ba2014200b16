//! Scenario 5: slow-loris connections and silent players. A connection that stalls half
//! way through a length prefix, or sends nothing, is closed at the login deadline with
//! NOT_LOGGED_IN; a logged-in player that sends nothing is closed at the idle deadline with
//! UNAVAILABLE and its observers see it leave; a player that pings when quiet stays.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::abuse::{metric_value, RawClient, RawRead};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::{ErrorCode, ServerMessage};
use meridian_testkit::{Bot, Bystander, ClusterOptions, Front};

use crate::common::{with_cluster_alone, GATEWAY_TICK, SCHEDULING_SLACK};
use crate::BYSTANDER_HOME;

const LOGIN_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the players that stay send something.
const PING_EVERY: Duration = Duration::from_millis(500);

/// What a silent connection saw until the gateway closed it: each message with when it
/// arrived, then when the stream ended.
struct Ending {
    messages: Vec<(Instant, ServerMessage)>,
    closed_at: Instant,
}

/// Reads `client` on a thread until the gateway closes it (at most `within`).
fn watch(mut client: RawClient, within: Duration) -> JoinHandle<anyhow::Result<Ending>> {
    thread::spawn(move || {
        let until = Instant::now() + within;
        let mut messages = Vec::new();
        loop {
            match client.read(until)? {
                RawRead::Message(message) => messages.push((Instant::now(), message)),
                RawRead::Closed => return Ok(Ending { messages, closed_at: Instant::now() }),
                RawRead::TimedOut => {
                    bail!("{} still open after {within:?}; received {messages:?}", client.label())
                }
            }
        }
    })
}

/// The connection got exactly one error, `Error{code}` (client_time 0), as its last message,
/// between `earliest` and `latest`, then the close soon after.
fn check_ending(
    what: &str,
    ending: &Ending,
    code: ErrorCode,
    earliest: Instant,
    latest: Instant,
) -> anyhow::Result<()> {
    let errors: Vec<&(Instant, ServerMessage)> =
        ending.messages.iter().filter(|(_, m)| matches!(m.kind, Some(S::Error(_)))).collect();
    let [(at, error)] = errors[..] else {
        bail!("{what}: expected one Error {}, got {:?}", code.as_str_name(), ending.messages);
    };
    ensure!(
        matches!(&error.kind, Some(S::Error(e)) if e.code == code as i32 && e.client_time == 0),
        "{what}: expected Error {} (client_time 0), got {error:?}",
        code.as_str_name()
    );
    let last = ending.messages.last().map(|(_, m)| m);
    ensure!(last == Some(error), "{what}: the error is the last message: {:?}", ending.messages);
    let late = at.saturating_duration_since(earliest);
    eprintln!(
        "{what}: Error {} {:.0} ms after its deadline",
        code.as_str_name(),
        late.as_secs_f64() * 1e3
    );
    ensure!(
        *at >= earliest && *at <= latest,
        "{what}: Error {} came {:.2} s after its deadline, expected within {:.2} s (and not before)",
        code.as_str_name(),
        late.as_secs_f64(),
        latest.saturating_duration_since(earliest).as_secs_f64()
    );
    ensure!(
        ending.closed_at.saturating_duration_since(*at) < SCHEDULING_SLACK,
        "{what}: the close came {:?} after the error",
        ending.closed_at.saturating_duration_since(*at)
    );
    Ok(())
}

pub fn deadlines(front: Front) {
    let opts = ClusterOptions::new(front)
        .env("MERIDIAN_LOGIN_TIMEOUT", "1s")
        .env("MERIDIAN_IDLE_TIMEOUT", "2s");
    with_cluster_alone(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let closes = |deadline: &str| {
            metric_value(admin, "meridian_gateway_deadline_closes_total", &[("deadline", deadline)])
        };
        let (logins_before, idles_before) = (closes("login")?, closes("idle")?);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut watcher = Bot::connect(addr)?;
        watcher.login("watcher", Some((100, 100)))?;

        // Half a length prefix (a varint with its continuation bit set), then nothing; and
        // nothing at all.
        let mut half = RawClient::connect(addr)?;
        let half_connected = Instant::now();
        half.send_raw(&[0x80])?;
        let silent = RawClient::connect(addr)?;
        let silent_connected = Instant::now();
        let half = watch(half, Duration::from_secs(5));
        let silent = watch(silent, Duration::from_secs(5));

        // A player that goes quiet after its login; its idle time starts with the last
        // frame it sent (the login's Ping barrier).
        let mut quiet = RawClient::connect(addr)?;
        quiet.send(&meridian_testkit::msg::login("quiet", Some((105, 100))))?;
        let first = quiet.recv(Instant::now() + Duration::from_secs(5))?;
        let Some(S::LoginOk(ok)) = &first.kind else {
            bail!("quiet's login was answered {first:?}");
        };
        let quiet_id = ok.player_id;
        let quiet_last_sent = Instant::now();
        quiet.ping_barrier()?;
        let quiet_pong = Instant::now();
        let quiet = watch(quiet, Duration::from_secs(6));

        let mut pinger = Bot::connect(addr)?;
        pinger.login("pinger", Some((110, 100)))?;

        // The watcher and the pinger send a Ping every 500 ms until a second after the quiet
        // one's deadline: ~3 s, past the idle deadline for them too.
        let until = quiet_pong + IDLE_TIMEOUT + Duration::from_secs(1);
        let mut watcher_saw: Vec<ServerMessage> = Vec::new();
        while Instant::now() < until {
            watcher_saw.extend(watcher.ping_barrier()?);
            pinger.ping_barrier().context("the pinger stays connected")?;
            thread::sleep(PING_EVERY);
        }
        watcher_saw.extend(watcher.ping_barrier()?);

        let tick_late = GATEWAY_TICK + SCHEDULING_SLACK;
        let half = half.join().expect("the watching thread does not panic")?;
        check_ending(
            "half a prefix",
            &half,
            ErrorCode::NotLoggedIn,
            half_connected + LOGIN_TIMEOUT,
            half_connected + LOGIN_TIMEOUT + tick_late,
        )?;
        let silent = silent.join().expect("the watching thread does not panic")?;
        check_ending(
            "a silent connection",
            &silent,
            ErrorCode::NotLoggedIn,
            silent_connected + LOGIN_TIMEOUT,
            silent_connected + LOGIN_TIMEOUT + tick_late,
        )?;
        let quiet = quiet.join().expect("the watching thread does not panic")?;
        check_ending(
            "a quiet player",
            &quiet,
            ErrorCode::Unavailable,
            quiet_last_sent + IDLE_TIMEOUT,
            quiet_pong + IDLE_TIMEOUT + tick_late,
        )?;

        let left = meridian_protocol::server::left(quiet_id);
        ensure!(
            watcher_saw.contains(&left),
            "the watcher saw the quiet player leave: {watcher_saw:?}"
        );
        ensure!(!watcher.view().sees(quiet_id), "the quiet player is out of the watcher's view");
        ensure!(watcher.view().sees(pinger.id()), "the pinger is still in the watcher's view");
        // The pinger is still here, and plays.
        pinger.move_ok(meridian_testkit::pb::Direction::Down, 1)?;

        let logins = closes("login")? - logins_before;
        let idles = closes("idle")? - idles_before;
        ensure!(
            logins == 2.0,
            "deadline_closes_total{{deadline=\"login\"}} moved by {logins}, expected 2"
        );
        ensure!(
            idles == 1.0,
            "deadline_closes_total{{deadline=\"idle\"}} moved by {idles}, expected 1"
        );
        bystander.finish()?;
        Ok(())
    })
}
