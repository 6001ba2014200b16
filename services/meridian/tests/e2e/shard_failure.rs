//! A shard killed with SIGKILL: its registration expires, its players' moves are refused with
//! UNAVAILABLE, and the gateways stay up and responsive.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::pb::{Direction, ErrorCode};
use meridian_testkit::{http_get, msg, wait_until, Bot, ClusterOptions, Front, DEFAULT_LEASE_TTL};

use crate::{entered, seen_moving, with_cluster};

fn registered_shards(status: &serde_json::Value) -> anyhow::Result<BTreeSet<u64>> {
    status["shards"]
        .as_array()
        .with_context(|| format!("no shards list in {status}"))?
        .iter()
        .map(|s| s["id"].as_u64().with_context(|| format!("a shard without an id: {s}")))
        .collect()
}

/// Time for etcd to expire a lease and the gateways to react, on top of the lease TTL.
const SLACK: Duration = Duration::from_secs(2);

/// Shards the cluster's gateways proved dead and took out (their lease revoked), summed.
pub(crate) fn deaths_detected(cluster: &meridian_testkit::Cluster) -> anyhow::Result<f64> {
    let name = "meridian_gateway_shard_deaths_detected_total";
    let mut sum = 0.0;
    for gateway in cluster.gateways() {
        sum += meridian_testkit::abuse::metric_value(gateway.admin, name, &[])?;
    }
    Ok(sum)
}

/// The connection works: a Ping is answered and nothing else is pending.
fn still_open(bot: &mut Bot) -> anyhow::Result<()> {
    bot.expect_quiet().with_context(|| format!("{}'s connection after UNAVAILABLE", bot.label()))
}

pub fn shard_kill(io: Front) {
    let ttl = format!("{}s", DEFAULT_LEASE_TTL.as_secs());
    let opts = ClusterOptions::new(io).gateways(2).arg("--lease-ttl").arg(ttl);
    with_cluster(opts, |cluster| {
        let shard = cluster.shard(0).clone();
        let status = cluster.status_json()?;
        ensure!(
            registered_shards(&status)? == BTreeSet::from([u64::from(shard.id)]),
            "shard {} registered before the kill: {status}",
            shard.id
        );

        // One player on each gateway, in sight of each other.
        let mut alice = Bot::connect(cluster.client_addr(0))?;
        alice.login("alice", Some((100, 100)))?;
        let mut bob = Bot::connect(cluster.client_addr(1))?;
        bob.login("bob", Some((110, 100)))?;
        alice.expect_messages(&[entered(&bob, 110, 100)])?;
        ensure!(bob.move_ok(Direction::Right, 1)? == (111, 100), "bob moves before the kill");
        alice.expect_messages(&[seen_moving(&bob, 111, 100)])?;

        let killed_at = Instant::now();
        cluster.kill_shard(0)?;

        // Every move still gets exactly one answer: UNAVAILABLE with its client_time.
        // The gateways may only learn of the death when the shard's lease expires.
        let answer_by = killed_at + DEFAULT_LEASE_TTL + SLACK;
        for (t, bot) in [(1, &mut alice), (2, &mut bob)] {
            bot.send_move(Direction::Up, t)?;
            let answer = bot.recv_answer(answer_by, t)?;
            ensure!(
                answer.error()? == ErrorCode::Unavailable,
                "{} moving with its shard dead: {answer:?}",
                bot.label()
            );
            still_open(bot)?;
            let answer = bot.move_(Direction::Up, t + 10)?;
            ensure!(answer.error()? == ErrorCode::Unavailable, "a second move: {answer:?}");
        }

        // The registration disappears within the lease TTL (plus slack for etcd's expiry).
        let mut last = serde_json::Value::Null;
        let mut failure = None;
        wait_until(
            killed_at + DEFAULT_LEASE_TTL + SLACK,
            &format!("shard {} to disappear from `meridian status` after SIGKILL", shard.id),
            || match cluster.status_json().and_then(|s| registered_shards(&s).map(|ids| (s, ids))) {
                Ok((status, ids)) => {
                    last = status;
                    !ids.contains(&u64::from(shard.id))
                }
                Err(e) => {
                    failure = Some(e);
                    true
                }
            },
        )
        .with_context(|| format!("last status: {last}"))?;
        if let Some(e) = failure {
            return Err(e.context("`meridian status` after the shard kill"));
        }
        // Taken out by a gateway that proved it dead (its port refused connections after its
        // relay links broke) and revoked its lease, not by the lease running out: once, by
        // whichever gateway was first (the other finds the record gone).
        let detected = deaths_detected(cluster)?;
        ensure!(detected == 1.0, "shard deaths detected by the gateways: {detected}, not 1");

        // No gateway crashed or hangs: Pings answered, health checks up, new connections
        // accepted, logins refused with UNAVAILABLE and the connection kept.
        for (i, gateway) in cluster.gateways().iter().enumerate() {
            let (code, body) = http_get(gateway.admin, "/healthz")?;
            ensure!(
                code == 200,
                "gateway {} /healthz after the shard kill: {code} {body}",
                gateway.id
            );
            let mut late = Bot::connect(cluster.client_addr(i))?;
            late.expect_quiet()?;
            late.send(&msg::login(&format!("late-{i}"), Some((300, 300))))?;
            late.expect_error(ErrorCode::Unavailable, 0)
                .with_context(|| format!("Login on gateway {} with no shard", gateway.id))?;
            late.expect_quiet()?;
        }
        for bot in [&mut alice, &mut bob] {
            bot.expect_quiet()?;
            let answer = bot.move_(Direction::Down, 30)?;
            ensure!(answer.error()? == ErrorCode::Unavailable, "{answer:?}");
        }
        ensure!(
            cluster.up_pid().is_some_and(meridian_testkit::process_alive),
            "`meridian up` survives the death of a shard"
        );
        Ok(())
    })
}
