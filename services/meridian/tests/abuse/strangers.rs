//! Scenario 10: strangers at the doors before trust (issue 31, items 5 and 6, and the QUIC
//! front's wait for a stream). Connections that never say who they are, held open and
//! replaced as they are dropped, from one address past its share and from several that
//! fill every place together, against a shard's gRPC/relay port, a gateway's admin port
//! and its QUIC front. Meanwhile the genuine peers must get in: a gateway's relay
//! handshake within the gateway's 2 s connect deadline, `/healthz` and `/readyz` within
//! a kubelet probe's 2 s, a QUIC client's login; and a bystander playing far away is not
//! disturbed. The attackers send only to loopback, hold at most a few hundred sockets, for
//! a few seconds.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::abuse::metric_value;
use meridian_testkit::strangers::{relay_handshake, QuicWithoutStream, Swarm, SwarmOptions};
use meridian_testkit::{
    deadline, http_get_within, wait_until, Bot, Bystander, ClusterOptions, Io, DEFAULT_WAIT,
};

use crate::common::with_cluster_alone;
use crate::BYSTANDER_HOME;

/// What a gateway gives a relay link to connect (`relay.rs`), and a kubelet probe its
/// answer (the chart's `timeoutSeconds`).
const GENUINE_WITHIN: Duration = Duration::from_secs(2);
/// How often the swarms replace the connections the server closed.
const REOPEN_EVERY: Duration = Duration::from_millis(250);
/// Genuine attempts made during each attack, one every `ATTEMPT_EVERY`: the attack lasts
/// past the first-byte deadline (1 s) and the pool's turnover.
const ATTEMPTS: usize = 10;
const ATTEMPT_EVERY: Duration = Duration::from_millis(300);
/// The gate's shares (`meridian_tls::UNTRUSTED`, `meridian_observe::admin`): one address
/// past its share, and eight that together want more than every place.
const ONE_ADDRESS: usize = 200;
const MANY_ADDRESSES: u8 = 8;
const EACH_OF_MANY: usize = 40;

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// One address with `ONE_ADDRESS` connections, and eight with `EACH_OF_MANY` each, all
/// sending `opening` and then nothing.
fn swarms(addr: SocketAddr, opening: &'static [u8]) -> anyhow::Result<(Swarm, Swarm)> {
    let one = SwarmOptions {
        addresses: vec![loopback(2)],
        per_address: ONE_ADDRESS,
        opening,
        reopen_every: REOPEN_EVERY,
    };
    let many = SwarmOptions {
        addresses: (3..3 + MANY_ADDRESSES).map(loopback).collect(),
        per_address: EACH_OF_MANY,
        ..one.clone()
    };
    Ok((Swarm::start(addr, one)?, Swarm::start(addr, many)?))
}

fn closed(admin: SocketAddr, port: &str, reason: &str) -> anyhow::Result<f64> {
    let name = "meridian_untrusted_connections_closed_total";
    metric_value(admin, name, &[("port", port), ("reason", reason)])
}

/// Waits until the gate of `port` has refused connections for their address and evicted
/// some for newcomers: the attack is at full strength.
fn wait_for_full_strength(admin: SocketAddr, port: &str) -> anyhow::Result<()> {
    wait_until(deadline(DEFAULT_WAIT), &format!("the {port} port to refuse and evict"), || {
        closed(admin, port, "per_address").is_ok_and(|n| n > 0.0)
            && closed(admin, port, "evicted").is_ok_and(|n| n > 0.0)
    })
}

fn milliseconds(times: &[Duration]) -> String {
    let ms: Vec<String> = times.iter().map(|t| format!("{:.0}", t.as_secs_f64() * 1e3)).collect();
    format!("[{}] ms", ms.join(", "))
}

/// Item 5: idle TCP connections to a shard's gRPC/relay port. Every genuine relay
/// handshake finishes within the gateway's connect deadline while they are held.
pub fn silent_connections_keep_no_relay_out() {
    let opts = ClusterOptions::new(Io::Uring).shards(1);
    with_cluster_alone(opts, |cluster| {
        let shard = cluster.shard(0);
        let name = format!("shard-{}", shard.id);
        let tls = meridian_tls::NodeTls::load(cluster.tls_files("gateway-90")?)?;
        let bystander = Bystander::start(cluster.game_addr(0), "bystander", BYSTANDER_HOME)?;
        let before: Vec<Duration> = (0..3)
            .map(|_| relay_handshake(&tls, shard.grpc, &name, GENUINE_WITHIN))
            .collect::<anyhow::Result<_>>()?;

        let (one, many) = swarms(shard.grpc, b"")?;
        wait_for_full_strength(shard.admin, "grpc")?;
        let started = Instant::now();
        let during = attempts(|| relay_handshake(&tls, shard.grpc, &name, GENUINE_WITHIN));
        bystander.wait_for_acks(10)?;
        let attack = started.elapsed();
        let (one, many) = (one.stop()?, many.stop()?);
        let acks = bystander.finish()?;
        eprintln!(
            "relay handshakes before {}, during the attack ({attack:.1?}): {}; strangers: one \
             address {one:?}, eight {many:?}; gate closed {} per address, {} evicted, {} at \
             the first-byte deadline; bystander {acks} acks",
            milliseconds(&before),
            summary(&during),
            closed(shard.admin, "grpc", "per_address")?,
            closed(shard.admin, "grpc", "evicted")?,
            closed(shard.admin, "grpc", "deadline")?,
        );
        all_in(during, "relay handshake")?;
        Ok(())
    })
}

