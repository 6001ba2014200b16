//! Sight across borders, step by step: every login, move, chat and logout is checked against
//! what one server running the whole world would send each bot, exactly (see
//! `meridian_testkit::Scene`). Bots on different shards and gateways see each other within
//! 20 cells; a bot that crosses a border keeps its connection and its acks, and whoever keeps
//! it in sight sees only `Moved`, never `Left` + `Entered`; sight starts and ends at the same
//! step as in one world, also when that step is a crossing.

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::pb::Direction::{self, Down, Left, Right, Up};
use meridian_testkit::{
    wait_for_expected_partition, wait_for_partition, Border, Cluster, ClusterOptions, Io,
    Partition, Scene,
};

use crate::{with_cluster, MAP, SIGHT};

/// The layout a test is written for: the live one on a sharded cluster (checked against
/// DESIGN.md), the promised one for `layout_shards` on a one-shard cluster, where the same
/// walk runs with no border at all.
fn layout(cluster: &Cluster, layout_shards: u32) -> anyhow::Result<Partition> {
    if cluster.shards().len() > 1 {
        wait_for_expected_partition(cluster, Duration::from_secs(10))
    } else {
        wait_for_partition(cluster, Duration::from_secs(10))?;
        let ids: Vec<u32> = (1..=layout_shards).collect();
        Ok(Partition::expected(&ids, MAP.0, MAP.1))
    }
}

fn step(at: (u32, u32), direction: Direction, n: u32) -> (u32, u32) {
    match direction {
        Right => (at.0 + n, at.1),
        Left => (at.0 - n, at.1),
        Down => (at.0, at.1 + n),
        Up => (at.0, at.1 - n),
        Direction::Unspecified => at,
    }
}

fn opposite(direction: Direction) -> Direction {
    match direction {
        Right => Left,
        Left => Right,
        Down => Up,
        Up => Down,
        Direction::Unspecified => Direction::Unspecified,
    }
}

fn repeat(direction: Direction, n: usize) -> Vec<Direction> {
    vec![direction; n]
}

/// The draft's story on two shards and two gateways: alice and bob on either side of the
/// border see each other and chat; bob walks into alice's region and back; carl, 30 from
/// alice, comes into her sight exactly when she has crossed far enough toward him.
fn border_story(cluster: &Cluster, regions: &Partition) -> anyhow::Result<()> {
    let border = regions
        .borders()
        .into_iter()
        .find(|b| matches!(b, Border::Vertical { .. }))
        .with_context(|| format!("no vertical border in {regions}"))?;
    let across = border.across();
    let back = opposite(across);
    // The last cell before the border, half-way along it.
    let edge = step(border.point(border.len() / 2), back, 1);
    let alice_at = step(edge, back, 4);
    let bob_at = step(edge, across, 6);
    let carl_at = step(bob_at, across, 20);
    ensure!(
        regions.owner(alice_at) != regions.owner(bob_at),
        "alice at {alice_at:?} and bob at {bob_at:?} should be on different shards: {regions}"
    );

    let mut scene = Scene::new(MAP, SIGHT);
    let alice = scene.login(cluster.game_addr(0), "alice", alice_at)?;
    let bob = scene.login(cluster.game_addr(1 % cluster.gateways().len()), "bob", bob_at)?;
    scene.chat(alice, "across the border")?;
    scene.chat(bob, "right back at you")?;

    // bob walks 7 cells toward alice, into her shard's region, and back.
    scene.walk(bob, &repeat(back, 7))?;
    scene.chat(bob, "on your side now")?;
    scene.walk(bob, &repeat(across, 7))?;

    // carl, 20 past bob: bob sees him, alice (30 away) does not, until she crosses (at her
    // 5th move) and gets within 20 of him (at her 10th).
    let carl = scene.login(cluster.game_addr(0), "carl", carl_at)?;
    scene.walk(alice, &repeat(across, 10))?;
    scene.chat(carl, "hello newcomer")?;
    ensure!(
        regions.owner(scene.position(alice)) == regions.owner(scene.position(carl)),
        "alice ended on carl's shard"
    );
    // And all the way back, out of carl's sight at the same step as in one world.
    scene.walk(alice, &repeat(back, 10))?;
    scene.logout(carl)?;
    scene.finish()
}

pub fn sight_across_a_shard_border(io: Io) {
    let opts = ClusterOptions::new(io).shards(2).gateways(2);
    with_cluster("sight across a shard border (2 shards)", opts, |cluster| {
        let regions = layout(cluster, 2)?;
        border_story(cluster, &regions)
    });
}

