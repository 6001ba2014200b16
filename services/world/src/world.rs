//! The world: who is where, and the operations of local players (log in, move, chat, leave).
//! Ghost operations live in `ghost.rs`, and what observers are told about an arrival, a move
//! or a departure in `diff.rs`; the entity store they all share is here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConfigError, WorldConfig};
use crate::grid::{IdHashBuilder, Member, SectorGrid};
use crate::rate::MoveBudget;
use crate::types::{
    Direction, EntityKind, Envelope, Look, Notification, PlayerId, Position, WorldError,
};

/// An entity as the world stores it. Its position lives in its sector's member entry (the
/// copy the hot loop scans), so there is only one place to keep up to date.
pub(crate) struct Entity {
    pub(crate) id: PlayerId,
    pub(crate) name: Arc<str>,
    pub(crate) kind: EntityKind,
    /// The game's kind (0: a player) and the public state observers are shown.
    pub(crate) game_kind: u32,
    pub(crate) state: Arc<[u8]>,
    pub(crate) sector: u32,
    pub(crate) index: u32,
    pub(crate) budget: MoveBudget,
}

/// The game rules of one map (DESIGN.md section 1), without I/O, threads, clock or randomness.
///
/// Every operation either fails with nothing applied and nothing emitted, or applies the
/// event and pushes the notifications it causes onto the caller's `out`, in event order per
/// recipient. Only local players are ever recipients.
pub struct World {
    pub(crate) config: WorldConfig,
    pub(crate) grid: SectorGrid,
    /// A slab of entities; `by_id` and the sector members point into it by slot.
    pub(crate) slots: Vec<Option<Entity>>,
    pub(crate) free_slots: Vec<u32>,
    pub(crate) by_id: HashMap<PlayerId, u32, IdHashBuilder>,
    pub(crate) n_local: usize,
    pub(crate) n_npcs: usize,
    pub(crate) n_ghosts: usize,
    /// The state of an entity that has none, shared.
    pub(crate) no_state: Arc<[u8]>,
}

impl World {
    /// Builds an empty world.
    ///
    /// # Panics
    /// If `config` is invalid; validate it first, or use [`World::try_new`].
    pub fn new(config: WorldConfig) -> World {
        match World::try_new(config) {
            Ok(world) => world,
            Err(error) => panic!("World::new needs a valid config: {error}"),
        }
    }

    /// Builds an empty world, or says everything that is wrong with `config`.
    pub fn try_new(config: WorldConfig) -> Result<World, ConfigError> {
        config.validate()?;
        Ok(World {
            grid: SectorGrid::new(&config),
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_id: HashMap::default(),
            n_local: 0,
            n_npcs: 0,
            n_ghosts: 0,
            no_state: Arc::from(&[][..]),
        })
    }

    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// Adds a local player at `at`. It is told about everyone already in its sight, and
    /// everyone local who sees it is told about it. Its move budget starts full at `now`.
    pub fn login(
        &mut self,
        id: PlayerId,
        name: Arc<str>,
        at: Position,
        now: Duration,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        if self.by_id.contains_key(&id) {
            return Err(WorldError::AlreadyPresent(id));
        }
        if !self.config.contains(at) {
            return Err(WorldError::OutsideMap(at));
        }
        let budget = MoveBudget::full_at(now, self.config.move_rate);
        let look = self.plain_look(name);
        let slot = self.insert_entity(id, look, EntityKind::Local, at, budget);
        self.announce_arrival(slot, out);
        Ok(())
    }

    /// A player's look: its name, kind 0 and no state.
    pub fn plain_look(&self, name: Arc<str>) -> Look {
        Look { name, kind: 0, state: Arc::clone(&self.no_state) }
    }

    /// Adds an NPC owned by this world at `at`: the local players that see it are told it
    /// entered (with its kind and state); it is told nothing. It moves with
    /// [`World::move_player`], under the same rules and rate limit as a player.
    pub fn spawn_npc(
        &mut self,
        id: PlayerId,
        look: Look,
        at: Position,
        now: Duration,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        if self.by_id.contains_key(&id) {
            return Err(WorldError::AlreadyPresent(id));
        }
        if !self.config.contains(at) {
            return Err(WorldError::OutsideMap(at));
        }
        let budget = MoveBudget::full_at(now, self.config.move_rate);
        let slot = self.insert_entity(id, look, EntityKind::Npc, at, budget);
        self.announce_arrival(slot, out);
        Ok(())
    }

