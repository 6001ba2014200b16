//! Conservation (DESIGN.md section 1): every logged-in player is owned by exactly one shard
//! at every moment. Checked from each shard's `GET /players`:
//! `{"shard":1,"epoch":E,"players":[{"id":17,"generation":3,"x":10,"y":20}, ...]}`, where
//! `generation` counts the player's owner changes and the old owner keeps listing a player
//! handed off (with the old generation) until the new owner confirms.
//!
//! A [`Sample`] asks every shard at once. Per sample, soundly: no shard lists an id twice, no
//! (id, generation) appears on two shards, every listed id is logged in, and the highest
//! generation of a player never goes down for two samples in a row.
//!
//! "Every logged-in player is listed" needs care, because the shards are asked at slightly
//! different instants: a player handed from X to Y can be missed if Y answered before it
//! started listing the player and X after it stopped. [`Conservation`] therefore judges a
//! missing player once it is seen again: if its generation did not change around the gap,
//! its owner never changed and the gap is a violation; if it changed by exactly one, the gap
//! is excused only when Y's answer may have been taken before X's (Y's request started before
//! X's answer ended); larger jumps are excused (several handoffs, order unknown). A player
//! never seen again is a violation. At rest ([`owners_at_rest`]) the check is exact.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::cluster::Cluster;
use crate::http::http_get;
use crate::partition::Partition;
use crate::wait::{deadline, wait_until};

/// One player as its shard lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct OwnedPlayer {
    pub id: u64,
    pub generation: u64,
    pub x: u32,
    pub y: u32,
}

/// A shard's answer to `GET /players`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlayersReport {
    pub shard: u32,
    pub epoch: u64,
    pub players: Vec<OwnedPlayer>,
}

/// `GET /players` on a shard's admin port.
pub fn fetch_players(admin: SocketAddr) -> anyhow::Result<PlayersReport> {
    let (code, body) = http_get(admin, "/players")?;
    if code != 200 {
        bail!(
            "GET /players on shard admin port {admin} answered {code} ({:?}); conservation \
             tests need every shard to list the players it owns there",
            body.trim()
        );
    }
    serde_json::from_str(&body).with_context(|| {
        format!("GET /players on {admin}: not {{shard, epoch, players:[{{id, generation, x, y}}]}}: {body}")
    })
}

/// One shard's part of a sample, with when the request started and the answer ended.
#[derive(Debug, Clone)]
pub struct ShardAnswer {
    pub shard: u32,
    pub started: Instant,
    pub finished: Instant,
    pub report: PlayersReport,
}

/// Every shard's `/players`, asked at the same time.
#[derive(Debug, Clone)]
pub struct Sample {
    pub answers: Vec<ShardAnswer>,
}

impl Sample {
    /// Asks every shard in `shards` (id, admin address) at once, one thread each.
    pub fn take(shards: &[(u32, SocketAddr)]) -> anyhow::Result<Sample> {
        let results: Vec<anyhow::Result<ShardAnswer>> = std::thread::scope(|scope| {
            let handles: Vec<_> = shards
                .iter()
                .map(|&(shard, admin)| {
                    scope.spawn(move || {
                        let started = Instant::now();
                        let report = fetch_players(admin)
                            .with_context(|| format!("sampling shard {shard}"))?;
                        Ok(ShardAnswer { shard, started, finished: Instant::now(), report })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| bail!("a sampling thread panicked")))
                .collect()
        });
        Ok(Sample { answers: results.into_iter().collect::<anyhow::Result<_>>()? })
    }

    /// The shards of a cluster, for [`Sample::take`].
    pub fn shards_of(cluster: &Cluster) -> Vec<(u32, SocketAddr)> {
        cluster.shards().iter().map(|s| (s.id, s.admin)).collect()
    }

    /// For each listed id, its highest generation and the shard listing it.
    pub fn owners(&self) -> Owners {
        let mut owners = Owners::new();
        for answer in &self.answers {
            for p in &answer.report.players {
                let entry = owners.entry(p.id).or_insert((answer.shard, p.generation));
                if p.generation > entry.1 {
                    *entry = (answer.shard, p.generation);
                }
            }
        }
        owners
    }

    fn answer_of(&self, shard: u32) -> Option<&ShardAnswer> {
        self.answers.iter().find(|a| a.shard == shard)
    }

    /// A compact description for failure messages.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        for a in &self.answers {
            let _ = write!(
                text,
                "\n    shard {} (epoch {}): {} players",
                a.shard,
                a.report.epoch,
                a.report.players.len()
            );
        }
        text
    }
}

