//! `meridian up` brings up every node it says it did, `meridian status` agrees with it, and
//! every node answers on its admin port.

use std::collections::BTreeSet;

use anyhow::{ensure, Context};
use meridian_testkit::{http_get, process_alive, Bot, ClusterOptions, Io};

use crate::with_cluster;

const MAP: u64 = 400;

pub fn up_reports_every_node(io: Io) {
    with_cluster(ClusterOptions::new(io).shards(2).gateways(2), |cluster| {
        let status = cluster.status_json()?;

        let shards = status["shards"].as_array().with_context(|| format!("shards: {status}"))?;
        ensure!(shards.len() == 2, "2 shards in status: {status}");
        for ready in cluster.shards() {
            ensure!(process_alive(ready.pid), "shard {} (pid {}) is running", ready.id, ready.pid);
            let entry = shards
                .iter()
                .find(|s| s["id"].as_u64() == Some(u64::from(ready.id)))
                .with_context(|| format!("shard {} missing from status: {status}", ready.id))?;
            ensure!(entry["state"] == "serving", "shard {} is serving: {entry}", ready.id);
            ensure!(entry["grpc"] == ready.grpc.to_string(), "grpc address: {entry} vs {ready:?}");
            ensure!(
                entry["admin"] == ready.admin.to_string(),
                "admin address: {entry} vs {ready:?}"
            );
        }
        let gateways =
            status["gateways"].as_array().with_context(|| format!("gateways: {status}"))?;
        ensure!(gateways.len() == 2, "2 gateways in status: {status}");
        for ready in cluster.gateways() {
            ensure!(
                process_alive(ready.pid),
                "gateway {} (pid {}) is running",
                ready.id,
                ready.pid
            );
            let entry = gateways
                .iter()
                .find(|g| g["id"].as_u64() == Some(u64::from(ready.id)))
                .with_context(|| format!("gateway {} missing from status: {status}", ready.id))?;
            ensure!(entry["game"] == ready.game.to_string(), "game address: {entry} vs {ready:?}");
            ensure!(
                entry["admin"] == ready.admin.to_string(),
                "admin address: {entry} vs {ready:?}"
            );
        }

        // The partition covers the map exactly, with live shards only.
        let partition = &status["partition"];
        ensure!(partition["epoch"].is_u64(), "partition epoch: {partition}");
        let live: BTreeSet<u64> = cluster.shards().iter().map(|s| u64::from(s.id)).collect();
        let regions =
            partition["regions"].as_array().with_context(|| format!("regions: {partition}"))?;
        let mut rects = Vec::new();
        for r in regions {
            let get = |k: &str| r[k].as_u64().with_context(|| format!("{k} in region {r}"));
            let (shard, x0, y0, x1, y1) =
                (get("shard")?, get("x0")?, get("y0")?, get("x1")?, get("y1")?);
            ensure!(live.contains(&shard), "region of a shard not running: {r}");
            ensure!(x0 < x1 && y0 < y1 && x1 <= MAP && y1 <= MAP, "region in bounds: {r}");
            rects.push((x0, y0, x1, y1));
        }
        for (i, a) in rects.iter().enumerate() {
            for b in &rects[i + 1..] {
                let overlap = a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3;
                ensure!(!overlap, "regions overlap: {a:?} and {b:?} in {partition}");
            }
        }
        let area: u64 = rects.iter().map(|(x0, y0, x1, y1)| (x1 - x0) * (y1 - y0)).sum();
        ensure!(area == MAP * MAP, "regions cover the 400x400 map exactly: {partition}");

        // Every node answers on its admin port.
        let admins = cluster
            .shards()
            .iter()
            .map(|s| (format!("shard {}", s.id), s.admin))
            .chain(cluster.gateways().iter().map(|g| (format!("gateway {}", g.id), g.admin)));
        for (node, admin) in admins {
            for path in ["/healthz", "/readyz"] {
                let (code, body) = http_get(admin, path)?;
                ensure!(code == 200, "{node} GET {path}: {code} {body}");
            }
            let (code, body) = http_get(admin, "/metrics")?;
            ensure!(code == 200, "{node} GET /metrics: {code} {body}");
            let samples = body
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter(|l| l.rsplit(' ').next().is_some_and(|v| v.parse::<f64>().is_ok()))
                .count();
            ensure!(samples > 0, "{node} /metrics has Prometheus samples: {body:?}");
        }

        // Each gateway speaks the protocol before login.
        for i in 0..cluster.gateways().len() {
            Bot::connect(cluster.game_addr(i))?.expect_quiet()?;
        }
        Ok(())
    })
}
