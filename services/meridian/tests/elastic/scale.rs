//! Scale 2 -> 4 -> 2 under load: 80 bots walk around the centre of the map (where the
//! borders of every layout meet) while shard 3 and shard 4 join (`meridian shard` started
//! by the test, as a StatefulSet scaling out) and then leave again (`meridian drain --wait`,
//! what the chart's preStop hook runs). Every layout change hands players over with the
//! ordered handoff: nobody may be disconnected, every move must be answered by its own ack
//! (no refusal is allowed), every stream must stay exact (observers see a player that stays
//! in sight only `Moved`, never `Left` + `Entered`), each step must finish (every player
//! owned by the shard of its cell, at the new epoch) within a deadline, and at rest every
//! view must equal the truth and every player be owned exactly once by the owner of its
//! cell. Time and handoffs per step are printed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::{
    drain_shard, metric_total, owners_at_rest, settle, test_seed, wait_for_expected_partition,
    wait_until, Area, Cluster, ExtraShard, Io, Partition, Rng, Sample, WalkOptions, Walkers,
    DEFAULT_LEASE_TTL, SEED_ENV,
};

use crate::{
    options, positions, stop_unnoticed, walkers_in, with_cluster, RESUME_KEY_HEX, SETTLE_WITHIN,
    SIGHT,
};

const WALKERS: usize = 80;
/// Around the centre: with 2 shards the border x = 200 runs through it, with 3 and 4 the
/// corner (200, 200) is in its middle.
const AREA: (u32, u32) = (130, 270);
/// How long one scale step may take, from the command to every player at its new owner.
const STEP_WITHIN: Duration = Duration::from_secs(30);
/// `meridian drain --wait --timeout`.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Step {
    Join(u32),
    Drain(u32),
}

/// Per shard: (handoffs in, handoffs out), from its `/metrics`.
fn handoff_counters(live: &[(u32, SocketAddr)]) -> anyhow::Result<BTreeMap<u32, (f64, f64)>> {
    live.iter()
        .map(|&(id, admin)| {
            let handoffs_in = metric_total(admin, "meridian_shard_handoffs_in_total")?;
            let handoffs_out = metric_total(admin, "meridian_shard_handoffs_out_total")?;
            Ok((id, (handoffs_in, handoffs_out)))
        })
        .collect()
}

/// Where a scale step stands.
enum StepState {
    /// The partition has exactly the live shards, every live shard is at its epoch, every
    /// logged-in player is listed, each by the owner of the cell it is listed at (its
    /// highest generation), and a joined shard owns somebody.
    Done(Partition),
    /// What is still missing, and the partition as published then (if any).
    Pending(String, Option<Partition>),
}

fn step_state(
    cluster: &Cluster,
    live: &[(u32, SocketAddr)],
    owners: &BTreeSet<u32>,
    players: &BTreeSet<u64>,
    joined: Option<u32>,
) -> anyhow::Result<StepState> {
    let Some(partition) = Partition::from_status(&cluster.status_json()?)? else {
        return Ok(StepState::Pending("no partition published".to_string(), None));
    };
    let pending = |what: String| Ok(StepState::Pending(what, Some(partition.clone())));
    if partition.owners() != *owners {
        return pending(format!("the partition's owners are {:?}", partition.owners()));
    }
    let sample = Sample::take(live)?;
    for answer in &sample.answers {
        if answer.report.epoch != partition.epoch {
            return pending(format!("shard {} is at epoch {}", answer.shard, answer.report.epoch));
        }
    }
    let highest = sample.owners();
    let missing: Vec<&u64> = players.iter().filter(|id| !highest.contains_key(id)).collect();
    if !missing.is_empty() {
        return pending(format!("players listed by no shard: {missing:?}"));
    }
    for answer in &sample.answers {
        for p in &answer.report.players {
            let (_, generation) = highest[&p.id];
            let owner = partition.owner((p.x, p.y));
            if p.generation == generation && owner != Some(answer.shard) {
                return pending(format!(
                    "player {} at {:?} is still owned by shard {} (its cell is shard {owner:?}'s)",
                    p.id,
                    (p.x, p.y),
                    answer.shard
                ));
            }
        }
    }
    if let Some(joined) = joined {
        if !highest.values().any(|(shard, _)| *shard == joined) {
            return pending(format!("the new shard {joined} owns nobody"));
        }
    }
    Ok(StepState::Done(partition))
}

/// Waits until the step is done (see [`StepState::Done`]); the error says what was left.
fn wait_step_done(
    cluster: &Cluster,
    walkers: &Walkers,
    live: &[(u32, SocketAddr)],
    players: &BTreeSet<u64>,
    joined: Option<u32>,
) -> anyhow::Result<Partition> {
    let owners: BTreeSet<u32> = live.iter().map(|(id, _)| *id).collect();
    let mut state = StepState::Pending("not looked at yet".to_string(), None);
    let mut error = None;
    let waited = wait_until(
        Instant::now() + STEP_WITHIN,
        &format!("the partition to be {owners:?}, with every player at the owner of its cell"),
        || {
            if walkers.failure().is_some() {
                return true;
            }
            match step_state(cluster, live, &owners, players, joined) {
                Ok(now) => {
                    state = now;
                    matches!(state, StepState::Done(_))
                }
                Err(e) => {
                    error = Some(e);
                    true
                }
            }
        },
    );
    walkers.check()?;
    if let Some(e) = error {
        return Err(e);
    }
    match (waited, state) {
        (Ok(()), StepState::Done(partition)) => Ok(partition),
        (waited, StepState::Pending(what, partition)) => {
            let partition = partition.map_or("none".to_string(), |p| p.to_string());
            let waited = waited.err().map_or(String::new(), |e| format!("{e:#}; "));
            bail!("{waited}last problem: {what}; partition {partition}")
        }
        (Err(e), StepState::Done(_)) => Err(e),
    }
}

