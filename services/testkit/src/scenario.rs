//! Scripts of bot actions, and a seeded generator of scripts aimed at shard borders.
//!
//! A [`Script`] says, for each bot slot, what to do and when: log in at a cell, move, chat,
//! log out or drop the connection, log in again under a new name. It is data, so the same
//! script runs against a one-shard world and against a sharded cluster, and everything that
//! depends only on the script (where each bot ends, who is logged in at the end) is known
//! before it runs. [`Fleet`](crate::Fleet) runs one.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use meridian_protocol::pb::Direction;

use crate::partition::Border;
use crate::rng::Rng;
use crate::stream::{chebyshev, step_clamped};

/// One thing a bot does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Connect (to the slot's gateway) and log in as `name` at `spawn` (dev mode).
    Login {
        name: String,
        spawn: (u32, u32),
    },
    Move(Direction),
    Chat(String),
    /// `Logout`, then wait for the server to close the connection.
    Logout,
    /// Close the connection without a `Logout`.
    Disconnect,
}

/// An action and when to do it, from the start of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at: Duration,
    pub action: Action,
}

/// What one bot slot does, in time order. A slot is one client at a time; after a logout
/// it may log in again as a new player.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotScript {
    pub slot: usize,
    /// Index of the gateway the slot connects to (modulo the gateways there are).
    pub gateway: usize,
    pub steps: Vec<Step>,
}

impl SlotScript {
    pub fn new(slot: usize, gateway: usize) -> SlotScript {
        SlotScript { slot, gateway, steps: Vec::new() }
    }

    pub fn push(&mut self, at: Duration, action: Action) -> &mut Self {
        self.steps.push(Step { at, action });
        self
    }

    /// Logs in as `name` at `spawn` at time `at`.
    pub fn login(&mut self, at: Duration, name: &str, spawn: (u32, u32)) -> &mut Self {
        self.push(at, Action::Login { name: name.to_string(), spawn })
    }

    /// The cells the slot's players go through, per player: (name, path from spawn).
    pub fn paths(&self, map: (u32, u32)) -> Vec<(String, Vec<(u32, u32)>)> {
        let mut paths: Vec<(String, Vec<(u32, u32)>)> = Vec::new();
        for step in &self.steps {
            match &step.action {
                Action::Login { name, spawn } => paths.push((name.clone(), vec![*spawn])),
                Action::Move(direction) => {
                    if let Some((_, path)) = paths.last_mut() {
                        let at = *path.last().expect("invariant: a path starts at its spawn");
                        path.push(step_clamped(at, *direction, map));
                    }
                }
                _ => {}
            }
        }
        paths
    }

    /// The name and final position of the player this slot leaves logged in, if any.
    pub fn final_player(&self, map: (u32, u32)) -> Option<(String, (u32, u32))> {
        let logged_in = matches!(
            self.steps.iter().rev().find(|s| matches!(
                s.action,
                Action::Login { .. } | Action::Logout | Action::Disconnect
            )),
            Some(Step { action: Action::Login { .. }, .. })
        );
        if !logged_in {
            return None;
        }
        self.paths(map)
            .pop()
            .map(|(name, path)| (name, *path.last().expect("invariant: non-empty path")))
    }

    pub fn moves(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s.action, Action::Move(_))).count()
    }
}

/// A whole scenario: every slot's steps, the seed it came from and the world it assumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub seed: u64,
    pub map: (u32, u32),
    pub view_range: u32,
    pub slots: Vec<SlotScript>,
}

impl Script {
    pub fn new(seed: u64, map: (u32, u32), view_range: u32) -> Script {
        Script { seed, map, view_range, slots: Vec::new() }
    }

    /// Who is logged in at the end and where, by name: known from the script alone, since
    /// moves are the only thing that changes a position and each is applied exactly once.
    pub fn final_positions(&self) -> BTreeMap<String, (u32, u32)> {
        self.slots.iter().filter_map(|slot| slot.final_player(self.map)).collect()
    }

    /// When the last step is due.
    pub fn duration(&self) -> Duration {
        self.slots
            .iter()
            .filter_map(|s| s.steps.last().map(|step| step.at))
            .max()
            .unwrap_or_default()
    }

    fn count(&self, what: impl Fn(&Action) -> bool) -> usize {
        self.slots.iter().flat_map(|s| &s.steps).filter(|s| what(&s.action)).count()
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} slots, {} logins, {} moves, {} chats, {} logouts, {} disconnects over {:.1} s, {} players at the end",
            self.seed,
            self.slots.len(),
            self.count(|a| matches!(a, Action::Login { .. })),
            self.count(|a| matches!(a, Action::Move(_))),
            self.count(|a| matches!(a, Action::Chat(_))),
            self.count(|a| matches!(a, Action::Logout)),
            self.count(|a| matches!(a, Action::Disconnect)),
            self.duration().as_secs_f64(),
            self.final_positions().len()
        )
    }
}

