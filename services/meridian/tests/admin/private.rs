//! With `--admin-token`, the admin pages that name players or addresses (a shard's
//! `/players` and `/density`, a gateway's `/map` and `/map.json`) answer only whoever
//! presents the token; probes, metrics and the game's `/play` page stay open; the gateway
//! presents the token to the shards for its live map; refusals are counted.

use anyhow::{ensure, Context};
use meridian_testkit::{http_get, metric_total};

use crate::{two_shards, with_cluster};

const TOKEN: &str = "4dm1n-t0ken";

pub fn private_pages_need_the_admin_token() {
    let opts = two_shards().arg("--admin-token").arg(TOKEN);
    with_cluster("private pages", opts, |cluster| {
        let gateway = cluster.gateways()[0].admin;
        let mut pages: Vec<_> = cluster
            .shards()
            .iter()
            .flat_map(|s| [(s.admin, "/players"), (s.admin, "/density")])
            .collect();
        pages.extend([(gateway, "/map"), (gateway, "/map.json")]);
        for (admin, page) in &pages {
            let (code, body) = http_get(*admin, page)?;
            ensure!(code == 401, "{admin}{page} without the token answered {code}: {body}");
            let (code, _) = http_get(*admin, &format!("{page}?token=wrong"))?;
            ensure!(code == 401, "{admin}{page} with a wrong token answered {code}");
            let (code, body) = http_get(*admin, &format!("{page}?token={TOKEN}"))?;
            ensure!(code == 200, "{admin}{page} with the token answered {code}: {body}");
        }
        for (admin, page) in
            [(gateway, "/healthz"), (gateway, "/readyz"), (gateway, "/metrics"), (gateway, "/play")]
        {
            let (code, _) = http_get(admin, page)?;
            ensure!(code == 200, "{page} stays open: {code}");
        }
        // The gateway's map got every shard's own density: it presented the token.
        let (_, json) = http_get(gateway, &format!("/map.json?token={TOKEN}"))?;
        let map: serde_json::Value = serde_json::from_str(&json).context("map.json")?;
        let shards = map["shards"].as_array().context("shards")?;
        ensure!(shards.len() == 2, "{json}");
        for shard in shards {
            ensure!(shard["density"] == "shard", "the shard's /density was not read: {shard}");
        }
        let refused = metric_total(gateway, "meridian_admin_refused_total")?;
        ensure!(refused >= 4.0, "gateway refusals counted: {refused}");
        Ok(())
    });
}
