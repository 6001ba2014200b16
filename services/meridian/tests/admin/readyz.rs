//! `/readyz` means "can serve players", not "etcd answered lately": every node of a running
//! cluster is ready; once etcd is killed, each shard and the gateway lose their
//! registration (the keep-alive fails: the etcd status metric goes to 0) but keep
//! answering `/readyz` with 200, as `/healthz`, all the while etcd stays away (they serve
//! from their last view, and a 503 would take every node out of its Service at once);
//! when etcd is started again they re-register, the metric back at 1, still ready.

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
/// How long the nodes may take to be registered again once etcd runs.
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

/// Every node's `/readyz` and `/healthz` answer 200; the error names those that did not.
fn all_ready(nodes: &[(String, SocketAddr)], when: &str) -> anyhow::Result<()> {
    for (name, admin) in nodes {
        let (code, body) = http_get(*admin, "/readyz")?;
        ensure!(code == 200, "{name}: /readyz answered {code} {:?} {when}", body.trim());
        let (health, _) = http_get(*admin, "/healthz")?;
        ensure!(health == 200, "{name}: /healthz answered {health} {when}");
    }
    Ok(())
}

/// Waits until every node's etcd status metric is `want`.
fn wait_registered(
    nodes: &[(String, SocketAddr)],
    want: f64,
    by: Instant,
    what: &str,
) -> anyhow::Result<()> {
    for (name, admin) in nodes {
        let mut last = String::new();
        wait_until(by, &format!("{name}: {what}"), || match registered_metric(name, *admin) {
            Ok(value) => {
                last = value.to_string();
                value == want
            }
            Err(e) => {
                last = format!("{e:#}");
                false
            }
        })
        .with_context(|| format!("last value: {last}"))?;
    }
    Ok(())
}

pub fn readyz_outlives_etcd() {
    let what = "readyz outlives etcd";
    let etcd = with_cluster(what, two_shards(), |cluster| {
        let nodes = admin_ports(cluster);
        wait_ready(&nodes, Duration::from_secs(15)).context("before etcd stops")?;
        for (name, admin) in &nodes {
            ensure!(registered_metric(name, *admin)? == 1.0, "{name}: not registered at start");
        }

        stop_etcd(cluster)?;
        let stopped = Instant::now();
        // Ready all the while, asked again and again until every node has noticed.
        let mut noticed = false;
        wait_until(stopped + NOTICE_WITHIN, "every node to notice etcd is gone", || {
            noticed = nodes.iter().all(|(name, admin)| {
                registered_metric(name, *admin).is_ok_and(|value| value == 0.0)
            });
            noticed || all_ready(&nodes, "with etcd gone").is_err()
        })?;
        all_ready(&nodes, "with etcd gone")?;
        ensure!(noticed, "checked in the wait");
        let unregistered = stopped.elapsed();
        // Still ready, every one, while etcd stays away longer than a lease: asked until
        // one is not (a failure) or two TTLs have passed (the wait ending is the success).
        let _ = wait_until(stopped + 2 * DEFAULT_LEASE_TTL, "a node to become unready", || {
            all_ready(&nodes, "with etcd still gone").is_err()
        });
        all_ready(&nodes, "with etcd still gone")?;

        let etcd = RestartedEtcd::start(cluster, Duration::from_secs(10))?;
        let restarted = Instant::now();
        wait_registered(
            &nodes,
            1.0,
            restarted + RECOVER_WITHIN,
            "registered after etcd came back",
        )?;
        let recovered = restarted.elapsed();
        all_ready(&nodes, "after etcd came back")?;
        println!(
            "{what}: every node unregistered within {:.1} s of etcd stopping and registered again \
             {:.1} s after it restarted; /readyz 200 and /healthz 200 throughout",
            unregistered.as_secs_f64(),
            recovered.as_secs_f64()
        );
        Ok(etcd)
    });
    // Only now, with every node stopped (they revoke their leases on the way out).
    drop(etcd);
}