    /// An entity's look (name, game kind, public state).
    pub fn look(&self, id: PlayerId) -> Option<Look> {
        let entity = self.entity(*self.by_id.get(&id)?);
        Some(Look {
            name: Arc::clone(&entity.name),
            kind: entity.game_kind,
            state: Arc::clone(&entity.state),
        })
    }

    /// An entity's game kind (0: a player).
    pub fn game_kind(&self, id: PlayerId) -> Option<u32> {
        self.by_id.get(&id).map(|&slot| self.entity(slot).game_kind)
    }

    /// An entity's public state.
    pub fn state(&self, id: PlayerId) -> Option<&Arc<[u8]>> {
        self.by_id.get(&id).map(|&slot| &self.entity(slot).state)
    }

    /// Sets an entity's public state without telling anyone (see [`World::announce_state`]):
    /// whoever sees it from now on is shown the new state.
    pub fn set_state(&mut self, id: PlayerId, state: Arc<[u8]>) -> Result<(), WorldError> {
        let slot = self.slot_of(id)?;
        self.entity_mut(slot).state = state;
        Ok(())
    }

    /// Tells every local player that sees the entity (and the entity itself, if it is a
    /// local player) its current public state.
    pub fn announce_state(&self, id: PlayerId, out: &mut Vec<Envelope>) -> Result<(), WorldError> {
        let slot = self.slot_of(id)?;
        let note =
            Notification::StateChanged { subject: id, state: Arc::clone(&self.entity(slot).state) };
        self.tell_observers(slot, &note, out);
        Ok(())
    }

    /// Tells every local player that sees `source` (and `source` itself, if it is a local
    /// player) a game event.
    pub fn event(
        &self,
        source: PlayerId,
        kind: u32,
        payload: Arc<[u8]>,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        let slot = self.slot_of(source)?;
        self.tell_observers(slot, &Notification::Event { source, kind, payload }, out);
        Ok(())
    }

