//! A model of what the clients know: each local player's view (subject -> position), rebuilt
//! only from the notifications it receives, and checked against the brute-force truth.
//! Shared by the scenario runner and the property test, so both check the same rules.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, ensure, Context as _};
use meridian_world::{Envelope, Notification, PlayerId, Position, World, WorldConfig};

pub type View = BTreeMap<PlayerId, Position>;

/// Every connected client's view of the world.
#[derive(Default)]
pub struct Clients {
    views: BTreeMap<PlayerId, View>,
}

impl Clients {
    /// A client that just logged in: it knows nothing until its `Entered`s arrive.
    pub fn connect(&mut self, id: PlayerId) {
        self.views.insert(id, View::new());
    }

    /// A client handed over from another shard, which kept its view correct until now.
    pub fn adopt(&mut self, id: PlayerId, view: View) {
        self.views.insert(id, view);
    }

    /// A client that logged out, or whose player was handed to another shard.
    pub fn disconnect(&mut self, id: PlayerId) {
        self.views.remove(&id);
    }

    pub fn view(&self, id: PlayerId) -> Option<&View> {
        self.views.get(&id)
    }

    /// Applies one event's notifications, checking each against the client's current view.
    /// `jumps_allowed` is true when the subject may move more than one cell (a ghost update).
    pub fn deliver(&mut self, envelopes: &[Envelope], jumps_allowed: bool) -> anyhow::Result<()> {
        for envelope in envelopes {
            let to = envelope.to;
            let view = self.views.get_mut(&to).with_context(|| {
                format!("{envelope:?} is addressed to a client that is not here")
            })?;
            apply(view, to, &envelope.note, jumps_allowed)
                .with_context(|| format!("client {to} got {:?}", envelope.note))?;
        }
        Ok(())
    }

    /// Checks that exactly the local players have clients and that each client's view is
    /// everyone else within sight, at their true positions.
    pub fn check(&self, config: &WorldConfig, world: &World) -> anyhow::Result<()> {
        let truth = truth_of(world);
        let locals: BTreeSet<PlayerId> = world.local_players().map(|(id, _)| id).collect();
        let clients: BTreeSet<PlayerId> = self.views.keys().copied().collect();
        ensure!(locals == clients, "local players {locals:?} but clients {clients:?}");
        for (&id, view) in &self.views {
            let expected = expected_view(config, &truth, id);
            ensure!(
                *view == expected,
                "client {id} at {:?} believes {view:?}, but sees {expected:?}",
                truth.get(&id)
            );
        }
        Ok(())
    }
}

fn apply(view: &mut View, to: PlayerId, note: &Notification, jumps: bool) -> anyhow::Result<()> {
    match note {
        Notification::Entered { subject, position, name, .. } => {
            ensure!(*subject != to, "Entered about itself");
            ensure!(!name.is_empty(), "Entered without a name");
            if let Some(old) = view.insert(*subject, *position) {
                bail!("Entered for {subject}, already in view at {old:?}");
            }
        }
        Notification::Moved { subject, position, client_time } if *subject == to => {
            // The mover's own acknowledgement; the position is checked against the truth by
            // the caller, which knows where the mover was.
            let _ = (position, client_time);
        }
        Notification::Moved { subject, position, client_time } => {
            ensure!(*client_time == 0, "an observer's Moved carries client_time {client_time}");
            let Some(old) = view.get_mut(subject) else {
                bail!("Moved for {subject}, which is not in view");
            };
            let distance = old.x.abs_diff(position.x) + old.y.abs_diff(position.y);
            ensure!(distance != 0, "Moved for {subject} without a change of position");
            ensure!(jumps || distance == 1, "Moved {subject} {distance} cells at once");
            *old = *position;
        }
        Notification::Left { subject } => {
            ensure!(view.remove(subject).is_some(), "Left for {subject}, which is not in view");
        }
        Notification::StateChanged { subject, .. } => {
            ensure!(
                *subject == to || view.contains_key(subject),
                "state of {subject}, not in view"
            );
        }
        Notification::Event { .. } => {}
        Notification::Chat { speaker, .. } => {
            ensure!(
                *speaker == to || view.contains_key(speaker),
                "Chat from {speaker}, who is neither the client nor in view"
            );
        }
    }
    Ok(())
}

/// Every entity's position as the world reports it.
pub fn truth_of(world: &World) -> BTreeMap<PlayerId, Position> {
    world.local_players().chain(world.ghosts()).collect()
}

/// What `id` should see, by brute force over every entity.
pub fn expected_view(
    config: &WorldConfig,
    everyone: &BTreeMap<PlayerId, Position>,
    id: PlayerId,
) -> View {
    let Some(&at) = everyone.get(&id) else {
        return View::new();
    };
    everyone
        .iter()
        .filter(|&(&other, &position)| other != id && config.in_sight(at, position))
        .map(|(&other, &position)| (other, position))
        .collect()
}

/// The local players that must hear a chat line from `speaker`, by brute force.
pub fn expected_chat_audience(
    config: &WorldConfig,
    world: &World,
    speaker: PlayerId,
) -> BTreeSet<PlayerId> {
    let at = world.position(speaker).expect("the speaker is in the world");
    let mut audience: BTreeSet<PlayerId> = world
        .local_players()
        .filter(|&(id, position)| id != speaker && config.in_sight(at, position))
        .map(|(id, _)| id)
        .collect();
    if world.is_local(speaker) == Some(true) {
        audience.insert(speaker);
    }
    audience
}

/// The ids as a set, checking that none is repeated.
pub fn sorted(ids: &[PlayerId]) -> BTreeSet<PlayerId> {
    let set: BTreeSet<PlayerId> = ids.iter().copied().collect();
    assert_eq!(set.len(), ids.len(), "no id is reported twice: {ids:?}");
    set
}

/// Checks that one chat event reached exactly `audience`, with chat lines of `speaker` only.
pub fn check_chat(
    out: &[Envelope],
    speaker: PlayerId,
    audience: &BTreeSet<PlayerId>,
) -> anyhow::Result<()> {
    let recipients: Vec<PlayerId> = out.iter().map(|envelope| envelope.to).collect();
    ensure!(sorted(&recipients) == *audience, "chat of {speaker} reached {recipients:?}");
    ensure!(
        out.iter().all(|e| matches!(e.note, Notification::Chat { speaker: s, .. } if s == speaker)),
        "a chat emits only chat lines"
    );
    Ok(())
}

/// How often the interesting things happened, so that a run that never exercises them
/// (say, a rate limit that is never reached) fails instead of passing vacuously.
#[derive(Default, Debug)]
pub struct Coverage {
    pub entered: usize,
    pub moved: usize,
    pub left: usize,
    pub chat: usize,
    pub refused_moves: usize,
    pub clamped_moves: usize,
    pub ghost_jumps: usize,
    pub promotions: usize,
    pub demotions: usize,
    pub most_entities: usize,
}

impl Coverage {
    pub fn count(&mut self, out: &[Envelope]) {
        for envelope in out {
            match envelope.note {
                Notification::Entered { .. } => self.entered += 1,
                Notification::Moved { subject, .. } if subject != envelope.to => self.moved += 1,
                Notification::Moved { .. } => {}
                Notification::Left { .. } => self.left += 1,
                Notification::Chat { .. } => self.chat += 1,
                Notification::StateChanged { .. } | Notification::Event { .. } => {}
            }
        }
    }
}