/// Four bots, one in each quadrant around a corner where `ways` shards meet (bots sharing a
/// shard where only three meet). All see each other at once; one walks a 10-cell square
/// around the corner through every region, then a tight 1-cell square around the corner
/// point itself (a handoff every move); another walks out of everybody's sight and back.
fn corner_story(cluster: &Cluster, regions: &Partition, ways: usize) -> anyhow::Result<()> {
    let (corner, _) = regions
        .corners()
        .into_iter()
        .find(|(_, w)| *w == ways)
        .with_context(|| format!("no {ways}-way corner in {regions}"))?;
    let (cx, cy) = corner;
    let nw = (cx - 3, cy - 3);
    let ne = (cx + 2, cy - 3);
    let sw = (cx - 3, cy + 2);
    let se = (cx + 2, cy + 2);
    let owners: std::collections::BTreeSet<Option<u32>> =
        [nw, ne, sw, se].iter().map(|c| regions.owner(*c)).collect();
    ensure!(
        owners.len() == ways,
        "the quadrants around {corner:?} should belong to {ways} shards: {regions}"
    );

    let gateways = cluster.gateways().len();
    let mut scene = Scene::new(MAP, SIGHT);
    let mut who = Vec::new();
    for (i, (name, at)) in [("nw", nw), ("ne", ne), ("sw", sw), ("se", se)].into_iter().enumerate()
    {
        who.push(scene.login(cluster.game_addr(i % gateways), name, at)?);
    }
    let [nw, ne, sw, se] = [who[0], who[1], who[2], who[3]];
    for (i, &speaker) in who.iter().enumerate() {
        scene.chat(speaker, &format!("hello from quadrant {i}"))?;
    }

    // A square around the corner through every region: nw -> ne's cell -> se's -> sw's ->
    // home.
    let square: Vec<Direction> =
        [Right, Down, Left, Up].into_iter().flat_map(|d| repeat(d, 5)).collect();
    scene.walk(nw, &square)?;

    // Up to the corner point, then around it on the four cells that touch it (a border
    // crossed at every move), twice.
    scene.walk(nw, &[Right, Right, Down, Down])?;
    ensure!(scene.position(nw) == (cx - 1, cy - 1), "nw is next to the corner");
    for _ in 0..2 {
        scene.walk(nw, &[Right, Down, Left, Up])?;
        scene.chat(nw, "round the corner")?;
    }

    // se walks east until the western bots lose sight of it, and comes back.
    scene.walk(se, &repeat(Right, 16))?;
    scene.chat(se, "anyone there?")?;
    scene.walk(se, &repeat(Left, 16))?;
    // ne walks north out of sight of the southern bots, and back.
    scene.walk(ne, &repeat(Up, 16))?;
    scene.walk(ne, &repeat(Down, 16))?;
    // sw crosses into se's region along the bottom, and back.
    scene.walk(sw, &repeat(Right, 6))?;
    scene.walk(sw, &repeat(Left, 6))?;
    scene.logout(ne)?;
    scene.finish()
}

pub fn four_way_corner(io: Io) {
    let opts = ClusterOptions::new(io).shards(4).gateways(2);
    with_cluster("four-way corner (2x2 shards)", opts, |cluster| {
        let regions = layout(cluster, 4)?;
        corner_story(cluster, &regions, 4)
    });
}

pub fn three_way_corner(io: Io) {
    let opts = ClusterOptions::new(io).shards(3).gateways(2);
    with_cluster("three-way corner (3 shards)", opts, |cluster| {
        let regions = layout(cluster, 3)?;
        corner_story(cluster, &regions, 3)
    });
}

/// A bot crosses a border back and forth while standing observers on both sides watch,
/// some keeping it in sight throughout (only `Moved`, ever), some at the edge of sight so
/// that it comes and goes exactly at the step one world would say.
fn crossing_story(cluster: &Cluster, regions: &Partition) -> anyhow::Result<()> {
    let border = regions
        .borders()
        .into_iter()
        .find(|b| matches!(b, Border::Vertical { .. }))
        .with_context(|| format!("no vertical border in {regions}"))?;
    let (bx, by) = border.point(border.len() / 2);
    // The walker goes between bx - 3 and bx + 2 (cells), like the load test's walkers.
    let walker_at = (bx - 3, by);
    let gateways = cluster.gateways().len();
    let mut scene = Scene::new(MAP, SIGHT);
    let observers = [
        ("west-near", (bx - 12, by + 3)),
        ("east-near", (bx + 10, by - 4)),
        // Sees the walker up to x = bx (cell bx is the first past the border).
        ("west-edge", (bx - 20, by + 10)),
        // Sees the walker from x = bx - 1 on.
        ("east-edge", (bx + 19, by - 12)),
        // Below the walker, on its path's side: sees it all the way.
        ("south", (bx, by + 20)),
    ];
    for (i, (name, at)) in observers.into_iter().enumerate() {
        scene.login(cluster.game_addr(i % gateways), name, at)?;
    }
    let walker = scene.login(cluster.game_addr(1 % gateways), "walker", walker_at)?;
    for round in 0..3 {
        scene.walk(walker, &repeat(Right, 5))?;
        scene.chat(walker, &format!("east, round {round}"))?;
        scene.walk(walker, &repeat(Left, 5))?;
        scene.chat(walker, &format!("west, round {round}"))?;
    }
    scene.finish()
}

pub fn crossing_observers_see_only_moves(io: Io) {
    let opts = ClusterOptions::new(io).shards(2).gateways(2);
    with_cluster("crossing seen as moves (2 shards)", opts, |cluster| {
        let regions = layout(cluster, 2)?;
        crossing_story(cluster, &regions)
    });
}

/// Every story above on one shard, where the same walks meet no border: the expectations
/// are those of one world by construction, so this shows the stories themselves are right.
/// Each story logs its bots out at the end, so they can share the map one after another.
pub fn single_world_walks(io: Io) {
    let opts = ClusterOptions::new(io).gateways(2);
    with_cluster("border stories on one shard", opts, |cluster| {
        border_story(cluster, &layout(cluster, 2)?).context("the border story")?;
        crossing_story(cluster, &layout(cluster, 2)?).context("the crossing story")?;
        corner_story(cluster, &layout(cluster, 4)?, 4).context("the four-way corner story")?;
        corner_story(cluster, &layout(cluster, 3)?, 3).context("the three-way corner story")
    });
}
