//! Ghosts: players owned by other shards, kept here because they are within sight range
//! of this shard's region, so local players see them through the normal view logic.
//!
//! A player's messages come from its owner; when the player is handed off they start to
//! come from the new owner, on another stream, and could overtake the old owner's last
//! ones. Every message therefore carries the player's ownership generation, and a track
//! per player applies them generation by generation: messages of a newer generation are
//! held while a ghost of the older one is shown and the old owner has not yet said
//! `Released`; anything older than the track's generation is stale and dropped.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::ShardId;
use meridian_rpc::pb::{peer_message::Kind, GhostRemove, GhostStep, PeerMessage};
use meridian_world::{Envelope, PlayerId, Position, World};

use crate::history::{History, KEEP as MAX_RECENT_STEPS};
use tracing::{debug, warn};

/// How long newer messages may wait for the old owner's `Released` before they are applied
/// anyway (the old owner died, say). Observers may then see one jump.
const HOLD_LIMIT: Duration = Duration::from_secs(2);
/// How long the generation of a removed ghost is remembered, to drop its late messages.
const TOMBSTONE_LIFETIME: Duration = Duration::from_secs(60);
/// Messages held per player at most; beyond this the oldest generation is given up on.
const MAX_HELD: usize = 4096;
/// How long the ghost of a player whose owner died stays, waiting for the player to be
/// restored elsewhere (which replaces it); after that it is removed (observers get Left).
const ORPHAN_LIMIT: Duration = Duration::from_secs(5);

struct Track {
    generation: u64,
    present: bool,
    /// The old owner said this generation is complete.
    closed: bool,
    held: VecDeque<(ShardId, PeerMessage)>,
    held_since: Option<Instant>,
    touched: Instant,
    /// The shard whose messages the current generation comes from.
    source: ShardId,
    /// Since when `source` is known to be dead.
    orphaned: Option<Instant>,
    /// The shard that released the current generation to `source`, until `source` speaks
    /// for the player: should it die meanwhile, its `Handoff` may have died with it (the
    /// `Released` travelled on another stream), and the copy is orphaned as its own.
    released_by: Option<ShardId>,
}

impl Track {
    /// Whether nobody alive may speak for the copy: its source is dead, or it was released
    /// by a dead shard to one that has not spoken for it yet.
    fn bereft(&self, live: impl Fn(ShardId) -> bool) -> bool {
        !live(self.source) || self.released_by.is_some_and(|releaser| !live(releaser))
    }
}

#[derive(Default)]
pub struct Ghosts {
    tracks: FxHashMap<PlayerId, Track>,
    /// Copies an owner stopped mirroring here that local players still see: kept, and
    /// the owner is to be asked to go on mirroring them (`GhostNeeded`), by owner, player
    /// and the version the copy is at. Drained by the core after each message.
    needed: Vec<(ShardId, PlayerId, (u64, u64))>,
    /// Holds given up on after [`HOLD_LIMIT`] (see [`Ghosts::expire`]).
    release_timeouts: u64,
}

impl Ghosts {
    /// Holds given up on so far: newer updates applied without the old owner's `Released`
    /// because it did not come within [`HOLD_LIMIT`]. Without a fault (an owner that died,
    /// a stream cut) this is a lost `Released`, a bug: the simulator fails such a run.
    pub fn release_timeouts(&self) -> u64 {
        self.release_timeouts
    }

    /// The owners to ask to go on mirroring a copy (see `needed`), by owner, player and
    /// version.
    pub fn take_needed(&mut self) -> Vec<(ShardId, PlayerId, (u64, u64))> {
        std::mem::take(&mut self.needed)
    }

    /// Players with a track (present, held, or remembered to drop late messages).
    pub fn tracks(&self) -> usize {
        self.tracks.len()
    }

    pub fn len(&self) -> usize {
        self.tracks.values().filter(|t| t.present).count()
    }

    /// The newest ownership generation seen for a player owned elsewhere, if it has a track.
    pub fn generation(&self, id: PlayerId) -> Option<u64> {
        self.tracks.get(&id).map(|t| t.generation)
    }

    /// The shard the current copy's messages come from (its owner, as far as known here).
    pub fn source(&self, id: PlayerId) -> Option<ShardId> {
        self.tracks.get(&id).filter(|t| t.present).map(|t| t.source)
    }