/// Each listed player's highest generation and the shard listing it: id -> (shard, generation).
pub type Owners = BTreeMap<u64, (u32, u64)>;

/// What a run of samples saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConservationStats {
    pub samples: usize,
    /// Players seen on two shards at once (a handoff in progress), summed over samples.
    pub in_handoff: usize,
    /// The most shards that listed one player in one sample.
    pub max_listings: usize,
    /// The largest difference between a player's highest generation and another listing of
    /// it in the same sample (1 when only the latest handoff is awaiting its confirmation).
    pub max_generation_lag: u64,
    /// Gaps excused because the shards' answers may have straddled a handoff.
    pub excused_gaps: usize,
    /// The highest generation seen, over all players.
    pub max_generation: u64,
}

/// The conservation checker for a fixed set of logged-in players. Feed it samples with
/// [`Conservation::add`]; call [`Conservation::finish`] at the end.
pub struct Conservation {
    logged_in: BTreeSet<u64>,
    /// Per sample: each player's highest (shard, generation), and the sample itself.
    history: Vec<(Owners, Sample)>,
    /// Players missing from a sample, by sample index, not judged yet.
    gaps: BTreeMap<u64, Vec<usize>>,
    highest: BTreeMap<u64, u64>,
    /// Consecutive samples in which a player's highest generation was below its highest.
    regressions: BTreeMap<u64, usize>,
    stats: ConservationStats,
}

impl Conservation {
    pub fn new(logged_in: BTreeSet<u64>) -> Conservation {
        Conservation {
            logged_in,
            history: Vec::new(),
            gaps: BTreeMap::new(),
            highest: BTreeMap::new(),
            regressions: BTreeMap::new(),
            stats: ConservationStats::default(),
        }
    }

    pub fn stats(&self) -> &ConservationStats {
        &self.stats
    }

    /// Checks one sample; an error names the rule broken and the sample.
    pub fn add(&mut self, sample: Sample) -> anyhow::Result<()> {
        let index = self.history.len();
        self.stats.samples += 1;
        let fail = |what: String| -> anyhow::Error {
            anyhow::anyhow!("conservation broken in sample {index}: {what}{}", sample.describe())
        };
        let mut seen_pairs: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let mut on_shards: BTreeMap<u64, usize> = BTreeMap::new();
        for answer in &sample.answers {
            if answer.report.shard != answer.shard {
                return Err(fail(format!(
                    "the admin port of shard {} says it is shard {}",
                    answer.shard, answer.report.shard
                )));
            }
            let mut ids = BTreeSet::new();
            for p in &answer.report.players {
                if !ids.insert(p.id) {
                    return Err(fail(format!(
                        "shard {} lists player {} twice",
                        answer.shard, p.id
                    )));
                }
                if let Some(other) = seen_pairs.insert((p.id, p.generation), answer.shard) {
                    return Err(fail(format!(
                        "player {} with generation {} is listed by shards {other} and {}: two \
                         owners of one generation (a duplicated player)",
                        p.id, p.generation, answer.shard
                    )));
                }
                if !self.logged_in.contains(&p.id) {
                    return Err(fail(format!(
                        "shard {} lists player {} ({:?}), who is not logged in (a ghost listed \
                         as owned, or a player not removed)",
                        answer.shard, p.id, p
                    )));
                }
                *on_shards.entry(p.id).or_default() += 1;
            }
        }
        self.stats.in_handoff += on_shards.values().filter(|n| **n > 1).count();
        let most = on_shards.values().copied().max().unwrap_or(0);
        self.stats.max_listings = self.stats.max_listings.max(most);
        let owners = sample.owners();
        for answer in &sample.answers {
            for p in &answer.report.players {
                let lag = owners[&p.id].1 - p.generation;
                self.stats.max_generation_lag = self.stats.max_generation_lag.max(lag);
            }
        }
        for (&id, &(shard, generation)) in &owners {
            let highest = self.highest.entry(id).or_insert(generation);
            if generation < *highest {
                // Once is possible (an old owner answered before it heard of the handoff,
                // the new ones after they passed the player on); twice in a row is a
                // rollback.
                let count = self.regressions.entry(id).or_default();
                *count += 1;
                if *count >= 2 {
                    return Err(fail(format!(
                        "player {id}'s highest generation went down from {highest} to \
                         {generation} (listed by shard {shard}) in two samples in a row: an \
                         ownership was rolled back or duplicated"
                    )));
                }
            } else {
                *highest = generation;
                self.regressions.remove(&id);
            }
            self.stats.max_generation = self.stats.max_generation.max(generation);
        }
        for &id in &self.logged_in {
            if !owners.contains_key(&id) {
                self.gaps.entry(id).or_default().push(index);
            }
        }
        self.history.push((owners, sample));
        self.judge_gaps(false)
    }

