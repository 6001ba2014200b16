//! What the core tells about itself: the `/players` report, the load profile the
//! coordinator draws borders by, and the live map's density. Pure functions of the parts
//! they read; only `ShardCore` calls them, for the shell's admin routes.

use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use meridian_cluster::{DensityReport, LoadProfile, ShardId};
use meridian_world::{PlayerId, World};

use crate::handoffs::Handoffs;
use crate::types::Seat;

/// A handed-off player stays listed by the old owner this long after the new owner
/// confirmed (so a sequential sample of all shards always finds it somewhere).
const LISTED_AFTER_ACK: Duration = Duration::from_secs(1);

/// Where this shard's players stand, and how crowded, by band of `LOAD_BAND` columns and
/// rows.
pub(crate) fn load_profile(world: &World) -> LoadProfile {
    let config = world.config();
    let band = meridian_cluster::LOAD_BAND;
    let (columns, rows) =
        (config.width.div_ceil(band) as usize, config.height.div_ceil(band) as usize);
    let mut load = LoadProfile {
        x: vec![0; columns],
        y: vec![0; rows],
        crowd_x: vec![0; columns],
        crowd_y: vec![0; rows],
    };
    for (_, at) in world.local_players() {
        let (column, row) = ((at.x / band) as usize, (at.y / band) as usize);
        let crowd = LoadProfile::crowd_weight(world.crowding(at));
        load.x[column] += 1;
        load.y[row] += 1;
        load.crowd_x[column] += crowd;
        load.crowd_y[row] += crowd;
    }
    load
}

/// Players per square of [`meridian_cluster::DENSITY_CELL`] cells, squares with
/// players only (`ready` is filled in by the admin route).
pub(crate) fn density(world: &World, shard: ShardId, epoch: u64) -> DensityReport {
    let cell = meridian_cluster::DENSITY_CELL;
    let mut squares: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
    for (_, at) in world.local_players() {
        *squares.entry((at.x / cell, at.y / cell)).or_default() += 1;
    }
    let mut npcs: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
    for (_, at, _) in world.npcs() {
        *npcs.entry((at.x / cell, at.y / cell)).or_default() += 1;
    }
    DensityReport {
        npcs: npcs.into_iter().map(|((column, row), n)| [column, row, n]).collect(),
        shard: shard.0,
        epoch,
        ready: false,
        cell,
        counts: squares.into_iter().map(|((column, row), n)| [column, row, n]).collect(),
    }
}

/// The `/players` report: JSON of the players this shard owns, those handed off lately,
/// and its NPCs.
pub(crate) fn players(
    world: &World,
    seats: &FxHashMap<PlayerId, Seat>,
    handoffs: &Handoffs,
    (shard, epoch): (ShardId, u64),
    now: Instant,
) -> String {
    let mut players: Vec<String> = seats
        .iter()
        .filter(|(_, seat)| !seat.npc)
        .filter_map(|(id, seat)| {
            let at = world.position(*id)?;
            Some(format!(
                "{{\"id\":{},\"generation\":{},\"x\":{},\"y\":{}}}",
                id.0, seat.generation, at.x, at.y
            ))
        })
        .collect();
    for (id, handed) in handoffs.iter() {
        if !handed.npc && handed.acked.is_none_or(|acked| now - acked < LISTED_AFTER_ACK) {
            players.push(format!(
                "{{\"id\":{},\"generation\":{},\"x\":{},\"y\":{}}}",
                id.0, handed.generation, handed.at.x, handed.at.y
            ));
        }
    }
    let npcs: Vec<String> = world
        .npcs()
        .map(|(id, at, kind)| {
            format!("{{\"id\":{},\"kind\":{kind},\"x\":{},\"y\":{}}}", id.0, at.x, at.y)
        })
        .collect();
    format!(
        "{{\"shard\":{},\"epoch\":{},\"players\":[{}],\"npcs\":[{}]}}",
        shard.0,
        epoch,
        players.join(","),
        npcs.join(",")
    )
}