    /// Every NPC owned here, its position and game kind, in no particular order.
    pub fn npcs(&self) -> impl Iterator<Item = (PlayerId, Position, u32)> + '_ {
        self.slots.iter().flatten().filter(|entity| entity.kind == EntityKind::Npc).map(|entity| {
            (entity.id, self.grid.member(entity.sector, entity.index).position, entity.game_kind)
        })
    }

    pub fn n_npcs(&self) -> usize {
        self.n_npcs
    }

    /// Moves a local player one step. The mover's acknowledgement (`Moved` with its own id
    /// and `client_time`) comes first, then what its observers and the mover itself must be
    /// told. A step off the map is acknowledged with the unchanged position and tells nobody
    /// else anything. Returns the new position.
    ///
    /// `RateLimited` means the move was not applied and nothing was emitted.
    pub fn move_player(
        &mut self,
        id: PlayerId,
        direction: Direction,
        client_time: u64,
        now: Duration,
        out: &mut Vec<Envelope>,
    ) -> Result<Position, WorldError> {
        let slot = self.local_slot(id)?;
        let move_rate = self.config.move_rate;
        if !self.entity_mut(slot).budget.try_take(now, move_rate) {
            return Err(WorldError::RateLimited);
        }
        let from = self.position_of_slot(slot);
        let to = self.config.step(from, direction);
        if self.entity(slot).kind.is_observer() {
            out.push(Envelope {
                to: id,
                note: Notification::Moved { subject: id, position: to, client_time },
            });
        }
        self.relocate(slot, to, out);
        Ok(to)
    }

    /// Delivers `text` to the speaker and to every local player who sees the speaker.
    pub fn chat(
        &mut self,
        id: PlayerId,
        text: Arc<str>,
        out: &mut Vec<Envelope>,
    ) -> Result<(), WorldError> {
        let slot = self.local_slot(id)?;
        out.push(Envelope {
            to: id,
            note: Notification::Chat { speaker: id, text: Arc::clone(&text) },
        });
        self.broadcast_chat(slot, text, out);
        Ok(())
    }

    /// Removes a local player (a logout or a disconnect); its local observers are told `Left`.
    pub fn logout(&mut self, id: PlayerId, out: &mut Vec<Envelope>) -> Result<(), WorldError> {
        let slot = self.local_slot(id)?;
        self.announce_departure(slot, out);
        self.remove_entity(slot);
        Ok(())
    }

    /// Where an entity (local or ghost) is.
    /// A local player's remaining move budget, to carry it over while the player is away
    /// (parked for a resume), so that coming back does not buy a fresh burst.
    pub fn move_budget(&self, id: PlayerId) -> Option<MoveBudget> {
        let slot = self.local_slot(id).ok()?;
        Some(self.entity(slot).budget)
    }

    /// Gives a local player back a budget taken with [`World::move_budget`].
    pub fn set_move_budget(&mut self, id: PlayerId, budget: MoveBudget) -> Result<(), WorldError> {
        let slot = self.local_slot(id)?;
        self.entity_mut(slot).budget = budget;
        Ok(())
    }

    pub fn position(&self, id: PlayerId) -> Option<Position> {
        self.by_id.get(&id).map(|&slot| self.position_of_slot(slot))
    }

    /// An entity's name.
    pub fn name(&self, id: PlayerId) -> Option<&Arc<str>> {
        self.by_id.get(&id).map(|&slot| &self.entity(slot).name)
    }

    /// Whether an entity is local (`Some(true)`), a ghost (`Some(false)`) or absent (`None`).
    pub fn is_local(&self, id: PlayerId) -> Option<bool> {
        self.kind(id).map(EntityKind::is_local)
    }

    /// An entity's kind, or `None` if it is absent.
    pub fn kind(&self, id: PlayerId) -> Option<EntityKind> {
        self.by_id.get(&id).map(|&slot| self.entity(slot).kind)
    }

    pub fn n_local(&self) -> usize {
        self.n_local
    }

    pub fn n_ghosts(&self) -> usize {
        self.n_ghosts
    }

    /// Appends to `out` every entity (local or ghost) that `id` sees now, in no particular
    /// order; appends nothing if `id` is absent. Used to rebuild a client's view after a reset.
    pub fn visible_to(&self, id: PlayerId, out: &mut Vec<PlayerId>) {
        let Some(&slot) = self.by_id.get(&id) else {
            return;
        };
        let at = self.position_of_slot(slot);
        self.grid.for_each_near(at, |member| {
            if member.slot != slot && self.config.in_sight(member.position, at) {
                out.push(member.id);
            }
        });
    }

    /// Appends to `out` every entity within `range` cells (Chebyshev) of `at`, as far as the
    /// neighbouring sectors reach (at least the view range; beyond it, not guaranteed).
    pub fn within(&self, at: Position, range: u32, out: &mut Vec<PlayerId>) {
        self.grid.for_each_near(at, |member| {
            let p = member.position;
            if p.x.abs_diff(at.x) <= range && p.y.abs_diff(at.y) <= range {
                out.push(member.id);
            }
        });
    }

    /// How crowded the neighbourhood of `at` is: the entities of the sectors around it, a
    /// superset of those in sight of it (about twice the sight square's area), counted
    /// without visiting them.
    pub fn crowding(&self, at: Position) -> usize {
        self.grid.population_near(at)
    }

    /// Appends to `out` every local player that sees the cell `at` (including one standing on
    /// it), in no particular order.
    pub fn observers_of(&self, at: Position, out: &mut Vec<PlayerId>) {
        self.grid.for_each_near(at, |member| {
            if member.local && self.config.in_sight(member.position, at) {
                out.push(member.id);
            }
        });
    }

    /// Every local player (not NPCs) and its position, in no particular order.
    pub fn local_players(&self) -> impl Iterator<Item = (PlayerId, Position)> + '_ {
        self.slots
            .iter()
            .flatten()
            .filter(|entity| entity.kind.is_observer())
            .map(|entity| (entity.id, self.grid.member(entity.sector, entity.index).position))
    }

    /// Every ghost and its position, in no particular order.
    pub fn ghosts(&self) -> impl Iterator<Item = (PlayerId, Position)> + '_ {
        self.slots
            .iter()
            .flatten()
            .filter(|entity| !entity.kind.is_local())
            .map(|entity| (entity.id, self.grid.member(entity.sector, entity.index).position))
    }

    /// Checks the internal indexes against each other and panics on the first inconsistency.
    /// Meant for tests; it walks the whole world.
    #[doc(hidden)]
    pub fn assert_consistent(&self) {
        let mut n_local = 0;
        let mut n_npcs = 0;
        let mut n_ghosts = 0;
        for (slot, entity) in self.slots.iter().enumerate() {
            let Some(entity) = entity else { continue };
            let member = self.grid.member(entity.sector, entity.index);
            assert_eq!(member.slot as usize, slot, "member of {} points to its slot", entity.id);
            assert_eq!(member.id, entity.id);
            assert_eq!(member.local, entity.kind.is_observer());
            assert_eq!(
                self.grid.sector_of(member.position),
                entity.sector,
                "sector of {}",
                entity.id
            );
            assert!(self.config.contains(member.position));
            assert_eq!(self.by_id.get(&entity.id), Some(&(slot as u32)));
            match entity.kind {
                EntityKind::Local => n_local += 1,
                EntityKind::Npc => n_npcs += 1,
                EntityKind::Ghost => n_ghosts += 1,
            }
        }
        assert_eq!((n_local, n_npcs, n_ghosts), (self.n_local, self.n_npcs, self.n_ghosts));
        assert_eq!(self.by_id.len(), n_local + n_npcs + n_ghosts);
        assert_eq!(self.grid.n_members(), n_local + n_npcs + n_ghosts);
    }

    // ----- the entity store, shared with `ghost.rs` and `diff.rs` -----

    pub(crate) fn entity(&self, slot: u32) -> &Entity {
        self.slots[slot as usize].as_ref().expect("invariant: a referenced slot is occupied")
    }

    pub(crate) fn entity_mut(&mut self, slot: u32) -> &mut Entity {
        self.slots[slot as usize].as_mut().expect("invariant: a referenced slot is occupied")
    }

    pub(crate) fn position_of_slot(&self, slot: u32) -> Position {
        let entity = self.entity(slot);
        self.grid.member(entity.sector, entity.index).position
    }

    pub(crate) fn slot_of(&self, id: PlayerId) -> Result<u32, WorldError> {
        self.by_id.get(&id).copied().ok_or(WorldError::UnknownPlayer(id))
    }

    /// The slot of a local player, or why `id` cannot act as one.
    fn local_slot(&self, id: PlayerId) -> Result<u32, WorldError> {
        let slot = self.slot_of(id)?;
        if self.entity(slot).kind.is_local() {
            Ok(slot)
        } else {
            Err(WorldError::NotLocal(id))
        }
    }

    /// Stores a new entity without telling anyone; the caller checked that `id` is absent and
    /// `at` is on the map.
    pub(crate) fn insert_entity(
        &mut self,
        id: PlayerId,
        look: Look,
        kind: EntityKind,
        at: Position,
        budget: MoveBudget,
    ) -> u32 {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                u32::try_from(self.slots.len() - 1).expect("invariant: fewer than 2^32 entities")
            }
        };
        let sector = self.grid.sector_of(at);
        let member = Member { id, position: at, slot, local: kind.is_observer() };
        let index = self.grid.insert(sector, member);
        let Look { name, kind: game_kind, state } = look;
        let entity = Entity { id, name, kind, game_kind, state, sector, index, budget };
        self.slots[slot as usize] = Some(entity);
        self.by_id.insert(id, slot);
        *self.count_of(kind) += 1;
        slot
    }

    /// Forgets an entity without telling anyone.
    pub(crate) fn remove_entity(&mut self, slot: u32) {
        let entity = self.slots[slot as usize].take().expect("invariant: removing a live slot");
        if let Some(moved) = self.grid.remove(entity.sector, entity.index) {
            self.entity_mut(moved).index = entity.index;
        }
        self.by_id.remove(&entity.id);
        self.free_slots.push(slot);
        *self.count_of(entity.kind) -= 1;
    }

    fn count_of(&mut self, kind: EntityKind) -> &mut usize {
        match kind {
            EntityKind::Local => &mut self.n_local,
            EntityKind::Npc => &mut self.n_npcs,
            EntityKind::Ghost => &mut self.n_ghosts,
        }
    }

    /// Sets whether an entity is local, in both places that record it.
    pub(crate) fn set_kind(&mut self, slot: u32, kind: EntityKind) {
        let entity = self.entity_mut(slot);
        let old = std::mem::replace(&mut entity.kind, kind);
        let (sector, index) = (entity.sector, entity.index);
        self.grid.member_mut(sector, index).local = kind.is_observer();
        *self.count_of(old) -= 1;
        *self.count_of(kind) += 1;
    }
}