    /// Copies shown whose messages come from `shard`, or that it released to an owner that
    /// has not spoken for them yet.
    pub fn copies_from(&self, shard: ShardId) -> Vec<PlayerId> {
        let from = |t: &Track| t.source == shard || t.released_by == Some(shard);
        self.tracks.iter().filter(|(_, t)| t.present && from(t)).map(|(id, _)| *id).collect()
    }

    /// Whether the copy's owner is known to be dead (and nobody has taken it over yet).
    pub fn is_orphaned(&self, id: PlayerId) -> bool {
        self.tracks.get(&id).is_some_and(|t| t.present && t.orphaned.is_some())
    }

    /// The player is now owned here: its ghost track ends.
    pub fn forget(&mut self, id: PlayerId) {
        self.tracks.remove(&id);
    }

    /// This shard handed the player off and keeps it as a ghost of the new generation.
    pub fn demoted(&mut self, id: PlayerId, generation: u64, new_owner: ShardId, now: Instant) {
        self.tracks.insert(
            id,
            Track {
                generation,
                present: true,
                closed: false,
                held: VecDeque::new(),
                held_since: None,
                touched: now,
                source: new_owner,
                orphaned: None,
                released_by: None,
            },
        );
    }

    /// Applies one message about a player owned elsewhere.
    pub fn apply(
        &mut self,
        world: &mut World,
        history: &mut History,
        from: ShardId,
        message: PeerMessage,
        now: Instant,
        out: &mut Vec<Envelope>,
    ) {
        self.apply_ordered(world, history, from, message, now, out, false);
    }

    /// Applies one message in generation order: a newer generation waits while the ghost
    /// shown is of a generation not yet released, or while a generation in between has
    /// not been seen (owners A -> B -> C: C's first update can arrive before B's moves).
    /// `force` lets it through anyway (an owner that never released: dead, or gone).
    fn apply_ordered(
        &mut self,
        world: &mut World,
        history: &mut History,
        from: ShardId,
        message: PeerMessage,
        now: Instant,
        out: &mut Vec<Envelope>,
        force: bool,
    ) {
        let id = PlayerId(message.player_id);
        let track = self.tracks.entry(id).or_insert_with(|| Track {
            generation: message.generation,
            present: false,
            closed: false,
            held: VecDeque::new(),
            held_since: None,
            touched: now,
            source: from,
            orphaned: None,
            released_by: None,
        });
        track.touched = now;
        if message.generation < track.generation {
            debug!(player = %id, generation = message.generation, "stale ghost message dropped");
            return;
        }
        let fresh = message.generation > track.generation;
        if fresh {
            let next = message.generation == track.generation + 1;
            if track.present && !force && (!track.closed || !next) {
                if track.held.len() >= MAX_HELD {
                    warn!(player = %id, "too many held ghost messages; releasing the old generation");
                    track.closed = true;
                } else {
                    track.held.push_back((from, message));
                    track.held_since.get_or_insert(now);
                    return;
                }
            }
            track.generation = message.generation;
            track.closed = false;
            track.released_by = None;
        }
        let shown_from = track.source;
        let was_orphaned = track.orphaned.is_some();
        track.source = from;
        track.orphaned = None;
        // A release of the generation shown, by a shard other than the one the copy is from:
        // two shards owned the player at that generation (this one handed it to a shard
        // that was paused past its lease and taken for dead, and the gateway restored the
        // player elsewhere at the same generation). The copy shown is the lost handoff's,
        // which nobody updates: it ends as below (`meridian-sim --pauses` seed 64). So does
        // a copy orphaned by its source's death released by that shard's next life, which
        // restored the player at the same generation (seed 2125: the copy stayed, its new
        // owner never told of it).
        let foreign = !fresh && (from != shown_from || was_orphaned);
        if let (true, Some(Kind::Released(released))) =
            ((fresh || foreign) && track.present, &message.kind)
        {
            // A generation's end with none of its messages before it (they would have come
            // first, on the same stream): its owner never mirrored the player here, and the
            // copy shown is an older owner's that nobody updates any more (that owner died,
            // say, and the player was restored elsewhere). The copy is treated as removed
            // by its owner: kept while players here see it, and the new owner asked for it.
            track.source = ShardId(released.new_owner);
            let at = world.position(id).map(|p| meridian_protocol::pb::Position { x: p.x, y: p.y });
            let remove = PeerMessage {
                kind: Some(Kind::Remove(GhostRemove { left_world: false, position: at })),
                ..message.clone()
            };
            apply_now(track, world, history, id, remove, now, out, &mut self.needed);
        }
        let released = apply_now(track, world, history, id, message, now, out, &mut self.needed);
        if let Some(new_owner) = released {
            // The next generation's messages come from the new owner: it is the shard whose
            // death orphans this copy from now on, and so is the releaser's until the new
            // owner speaks.
            track.source = new_owner;
            track.released_by = Some(from);
            self.release(world, history, id, now, out, force);
        }
    }