    /// Judges the gaps of players seen again since; with `at_end`, also those never seen
    /// again.
    fn judge_gaps(&mut self, at_end: bool) -> anyhow::Result<()> {
        let mut judged = Vec::new();
        for (&id, indexes) in &self.gaps {
            let last_gap = *indexes.last().expect("invariant: gaps are non-empty");
            let after =
                (last_gap + 1..self.history.len()).find(|&k| self.history[k].0.contains_key(&id));
            let Some(after) = after else {
                if at_end {
                    bail!(
                        "player {id} is logged in but no shard lists it from sample {} to the \
                         last ({}): a lost player{}",
                        indexes[0],
                        self.history.len() - 1,
                        self.history[last_gap].1.describe()
                    );
                }
                continue;
            };
            for &k in indexes {
                let before = (0..k).rev().find(|&j| self.history[j].0.contains_key(&id));
                let next = self.history[after].0[&id];
                let prev = before.map(|j| self.history[j].0[&id]);
                let excused = match prev {
                    // Never seen before: it was listed nowhere since it logged in, unless it
                    // changed owner at least once in between.
                    None => next.1 > 0,
                    Some(prev) if next.1 == prev.1 => false,
                    Some(prev) if next.1 == prev.1 + 1 => {
                        let sample = &self.history[k].1;
                        match (sample.answer_of(prev.0), sample.answer_of(next.0)) {
                            (Some(from), Some(to)) => to.started < from.finished,
                            _ => true,
                        }
                    }
                    Some(_) => true,
                };
                if !excused {
                    bail!(
                        "player {id} is listed by no shard in sample {k}, though it was owned \
                         before and after with no owner change in between that the sampling \
                         could have straddled (before: {prev:?}, after: {next:?} as (shard, \
                         generation)): a player missing for a moment{}",
                        self.history[k].1.describe()
                    );
                }
                self.stats.excused_gaps += 1;
            }
            judged.push(id);
        }
        for id in judged {
            self.gaps.remove(&id);
        }
        Ok(())
    }

    /// Judges what is left: a player missing from the last samples is lost.
    pub fn finish(&mut self) -> anyhow::Result<ConservationStats> {
        self.judge_gaps(true)?;
        Ok(self.stats.clone())
    }
}

/// At rest, the exact rule: every logged-in player listed by exactly one shard, the one
/// whose region (in the live partition, read anew each try: borders may move for load)
/// holds it, at its position, with the partition's epoch; nobody else listed. `players` maps
/// id -> position. Retried until `within` passes (a handoff may still await its
/// confirmation, a border move its handoffs), then the problems are reported. Returns the
/// partition and the sample that satisfied it.
pub fn owners_at_rest(
    cluster: &Cluster,
    players: &BTreeMap<u64, (u32, u32)>,
    within: Duration,
) -> anyhow::Result<(Partition, Sample)> {
    owners_at_rest_on(cluster, &Sample::shards_of(cluster), players, within)
}

