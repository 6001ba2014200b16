//! What every client must see once the world is quiet, computed from where every player
//! really is (DESIGN.md section 1: "once the cluster is quiet, each client's view set equals
//! the set of players within sight of it").

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::stream::chebyshev;
use crate::view::Seen;

/// The players logged in, by id, with their names and positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Truth {
    pub view_range: u32,
    pub players: BTreeMap<u64, Seen>,
}

impl Truth {
    pub fn new(view_range: u32) -> Truth {
        Truth { view_range, players: BTreeMap::new() }
    }

    pub fn add(&mut self, id: u64, name: &str, position: (u32, u32)) {
        self.players
            .insert(id, Seen { name: name.to_string(), position, kind: 0, state: Vec::new() });
    }

    pub fn ids(&self) -> BTreeSet<u64> {
        self.players.keys().copied().collect()
    }

    /// Whether `a` sees `b`: a square of side `2 * view_range + 1`.
    pub fn sees(&self, a: (u32, u32), b: (u32, u32)) -> bool {
        chebyshev(a, b) <= self.view_range
    }

    /// Everyone `observer` must see: all others within sight of its position.
    pub fn expected_view(&self, observer: u64) -> BTreeMap<u64, Seen> {
        let Some(me) = self.players.get(&observer) else {
            return BTreeMap::new();
        };
        self.players
            .iter()
            .filter(|(id, other)| **id != observer && self.sees(me.position, other.position))
            .map(|(id, other)| (*id, other.clone()))
            .collect()
    }

    /// How `observer`'s view differs from what it must be, one line per difference; empty
    /// when they are equal.
    pub fn view_diff(&self, observer: u64, view: &BTreeMap<u64, Seen>) -> Vec<String> {
        let expected = self.expected_view(observer);
        let at = self.players.get(&observer).map_or((0, 0), |seen| seen.position);
        let mut lines = Vec::new();
        for (id, want) in &expected {
            match view.get(id) {
                None => lines.push(format!(
                    "missing {id} {:?} at {:?} ({} away)",
                    want.name,
                    want.position,
                    chebyshev(at, want.position)
                )),
                Some(got) if got != want => lines.push(format!(
                    "{id} {:?} seen at {:?} as {:?}, really at {:?} as {:?}",
                    want.name, got.position, got.name, want.position, want.name
                )),
                Some(_) => {}
            }
        }
        for (id, got) in view {
            if !expected.contains_key(id) {
                let really = match self.players.get(id) {
                    Some(p) => {
                        format!("really at {:?}, {} away", p.position, chebyshev(at, p.position))
                    }
                    None => "not logged in".to_string(),
                };
                lines.push(format!(
                    "extra {id} {:?} seen at {:?} ({really})",
                    got.name, got.position
                ));
            }
        }
        lines
    }

    /// Who hears a chat from `speaker`: the speaker and everyone who sees it.
    pub fn hearers(&self, speaker: u64) -> BTreeSet<u64> {
        let mut hearers: BTreeSet<u64> = self.expected_view(speaker).into_keys().collect();
        hearers.insert(speaker);
        hearers
    }
}

/// Lines of the form `name: difference` for a failure message, at most `limit` of them,
/// with a count of the rest.
pub fn summarize(differences: &[(String, Vec<String>)], limit: usize) -> String {
    let total: usize = differences.iter().map(|(_, lines)| lines.len()).sum();
    let mut text = String::new();
    let mut shown = 0;
    for (who, lines) in differences {
        for line in lines {
            if shown == limit {
                let _ = write!(text, "\n  ... and {} more", total - shown);
                return text;
            }
            let _ = write!(text, "\n  {who}: {line}");
            shown += 1;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sight_is_a_square_of_radius_view_range() {
        let mut truth = Truth::new(20);
        truth.add(1, "a", (100, 100));
        truth.add(2, "b", (120, 120));
        truth.add(3, "c", (121, 100));
        truth.add(4, "d", (100, 79));
        let view = truth.expected_view(1);
        assert_eq!(view.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(truth.hearers(2), BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn differences_name_what_is_missing_extra_or_misplaced() {
        let mut truth = Truth::new(20);
        truth.add(1, "a", (100, 100));
        truth.add(2, "b", (110, 100));
        truth.add(3, "c", (300, 300));
        let mut view = BTreeMap::new();
        assert_eq!(truth.view_diff(1, &view).len(), 1);
        view.insert(2, Seen { name: "b".into(), position: (111, 100), kind: 0, state: Vec::new() });
        view.insert(3, Seen { name: "c".into(), position: (101, 100), kind: 0, state: Vec::new() });
        let diff = truth.view_diff(1, &view);
        assert_eq!(diff.len(), 2, "{diff:?}");
        assert!(diff[0].contains("really at (110, 100)"), "{diff:?}");
        assert!(diff[1].starts_with("extra 3"), "{diff:?}");
        view.remove(&3);
        view.get_mut(&2).unwrap().position = (110, 100);
        assert!(truth.view_diff(1, &view).is_empty());
    }
}
