//! `/readyz` follows etcd: every node of a running cluster is ready; once etcd is killed,
//! each shard and the gateway lose their registration (the keep-alive fails) and answer
//! 503 saying so, with `/healthz` still 200 (the process is alive and keeps serving) and
//! the etcd status metric at 0; when etcd is started again they re-register and answer
//! 200 again, the metric back at 1.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::{
    http_get, metric_total, stop_etcd, wait_ready, wait_until, RestartedEtcd, DEFAULT_LEASE_TTL,
};

use crate::{admin_ports, two_shards, with_cluster};

/// How long a node may take to notice etcd is gone: its keep-alive runs every TTL/3 and
/// waits two periods for an answer, so within the TTL; a margin for a loaded machine.
const NOTICE_WITHIN: Duration = Duration::from_secs(DEFAULT_LEASE_TTL.as_secs() + 7);
/// How long the nodes may take to be registered and ready again once etcd runs.
const RECOVER_WITHIN: Duration = Duration::from_secs(15);

/// The etcd status metric of a node (`..._etcd_registered`).
fn registered_metric(name: &str, admin: SocketAddr) -> anyhow::Result<f64> {
    let metric = if name.starts_with("shard") {
        "meridian_shard_etcd_registered"
    } else {
        "meridian_gateway_etcd_registered"
    };
    metric_total(admin, metric)
}

pub fn readyz_follows_etcd() {
    let what = "readyz follows etcd";
    let etcd = with_cluster(what, two_shards(), |cluster| {
        let nodes = admin_ports(cluster);
        wait_ready(&nodes, Duration::from_secs(15)).context("before etcd stops")?;
        for (name, admin) in &nodes {
            ensure!(registered_metric(name, *admin)? == 1.0, "{name}: not registered at start");
        }

        stop_etcd(cluster)?;
        let stopped = Instant::now();
        for (name, admin) in &nodes {
            let mut last = String::new();
            wait_until(
                stopped + NOTICE_WITHIN,
                &format!("{name} to answer /readyz with 503 with etcd gone"),
                || match http_get(*admin, "/readyz") {
                    Ok((code, body)) => {
                        last = format!("{code} {}", body.trim());
                        code == 503
                    }
                    Err(e) => {
                        last = format!("{e:#}");
                        false
                    }
                },
            )
            .with_context(|| format!("last answer: {last}"))?;
            ensure!(
                last.contains("not registered in etcd"),
                "{name}: 503 for another reason: {last}"
            );
            let (health, _) = http_get(*admin, "/healthz")?;
            ensure!(health == 200, "{name}: /healthz answered {health} with etcd gone");
            ensure!(
                registered_metric(name, *admin)? == 0.0,
                "{name}: metric still says registered"
            );
        }
        let noticed = stopped.elapsed();
        // Still unready, every one, while etcd stays away.
        for (name, admin) in &nodes {
            let (code, body) = http_get(*admin, "/readyz")?;
            ensure!(code == 503, "{name}: /readyz answered {code} {body:?} with etcd still gone");
        }

        let etcd = RestartedEtcd::start(cluster, Duration::from_secs(10))?;
        let restarted = Instant::now();
        wait_ready(&nodes, RECOVER_WITHIN).context("after etcd came back")?;
        let recovered = restarted.elapsed();
        for (name, admin) in &nodes {
            ensure!(
                registered_metric(name, *admin)? == 1.0,
                "{name}: ready but metric says not registered"
            );
        }
        println!(
            "{what}: every node answered 503 within {:.1} s of etcd stopping, 200 again {:.1} s \
             after it restarted",
            noticed.as_secs_f64(),
            recovered.as_secs_f64()
        );
        Ok(etcd)
    });
    // Only now, with every node stopped (they revoke their leases on the way out).
    drop(etcd);
}