/// [`owners_at_rest`] on the shards given (id, admin address) rather than those of the
/// cluster's ready file: for a cluster that has lost a shard, or gained one a test started.
pub fn owners_at_rest_on(
    cluster: &Cluster,
    shards: &[(u32, SocketAddr)],
    players: &BTreeMap<u64, (u32, u32)>,
    within: Duration,
) -> anyhow::Result<(Partition, Sample)> {
    let mut problems = Vec::new();
    let mut last = None;
    let mut error = None;
    let waited = wait_until(
        deadline(within),
        "every player to be listed exactly once, by the shard that owns its cell",
        || {
            let taken = cluster
                .status_json()
                .and_then(|status| Partition::from_status(&status))
                .and_then(|p| p.context("no partition published"))
                .and_then(|partition| Ok((partition, Sample::take(shards)?)));
            match taken {
                Ok((partition, sample)) => {
                    problems = rest_problems(&sample, &partition, players);
                    last = Some((partition, sample));
                    problems.is_empty()
                }
                Err(e) => {
                    error = Some(e);
                    true
                }
            }
        },
    );
    if let Some(e) = error {
        return Err(e);
    }
    if waited.is_err() {
        let shown: Vec<&str> = problems.iter().take(30).map(String::as_str).collect();
        let partition = last.as_ref().map(|(p, _)| p.to_string()).unwrap_or_default();
        bail!(
            "at rest, after {:.1} s, {} ownership problems (first {}), partition {partition}:\n  {}",
            within.as_secs_f64(),
            problems.len(),
            shown.len(),
            shown.join("\n  ")
        );
    }
    Ok(last.expect("invariant: set when the wait succeeded"))
}

fn rest_problems(
    sample: &Sample,
    partition: &Partition,
    players: &BTreeMap<u64, (u32, u32)>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut listed: BTreeMap<u64, Vec<(u32, OwnedPlayer)>> = BTreeMap::new();
    for answer in &sample.answers {
        if answer.report.epoch != partition.epoch {
            problems.push(format!(
                "shard {} reports epoch {}, the live partition has epoch {}",
                answer.shard, answer.report.epoch, partition.epoch
            ));
        }
        for p in &answer.report.players {
            listed.entry(p.id).or_default().push((answer.shard, *p));
        }
    }
    for (id, &at) in players {
        let owner = partition.owner(at);
        match listed.get(id).map(Vec::as_slice) {
            None | Some([]) => problems.push(format!(
                "player {id} at {at:?} is listed by no shard (owner of its cell: {owner:?})"
            )),
            Some([(shard, p)]) => {
                if Some(*shard) != owner {
                    problems.push(format!(
                        "player {id} at {at:?} is owned by shard {shard}, but its cell belongs \
                         to shard {owner:?}"
                    ));
                }
                if (p.x, p.y) != at {
                    problems.push(format!(
                        "shard {shard} lists player {id} at {:?}, its acks put it at {at:?}",
                        (p.x, p.y)
                    ));
                }
            }
            Some(many) => problems.push(format!(
                "player {id} at {at:?} is listed by several shards at rest: {many:?}"
            )),
        }
    }
    for (id, entries) in &listed {
        if !players.contains_key(id) {
            problems.push(format!("{entries:?} lists player {id}, who is not logged in"));
        }
    }
    problems
}

