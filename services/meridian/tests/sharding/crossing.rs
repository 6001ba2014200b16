//! Crossing under load: 100 bots walk back and forth across the border at x = 200, three
//! cells each side (x 197..=202), one move every 50 ms, for seconds on end, while 24 bots
//! stand still on both sides, some of them exactly at the edge of sight of the walkers'
//! turning points. Every move must be answered by its own ack, in order; nobody may be
//! disconnected; every stream must stay exact (the standing observers' checks have no slack
//! at all: a walker that stays in sight must only ever be `Moved`); at rest every view must
//! equal the truth, each walker must be owned by the shard of its cell, and its generation
//! must count exactly its border crossings.
//!
//! The one-shard variant runs the same walk (shorter) where there is no border, to show the
//! checks hold on a world known to work.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::Direction;
use meridian_testkit::{
    owners_at_rest, settle, test_seed, wait_for_expected_partition, wait_for_partition, Action,
    ClusterOptions, Fleet, FleetOptions, Io, Partition, Script, SlotScript, SEED_ENV,
};

use crate::{with_cluster, MAP, SIGHT};

const WALKERS: usize = 100;
/// Walkers turn at these columns: three cells each side of the border at x = 200.
const WEST_TURN: u32 = 197;
const EAST_TURN: u32 = 202;
/// Standing observers: x = 180 sees a walker up to x = 200, x = 219 from x = 199 on (edge
/// of sight inside the walk); 185 and 215 see the whole walk.
const OBSERVER_COLUMNS: [u32; 4] = [180, 185, 215, 219];
const OBSERVERS_PER_COLUMN: u32 = 6;
const MOVE_EVERY: Duration = Duration::from_millis(50);

/// The cell mirroring `x` across the border between 199 and 200.
fn mirror(x: u32) -> u32 {
    WEST_TURN + EAST_TURN - x
}

/// The script: walkers come in mirrored pairs, one each side of the border, logging in
/// together and moving at the same instants in opposite directions, and standing observers
/// log in in pairs on both sides too, so both shards always carry the same load and the
/// coordinator has no reason to move the border for load. Logins during the first second;
/// walking from 1.5 s for `walk`. The seed staggers the pairs and picks their first
/// directions; the walk itself is a fixed back-and-forth.
fn script(seed: u64, walk: Duration) -> Script {
    let mut rng = meridian_testkit::Rng::new(seed);
    let mut script = Script::new(seed, MAP, SIGHT);
    let pairs = WALKERS / 2;
    for k in 0..pairs {
        let login_at = Duration::from_millis(rng.below(1000));
        let start = Duration::from_millis(1500 + rng.below(50));
        let y = 10 + (k as u32) * 380 / pairs as u32;
        let west_x = WEST_TURN + (k as u32) % 3;
        let west_first = if rng.chance(0.5) { Direction::Right } else { Direction::Left };
        for (member, first_x, first_direction, dy) in
            [(0, west_x, west_first, 0), (1, mirror(west_x), opposite(west_first), 3)]
        {
            let i = 2 * k + member;
            let mut slot = SlotScript::new(i, i % 2);
            let mut x = first_x;
            slot.login(login_at, &format!("walker{i:03}"), (x, y + dy));
            let mut direction = first_direction;
            let mut at = start;
            while at < start + walk {
                if x == EAST_TURN {
                    direction = Direction::Left;
                } else if x == WEST_TURN {
                    direction = Direction::Right;
                }
                x = if direction == Direction::Right { x + 1 } else { x - 1 };
                slot.push(at, Action::Move(direction));
                at += MOVE_EVERY;
            }
            script.slots.push(slot);
        }
    }
    for k in 0..OBSERVERS_PER_COLUMN {
        let login_at = Duration::from_millis(rng.below(1000));
        for (c, &x) in OBSERVER_COLUMNS.iter().enumerate() {
            let i = script.slots.len();
            let mut slot = SlotScript::new(i, i % 2);
            let y = 20 + k * 60 + c as u32 * 7;
            slot.login(login_at, &format!("observer{x}-{k}"), (x, y));
            script.slots.push(slot);
        }
    }
    script
}

fn opposite(direction: Direction) -> Direction {
    if direction == Direction::Right {
        Direction::Left
    } else {
        Direction::Right
    }
}

