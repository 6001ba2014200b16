//! What a run of a script ends with, by player name rather than player id (ids differ from
//! cluster to cluster), so that the same script run against a one-shard world and against a
//! sharded cluster can be compared: single-world equivalence, at rest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::fleet::Player;
use crate::rest::ping_all;
use crate::truth::{summarize, Truth};
use crate::wait::{deadline, DEFAULT_WAIT};

/// The state at rest after a script, and who heard whom in the quiet chat round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Every player logged in at the end, at its position.
    pub positions: BTreeMap<String, (u32, u32)>,
    /// Every player's view: the names it sees and where.
    pub views: BTreeMap<String, BTreeMap<String, (u32, u32)>>,
    /// For every player, the speakers of the quiet round it heard.
    pub heard: BTreeMap<String, BTreeSet<String>>,
}

impl Outcome {
    /// Positions and views of `players`, as they are now.
    pub fn at_rest(players: &[Player]) -> Outcome {
        let positions = players.iter().map(|p| (p.name.clone(), p.position())).collect();
        let views = players
            .iter()
            .map(|p| {
                let seen =
                    p.bot.view().others().values().map(|s| (s.name.clone(), s.position)).collect();
                (p.name.clone(), seen)
            })
            .collect();
        Outcome { positions, views, heard: BTreeMap::new() }
    }

    /// Every difference from `other`, one line each, `self` first: empty when equal.
    pub fn diff(&self, other: &Outcome) -> Vec<String> {
        let mut lines = Vec::new();
        diff_maps(&self.positions, &other.positions, "position of", &mut lines);
        let names: BTreeSet<&String> = self.views.keys().chain(other.views.keys()).collect();
        for name in names {
            let empty = BTreeMap::new();
            let a = self.views.get(name).unwrap_or(&empty);
            let b = other.views.get(name).unwrap_or(&empty);
            diff_maps(a, b, &format!("{name} sees"), &mut lines);
        }
        let names: BTreeSet<&String> = self.heard.keys().chain(other.heard.keys()).collect();
        for name in names {
            let empty = BTreeSet::new();
            let a = self.heard.get(name).unwrap_or(&empty);
            let b = other.heard.get(name).unwrap_or(&empty);
            if a != b {
                lines.push(format!(
                    "{name} heard only here {:?}, only there {:?}",
                    a.difference(b).collect::<Vec<_>>(),
                    b.difference(a).collect::<Vec<_>>()
                ));
            }
        }
        lines
    }
}

fn diff_maps<V: PartialEq + std::fmt::Debug>(
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
    what: &str,
    lines: &mut Vec<String>,
) {
    for (key, va) in a {
        match b.get(key) {
            None => lines.push(format!("{what} {key}: {va:?} here, absent there")),
            Some(vb) if vb != va => lines.push(format!("{what} {key}: {va:?} here, {vb:?} there")),
            Some(_) => {}
        }
    }
    for (key, vb) in b {
        if !a.contains_key(key) {
            lines.push(format!("{what} {key}: absent here, {vb:?} there"));
        }
    }
}

/// A chat round at rest, where who hears whom is decided by the positions alone: each of
/// `speakers` (indices into `players`) says `"{tag} {name}"`, then barrier rounds run until
/// every player has heard exactly the speakers that the truth says it hears (itself, if it
/// spoke, and every speaker in sight), or `within` passes. Returns, by name, whom each heard.
pub fn chat_round(
    players: &mut [Player],
    speakers: &[usize],
    tag: &str,
    truth: &Truth,
    within: Duration,
) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let speaker_ids: BTreeSet<u64> = speakers.iter().map(|&i| players[i].id()).collect();
    for &i in speakers {
        let text = format!("{tag} {}", players[i].name);
        players[i].bot.chat(&text)?;
    }
    let names: BTreeMap<u64, String> = players.iter().map(|p| (p.id(), p.name.clone())).collect();
    let expected: BTreeMap<u64, BTreeSet<u64>> = players
        .iter()
        .map(|p| {
            let hears = speaker_ids
                .iter()
                .copied()
                .filter(|s| truth.hearers(*s).contains(&p.id()))
                .collect();
            (p.id(), hears)
        })
        .collect();
    let heard_now = |players: &[Player]| -> BTreeMap<u64, BTreeSet<u64>> {
        players
            .iter()
            .map(|p| {
                let heard = p
                    .bot
                    .stream_check()
                    .map(|s| {
                        s.chats()
                            .iter()
                            .filter(|c| c.text.starts_with(tag))
                            .map(|c| c.speaker)
                            .collect()
                    })
                    .unwrap_or_default();
                (p.id(), heard)
            })
            .collect()
    };
    let prefix = format!("{tag} ");
    let by = deadline(within);
    loop {
        let received = ping_all(players.iter_mut().map(|p| &mut p.bot), DEFAULT_WAIT)?;
        let heard = heard_now(players);
        // The texts must also be what each speaker said.
        for p in players.iter() {
            for chat in p.bot.stream_check().map(|s| s.chats()).unwrap_or_default() {
                if let Some(name) = chat.text.strip_prefix(&prefix) {
                    if names.get(&chat.speaker).map(String::as_str) != Some(name) {
                        return Err(p.bot.report(&format!(
                            "heard {:?} from player {}, who is not {name}",
                            chat.text, chat.speaker
                        )));
                    }
                }
            }
        }
        if heard == expected && received == 0 {
            let by_name = heard
                .into_iter()
                .map(|(id, speakers)| {
                    (names[&id].clone(), speakers.iter().map(|s| names[s].clone()).collect())
                })
                .collect();
            return Ok(by_name);
        }
        let extra: Vec<(String, Vec<String>)> = players
            .iter()
            .filter_map(|p| {
                let got = &heard[&p.id()];
                let want = &expected[&p.id()];
                let mut lines = Vec::new();
                for s in got.difference(want) {
                    lines.push(format!("heard {} who is not in sight", names[s]));
                }
                for s in want.difference(got) {
                    lines.push(format!("did not hear {} (in sight, or itself)", names[s]));
                }
                (!lines.is_empty()).then(|| (p.name.clone(), lines))
            })
            .collect();
        if extra.iter().any(|(_, l)| l.iter().any(|l| l.starts_with("heard"))) {
            bail!("chat heard by players who do not see the speaker:{}", summarize(&extra, 30));
        }
        if Instant::now() >= by {
            bail!(
                "the quiet chat round ({} speakers) did not reach exactly those in sight within {:.1} s:{}",
                speakers.len(),
                within.as_secs_f64(),
                summarize(&extra, 30)
            );
        }
        if received == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
