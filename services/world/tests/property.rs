//! Random logins, moves, chats and logouts (and, in the mixed runs, ghost updates, handoffs
//! and ghost chat) of up to 50 players on small maps where sectors matter. Every client's
//! view is rebuilt from the notifications it receives alone, and after every step it must
//! equal the brute-force truth kept by an independent model of the world.
//!
//! Runs are seeded; a failure prints the seed and the step. Replay one seed with
//! `MERIDIAN_WORLD_SEED=<seed> cargo test -p meridian-world --test property`, or run more
//! seeds than the default with `MERIDIAN_WORLD_SEEDS=<count>`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use common::{
    check_chat, expected_chat_audience, expected_view, sorted, truth_of, Clients, Coverage,
};
use meridian_world::{
    Direction, EntityKind, Envelope, Notification, PlayerId, Position, World, WorldConfig,
    WorldError,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const N_IDS: u64 = 50;
const STEPS: usize = 1_200;
const SEEDS_PER_CONFIG: u64 = 4;

/// The maps tried: sectors of 5 on a 60x60 map, a map that does not divide into sectors
/// evenly, and a view range of 0 (sectors of 1, sight only on one's own cell).
const CONFIGS: [WorldConfig; 3] = [
    WorldConfig { width: 60, height: 60, view_range: 5, move_rate: 20 },
    WorldConfig { width: 37, height: 23, view_range: 4, move_rate: 20 },
    WorldConfig { width: 12, height: 9, view_range: 0, move_rate: 20 },
];

/// The independent model: where every entity is and what kind it is.
struct Model {
    config: WorldConfig,
    entities: BTreeMap<PlayerId, (Position, EntityKind)>,
}

impl Model {
    fn ids_of(&self, kind: EntityKind) -> Vec<PlayerId> {
        self.entities.iter().filter(|(_, (_, k))| *k == kind).map(|(id, _)| *id).collect()
    }

    fn positions(&self) -> BTreeMap<PlayerId, Position> {
        self.entities.iter().map(|(id, (position, _))| (*id, *position)).collect()
    }
}

struct Run {
    coverage: Coverage,
    rng: SmallRng,
    world: World,
    model: Model,
    clients: Clients,
    now: Duration,
    out: Vec<Envelope>,
    with_ghosts: bool,
}

impl Run {
    fn random_position(&mut self) -> Position {
        let (width, height) = (self.model.config.width, self.model.config.height);
        Position::new(self.rng.random_range(0..width), self.rng.random_range(0..height))
    }

    fn pick(&mut self, ids: &[PlayerId]) -> Option<PlayerId> {
        (!ids.is_empty()).then(|| ids[self.rng.random_range(0..ids.len())])
    }

    fn absent_id(&mut self) -> Option<PlayerId> {
        let absent: Vec<PlayerId> =
            (1..=N_IDS).map(PlayerId).filter(|id| !self.model.entities.contains_key(id)).collect();
        self.pick(&absent)
    }

    /// Performs one random operation and checks what it emitted. Returns a description for
    /// failure messages.
    fn step(&mut self) -> anyhow::Result<String> {
        self.out.clear();
        self.now += Duration::from_millis(self.rng.random_range(0..=20));
        let locals = self.model.ids_of(EntityKind::Local);
        let ghosts = self.model.ids_of(EntityKind::Ghost);
        let roll = self.rng.random_range(0..100);
        let ghost_roll = if self.with_ghosts { self.rng.random_range(0..100) } else { 100 };
        let mut jumps_allowed = false;
        let description = if ghost_roll < 25 {
            jumps_allowed = true;
            self.ghost_step(&ghosts, &locals)?
        } else if roll < 12 || locals.is_empty() {
            let Some(id) = self.absent_id() else {
                return Ok("no free id".into());
            };
            let at = self.random_position();
            self.world.login(id, name_of(id), at, self.now, &mut self.out)?;
            self.model.entities.insert(id, (at, EntityKind::Local));
            self.clients.connect(id);
            format!("login {id} at {at}")
        } else if roll < 18 {
            let id = self.pick(&locals).context("a local exists")?;
            self.world.logout(id, &mut self.out)?;
            self.model.entities.remove(&id);
            self.clients.disconnect(id);
            format!("logout {id}")
        } else if roll < 25 {
            let id = self.pick(&locals).context("a local exists")?;
            let audience = expected_chat_audience(&self.model.config, &self.world, id);
            self.world.chat(id, Arc::from("hi"), &mut self.out)?;
            check_chat(&self.out, id, &audience)?;
            format!("chat {id}")
        } else if roll < 27 {
            self.invalid_step(&locals)?
        } else {
            // Mostly one player at a time, but sometimes a burst from one player, so that
            // the rate limit is hit too.
            let id = self.pick(&locals).context("a local exists")?;
            let burst = if self.rng.random_range(0..20) == 0 { 25 } else { 1 };
            let mut moves = Vec::new();
            for _ in 0..burst {
                let before = self.out.len();
                moves.push(self.move_once(id)?);
                self.coverage.count(&self.out[before..]);
                self.clients.deliver(&self.out[before..], false)?;
                self.check_views()?;
            }
            self.out.clear();
            format!("moves of {id}: {moves:?}")
        };
        self.coverage.count(&self.out);
        self.coverage.most_entities = self.coverage.most_entities.max(self.model.entities.len());
        self.clients.deliver(&self.out, jumps_allowed)?;
        self.check_views()?;
        self.check_queries()?;
        Ok(description)
    }

    fn move_once(&mut self, id: PlayerId) -> anyhow::Result<String> {
        let direction = Direction::ALL[self.rng.random_range(0..4)];
        let client_time = self.rng.random_range(1..u64::MAX);
        let before = self.out.len();
        match self.world.move_player(id, direction, client_time, self.now, &mut self.out) {
            Ok(position) => {
                let entry = self.model.entities.get_mut(&id).context("the mover is modelled")?;
                let expected = self.model.config.step(entry.0, direction);
                ensure!(
                    position == expected,
                    "{id} moved {direction:?} to {position}, not {expected}"
                );
                if position == entry.0 {
                    self.coverage.clamped_moves += 1;
                }
                entry.0 = position;
                let ack = Notification::Moved { subject: id, position, client_time };
                ensure!(
                    self.out.get(before) == Some(&Envelope { to: id, note: ack }),
                    "the first envelope of a move is the mover's ack"
                );
                Ok(format!("{direction:?}"))
            }
            Err(WorldError::RateLimited) => {
                ensure!(self.out.len() == before, "a refused move emitted notifications");
                self.coverage.refused_moves += 1;
                Ok("refused".into())
            }
            Err(error) => Err(error.into()),
        }
    }

    fn ghost_step(&mut self, ghosts: &[PlayerId], locals: &[PlayerId]) -> anyhow::Result<String> {
        let roll = self.rng.random_range(0..100);
        if roll < 15 || ghosts.is_empty() {
            let Some(id) = self.absent_id() else {
                return Ok("no free id".into());
            };
            let at = self.random_position();
            self.world.upsert_ghost(id, name_of(id), at, &mut self.out)?;
            self.model.entities.insert(id, (at, EntityKind::Ghost));
            return Ok(format!("new ghost {id} at {at}"));
        }
        let id = self.pick(ghosts).context("a ghost exists")?;
        if roll < 70 {
            // Ghosts mostly step like players, and sometimes jump (a coalesced update).
            let from = self.model.entities[&id].0;
            let at = if roll < 60 {
                self.model.config.step(from, Direction::ALL[self.rng.random_range(0..4)])
            } else {
                self.coverage.ghost_jumps += 1;
                self.random_position()
            };
            self.world.upsert_ghost(id, name_of(id), at, &mut self.out)?;
            self.model.entities.insert(id, (at, EntityKind::Ghost));
            Ok(format!("ghost {id} {from} -> {at}"))
        } else if roll < 78 {
            self.world.remove_ghost(id, &mut self.out)?;
            self.model.entities.remove(&id);
            Ok(format!("remove ghost {id}"))
        } else if roll < 86 {
            let audience = expected_chat_audience(&self.model.config, &self.world, id);
            self.world.ghost_chat(id, Arc::from("boo"), &mut self.out)?;
            check_chat(&self.out, id, &audience)?;
            Ok(format!("ghost chat {id}"))
        } else if roll < 93 {
            self.world.promote_to_local(id)?;
            ensure!(self.out.is_empty(), "promote emits nothing");
            let entry = self.model.entities.get_mut(&id).context("the ghost is modelled")?;
            entry.1 = EntityKind::Local;
            let view = expected_view(&self.model.config, &self.model.positions(), id);
            self.clients.adopt(id, view);
            self.coverage.promotions += 1;
            Ok(format!("promote {id}"))
        } else {
            let Some(id) = self.pick(locals) else {
                return Ok("no local to demote".into());
            };
            self.world.demote_to_ghost(id)?;
            ensure!(self.out.is_empty(), "demote emits nothing");
            let entry = self.model.entities.get_mut(&id).context("the local is modelled")?;
            entry.1 = EntityKind::Ghost;
            self.clients.disconnect(id);
            self.coverage.demotions += 1;
            Ok(format!("demote {id}"))
        }
    }

    /// Operations the world must refuse without changing or emitting anything.
    fn invalid_step(&mut self, locals: &[PlayerId]) -> anyhow::Result<String> {
        let out = &mut self.out;
        let absent = PlayerId(N_IDS + 1);
        let (width, height) = (self.model.config.width, self.model.config.height);
        let outside = Position::new(width, self.rng.random_range(0..height));
        let results = [
            self.world.move_player(absent, Direction::Up, 1, self.now, out).map(|_| ()),
            self.world.chat(absent, Arc::from("x"), out),
            self.world.logout(absent, out),
            self.world.login(absent, name_of(absent), outside, self.now, out),
            self.world.upsert_ghost(absent, name_of(absent), outside, out),
        ];
        ensure!(results.iter().all(Result::is_err), "invalid operations are refused: {results:?}");
        if let Some(&id) = locals.first() {
            let at = self.model.entities[&id].0;
            let again = self.world.login(id, name_of(id), at, self.now, &mut self.out);
            ensure!(again == Err(WorldError::AlreadyPresent(id)), "a second login: {again:?}");
        }
        ensure!(self.out.is_empty(), "refused operations emitted {:?}", self.out);
        Ok("invalid operations".into())
    }

    fn check_views(&self) -> anyhow::Result<()> {
        self.world.assert_consistent();
        let world_truth = truth_of(&self.world);
        ensure!(
            world_truth == self.model.positions(),
            "the world's positions differ from the model"
        );
        for (id, (_, kind)) in &self.model.entities {
            ensure!(self.world.kind(*id) == Some(*kind), "{id} should be {kind:?}");
        }
        let (n_local, n_ghosts) = (self.world.n_local(), self.world.n_ghosts());
        ensure!(n_local == self.model.ids_of(EntityKind::Local).len(), "n_local {n_local}");
        ensure!(n_ghosts == self.model.ids_of(EntityKind::Ghost).len(), "n_ghosts {n_ghosts}");
        self.clients.check(&self.model.config, &self.world)
    }

    /// `visible_to` and `observers_of` against brute force, for a random entity and cell.
    fn check_queries(&mut self) -> anyhow::Result<()> {
        let config = self.model.config.clone();
        let positions = self.model.positions();
        let all: Vec<PlayerId> = positions.keys().copied().collect();
        if let Some(id) = self.pick(&all) {
            let mut visible = Vec::new();
            self.world.visible_to(id, &mut visible);
            let expected: BTreeSet<PlayerId> =
                expected_view(&config, &positions, id).into_keys().collect();
            ensure!(sorted(&visible) == expected, "visible_to({id}) = {visible:?}");
        }
        let cell = self.random_position();
        let mut observers = Vec::new();
        self.world.observers_of(cell, &mut observers);
        let expected: BTreeSet<PlayerId> = self
            .model
            .entities
            .iter()
            .filter(|(_, (at, kind))| *kind == EntityKind::Local && config.in_sight(*at, cell))
            .map(|(id, _)| *id)
            .collect();
        ensure!(sorted(&observers) == expected, "observers_of({cell}) = {observers:?}");
        Ok(())
    }
}

fn name_of(id: PlayerId) -> Arc<str> {
    Arc::from(format!("p{id}"))
}

fn run_seed(config: WorldConfig, seed: u64, with_ghosts: bool, coverage: &mut Coverage) {
    let mut run = Run {
        coverage: std::mem::take(coverage),
        rng: SmallRng::seed_from_u64(seed),
        world: World::new(config.clone()),
        model: Model { config: config.clone(), entities: BTreeMap::new() },
        clients: Clients::default(),
        now: Duration::ZERO,
        out: Vec::new(),
        with_ghosts,
    };
    for step in 0..STEPS {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.step()));
        let failure = match outcome {
            Ok(Ok(_)) => {
                if step + 1 == STEPS {
                    *coverage = std::mem::take(&mut run.coverage);
                }
                continue;
            }
            Ok(Err(error)) => format!("{error:#}"),
            Err(panic) => match panic.downcast_ref::<String>() {
                Some(message) => format!("panic: {message}"),
                None => format!("panic: {:?}", panic.downcast_ref::<&str>()),
            },
        };
        panic!(
            "seed {seed} failed at step {step} ({config:?}, ghosts: {with_ghosts}): {failure}\n\
             replay with MERIDIAN_WORLD_SEED={seed}"
        );
    }
}

