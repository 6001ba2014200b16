//! Runs the scenarios in `tests/scenarios/*.scn` (the format is described in
//! `tests/scenario/mod.rs`). Each step's notifications must match the expectations exactly,
//! per recipient and per subject, in order; on top of that, every client's view, rebuilt from
//! what it received, must equal the brute-force truth after every step.

mod common;
mod scenario;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, ensure};
use common::Clients;
use meridian_world::{Envelope, Notification, PlayerId, World, WorldError};
use scenario::{by_recipient, by_recipient_and_subject, Command, Labels, Scenario, Step};

fn error_name(error: &WorldError) -> &'static str {
    match error {
        WorldError::UnknownPlayer(_) => "unknown-player",
        WorldError::AlreadyPresent(_) => "already-present",
        WorldError::OutsideMap(_) => "outside-map",
        WorldError::RateLimited => "rate-limited",
        WorldError::NotLocal(_) => "not-local",
        WorldError::NotGhost(_) => "not-ghost",
    }
}

struct Runner {
    world: World,
    clients: Clients,
    now: Duration,
    out: Vec<Envelope>,
}

impl Runner {
    /// Applies one command once. Returns whether a ghost moved (which may jump cells).
    fn apply(&mut self, labels: &Labels, command: &Command) -> Result<bool, WorldError> {
        let out = &mut self.out;
        let world = &mut self.world;
        match command {
            Command::Time(now) => self.now = *now,
            Command::Login(who, at) => {
                // The client's view starts empty once the login succeeds; its `Entered`s are
                // delivered after this returns.
                world.login(*who, labels.name(*who), *at, self.now, out)?;
                self.clients.connect(*who);
            }
            Command::Move { who, direction, client_time } => {
                let before = out.len();
                let position = world.move_player(*who, *direction, *client_time, self.now, out)?;
                let ack =
                    Notification::Moved { subject: *who, position, client_time: *client_time };
                assert_eq!(
                    out.get(before),
                    Some(&Envelope { to: *who, note: ack }),
                    "the mover's acknowledgement comes first"
                );
            }
            Command::Chat(who, text) => world.chat(*who, text.clone(), out)?,
            Command::Logout(who) => {
                world.logout(*who, out)?;
                self.clients.disconnect(*who);
            }
            Command::Ghost(who, at) => {
                world.upsert_ghost(*who, labels.name(*who), *at, out)?;
                return Ok(true);
            }
            Command::RemoveGhost(who) => world.remove_ghost(*who, out)?,
            Command::GhostChat(who, text) => world.ghost_chat(*who, text.clone(), out)?,
            Command::Promote(who) => {
                world.promote_to_local(*who)?;
                let mut visible = Vec::new();
                world.visible_to(*who, &mut visible);
                let view = visible
                    .into_iter()
                    .map(|id| (id, world.position(id).expect("a visible entity is present")))
                    .collect();
                self.clients.adopt(*who, view);
            }
            Command::Demote(who) => {
                world.demote_to_ghost(*who)?;
                self.clients.disconnect(*who);
            }
            Command::Sees(..)
            | Command::Observers(..)
            | Command::At(..)
            | Command::Counts { .. } => {}
        }
        Ok(false)
    }

    fn check_query(&self, labels: &Labels, command: &Command) -> anyhow::Result<()> {
        let render = |set: &BTreeSet<PlayerId>| -> Vec<String> {
            set.iter().map(|id| labels.name(*id).to_string()).collect()
        };
        match command {
            Command::Sees(who, expected) => {
                let mut visible = Vec::new();
                self.world.visible_to(*who, &mut visible);
                let actual: BTreeSet<PlayerId> = visible.iter().copied().collect();
                ensure!(actual.len() == visible.len(), "visible_to repeats an id: {visible:?}");
                ensure!(
                    actual == *expected,
                    "sees {:?}, expected {:?}",
                    render(&actual),
                    render(expected)
                );
            }
            Command::Observers(at, expected) => {
                let mut observers = Vec::new();
                self.world.observers_of(*at, &mut observers);
                let actual: BTreeSet<PlayerId> = observers.iter().copied().collect();
                ensure!(actual.len() == observers.len(), "observers_of repeats an id");
                ensure!(
                    actual == *expected,
                    "observers {:?}, expected {:?}",
                    render(&actual),
                    render(expected)
                );
            }
            Command::At(who, expected) => {
                let actual = self.world.position(*who);
                ensure!(actual == *expected, "position {actual:?}, expected {expected:?}");
            }
            Command::Counts { local, ghosts } => {
                let actual = (self.world.n_local(), self.world.n_ghosts());
                ensure!(actual == (*local, *ghosts), "counts (local, ghosts) = {actual:?}");
            }
            _ => {}
        }
        Ok(())
    }

