//! The check at quiescence: once the workload and the faults have stopped and the cluster
//! has settled, every client's view is the truth within its sight, every player is local
//! on exactly one shard, every ghost is where its owner has it, nothing waits in a queue.

use std::collections::BTreeMap;

use meridian_cluster::ShardId;

use crate::client::ClientState;
use crate::{Sim, DEATH_SETTLES_WITHIN};

impl Sim {
    /// Every 100 ms: a killed shard's copies, shown by the shards that mirrored its players,
    /// go within [`DEATH_SETTLES_WITHIN`] of its death (issue 30 item 2), each taken over
    /// by its player's restore or removed as an orphan. Records how long that took.
    pub(crate) fn check_deaths_settle(&mut self) {
        if self.dying.is_empty() {
            return;
        }
        let held_to_it = self.settings.faults.etcd_stalls == 0 && self.settings.faults.pauses == 0;
        for (dead, since) in std::mem::take(&mut self.dying) {
            let shown: Vec<u64> = self
                .shards
                .values()
                .filter_map(|node| node.core.as_ref())
                .flat_map(|core| core.copies_from(ShardId(dead)))
                .map(|id| id.0)
                .collect();
            let age = self.t - since;
            if shown.is_empty() {
                let longest = self.outcome.death_settled.map_or(age, |d| d.max(age));
                self.outcome.death_settled = Some(longest);
                continue;
            }
            if held_to_it && age > DEATH_SETTLES_WITHIN {
                let what = format!(
                    "copies of players {shown:?} of shard {dead} still shown {age:?} after it was killed"
                );
                return self.fail(what, shown);
            }
            self.dying.push((dead, since));
        }
    }

    pub(crate) fn check_quiescent(&mut self) {
        // Without a destructive fault (a kill, a pause, a cut link) every old owner lives to
        // send its `Released`: a hold given up on after 2 s is a lost one (issue 30).
        if !self.settings.faults.destructive() {
            let gave_up = self.shards.iter().find_map(|(&s, node)| {
                node.core.as_ref().map(|c| (s, c.ghost_release_timeouts())).filter(|(_, n)| *n > 0)
            });
            if let Some((s, n)) = gave_up {
                let what = format!(
                    "shard {s} gave up waiting for an old owner's Released {n} times in a run without a destructive fault"
                );
                return self.fail(what, Vec::new());
            }
        }
        // Truth: who is local where.
        let mut owner: BTreeMap<u64, (u32, (u32, u32))> = BTreeMap::new();
        let mut broken = None;
        'shards: for (&s, node) in &self.shards {
            let Some(core) = &node.core else { continue };
            let npcs = core.owned_npcs().into_iter().map(|(id, at, _)| (id, at));
            for (id, at) in core.local_players().chain(npcs) {
                if let Some((other, _)) = owner.insert(id.0, (s, (at.x, at.y))) {
                    let what = format!("entity {} is local on shards {other} and {s}", id.0);
                    broken = Some((what, vec![id.0]));
                    break 'shards;
                }
            }
            let sizes = core.sizes();
            if sizes.early > 0 || sizes.awaiting_gateway > 0 {
                let what = format!("shard {s} still holds inputs or handoffs at rest: {sizes:?}");
                let players = core.players_waited_for().into_iter().map(|p| p.0).collect();
                broken = Some((what, players));
                break;
            }
        }
        if let Some((what, players)) = broken {
            return self.fail(what, players);
        }
        if self.settings.entities {
            self.check_entities();
            if self.violation.is_some() {
                return;
            }
        }
        // Every ghost is mirrored by its owner, where the owner has it.
        for (&s, node) in &self.shards {
            let Some(core) = &node.core else { continue };
            for (id, at) in core.ghost_positions() {
                let Some(&(o, truth)) = owner.get(&id.0) else {
                    let what =
                        format!("shard {s} shows a ghost of player {} who is in no shard", id.0);
                    return self.fail(what, vec![id.0]);
                };
                let mirrored = self.shards[&o]
                    .core
                    .as_ref()
                    .and_then(|c| c.ghosted_at(id))
                    .is_some_and(|holders| holders.contains(&ShardId(s)));
                if !mirrored {
                    let what = format!(
                        "shard {s} keeps a ghost of player {} that its owner {o} does not mirror there",
                        id.0
                    );
                    return self.fail(what, vec![id.0]);
                }
                if (at.x, at.y) != truth {
                    let what = format!(
                        "shard {s}'s ghost of player {} is at {:?}, the player at {truth:?}",
                        id.0,
                        (at.x, at.y)
                    );
                    return self.fail(what, vec![id.0]);
                }
            }
        }
        let range = self.settings.view_range;
        for i in 0..self.clients.len() {
            let client = &self.clients[i];
            let ClientState::Playing = client.state else { continue };
            let me = client.id;
            let Some(&(_, at)) = owner.get(&me) else {
                return self.fail(format!("player {me} is connected but in no shard"), vec![me]);
            };
            if client.at != at {
                let what =
                    format!("player {me} believes it is at {:?}, but is at {at:?}", client.at);
                return self.fail(what, vec![me]);
            }
            let truth: BTreeMap<u64, (u32, u32)> = owner
                .iter()
                .filter(|(id, (_, p))| {
                    **id != me && p.0.abs_diff(at.0) <= range && p.1.abs_diff(at.1) <= range
                })
                .map(|(id, (_, p))| (*id, *p))
                .collect();
            if client.view != truth {
                let extra: Vec<u64> =
                    client.view.keys().filter(|id| !truth.contains_key(id)).copied().collect();
                let missing: Vec<u64> =
                    truth.keys().filter(|id| !client.view.contains_key(id)).copied().collect();
                let wrong: Vec<u64> = client
                    .view
                    .iter()
                    .filter(|(id, p)| truth.get(id).is_some_and(|t| t != *p))
                    .map(|(id, _)| *id)
                    .collect();
                let what = format!(
                    "player {me} at {at:?} sees wrongly: shows {extra:?} who are out of sight, misses {missing:?}, has {wrong:?} at stale cells"
                );
                let mut players = vec![me];
                players.extend(extra.iter().chain(&missing).chain(&wrong));
                return self.fail(what, players);
            }
        }
    }
}