fn seeds() -> Vec<u64> {
    let env = |name: &str| std::env::var(name).ok().and_then(|value| value.parse::<u64>().ok());
    match (env("MERIDIAN_WORLD_SEED"), env("MERIDIAN_WORLD_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, Some(count)) => (0..count).collect(),
        (None, None) => (0..SEEDS_PER_CONFIG).collect(),
    }
}

fn run_all(with_ghosts: bool) -> Coverage {
    let mut coverage = Coverage::default();
    for config in CONFIGS {
        for seed in seeds() {
            run_seed(config.clone(), seed, with_ghosts, &mut coverage);
        }
    }
    coverage
}

#[test]
fn views_follow_the_truth_with_local_players_only() {
    let c = run_all(false);
    let exercised = [c.entered, c.moved, c.left, c.chat, c.refused_moves, c.clamped_moves];
    assert!(exercised.iter().all(|&n| n > 0), "not everything was exercised: {c:?}");
    assert!(c.most_entities >= 40, "the world never got crowded: {c:?}");
}

#[test]
fn views_follow_the_truth_with_ghosts_and_handoffs() {
    let c = run_all(true);
    let exercised = [c.entered, c.moved, c.left, c.chat, c.ghost_jumps, c.promotions, c.demotions];
    assert!(exercised.iter().all(|&n| n > 0), "not everything was exercised: {c:?}");
}