/// Joins and drains shards step by step under the walkers; returns a line of figures per
/// step. The shards it starts are dropped (killed, if still running) when it returns.
fn scale_steps(
    cluster: &Cluster,
    walkers: &Walkers,
    players: &BTreeSet<u64>,
    label: &str,
) -> anyhow::Result<Vec<String>> {
    let mut live: Vec<(u32, SocketAddr)> = Sample::shards_of(cluster);
    let mut extra: BTreeMap<u32, ExtraShard> = BTreeMap::new();
    let mut figures = Vec::new();
    for step in [Step::Join(3), Step::Join(4), Step::Drain(3), Step::Drain(4)] {
        let before = handoff_counters(&live)?;
        let started = Instant::now();
        let joined = match step {
            Step::Join(id) => {
                let shard = ExtraShard::start(cluster, id, RESUME_KEY_HEX, DEFAULT_LEASE_TTL)?;
                live.push((id, shard.admin()));
                extra.insert(id, shard);
                Some(id)
            }
            Step::Drain(id) => {
                let drained =
                    drain_shard(cluster, id, DRAIN_TIMEOUT).with_context(|| format!("{step:?}"))?;
                let mut shard =
                    extra.remove(&id).context("only shards the test started are drained")?;
                let status = shard.wait_exit(Duration::from_secs(10))?;
                ensure!(
                    status.success(),
                    "shard {id} exited with {status} after its drain, expected 0; its log:\n{}",
                    shard.log_tail()
                );
                println!(
                    "{label}: `meridian drain {id} --wait` took {:.1} s:\n  {}",
                    drained.took.as_secs_f64(),
                    drained.output.trim().replace('\n', "\n  ")
                );
                live.retain(|(shard, _)| *shard != id);
                None
            }
        };
        let partition = wait_step_done(cluster, walkers, &live, players, joined)
            .with_context(|| format!("{step:?}"))?;
        let took = started.elapsed();
        let after = handoff_counters(&live)?;
        let received: f64 =
            after.iter().map(|(id, (n, _))| n - before.get(id).map_or(0.0, |(n, _)| *n)).sum();
        let by_shard: Vec<String> = after
            .iter()
            .map(|(id, (n_in, n_out))| {
                let (b_in, b_out) = before.get(id).copied().unwrap_or_default();
                format!("shard {id} in +{} out +{}", n_in - b_in, n_out - b_out)
            })
            .collect();
        let figure = format!(
            "{step:?}: {:.1} s to every player at its new owner, {received} handoffs received \
             ({}); partition {partition}",
            took.as_secs_f64(),
            by_shard.join(", ")
        );
        println!("{label}: {figure}");
        figures.push(figure);
        // Everybody keeps playing after the step.
        walkers
            .wait_for_acks(3, Duration::from_secs(10))
            .with_context(|| format!("after {step:?}"))?;
    }
    Ok(figures)
}

pub fn scale_2_4_2_under_load(io: Io) {
    let seed = test_seed("elastic::scale", 2_4_2);
    let label = format!("seed {seed} ({SEED_ENV}={seed}), scale 2-4-2 under load");
    with_cluster(&label.clone(), options(io, 2), |cluster| {
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(10))?;
        let mut rng = Rng::new(seed);
        let area = Area::new(AREA.0..=AREA.1, AREA.0..=AREA.1);
        let specs = walkers_in("w", WALKERS, area, &mut rng);
        let gateways = cluster.gateways().iter().map(|g| g.game).collect();
        let walk = WalkOptions::new(gateways, seed, label.clone());
        println!(
            "{label}: {WALKERS} walkers in {area:?}, a move every {:?}; partition {partition}",
            walk.move_every
        );
        let walkers = Walkers::start(&specs, walk)?;
        walkers.wait_logged_in(Duration::from_secs(15))?;
        walkers.wait_for_acks(3, Duration::from_secs(10))?;
        let players: BTreeSet<u64> = walkers.status().iter().filter_map(|s| s.id).collect();

        let figures = match scale_steps(cluster, &walkers, &players, &label) {
            Ok(figures) => figures,
            // The shards the test started have been killed; their logs stay in the
            // cluster's temp dir, which is kept when the test fails.
            Err(e) => bail!(
                "{e:?}\n(the logs of shards 3 and 4: extra-shard-3.log and extra-shard-4.log in \
                 {})",
                cluster.dir().display()
            ),
        };

        let (mut players, statuses) =
            stop_unnoticed(walkers, WALKERS, "in a run where nothing fails")?;
        settle(&mut players, SIGHT, SETTLE_WITHIN).context("at rest after scaling")?;
        let (at_rest, _) = owners_at_rest(cluster, &positions(&players), Duration::from_secs(10))
            .context("ownership at rest")?;
        let moves: u64 = statuses.iter().map(|s| s.moves).sum();
        let acks: u64 = statuses.iter().map(|s| s.acks).sum();
        println!(
            "{label}: ok: {moves} moves, {acks} acks, 0 refused, 0 disconnects; views equal \
             the truth and ownership exact at rest; partition {at_rest}\n  {}",
            figures.join("\n  ")
        );
        Ok(())
    });
}