    /// After a message about `id`: a copy whose source is not a live shard (a message that
    /// was on the way when its sender died, or a `Released` naming an owner that is gone)
    /// is orphaned, so it goes if nobody restores the player.
    pub fn orphan_unless_live(
        &mut self,
        id: PlayerId,
        live: impl Fn(ShardId) -> bool,
        now: Instant,
    ) {
        if let Some(track) = self.tracks.get_mut(&id) {
            if track.present && track.orphaned.is_none() && track.bereft(&live) {
                track.orphaned = Some(now);
            }
        }
    }

    /// The current generation is complete: apply what was held, generation by generation
    /// (a later owner's messages can overtake an earlier one's on another stream), each in
    /// arrival order. What is newer than the next generation is held again until that one
    /// is released in turn.
    fn release(
        &mut self,
        world: &mut World,
        history: &mut History,
        id: PlayerId,
        now: Instant,
        out: &mut Vec<Envelope>,
        force: bool,
    ) {
        let Some(track) = self.tracks.get_mut(&id) else {
            return;
        };
        track.closed = true;
        track.held_since = None;
        let mut held = std::mem::take(&mut track.held);
        held.make_contiguous().sort_by_key(|(_, message)| message.generation);
        for (from, message) in held {
            self.apply_ordered(world, history, from, message, now, out, force);
        }
    }

    /// Shards that left the cluster will never release or update their players: what they
    /// held back is released now, and their ghosts are orphaned (removed if no new owner
    /// takes them over within [`ORPHAN_LIMIT`]).
    pub fn sources_gone(
        &mut self,
        world: &mut World,
        history: &mut History,
        live: impl Fn(ShardId) -> bool,
        now: Instant,
        out: &mut Vec<Envelope>,
    ) {
        let waiting: Vec<PlayerId> = self
            .tracks
            .iter()
            .filter(|(_, t)| !live(t.source) && !t.held.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.release(world, history, id, now, out, true);
        }
        for track in self.tracks.values_mut() {
            if track.present && track.bereft(&live) && track.orphaned.is_none() {
                track.orphaned = Some(now);
            }
        }
    }

    /// Releases holds that waited too long, removes orphans nobody took over, and forgets
    /// old tombstones. Returns how many holds it gave up on (each logged once, with the
    /// handoff's ids).
    pub fn expire(
        &mut self,
        world: &mut World,
        history: &mut History,
        now: Instant,
        out: &mut Vec<Envelope>,
    ) -> u64 {
        for (id, track) in self.tracks.iter_mut() {
            if track.present && track.orphaned.is_some_and(|since| now - since > ORPHAN_LIMIT) {
                warn!(player = %id, owner = %track.source, "owner died and nobody restored the player; removing its ghost");
                track.present = false;
                track.orphaned = None;
                history.forget(*id, true, now);
                if let Err(error) = world.remove_ghost(*id, out) {
                    warn!(player = %id, %error, "cannot remove an orphaned ghost");
                }
            }
        }
        let overdue: Vec<PlayerId> = self
            .tracks
            .iter()
            .filter(|(_, t)| t.held_since.is_some_and(|since| now - since > HOLD_LIMIT))
            .map(|(id, _)| *id)
            .collect();
        let timeouts = overdue.len() as u64;
        for id in overdue {
            if let Some(track) = self.tracks.get(&id) {
                let (new_owner, new_generation) = track
                    .held
                    .front()
                    .map_or((None, None), |(from, m)| (Some(from.0), Some(m.generation)));
                warn!(
                    player = %id,
                    old_owner = %track.source,
                    generation = track.generation,
                    ?new_owner,
                    ?new_generation,
                    held = track.held.len(),
                    "old owner never released this ghost within 2 s; applying newer updates"
                );
            }
            self.release(world, history, id, now, out, true);
        }
        self.release_timeouts += timeouts;
        self.tracks
            .retain(|_, t| t.present || !t.held.is_empty() || now - t.touched < TOMBSTONE_LIFETIME);
        timeouts
    }
}

