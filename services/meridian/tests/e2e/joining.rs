//! One more shard for a cluster of `meridian up`, as README says to add it (issue 32):
//! `meridian shard --join <data dir> --id N`, a process of its own with nothing else given.
//! It must take a region, serve players there (moves acknowledged, seen across its border
//! by a player on another shard: the links between them are the cluster's mutual TLS), and
//! on SIGTERM hand its players back and exit 0.

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::pb::Direction;
use meridian_testkit::{deadline, loads, wait_until, Bot, ClusterOptions, ExtraShard, Io};

use crate::{seen_moving, with_cluster};

/// How long a repartition, a readiness or a drain may take.
const STEP_WITHIN: Duration = Duration::from_secs(20);

/// Shard `id`'s region in `status` (the first, if it has several), as (x0, y0, x1, y1).
fn region_of(status: &serde_json::Value, id: u64) -> Option<(u32, u32, u32, u32)> {
    let regions = status["partition"]["regions"].as_array()?;
    let r = regions.iter().find(|r| r["shard"].as_u64() == Some(id))?;
    let get = |k: &str| r[k].as_u64().map(|v| v as u32);
    Some((get("x0")?, get("y0")?, get("x1")?, get("y1")?))
}

/// The owner of cell (x, y) in `status`'s partition.
fn owner_of(status: &serde_json::Value, x: u32, y: u32) -> Option<u64> {
    let regions = status["partition"]["regions"].as_array()?;
    regions
        .iter()
        .find(|r| {
            let get = |k: &str| r[k].as_u64().unwrap_or(0) as u32;
            get("x0") <= x && x < get("x1") && get("y0") <= y && y < get("y1")
        })
        .and_then(|r| r["shard"].as_u64())
}

pub fn a_shard_joins_with_the_data_dir_serves_and_leaves_on_sigterm() {
    with_cluster(ClusterOptions::new(Io::Epoll), |cluster| {
        let mut joined = ExtraShard::join(cluster, 2)?;

        // It takes a region and says it is ready.
        let mut status = serde_json::Value::Null;
        wait_until(deadline(STEP_WITHIN), "the joined shard 2 to own a region", || {
            status = cluster.status_json().unwrap_or_default();
            region_of(&status, 2).is_some() && region_of(&status, 1).is_some()
        })
        .with_context(|| format!("last status: {status}"))?;
        let admin = joined.admin();
        wait_until(deadline(STEP_WITHIN), "the joined shard's /readyz to be 200", || {
            meridian_testkit::http_get(admin, "/readyz").is_ok_and(|(code, _)| code == 200)
        })?;

        // A player logs in on its side of a border with shard 1 and moves: the joined
        // shard owns it and acknowledges every move.
        let (x0, y0, _, y1) = region_of(&status, 2).context("shard 2's region")?;
        let (x, y) = (x0 + 5, (y0 + y1) / 2);
        ensure!(x0 >= 10 && owner_of(&status, x0 - 5, y) == Some(1), "shard 1 west of 2: {status}");
        let mut walker = Bot::connect(cluster.game_addr(0))?;
        walker.login("joiner", Some((x, y)))?;
        let mut at = (x, y);
        for client_time in 1..=3 {
            at = walker.move_ok(Direction::Right, client_time)?;
        }
        ensure!(at == (x + 3, y), "three moves right from ({x}, {y}) end at {at:?}");
        let shards = [(1, cluster.shard(0).admin), (2, admin)];
        let owned = loads(&shards)?;
        ensure!(owned.get(&2) == Some(&1), "the joined shard owns the walker: {owned:?}");

        // A player on shard 1 across the border sees it, and sees it move: shard 2 and
        // shard 1 talk over the cluster's mutual TLS.
        let mut watcher = Bot::connect(cluster.game_addr(0))?;
        let seen = watcher.login("watcher", Some((x0 - 5, y)))?;
        ensure!(
            seen.entered_ids().contains(&walker.id()),
            "the watcher on shard 1 sees the walker on shard 2 at login: {:?}",
            seen.after
        );
        at = walker.move_ok(Direction::Up, 4)?;
        watcher.expect_messages(&[seen_moving(&walker, at.0, at.1)])?;

        // SIGTERM: it hands the walker back to shard 1 and exits 0; the walker plays on.
        joined.terminate()?;
        let exit = joined.wait_exit(STEP_WITHIN)?;
        ensure!(exit.success(), "the joined shard exited with {exit} after SIGTERM");
        wait_until(deadline(STEP_WITHIN), "shard 1 alone to own the map again", || {
            status = cluster.status_json().unwrap_or_default();
            region_of(&status, 2).is_none() && region_of(&status, 1).is_some()
        })
        .with_context(|| format!("last status: {status}"))?;
        let before = at;
        at = walker.move_ok(Direction::Down, 5)?;
        ensure!(at == (before.0, before.1 + 1), "the walker moved down from {before:?}: {at:?}");
        let owned = loads(&shards[..1])?;
        ensure!(owned.get(&1) == Some(&2), "shard 1 owns both players now: {owned:?}");
        Ok(())
    })
}