/// Where a generated scenario puts its players: near these borders and corners.
#[derive(Debug, Clone, Default)]
pub struct HotSpots {
    pub borders: Vec<Border>,
    pub corners: Vec<(u32, u32)>,
}

/// The knobs of [`generate`]. `Default` is a moderate load: 150 slots near the borders for
/// about 7 s.
#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    pub slots: usize,
    pub gateways: usize,
    pub map: (u32, u32),
    pub view_range: u32,
    pub hot: HotSpots,
    /// The share of players spawned near a corner rather than along a border.
    pub corner_share: f64,
    /// Players spawn, and walk, within this Chebyshev distance of their anchor: a point on
    /// a border or a corner.
    pub spread: u32,
    /// Initial logins are spread over this long.
    pub login_window: Duration,
    /// Everyone walks until this long after the login window.
    pub walk: Duration,
    /// Each move comes this long after the previous one (uniform, inclusive), in ms.
    pub move_gap_ms: (u64, u64),
    /// The chance of keeping the previous direction: higher makes longer straight runs, so
    /// players really cross borders instead of dithering.
    pub momentum: f64,
    /// The chance of a chat after each move.
    pub chat_chance: f64,
    /// The share of slots whose player leaves once during the walk (logout or drop).
    pub churn: f64,
    /// Of those who leave, the share that drop the connection instead of logging out.
    pub drop_share: f64,
    /// Of those who leave, the share that log in again (as a new player) a moment later.
    pub rejoin_share: f64,
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        ScenarioConfig {
            slots: 150,
            gateways: 2,
            map: (400, 400),
            view_range: 20,
            hot: HotSpots::default(),
            corner_share: 0.3,
            spread: 30,
            login_window: Duration::from_millis(1000),
            walk: Duration::from_secs(6),
            move_gap_ms: (50, 100),
            momentum: 0.6,
            chat_chance: 0.02,
            churn: 0.15,
            drop_share: 0.35,
            rejoin_share: 0.6,
        }
    }
}

const DIRECTIONS: [Direction; 4] =
    [Direction::Up, Direction::Down, Direction::Left, Direction::Right];

/// A random anchor: a corner, or a random point of a random border; the map centre if the
/// config names neither.
fn anchor(config: &ScenarioConfig, rng: &mut Rng) -> (u32, u32) {
    let (w, h) = config.map;
    let corner = !config.hot.corners.is_empty()
        && (config.hot.borders.is_empty() || rng.chance(config.corner_share));
    if corner {
        return *rng.pick(&config.hot.corners);
    }
    if config.hot.borders.is_empty() {
        return (w / 2, h / 2);
    }
    let border = *rng.pick(&config.hot.borders);
    let along = rng.below(u64::from(border.len().max(1))) as u32;
    let (x, y) = border.point(along);
    (x.min(w - 1), y.min(h - 1))
}

/// A random cell within `spread` of `anchor`, on the map.
fn near(config: &ScenarioConfig, anchor: (u32, u32), rng: &mut Rng) -> (u32, u32) {
    let (w, h) = config.map;
    let lo = |c: u32| c.saturating_sub(config.spread);
    let hi = |c: u32, max: u32| (c + config.spread).min(max - 1);
    (rng.range_u32(lo(anchor.0), hi(anchor.0, w)), rng.range_u32(lo(anchor.1), hi(anchor.1, h)))
}