/// Takes in another shard's recent steps of an entity, those before `version` (the state
/// about to be applied): they go into the history (for clients handed in later, see
/// `views`), and a copy this world still shows at an older state walks through the ones it
/// missed, so its observers see every step, as in one world.
pub(crate) fn catch_up(
    world: &mut World,
    history: &mut History,
    id: PlayerId,
    recent: Vec<GhostStep>,
    version: (u64, u64),
    out: &mut Vec<Envelope>,
) {
    let shown = world.name(id).cloned().zip(history.version(id));
    for step in recent.into_iter().rev().take(MAX_RECENT_STEPS).rev() {
        let step_version = (step.generation, step.subject_seq);
        if step_version >= version {
            continue;
        }
        let at = step.position.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default();
        history.fill(id, step_version, at);
        if let Some((name, _)) = shown.as_ref().filter(|(_, was)| step_version > *was) {
            if let Err(error) = world.upsert_ghost(id, name.clone(), at, out) {
                warn!(player = %id, %error, "ghost step refused by the world");
            }
        }
    }
}

/// Applies a message of the track's own generation. Returns the new owner if it closed it.
fn apply_now(
    track: &mut Track,
    world: &mut World,
    history: &mut History,
    id: PlayerId,
    message: PeerMessage,
    now: Instant,
    out: &mut Vec<Envelope>,
    needed: &mut Vec<(ShardId, PlayerId, (u64, u64))>,
) -> Option<ShardId> {
    let position = |p: Option<meridian_protocol::pb::Position>| {
        p.map(|p| Position { x: p.x, y: p.y }).unwrap_or_default()
    };
    let version = (message.generation, message.subject_seq);
    let result = match message.kind {
        Some(Kind::Upsert(upsert)) => {
            track.present = true;
            let look = meridian_world::Look {
                name: upsert.name.into(),
                kind: upsert.kind,
                state: Arc::from(upsert.state),
            };
            let at = position(upsert.position);
            catch_up(world, history, id, upsert.recent, version, out);
            history.record(id, version, at);
            world.upsert_ghost_as(id, look, at, out)
        }
        Some(Kind::State(change)) if track.present => world
            .set_state(id, Arc::from(change.state))
            .and_then(|()| world.announce_state(id, out)),
        Some(Kind::Event(event)) if track.present && event.to == 0 => {
            world.event(id, event.kind, Arc::from(event.payload), out)
        }
        Some(Kind::Moved(at)) if track.present => {
            let name = world.name(id).cloned().unwrap_or_else(|| Arc::from(""));
            let at = position(Some(at));
            history.record(id, version, at);
            world.upsert_ghost(id, name, at, out)
        }
        Some(Kind::Chat(chat)) if track.present => world.ghost_chat(id, chat.text.into(), out),
        Some(Kind::Remove(remove)) if track.present => {
            debug!(player = %id, from = %track.source, ?version, remove.left_world, "ghost remove");
            if let (false, Some(at)) = (remove.left_world, remove.position) {
                // The owner no longer mirrors the player here by its borders. This shard
                // is the one that knows whether its own players still see the copy (its
                // borders, or its players' cells, may lag behind the owner's): the copy
                // goes to where the owner last had it, and stays while anyone here sees it.
                let at = position(Some(at));
                let name = world.name(id).cloned().unwrap_or_else(|| Arc::from(""));
                history.record(id, version, at);
                if let Err(error) = world.upsert_ghost(id, name, at, out) {
                    warn!(player = %id, %error, "ghost message refused by the world");
                }
                let mut observers = Vec::new();
                world.observers_of(at, &mut observers);
                if !observers.is_empty() {
                    // This generation's updates stop here until the owner takes the copy
                    // back: a newer owner's first message need not wait for a `Released`.
                    track.closed = true;
                    needed.push((track.source, id, version));
                    return None;
                }
            }
            track.present = false;
            history.forget(id, remove.left_world, now);
            world.remove_ghost(id, out)
        }
        Some(Kind::Released(released)) => return Some(ShardId(released.new_owner)),
        _ => Ok(()),
    };
    if let Err(error) = result {
        warn!(player = %id, %error, "ghost message refused by the world");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::pb::Position as WirePosition;
    use meridian_rpc::pb::{GhostUpsert, Released};
    use meridian_world::{Notification, WorldConfig};

    const GHOST: u64 = 100;
    const WATCHER: PlayerId = PlayerId(1);

    fn world_with_watcher() -> World {
        let mut world =
            World::new(WorldConfig { width: 100, height: 100, view_range: 5, move_rate: 20 });
        let mut out = Vec::new();
        world
            .login(WATCHER, "watcher".into(), Position { x: 10, y: 10 }, Duration::ZERO, &mut out)
            .unwrap();
        world
    }

    fn message(generation: u64, kind: Kind) -> PeerMessage {
        PeerMessage { player_id: GHOST, generation, subject_seq: 0, kind: Some(kind) }
    }

    fn upsert(generation: u64, x: u32) -> PeerMessage {
        let position = Some(WirePosition { x, y: 10 });
        let upsert = GhostUpsert { name: "ghost".into(), position, ..Default::default() };
        message(generation, Kind::Upsert(upsert))
    }

    fn moved(generation: u64, x: u32) -> PeerMessage {
        message(generation, Kind::Moved(WirePosition { x, y: 10 }))
    }

    fn released(generation: u64) -> PeerMessage {
        message(generation, Kind::Released(Released { new_owner: 2 }))
    }

    /// What the watcher was told, as (kind, x) pairs.
    fn told(out: &mut Vec<Envelope>) -> Vec<(&'static str, u32)> {
        out.drain(..)
            .filter(|e| e.to == WATCHER)
            .map(|e| match e.note {
                Notification::Entered { position, .. } => ("entered", position.x),
                Notification::Moved { position, .. } => ("moved", position.x),
                Notification::Left { .. } => ("left", 0),
                Notification::Chat { .. } => ("chat", 0),
                Notification::StateChanged { .. } => ("state", 0),
                Notification::Event { .. } => ("event", 0),
            })
            .collect()
    }

    #[test]
    fn a_new_owner_waits_for_the_old_owner_to_release() {
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut out = Vec::new();
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(0, 12),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [("entered", 12)]);
        // The new owner's first update overtakes the old owner's last move.
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(1, 14),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [], "held until generation 0 is released");
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            moved(0, 13),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [("moved", 13)]);
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            released(0),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [("moved", 14)], "no jump, nothing lost");
        // Anything from the old generation after that is stale.
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            moved(0, 40),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), []);
        assert_eq!(world.position(PlayerId(GHOST)), Some(Position { x: 14, y: 10 }));
    }

    #[test]
    fn held_generations_are_applied_in_generation_order_not_arrival_order() {
        // Owners 9 -> 8 -> 9 in quick succession: generation 2 (from 9) arrives before
        // generation 1 (from 8); both wait for generation 0's release.
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut history = History::default();
        let mut out = Vec::new();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [("entered", 12)]);
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(2, 15), Instant::now(), &mut out);
        for (generation, message) in [(1, moved(1, 13)), (1, moved(1, 14)), (1, released(1))] {
            assert_eq!(generation, message.generation);
            ghosts.apply(&mut world, &mut history, ShardId(8), message, Instant::now(), &mut out);
        }
        assert_eq!(told(&mut out), [], "everything newer waits for generation 0");
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [("moved", 13), ("moved", 14), ("moved", 15)], "every step");
    }

    #[test]
    fn a_generation_waits_for_the_one_before_it_even_after_a_release() {
        // Owners 9 (gen 1, released) -> 8 (gen 2) -> 9 (gen 3): generation 3 arrives first.
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut history = History::default();
        let mut out = Vec::new();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(1, 12), Instant::now(), &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(1), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [("entered", 12)]);
        ghosts.apply(&mut world, &mut history, ShardId(9), moved(3, 15), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [], "generation 2 has not been seen yet");
        ghosts.apply(&mut world, &mut history, ShardId(8), moved(2, 13), Instant::now(), &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(8), moved(2, 14), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [("moved", 13), ("moved", 14)]);
        ghosts.apply(&mut world, &mut history, ShardId(8), released(2), Instant::now(), &mut out);
        assert_eq!(told(&mut out), [("moved", 15)], "every step, in order");
    }

    #[test]
    fn without_a_ghost_the_newer_generation_applies_at_once_and_older_is_dropped() {
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut out = Vec::new();
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(3, 12),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [("entered", 12)]);
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(2, 11),
            Instant::now(),
            &mut out,
        );
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            message(2, Kind::Remove(GhostRemove { left_world: true, position: None })),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [], "an older owner's late messages change nothing");
        assert_eq!(world.position(PlayerId(GHOST)), Some(Position { x: 12, y: 10 }));
    }

    #[test]
    fn a_removed_ghost_is_not_resurrected_by_its_late_messages() {
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut out = Vec::new();
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(0, 12),
            Instant::now(),
            &mut out,
        );
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            message(1, Kind::Remove(GhostRemove { left_world: true, position: None })),
            Instant::now(),
            &mut out,
        );
        // Generation 1 is held (the ghost of generation 0 is shown, not yet released).
        assert_eq!(told(&mut out), [("entered", 12)]);
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            released(0),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [("left", 0)]);
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            moved(0, 13),
            Instant::now(),
            &mut out,
        );
        ghosts.apply(
            &mut world,
            &mut History::default(),
            ShardId(9),
            upsert(0, 13),
            Instant::now(),
            &mut out,
        );
        assert_eq!(told(&mut out), [], "tombstone of generation 1 drops generation 0");
        assert_eq!(world.position(PlayerId(GHOST)), None);
    }

    /// This shard handed the player (generation 2) to shard 3, which was paused past its
    /// lease and never took it; the gateway restored the player on shard 2, also at
    /// generation 2, and shard 2 now hands it on: its `Released` of generation 2 is not from
    /// the shard the copy here is from. The copy is the lost handoff's: it goes (kept, and
    /// asked for, only while a player here sees it). Found by `meridian-sim --pauses`, seed 64.
    /// A copy out of the watcher's sight, demoted here when this shard handed the player
    /// (generation 2) to shard 3.
    fn handed_to_shard_3() -> (World, Ghosts, History, Vec<Envelope>, Instant) {
        let (mut world, mut ghosts, mut out) =
            (world_with_watcher(), Ghosts::default(), Vec::new());
        let now = Instant::now();
        let far = Position { x: 30, y: 10 };
        world.upsert_ghost(PlayerId(GHOST), "ghost".into(), far, &mut out).unwrap();
        ghosts.demoted(PlayerId(GHOST), 2, ShardId(3), now);
        (world, ghosts, History::default(), out, now)
    }

    #[test]
    fn a_release_of_the_shown_generation_by_another_shard_ends_the_copy() {
        let (mut world, mut ghosts, mut history, mut out, now) = handed_to_shard_3();
        let released = message(2, Kind::Released(Released { new_owner: 3 }));
        ghosts.apply(&mut world, &mut history, ShardId(2), released, now, &mut out);
        assert_eq!(world.position(PlayerId(GHOST)), None, "out of everyone's sight: gone");
        assert!(ghosts.needed.is_empty());
    }

    /// This shard handed the player (generation 2) to shard 3, which was paused past its
    /// lease and taken for dead before it took it: the copy here is orphaned. Shard 3's next
    /// life restored the player, at generation 2 too, and hands it to shard 4: its
    /// `Released` of generation 2 comes from the shard id the copy is from, but the copy is
    /// the lost handoff's all the same, and shard 4 never heard of it. It goes (kept, and
    /// asked for, only while a player here sees it). Found by `meridian-sim`, seed 2125.
    #[test]
    fn a_release_of_an_orphaned_copy_by_its_sources_next_life_ends_the_copy() {
        let (mut world, mut ghosts, mut history, mut out, now) = handed_to_shard_3();
        ghosts.sources_gone(&mut world, &mut history, |s| s != ShardId(3), now, &mut out);
        assert!(ghosts.is_orphaned(PlayerId(GHOST)));
        let released = message(2, Kind::Released(Released { new_owner: 4 }));
        ghosts.apply(&mut world, &mut history, ShardId(3), released, now, &mut out);
        assert_eq!(world.position(PlayerId(GHOST)), None, "out of everyone's sight: gone");
        assert!(ghosts.needed.is_empty());
    }

    /// A copy that missed some of the owner's updates (they travelled on another stream,
    /// or the owner stopped mirroring it for a while) gets a full state with the owner's
    /// recent steps: it walks through the ones it missed, and its observers see every step
    /// instead of a jump; the history has them for clients handed in later.
    /// The watcher sees a ghost from shard 9 at x = 12 (told and drained).
    fn watched_ghost() -> (World, Ghosts, Vec<Envelope>, Instant, History) {
        let (mut world, mut ghosts, mut out) =
            (world_with_watcher(), Ghosts::default(), Vec::new());
        let (now, mut history) = (Instant::now(), History::default());
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), now, &mut out);
        assert_eq!(told(&mut out), [("entered", 12)]);
        (world, ghosts, out, now, history)
    }

    #[test]
    fn a_copy_behind_walks_through_the_steps_it_missed() {
        let (mut world, mut ghosts, mut out, now, mut history) = watched_ghost();
        let step = |seq, x| GhostStep {
            generation: 0,
            subject_seq: seq,
            position: Some(WirePosition { x, y: 10 }),
        };
        let recent = vec![step(0, 12), step(1, 13), step(2, 14), step(3, 13), step(4, 14)];
        let position = Some(WirePosition { x: 14, y: 10 });
        let upsert = GhostUpsert { name: "ghost".into(), position, recent, ..Default::default() };
        let mut full = message(0, Kind::Upsert(upsert));
        full.subject_seq = 4;
        ghosts.apply(&mut world, &mut history, ShardId(9), full, now, &mut out);
        assert_eq!(told(&mut out), [("moved", 13), ("moved", 14), ("moved", 13), ("moved", 14)]);
        let from = Position { x: 12, y: 10 };
        let walk: Vec<u32> = history
            .steps_after(PlayerId(GHOST), (0, 0), from)
            .unwrap()
            .iter()
            .map(|p| p.x)
            .collect();
        assert_eq!(walk, [13, 14, 13, 14]);
    }

    fn out_of_reach(generation: u64, x: u32) -> PeerMessage {
        let position = Some(WirePosition { x, y: 10 });
        message(generation, Kind::Remove(GhostRemove { left_world: false, position }))
    }

    /// The owner stopped mirroring the player here (its borders say this shard no longer
    /// needs it), but a player here still sees it: the copy moves to where the owner has
    /// it and stays, and the owner is asked to go on mirroring it.
    #[test]
    fn a_removed_copy_that_a_player_here_still_sees_is_kept_and_asked_for() {
        let (mut world, mut ghosts, mut out, now, mut history) = watched_ghost();
        ghosts.apply(&mut world, &mut history, ShardId(9), out_of_reach(0, 13), now, &mut out);
        assert_eq!(told(&mut out), [("moved", 13)], "moved to where the owner has it, kept");
        assert_eq!(ghosts.needed, vec![(ShardId(9), PlayerId(GHOST), (0, 0))]);
        assert_eq!(ghosts.len(), 1);
        ghosts.needed.clear();
        // Out of the watcher's sight (5 cells): removed, nothing asked.
        ghosts.apply(&mut world, &mut history, ShardId(9), out_of_reach(0, 16), now, &mut out);
        assert_eq!(told(&mut out), [("left", 0)]);
        assert!(ghosts.needed.is_empty());
        assert_eq!(ghosts.len(), 0);
        assert_eq!(world.position(PlayerId(GHOST)), None);
    }

    /// The owner died with a copy here (orphaned); its `Released`, already on the way, then
    /// arrives. The copy belongs to the owner that `Released` names: if that one is gone
    /// too, the copy stays orphaned and goes when nobody restores the player.
    #[test]
    fn a_late_released_does_not_save_an_orphaned_copy() {
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut history = History::default();
        let mut out = Vec::new();
        let start = Instant::now();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        assert_eq!(told(&mut out), [("entered", 12)]);
        let live = |s: ShardId| s != ShardId(9) && s != ShardId(2);
        ghosts.sources_gone(&mut world, &mut history, live, start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), start, &mut out);
        ghosts.orphan_unless_live(PlayerId(GHOST), live, start);
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT / 2, &mut out);
        assert_eq!(told(&mut out), [], "kept a while for a restore");
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT * 2, &mut out);
        assert_eq!(told(&mut out), [("left", 0)], "nobody took the player over");

        // The same, but the new owner lives: the copy waits for its updates. The handoff
        // may have died with its sender, though, and the player been restored on shard 2
        // without a word of this copy: it waits as long as an orphan does, and goes if
        // shard 2 never speaks for the player here (it would if players here saw it).
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        let live = |s: ShardId| s != ShardId(9);
        ghosts.sources_gone(&mut world, &mut history, live, start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), start, &mut out);
        ghosts.orphan_unless_live(PlayerId(GHOST), live, start);
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT / 2, &mut out);
        assert_eq!(told(&mut out), [("entered", 12)], "owned by shard 2 now: kept a while");
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT * 2, &mut out);
        assert_eq!(told(&mut out), [("left", 0)], "shard 2 never spoke for it");
    }

    /// The owner released the player to shard 2 and died before its `Handoff` left (the
    /// `Released` on another stream made it): shard 2 restored the player from the gateway,
    /// never told of this copy, and does not mirror it here (nobody here sees it). The copy
    /// is orphaned when its releaser's death is known, as if still its owner's, and goes
    /// unless shard 2 speaks for the player (found by `meridian-sim`, seed 38174: the
    /// copy stayed for good).
    #[test]
    fn a_copy_released_by_a_shard_that_died_waits_for_the_new_owner_only_so_long() {
        let (mut world, mut history, mut out) =
            (world_with_watcher(), History::default(), Vec::new());
        let mut ghosts = Ghosts::default();
        let start = Instant::now();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), start, &mut out);
        told(&mut out);
        ghosts.sources_gone(&mut world, &mut history, |s| s != ShardId(9), start, &mut out);
        assert!(ghosts.is_orphaned(PlayerId(GHOST)), "its handoff may have died with shard 9");
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT * 2, &mut out);
        assert_eq!(told(&mut out), [("left", 0)], "shard 2 never spoke for it");

        // Shard 2 speaks for it in time: the copy is its, and stays.
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), start, &mut out);
        ghosts.sources_gone(&mut world, &mut history, |s| s != ShardId(9), start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(2), moved(1, 13), start, &mut out);
        assert!(!ghosts.is_orphaned(PlayerId(GHOST)));
        ghosts.expire(&mut world, &mut history, start + ORPHAN_LIMIT * 2, &mut out);
        assert_eq!(told(&mut out), [("entered", 12), ("moved", 13)]);
    }

    /// The owner of generation 0 died; the player was restored elsewhere (generation 1),
    /// whose owner never mirrored it here, and handed on to shard 2: generation 1's
    /// `Released` is all that arrives. The copy shown is nobody's any more: like a removal
    /// by its owner, it stays while the watcher sees it and shard 2 is asked for it
    /// (found by `meridian-sim`, seed 589: the copy stayed for good, its owner's messages
    /// never coming).
    #[test]
    fn a_release_of_a_generation_never_mirrored_here_ends_the_older_copy() {
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        let mut history = History::default();
        let mut out = Vec::new();
        let start = Instant::now();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(3), released(1), start, &mut out);
        assert_eq!(told(&mut out), [("entered", 12)], "held: generation 0 was not released");
        assert_eq!(ghosts.expire(&mut world, &mut history, start + HOLD_LIMIT, &mut out), 0);
        assert_eq!(ghosts.release_timeouts(), 0, "not yet overdue");
        let given_up = ghosts.expire(&mut world, &mut history, start + HOLD_LIMIT * 2, &mut out);
        assert_eq!((given_up, ghosts.release_timeouts()), (1, 1), "one hold given up on, counted");
        assert_eq!(told(&mut out), [], "still seen by the watcher: kept");
        assert_eq!(ghosts.needed, vec![(ShardId(2), PlayerId(GHOST), (1, 0))]);

        // Out of everyone's sight, the copy goes.
        let mut world = world_with_watcher();
        let mut ghosts = Ghosts::default();
        ghosts.apply(&mut world, &mut history, ShardId(9), upsert(0, 12), start, &mut out);
        ghosts.apply(&mut world, &mut history, ShardId(9), released(0), start, &mut out);
        let mut moved_away = Vec::new();
        world
            .upsert_ghost(
                PlayerId(GHOST),
                "ghost".into(),
                Position { x: 30, y: 10 },
                &mut moved_away,
            )
            .unwrap();
        told(&mut out);
        ghosts.apply(&mut world, &mut history, ShardId(3), released(1), start, &mut out);
        assert!(ghosts.needed.is_empty());
        assert_eq!(ghosts.len(), 0);
        assert_eq!(world.position(PlayerId(GHOST)), None);
    }
}