/// Waits until the `players` of the shards in `meridian status --json` add up to `expected`
/// (they are refreshed every couple of seconds), and returns the per-shard counts.
pub fn status_player_counts(
    cluster: &Cluster,
    expected: u64,
    within: Duration,
) -> anyhow::Result<BTreeMap<u64, u64>> {
    let mut counts = BTreeMap::new();
    let mut error = None;
    let waited = wait_until(
        deadline(within),
        &format!("the shards' player counts in `meridian status --json` to add up to {expected}"),
        || {
            let status = match cluster.status_json() {
                Ok(s) => s,
                Err(e) => {
                    error = Some(e);
                    return true;
                }
            };
            counts = status["shards"]
                .as_array()
                .map(|shards| {
                    shards
                        .iter()
                        .filter_map(|s| Some((s["id"].as_u64()?, s["players"].as_u64()?)))
                        .collect()
                })
                .unwrap_or_default();
            counts.values().sum::<u64>() == expected
        },
    );
    if let Some(e) = error {
        return Err(e);
    }
    waited.with_context(|| format!("last counts by shard: {counts:?}"))?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(shard: u32, at: Instant, players: &[(u64, u64)]) -> ShardAnswer {
        ShardAnswer {
            shard,
            started: at,
            finished: at + Duration::from_millis(1),
            report: PlayersReport {
                shard,
                epoch: 1,
                players: players
                    .iter()
                    .map(|&(id, generation)| OwnedPlayer { id, generation, x: 0, y: 0 })
                    .collect(),
            },
        }
    }

    fn sample(answers: Vec<ShardAnswer>) -> Sample {
        Sample { answers }
    }

    #[test]
    fn a_handoff_in_progress_is_fine_and_duplicates_are_not() {
        let t = Instant::now();
        let mut c = Conservation::new(BTreeSet::from([1, 2]));
        c.add(sample(vec![answer(1, t, &[(1, 0), (2, 0)]), answer(2, t, &[])])).unwrap();
        c.add(sample(vec![answer(1, t, &[(1, 0), (2, 0)]), answer(2, t, &[(1, 1)])])).unwrap();
        assert_eq!(c.stats().in_handoff, 1);
        let mut c = Conservation::new(BTreeSet::from([1]));
        let err =
            c.add(sample(vec![answer(1, t, &[(1, 2)]), answer(2, t, &[(1, 2)])])).unwrap_err();
        assert!(err.to_string().contains("two owners"), "{err}");
        let mut c = Conservation::new(BTreeSet::from([1]));
        assert!(c.add(sample(vec![answer(1, t, &[(1, 0), (9, 0)])])).is_err());
    }

    #[test]
    fn a_gap_without_an_owner_change_is_a_violation() {
        let t = Instant::now();
        let mut c = Conservation::new(BTreeSet::from([1]));
        c.add(sample(vec![answer(1, t, &[(1, 3)]), answer(2, t, &[])])).unwrap();
        c.add(sample(vec![answer(1, t, &[]), answer(2, t, &[])])).unwrap();
        let err = c.add(sample(vec![answer(1, t, &[(1, 3)]), answer(2, t, &[])])).unwrap_err();
        assert!(err.to_string().contains("missing for a moment"), "{err}");
    }

    #[test]
    fn a_gap_across_one_handoff_is_excused_only_if_the_answers_may_straddle_it() {
        let t = Instant::now();
        let later = t + Duration::from_millis(10);
        // Shard 2 (the new owner) answered before shard 1 (the old) finished: excused.
        let mut c = Conservation::new(BTreeSet::from([1]));
        c.add(sample(vec![answer(1, t, &[(1, 0)]), answer(2, t, &[])])).unwrap();
        c.add(sample(vec![answer(1, later, &[]), answer(2, t, &[])])).unwrap();
        c.add(sample(vec![answer(1, t, &[]), answer(2, t, &[(1, 1)])])).unwrap();
        assert_eq!(c.finish().unwrap().excused_gaps, 1);
        // Shard 2 was asked after shard 1 had answered: the player was nowhere.
        let mut c = Conservation::new(BTreeSet::from([1]));
        c.add(sample(vec![answer(1, t, &[(1, 0)]), answer(2, t, &[])])).unwrap();
        c.add(sample(vec![answer(1, t, &[]), answer(2, later, &[])])).unwrap();
        assert!(c.add(sample(vec![answer(1, t, &[]), answer(2, t, &[(1, 1)])])).is_err());
    }

    #[test]
    fn a_player_never_listed_again_is_lost() {
        let t = Instant::now();
        let mut c = Conservation::new(BTreeSet::from([1]));
        c.add(sample(vec![answer(1, t, &[(1, 0)])])).unwrap();
        c.add(sample(vec![answer(1, t, &[])])).unwrap();
        let err = c.finish().unwrap_err();
        assert!(err.to_string().contains("lost player"), "{err}");
    }

    #[test]
    fn at_rest_each_player_once_on_the_owner_of_its_cell() {
        let t = Instant::now();
        let p = Partition { epoch: 1, ..Partition::expected(&[1, 2], 400, 400) };
        let mut a1 = answer(1, t, &[]);
        a1.report.players.push(OwnedPlayer { id: 7, generation: 1, x: 10, y: 10 });
        let a2 = answer(2, t, &[]);
        let at = BTreeMap::from([(7, (10, 10))]);
        assert!(rest_problems(&sample(vec![a1.clone(), a2.clone()]), &p, &at).is_empty());
        let moved = BTreeMap::from([(7, (210, 10))]);
        assert_eq!(rest_problems(&sample(vec![a1, a2]), &p, &moved).len(), 2);
    }
}