/// One step of a walk that stays within `spread` of `anchor`: keeps its direction with
/// probability `momentum` when it can, else picks among the directions that stay in the box.
/// Moves into the map edge are allowed (they are clamped, and acknowledged in place).
fn next_direction(
    config: &ScenarioConfig,
    at: (u32, u32),
    anchor: (u32, u32),
    previous: Option<Direction>,
    rng: &mut Rng,
) -> Direction {
    let stays = |d: Direction| {
        let next = step_clamped(at, d, config.map);
        chebyshev(next, anchor) <= config.spread || chebyshev(next, anchor) < chebyshev(at, anchor)
    };
    if let Some(previous) = previous {
        if stays(previous) && rng.chance(config.momentum) {
            return previous;
        }
    }
    let allowed: Vec<Direction> = DIRECTIONS.into_iter().filter(|d| stays(*d)).collect();
    if allowed.is_empty() {
        *rng.pick(&DIRECTIONS)
    } else {
        *rng.pick(&allowed)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A seeded scenario: `config.slots` bots spawned near the hot spots, logging in over the
/// login window, walking at the configured pace until the walk ends, chatting now and then;
/// some leave once (logout or dropped connection) and some of those come back as new players.
/// Every slot gets its own random stream, so the script of one slot does not depend on how
/// many numbers another drew.
pub fn generate(config: &ScenarioConfig, seed: u64) -> Script {
    let root = Rng::new(seed);
    let mut script = Script::new(seed, config.map, config.view_range);
    let walk_end = config.login_window + config.walk;
    for slot in 0..config.slots {
        let mut rng = root.fork(slot as u64);
        let mut steps = SlotScript::new(slot, slot % config.gateways.max(1));
        let mut name = format!("s{slot:03}");
        let mut anchor_at = anchor(config, &mut rng);
        let mut at = near(config, anchor_at, &mut rng);
        let mut now = ms(rng.below(config.login_window.as_millis().max(1) as u64));
        steps.login(now, &name, at);

        // When this slot's player leaves, if it does, and whether it comes back.
        let leaves_at = rng.chance(config.churn).then(|| {
            let walk_ms = config.walk.as_millis() as u64;
            config.login_window + ms(rng.range(walk_ms / 5, walk_ms * 4 / 5))
        });
        let drops = rng.chance(config.drop_share);
        let rejoins = rng.chance(config.rejoin_share);
        let mut left = false;
        let mut incarnation = 0;
        let mut previous = None;
        let mut chats = 0;
        loop {
            now += ms(rng.range(config.move_gap_ms.0, config.move_gap_ms.1));
            if now >= walk_end {
                break;
            }
            if let Some(leave) = leaves_at.filter(|t| !left && now >= *t) {
                left = true;
                steps.push(leave.max(now), if drops { Action::Disconnect } else { Action::Logout });
                if !rejoins {
                    break;
                }
                now = leave.max(now) + ms(rng.range(200, 800));
                if now >= walk_end {
                    break;
                }
                incarnation += 1;
                name = format!("s{slot:03}.{incarnation}");
                anchor_at = anchor(config, &mut rng);
                at = near(config, anchor_at, &mut rng);
                previous = None;
                steps.login(now, &name, at);
                continue;
            }
            let direction = next_direction(config, at, anchor_at, previous, &mut rng);
            at = step_clamped(at, direction, config.map);
            previous = Some(direction);
            steps.push(now, Action::Move(direction));
            if rng.chance(config.chat_chance) {
                chats += 1;
                steps.push(now, Action::Chat(format!("{name} says {chats}")));
            }
        }
        script.slots.push(steps);
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::Partition;

    fn config() -> ScenarioConfig {
        let p = Partition::expected(&[1, 2, 3, 4], 400, 400);
        ScenarioConfig {
            hot: HotSpots {
                borders: p.borders(),
                corners: p.corners().into_iter().map(|(c, _)| c).collect(),
            },
            ..ScenarioConfig::default()
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_script() {
        assert_eq!(generate(&config(), 9), generate(&config(), 9));
        assert_ne!(generate(&config(), 9), generate(&config(), 10));
    }

    #[test]
    fn scripts_stay_near_the_hot_spots_and_keep_the_pace() {
        let config = config();
        let script = generate(&config, 3);
        let hot: Vec<(u32, u32)> = config
            .hot
            .borders
            .iter()
            .flat_map(|b| (0..b.len()).map(move |i| b.point(i)))
            .chain(config.hot.corners.iter().copied())
            .collect();
        for slot in &script.slots {
            for (name, path) in slot.paths(script.map) {
                for cell in path {
                    let nearest = hot.iter().map(|h| chebyshev(*h, cell)).min().unwrap();
                    assert!(nearest <= config.spread + 1, "{name} strays to {cell:?}");
                }
            }
            let mut last_move: Option<Duration> = None;
            for step in &slot.steps {
                if let Action::Move(_) = step.action {
                    if let Some(last) = last_move {
                        assert!(step.at >= last + ms(config.move_gap_ms.0), "{step:?}");
                    }
                    last_move = Some(step.at);
                }
                if matches!(step.action, Action::Login { .. }) {
                    last_move = None;
                }
            }
        }
        // Some churn, some chat, and a few hundred bot actions at least.
        let text = script.to_string();
        let summary = |what: &str| {
            script
                .slots
                .iter()
                .flat_map(|s| &s.steps)
                .filter(|s| match what {
                    "chat" => matches!(s.action, Action::Chat(_)),
                    "logout" => matches!(s.action, Action::Logout | Action::Disconnect),
                    _ => matches!(s.action, Action::Move(_)),
                })
                .count()
        };
        assert!(summary("move") > 1000, "{text}");
        assert!(summary("chat") > 10, "{text}");
        assert!(summary("logout") > 5, "{text}");
    }

    #[test]
    fn final_positions_follow_the_moves_and_the_logouts() {
        let mut script = Script::new(0, (400, 400), 20);
        let mut a = SlotScript::new(0, 0);
        a.login(ms(0), "a", (0, 0))
            .push(ms(10), Action::Move(Direction::Left))
            .push(ms(20), Action::Move(Direction::Down));
        let mut b = SlotScript::new(1, 1);
        b.login(ms(0), "b", (5, 5)).push(ms(10), Action::Logout);
        let mut c = SlotScript::new(2, 0);
        c.login(ms(0), "c", (5, 5))
            .push(ms(10), Action::Disconnect)
            .login(ms(20), "c.1", (9, 9))
            .push(ms(30), Action::Move(Direction::Right));
        script.slots = vec![a, b, c];
        assert_eq!(
            script.final_positions(),
            BTreeMap::from([("a".to_string(), (0, 1)), ("c.1".to_string(), (10, 9))])
        );
    }
}
