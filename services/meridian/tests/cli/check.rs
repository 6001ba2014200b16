//! `meridian status --check` against a real cluster: 0 while it is healthy, 1 with one line
//! per problem once a shard and then the gateway are killed, 3 when etcd is not there.

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::{deadline, wait_until, Cluster, ClusterOptions, CommandRun, Io};

use crate::meridian_bin;

/// Long enough that a killed node stays registered while the test looks at it, short
/// enough that the gateway's registration lapses within the test.
const LEASE_TTL: &str = "6s";

fn check(cluster: &Cluster) -> anyhow::Result<CommandRun> {
    let name = cluster.cluster_name().to_string();
    cluster.run_meridian(&["status", "--check", "--etcd", cluster.etcd_url(), "--cluster", &name])
}

#[test]
fn status_check_exits_non_zero_on_each_problem() {
    let opts = ClusterOptions::new(Io::Epoll).shards(2).arg("--lease-ttl").arg(LEASE_TTL);
    let cluster = Cluster::start(meridian_bin(), opts).expect("meridian up");
    let checked = (|| {
        let healthy = check(&cluster)?;
        ensure!(healthy.status.code() == Some(0), "a healthy cluster: {healthy:?}");
        ensure!(healthy.stdout.lines().count() == 1, "one summary line: {healthy:?}");
        ensure!(healthy.stdout.contains("2 shards and 1 gateway ready"), "{healthy:?}");

        // A killed shard stays registered until its lease lapses: it does not answer.
        let shard = cluster.shard(1).clone();
        cluster.kill_shard(1)?;
        let run = check(&cluster)?;
        ensure!(run.status.code() == Some(1), "a killed shard: {run:?}");
        let line = format!("shard-{}: unreachable", shard.id);
        ensure!(run.stdout.lines().any(|l| l.starts_with(&line)), "{line}: {run:?}");

        // The gateway too; once its registration lapses, no gateway is left.
        cluster.kill_gateway(0)?;
        let run = check(&cluster)?;
        ensure!(run.status.code() == Some(1), "a killed gateway: {run:?}");
        ensure!(run.stdout.lines().any(|l| l.starts_with("gateway-1: unreachable")), "{run:?}");
        let mut last = None;
        let gone = wait_until(deadline(Duration::from_secs(30)), "no gateway registered", || {
            last = check(&cluster).ok();
            last.as_ref().is_some_and(|run| {
                run.status.code() == Some(1)
                    && run
                        .stdout
                        .lines()
                        .any(|l| l == "no gateway is registered: players cannot connect")
            })
        });
        gone.with_context(|| format!("the last check: {last:?}"))?;

        // etcd that does not answer: a port nothing listens on.
        let free = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let nowhere = format!("http://{free}");
        let run = cluster.run_meridian(&["status", "--check", "--etcd", &nowhere])?;
        ensure!(run.status.code() == Some(3), "etcd unreachable: {run:?}");
        ensure!(run.stdout.starts_with("cannot check cluster"), "{run:?}");
        // Issue 32: the cause once, and where etcd was looked for.
        let hint = format!("is etcd running at {nowhere}?");
        ensure!(run.stdout.matches(&hint).count() == 1, "says {hint:?} once: {run:?}");
        ensure!(run.stdout.matches("connect error").count() == 1, "the cause once: {run:?}");
        ensure!(run.stdout.len() < 200, "one short line: {run:?}");
        Ok(())
    })();
    if let Err(error) = checked {
        panic!("{error:#}");
    }
    drop(cluster);
}
