//! etcd down for 10 s under load: 60 bots walk on both sides of the border of a two-shard
//! cluster (30 a side, in sight of each other across it), etcd is killed (SIGKILL), and
//! started again 10 s later with the same data dir and ports. The cluster must keep serving
//! from its last view: every move acknowledged (no refusal at all), no disconnect, streams
//! exact, and every bot still playing all through the outage. Afterwards every shard and
//! gateway must be back in `meridian status --json` once the leases of before the outage
//! have expired (so they re-registered, or kept their leases alive), the partition still
//! there, and every node ready (`/readyz` 200); at rest views equal the truth and
//! ownership is exact.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::{
    owners_at_rest, settle, stop_etcd, test_seed, wait_for_expected_partition, wait_ready,
    wait_until, Cluster, Io, Partition, RestartedEtcd, Rng, WalkOptions, Walkers,
    DEFAULT_LEASE_TTL, SEED_ENV,
};

use crate::two_sides::TwoSides;
use crate::{options, positions, stop_unnoticed, with_cluster, SETTLE_WITHIN, SIGHT};

const PER_SIDE: usize = 30;
const WEST: (u32, u32) = (170, 199);
const EAST: (u32, u32) = (200, 229);
const ROWS: (u32, u32) = (100, 300);
const OUTAGE: Duration = Duration::from_secs(10);
/// How many acks every bot must get while etcd is down: at a move every 100 ms, 10 s give
/// about 100; a quarter of that shows nobody was stalled for long.
const ACKS_DURING_OUTAGE: u64 = 25;
/// How long the members may take to be back in etcd and ready once it runs again.
const RECOVER_WITHIN: Duration = Duration::from_secs(15);

/// The ids listed under `what` ("shards" or "gateways") in `meridian status --json`.
fn member_ids(status: &serde_json::Value, what: &str) -> BTreeSet<u64> {
    status[what]
        .as_array()
        .map(|list| list.iter().filter_map(|m| m["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// Waits until `meridian status --json` lists every shard and gateway of the cluster and a
/// partition giving a region to each shard.
pub(crate) fn wait_members_back(cluster: &Cluster, within: Duration) -> anyhow::Result<Partition> {
    let shards: BTreeSet<u64> = cluster.shards().iter().map(|s| u64::from(s.id)).collect();
    let gateways: BTreeSet<u64> = cluster.gateways().iter().map(|g| u64::from(g.id)).collect();
    let mut last = String::from("no answer");
    let mut partition = None;
    wait_until(
        Instant::now() + within,
        &format!("`meridian status` to list shards {shards:?} and gateways {gateways:?} again"),
        || match cluster.status_json() {
            Ok(status) => {
                let (s, g) = (member_ids(&status, "shards"), member_ids(&status, "gateways"));
                partition = Partition::from_status(&status).ok().flatten();
                let mapped = partition.as_ref().is_some_and(|p| {
                    p.owners().into_iter().map(u64::from).collect::<BTreeSet<_>>() == shards
                });
                last = format!("shards {s:?}, gateways {g:?}, partition {partition:?}");
                s == shards && g == gateways && mapped
            }
            Err(e) => {
                last = format!("{e:#}");
                false
            }
        },
    )
    .with_context(|| format!("last status: {last}"))?;
    partition.context("checked in the wait")
}

pub fn etcd_outage_is_invisible(io: Io) {
    let seed = test_seed("elastic::etcd_outage", 10);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), etcd down for 10 s under load");
    let etcd = with_cluster(&label.clone(), options(io, 2), |cluster| {
        let before = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let specs = TwoSides::new(WEST, EAST, ROWS).walkers(PER_SIDE, &mut Rng::new(seed));
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let walkers = Walkers::start(&specs, WalkOptions::new(gateways, seed, label.clone()))?;
        walkers.wait_logged_in(Duration::from_secs(15))?;
        walkers.wait_for_acks(3, Duration::from_secs(10))?;

        stop_etcd(cluster)?;
        let stopped_at = Instant::now();
        let acks_before: Vec<u64> = walkers.status().iter().map(|s| s.acks).collect();
        walkers
            .walk_for(OUTAGE.saturating_sub(stopped_at.elapsed()))
            .context("while etcd is down")?;
        let during: Vec<(String, u64)> = walkers
            .status()
            .iter()
            .zip(&acks_before)
            .map(|(s, before)| (s.name.clone(), s.acks - before))
            .collect();
        let stalled: Vec<&(String, u64)> =
            during.iter().filter(|(_, n)| *n < ACKS_DURING_OUTAGE).collect();
        ensure!(
            stalled.is_empty(),
            "walkers with fewer than {ACKS_DURING_OUTAGE} acks in the {OUTAGE:?} etcd was down: \
             {stalled:?}"
        );
        let etcd = RestartedEtcd::start(cluster, Duration::from_secs(10))?;
        let restarted_at = Instant::now();
        println!(
            "{label}: etcd was down {:.1} s; the fewest acks a walker got meanwhile: {}",
            (restarted_at - stopped_at).as_secs_f64(),
            during.iter().map(|(_, n)| *n).min().unwrap_or(0)
        );

        // The restarted etcd still holds the keys on the old leases (their TTL restarts
        // with it), so the members are listed at once whether or not they came back. Past
        // twice the TTL, only keys kept alive since are left: then every member must be
        // listed.
        walkers
            .walk_for(2 * DEFAULT_LEASE_TTL)
            .context("after etcd came back, while the old leases expire")?;
        let after = wait_members_back(cluster, RECOVER_WITHIN).context("after etcd came back")?;
        let members_back = restarted_at.elapsed();
        let nodes: Vec<(String, std::net::SocketAddr)> = cluster
            .shards()
            .iter()
            .map(|s| (format!("shard {}", s.id), s.admin))
            .chain(cluster.gateways().iter().map(|g| (format!("gateway {}", g.id), g.admin)))
            .collect();
        wait_ready(&nodes, RECOVER_WITHIN).context("after etcd came back")?;
        let ready = restarted_at.elapsed();
        walkers.check()?;
        walkers.wait_for_acks(3, Duration::from_secs(10)).context("after etcd came back")?;

        let (mut players, statuses) =
            stop_unnoticed(walkers, 2 * PER_SIDE, "(players must not notice etcd)")?;
        settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after the outage")?;
        owners_at_rest(cluster, &positions(&players), Duration::from_secs(10))
            .context("ownership at rest")?;
        let acks: u64 = statuses.iter().map(|s| s.acks).sum();
        println!(
            "{label}: ok: {acks} acks, 0 refused, 0 disconnects; every member listed on live \
             leases {:.1} s and every node ready {:.1} s after etcd restarted (checked once \
             the old leases had expired); partition epoch {} before, {} after",
            members_back.as_secs_f64(),
            ready.as_secs_f64(),
            before.epoch,
            after.epoch
        );
        Ok(etcd)
    });
    // Only now, with every node stopped (they revoke their leases on the way out).
    drop(etcd);
}