/// `ATTEMPTS` genuine attempts, one every `ATTEMPT_EVERY`: how long each took, or why not.
fn attempts(
    mut attempt: impl FnMut() -> anyhow::Result<Duration>,
) -> Vec<anyhow::Result<Duration>> {
    let first = Instant::now();
    (0..ATTEMPTS)
        .map(|n| {
            let at = first + ATTEMPT_EVERY * n as u32;
            // Paces the attempts on their schedule: waits for nothing.
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            attempt()
        })
        .collect()
}

/// "k of n within 2 s", and the times of those that were.
fn summary(results: &[anyhow::Result<Duration>]) -> String {
    let times: Vec<Duration> = results.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    format!(
        "{} of {} within {GENUINE_WITHIN:?}, {}",
        times.len(),
        results.len(),
        milliseconds(&times)
    )
}

/// Every attempt got in; else the first failure, with how many failed.
fn all_in(results: Vec<anyhow::Result<Duration>>, what: &str) -> anyhow::Result<()> {
    let failed = results.iter().filter(|r| r.is_err()).count();
    for (n, result) in results.into_iter().enumerate() {
        result.with_context(|| {
            format!("{what} {n} of {ATTEMPTS} during the attack ({failed} failed)")
        })?;
    }
    Ok(())
}

/// Item 6: slow-loris clients of a gateway's admin port, half a request head each. Every
/// probe is answered within 2 s while they are held.
pub fn slow_admin_clients_keep_no_probe_out() {
    let opts = ClusterOptions::new(Io::Uring).shards(1);
    with_cluster_alone(opts, |cluster| {
        let admin = cluster.gateway(0).admin;
        let bystander = Bystander::start(cluster.game_addr(0), "bystander", BYSTANDER_HOME)?;
        let (one, many) = swarms(admin, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")?;
        wait_for_full_strength(admin, "admin")?;
        let probe = |path: &str| -> anyhow::Result<Duration> {
            let asked = Instant::now();
            let (status, body) = http_get_within(admin, path, GENUINE_WITHIN)?;
            ensure!(status == 200, "GET {path}: {status} {body:?}");
            Ok(asked.elapsed())
        };
        let probes = attempts(|| Ok(probe("/healthz")? + probe("/readyz")?));
        bystander.wait_for_acks(10)?;
        let (one, many) = (one.stop()?, many.stop()?);
        let acks = bystander.finish()?;
        eprintln!(
            "admin probes (/healthz then /readyz) during the attack: {}; slow clients: one \
             address {one:?}, eight {many:?}; gate closed {} per address, {} evicted, {} \
             past the head deadline; bystander {acks} acks",
            summary(&probes),
            closed(admin, "admin", "per_address")?,
            closed(admin, "admin", "evicted")?,
            closed(admin, "admin", "deadline")?,
        );
        all_in(probes, "probe pair")?;
        Ok(())
    })
}

/// The gateway's share of connections from one address waiting for their stream
/// (`quic::WAITING_FOR_STREAM`), and how long it waits (`STREAM_WITHIN`).
const QUIC_SHARE: usize = 16;
const STREAM_WITHIN: Duration = Duration::from_secs(2);
/// QUIC application close codes (`quic.rs`).
const CLOSE_NO_STREAM: u64 = 2;
const CLOSE_BUSY: u64 = 3;

/// The QUIC front: connections that finish their handshake and never open a stream. One
/// address gets its share and the rest are closed at once; those held are closed at the
/// stream deadline; a genuine client logs in meanwhile.
pub fn quic_connections_without_a_stream_keep_no_client_out() {
    let opts = ClusterOptions::new(Io::Uring).shards(1).arg("--limit-exempt").arg("");
    with_cluster_alone(opts, |cluster| {
        let quic = cluster.quic_target(0);
        let admin = cluster.gateway(0).admin;
        let bystander = Bystander::start(cluster.game_addr(0), "bystander", BYSTANDER_HOME)?;
        let wanted = QUIC_SHARE + 24;
        let strangers = QuicWithoutStream::connect(&quic, loopback(2), wanted)?;
        let connected = Instant::now();
        let mut genuine = Bot::connect(quic).context("a QUIC client while strangers wait")?;
        let (x, y) = (BYSTANDER_HOME.0 - 100, BYSTANDER_HOME.1);
        genuine.login("genuine", Some((x, y))).context("a QUIC login while strangers wait")?;
        let login = connected.elapsed();
        let codes = strangers.closes(STREAM_WITHIN + Duration::from_secs(3));
        let closed_within = connected.elapsed();
        let (busy, no_stream) = (
            codes.iter().filter(|c| **c == Some(CLOSE_BUSY)).count(),
            codes.iter().filter(|c| **c == Some(CLOSE_NO_STREAM)).count(),
        );
        bystander.wait_for_acks(10)?;
        let acks = bystander.finish()?;
        eprintln!(
            "{wanted} QUIC connections without a stream (handshakes took {:?}): {busy} closed \
             as past their address's share, {no_stream} at the stream deadline, all within \
             {closed_within:?}; a genuine client logged in after {login:?}; bystander {acks} \
             acks",
            strangers.handshakes_took
        );
        ensure!(
            busy == wanted - QUIC_SHARE && no_stream == QUIC_SHARE,
            "expected {} closed as busy and {QUIC_SHARE} at the deadline, got {codes:?}",
            wanted - QUIC_SHARE
        );
        let counted = closed(admin, "quic", "per_address")?;
        ensure!(counted == (wanted - QUIC_SHARE) as f64, "per_address counted {counted}");
        let counted = closed(admin, "quic", "deadline")?;
        ensure!(counted == QUIC_SHARE as f64, "deadline counted {counted}");
        ensure!(genuine.move_ok(meridian_testkit::pb::Direction::Up, 1)? == (x, y - 1));
        Ok(())
    })
}