fn crossing(io: Io, shards: usize, walk: Duration) {
    let seed = test_seed("sharding::crossing", 7);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), {shards} shards, crossing under load");
    let opts = ClusterOptions::new(io).shards(shards).gateways(2);
    with_cluster(&label.clone(), opts, |cluster| {
        let partition = if shards > 1 {
            wait_for_expected_partition(cluster, Duration::from_secs(10))?
        } else {
            wait_for_partition(cluster, Duration::from_secs(10))?
        };
        let layout = Partition::expected(&[1, 2], MAP.0, MAP.1);
        if shards == 2 {
            ensure!(
                partition.owner((199, 100)) != partition.owner((200, 100)),
                "the walk assumes a border between x = 199 and x = 200: {partition}"
            );
        }
        let script = script(seed, walk);
        eprintln!("{label}: {script}; partition {partition}");
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let fleet = Fleet::start(&script, FleetOptions::new(gateways, "fleet"))?;
        let mut players = fleet.finish(Duration::from_secs(30))?;

        // Nobody was disconnected, every move was answered by its own ack.
        ensure!(
            players.len() == script.slots.len(),
            "{} of {} bots are still logged in at the end",
            players.len(),
            script.slots.len()
        );
        let mut acks = 0;
        let mut crossings = BTreeMap::new();
        for (player, slot) in players.iter().zip(&script.slots) {
            let stats = player.bot.stream_check().context("stream checks are on")?.stats();
            ensure!(
                stats.acks == slot.moves() as u64 && stats.move_errors.is_empty(),
                "{}: {} moves, {} acks, errors {:?}",
                player.name,
                slot.moves(),
                stats.acks,
                stats.move_errors
            );
            acks += stats.acks;
            let (name, path) = slot.paths(MAP).pop().context("every slot logs in")?;
            ensure!(
                player.position() == *path.last().context("a path has a start")?,
                "{name} ended at {:?}, the script says {:?}",
                player.position(),
                path.last()
            );
            crossings.insert(player.id(), (name, layout.owner_changes(path)));
        }
        let total_crossings: u64 = crossings.values().map(|(_, n)| n).sum();
        eprintln!("{label}: {acks} moves acknowledged, {total_crossings} border crossings");

        let truth = settle(&mut players, SIGHT, Duration::from_secs(5))
            .context("at rest after the walk")?;
        if shards > 1 {
            let positions = truth.players.iter().map(|(id, seen)| (*id, seen.position)).collect();
            let (at_rest, sample) = owners_at_rest(cluster, &positions, Duration::from_secs(5))
                .context("ownership at rest")?;
            let owners = sample.owners();
            if at_rest.epoch != partition.epoch {
                // The load was balanced by construction; if borders moved anyway, owner
                // changes are no longer the crossings of the fixed border, but the walk must
                // still have crossed a border most of the time, or it tested nothing.
                let handoffs: u64 = owners.values().map(|(_, generation)| generation).sum();
                eprintln!(
                    "{label}: NOTE the partition changed during the run ({partition} -> \
                     {at_rest}): {handoffs} owner changes for {total_crossings} crossings of \
                     the original border; the exact generation check is skipped"
                );
                ensure!(
                    handoffs * 2 >= total_crossings,
                    "the border moved away from the walk during the run ({partition} -> \
                     {at_rest}, though both sides carried the same load): only {handoffs} \
                     owner changes for {total_crossings} crossings of the original border, so \
                     crossing under load was hardly tested"
                );
                return Ok(());
            }
            let wrong: Vec<String> = crossings
                .iter()
                .filter_map(|(id, (name, crossed))| {
                    let generation = owners.get(id).map(|(_, g)| *g);
                    (generation != Some(*crossed)).then(|| {
                        format!(
                            "{name} (id {id}) crossed {crossed} times, generation {generation:?}"
                        )
                    })
                })
                .take(20)
                .collect();
            if !wrong.is_empty() {
                bail!(
                    "a player's generation counts its owner changes, one per border crossing: {wrong:?}"
                );
            }
        }
        Ok(())
    });
}

/// Two shards split at x = 200, ten seconds of crossing.
pub fn crossing_under_load_2_shards(io: Io) {
    crossing(io, 2, Duration::from_secs(10));
}

/// The same walk on one shard (no border), shorter: the checks on a world known to work.
pub fn crossing_under_load_single_world(io: Io) {
    crossing(io, 1, Duration::from_secs(4));
}