    fn run_step(&mut self, labels: &Labels, step: &Step) -> anyhow::Result<()> {
        self.out.clear();
        for _ in 0..step.repeat {
            let before = self.out.len();
            let result = self.apply(labels, &step.command);
            let jumps_allowed = match (&step.error, result) {
                (None, Ok(jumps)) => jumps,
                (Some(expected), Err(error)) if error_name(&error) == expected => {
                    ensure!(self.out.len() == before, "a failed command emitted notifications");
                    false
                }
                (expected, result) => {
                    let actual = result.map_err(|error| error_name(&error));
                    bail!("result {actual:?}, expected error {expected:?}")
                }
            };
            self.clients.deliver(&self.out[before..], jumps_allowed)?;
            self.clients.check(self.world.config(), &self.world)?;
            self.world.assert_consistent();
        }
        self.check_query(labels, &step.command)?;
        for envelope in &self.out {
            ensure!(
                self.world.is_local(envelope.to) == Some(true),
                "sent to non-local {:?}",
                envelope
            );
        }
        let actual = by_recipient(&self.out);
        if by_recipient_and_subject(&actual) != by_recipient_and_subject(&step.expected) {
            bail!(
                "notifications differ\nexpected:\n{}actual:\n{}",
                labels.render_all(&step.expected),
                labels.render_all(&actual)
            );
        }
        Ok(())
    }
}

fn run(name: &str, text: &str) {
    let Scenario { config, steps, labels } = match scenario::parse(text) {
        Ok(scenario) => scenario,
        Err(error) => panic!("scenario {name} does not parse: {error:#}"),
    };
    let world = World::try_new(config).unwrap_or_else(|error| panic!("scenario {name}: {error}"));
    let mut runner =
        Runner { world, clients: Clients::default(), now: Duration::ZERO, out: Vec::new() };
    for step in &steps {
        if let Err(error) = runner.run_step(&labels, step) {
            panic!("scenario {name}, line {}: `{}`\n{error:#}", step.line, step.text);
        }
    }
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let text = include_str!(concat!("scenarios/", stringify!($name), ".scn"));
                run(stringify!($name), text);
            }
        )*

        /// Every scenario file has a test, so a new file cannot be silently skipped.
        #[test]
        fn every_scenario_file_is_run() {
            let known: BTreeSet<String> =
                [$(stringify!($name)),*].iter().map(|name| name.to_string()).collect();
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scenarios");
            let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
                .expect("the scenarios directory exists")
                .filter_map(|entry| {
                    let path = entry.expect("the scenarios directory is readable").path();
                    let is_scenario = path.extension().is_some_and(|ext| ext == "scn");
                    let stem = path.file_stem()?.to_str()?.to_owned();
                    is_scenario.then_some(stem)
                })
                .collect();
            assert_eq!(on_disk, known, "list every tests/scenarios/*.scn in the scenarios! macro");
        }
    };
}

scenarios!(
    sight_boundary,
    enter_and_leave,
    edges,
    chat,
    login_logout,
    shared_cell,
    rate_limit,
    ghosts,
    sectors,
    zero_view,
);

/// The runner itself must catch a wrong expectation, or every scenario could pass vacuously.
#[test]
fn a_wrong_expectation_fails() {
    let wrong = "login a 1,1\nlogin b 2,2\n  a: entered b 2,2\n  b: entered a 1,2\n";
    let result = std::panic::catch_unwind(|| run("wrong", wrong));
    assert!(result.is_err(), "a wrong position in an expectation must fail the scenario");
    let missing = "login a 1,1\nlogin b 2,2\n  a: entered b 2,2\n";
    assert!(std::panic::catch_unwind(|| run("missing", missing)).is_err());
    let extra_error = "login a 1,1 => already-present\n";
    assert!(std::panic::catch_unwind(|| run("extra_error", extra_error)).is_err());
}
