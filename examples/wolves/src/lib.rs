//! Wolves: Meridian's example game, written against the game API alone (`meridian-game`).
//!
//! Wolves wander the map. A wolf that sees a player chases the nearest one and bites it
//! when adjacent; a player attacks an adjacent wolf with an `Action`; a wolf with no health
//! left dies, and a player with none dies and respawns where it stands with full health.
//! Every shard keeps its region populated. It runs on the stock binary with
//! `meridian up --game wolves`, and shows every part of the API across borders: wolves are
//! handed off with their state when they chase someone into a neighbour's region, a bite
//! of a player owned by a neighbour is a game message sent there, and an attack on a wolf
//! across a border is carried out by the wolf's shard.
//!
//! Players also plant **flags** ([`flags`]): a flag is a persistent NPC that outlives its
//! shard (it needs a shard with a store), and how many each player has standing is kept
//! in the game's key-value space ([`flag_count`]).
//!
//! The wire format a client needs (`docs/protocol.md`, section 12, has it worked through):
//! - NPC kinds [`WOLF`] (1) and [`FLAG`] (2, named `flag`); players are kind 0.
//! - Public state of wolves and players: UTF-8 JSON `{"hp":H,"max":M}`; of a flag: its
//!   text, UTF-8, at most 64 bytes (possibly empty).
//! - Actions: [`ATTACK`] (1, `target` = an adjacent wolf; answered `{"hp":H}` or
//!   `killed`), [`SUMMON`] (2, payload `dx,dy`, default `1,0`: a wolf appears at that
//!   offset from the player, if the cell is on the player's shard, within the summon
//!   budget below), [`PLANT`] (3, payload the flag's text: a flag on the player's cell,
//!   answered with its id in decimal; refused if a flag stands there, the text is over
//!   [`FLAG_TEXT_MAX`] bytes or not UTF-8, the player has [`FLAGS_PER_PLAYER`] (5)
//!   standing, its count is still loading (try again), or the shard has no store),
//!   [`UPROOT`] (4, `target` = one of the player's own flags at most one cell away; it is
//!   removed, for good; answered with an empty payload).
//! - Events: [`BITE`] (1, from the wolf, payload the damage), [`DIED`] (2, to everyone
//!   who saw the entity die; to the player itself when it dies), [`RESPAWNED`] (3).
//!
//! Tuning is configuration the binary hands in: the population each shard keeps
//! ([`Wolves::per_shard`], default [`DEFAULT_PER_SHARD`]; the stock binary reads it from
//! `MERIDIAN_WOLVES_PER_SHARD`). The library never reads the environment.
//!
//! SUMMON has a budget ([`Wolves::summons`], a [`SpawnBudget`] of the game API, with
//! [`DEFAULT_SUMMON_LIMITS`]): a player may have at most [`SUMMONED_PER_PLAYER`] (5)
//! summoned wolves alive on the shard it summons on, the shard at most
//! [`SUMMONED_PER_SHARD`] (500) summoned wolves whoever summoned them, and a player summons
//! at most 1 wolf per second on average, 3 at once ([`SUMMON_RATE`]). Beyond it the action
//! is answered `REJECTED` with the reason, and nothing is charged for a refused summon. A
//! summoned wolf carries its summoner's id in its private state, so it still counts where
//! it roams; one killed or gone frees its place. (The population wolves of
//! [`Wolves::per_shard`] are the game's own and count against none of these.) Without
//! such a budget one player within the action rate limit could add thousands of wolves
//! and keep a shard's core busy with them.

use std::sync::Arc;
use std::time::Duration;

use meridian_game::{
    Action, Context, Direction, EntityId, Game, GameFactory, KvAnswer, KvTicket, Position, Rate,
    Reply, SpawnBudget, SpawnLimits,
};

pub mod flag_count;
pub mod flags;

pub use flag_count::{FlagCount, FlagCounts};
pub use flags::{FlagRefusal, Flags, FLAGS_PER_PLAYER, FLAG_TEXT_MAX};

pub const WOLF: u32 = 1;
pub const FLAG: u32 = 2;

pub const ATTACK: u32 = 1;
pub const SUMMON: u32 = 2;
pub const PLANT: u32 = 3;
pub const UPROOT: u32 = 4;

pub const BITE: u32 = 1;
pub const DIED: u32 = 2;
pub const RESPAWNED: u32 = 3;

/// Game messages between entities (a wolf's bite to a player owned anywhere; the news of
/// a kill to the killer's shard; `flags::MSG_FLAG_UPROOTED` (3), the news of an uproot to
/// the uprooter's shard).
const MSG_BITE: u32 = 1;
const MSG_KILLED: u32 = 2;

pub const PLAYER_HP: i32 = 20;
pub const WOLF_HP: i32 = 10;
pub const BITE_DAMAGE: i32 = 2;
pub const ATTACK_DAMAGE: i32 = 4;
/// A wolf steps at most this often while chasing, and bites at most this often.
pub const STEP_EVERY: Duration = Duration::from_millis(300);
pub const BITE_EVERY: Duration = Duration::from_millis(1000);
/// A wolf with nobody in sight takes a step this often, in a random direction.
pub const WANDER_EVERY: Duration = Duration::from_millis(1500);

/// The game: one per shard. It keeps nothing of its own about entities (their state
/// travels with them); only how many wolves its shard should have, the summon budget, and
/// its cache of the players' flag counts (the store has them).
#[derive(Debug, Clone)]
pub struct Wolves {
    /// The wolves each shard keeps: it spawns one per tick while it has fewer.
    pub per_shard: usize,
    /// The budget of SUMMON on this shard (see the crate's documentation).
    pub summons: SpawnBudget,
    /// PLANT and UPROOT, and the flag counts this shard caches.
    flags: Flags,
}

/// The population a shard keeps unless told otherwise.
pub const DEFAULT_PER_SHARD: usize = 40;
/// Summoned wolves one player may have alive on a shard.
pub const SUMMONED_PER_PLAYER: usize = 5;
/// Summoned wolves a shard may hold, whoever summoned them.
pub const SUMMONED_PER_SHARD: usize = 500;
/// How fast one player may summon: 1 a second, 3 at once.
pub const SUMMON_RATE: Rate = Rate { per_second: 1, burst: 3 };
/// The summon budget a shard has unless told otherwise.
pub const DEFAULT_SUMMON_LIMITS: SpawnLimits = SpawnLimits {
    per_owner: SUMMONED_PER_PLAYER,
    per_shard: SUMMONED_PER_SHARD,
    rate: SUMMON_RATE,
};

impl Default for Wolves {
    fn default() -> Self {
        Wolves::new(DEFAULT_PER_SHARD)
    }
}

impl Wolves {
    /// A shard's game that keeps `per_shard` wolves, with the default summon budget.
    pub fn new(per_shard: usize) -> Wolves {
        Wolves { per_shard, summons: SpawnBudget::new(DEFAULT_SUMMON_LIMITS), flags: Flags::new() }
    }

    /// PLANT, UPROOT and the flag counts cached on this shard.
    pub fn flags(&self) -> &Flags {
        &self.flags
    }

    /// The factory a shard makes its game with: every shard keeps `per_shard` wolves.
    pub fn factory(per_shard: usize) -> GameFactory {
        Arc::new(move |_| Box::new(Wolves::new(per_shard)))
    }
}

/// `{"hp":H,"max":M}`.
pub fn health_state(hp: i32, max: i32) -> Vec<u8> {
    format!("{{\"hp\":{hp},\"max\":{max}}}").into_bytes()
}

/// The health in a public state, if it has one.
pub fn health(state: &[u8]) -> Option<(i32, i32)> {
    let text = std::str::from_utf8(state).ok()?;
    let number = |key: &str| -> Option<i32> {
        let start = text.find(key)? + key.len();
        let rest = &text[start..];
        let end = rest.find(|c: char| c != '-' && !c.is_ascii_digit()).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    Some((number("\"hp\":")?, number("\"max\":")?))
}

/// A wolf's memory, its private state: when it last stepped and bit (ms since its shard
/// started; a new shard's clock starts over, which only lets it act a moment early), and
/// who summoned it (0: nobody, a wolf of the population).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Memory {
    last_step_ms: u64,
    last_bite_ms: u64,
    summoner: u64,
}

impl Memory {
    fn read(bytes: &[u8]) -> Memory {
        let word = |i: usize| {
            bytes.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
        };
        Memory {
            last_step_ms: word(0).unwrap_or(0),
            last_bite_ms: word(1).unwrap_or(0),
            summoner: word(2).unwrap_or(0),
        }
    }

    fn bytes(self) -> Vec<u8> {
        let mut out = self.last_step_ms.to_le_bytes().to_vec();
        out.extend_from_slice(&self.last_bite_ms.to_le_bytes());
        out.extend_from_slice(&self.summoner.to_le_bytes());
        out
    }
}

/// A player's private state: its kills.
fn kills(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.strip_prefix("{\"kills\":"))
        .and_then(|t| t.strip_suffix('}'))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn chebyshev(a: Position, b: Position) -> u32 {
    a.x.abs_diff(b.x).max(a.y.abs_diff(b.y))
}

/// One step from `from` toward `to`, along the axis with the larger gap.
fn toward(from: Position, to: Position) -> Option<Direction> {
    let (dx, dy) = (i64::from(to.x) - i64::from(from.x), i64::from(to.y) - i64::from(from.y));
    if dx == 0 && dy == 0 {
        return None;
    }
    Some(if dx.abs() >= dy.abs() {
        if dx > 0 {
            Direction::Right
        } else {
            Direction::Left
        }
    } else if dy > 0 {
        Direction::Down
    } else {
        Direction::Up
    })
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Wolves {
    /// The nearest player a wolf at `at` sees (ties: the lowest id).
    fn prey(ctx: &Context<'_>, at: Position) -> Option<(EntityId, Position)> {
        let (_, _, range) = ctx.map();
        ctx.within(at, range)
            .into_iter()
            .filter_map(|id| ctx.entity(id))
            .filter(|e| e.is_player())
            .min_by_key(|e| (chebyshev(at, e.position), e.id))
            .map(|e| (e.id, e.position))
    }

    fn hunt(&mut self, ctx: &mut Context<'_>, wolf: EntityId) {
        let Some(at) = ctx.position(wolf) else { return };
        let now = millis(ctx.now());
        let mut memory = Memory::read(ctx.private_state(wolf).unwrap_or_default());
        match Self::prey(ctx, at) {
            Some((player, there)) if chebyshev(at, there) <= 1 => {
                if now.saturating_sub(memory.last_bite_ms) >= millis(BITE_EVERY) {
                    memory.last_bite_ms = now;
                    let _ = ctx.set_private_state(wolf, memory.bytes());
                    ctx.send(player, wolf, MSG_BITE, &[BITE_DAMAGE as u8]);
                }
            }
            Some((_, there)) => {
                if now.saturating_sub(memory.last_step_ms) >= millis(STEP_EVERY) {
                    memory.last_step_ms = now;
                    // Saved before the step: a step across a border hands the wolf off,
                    // with this state.
                    let _ = ctx.set_private_state(wolf, memory.bytes());
                    if let Some(direction) = toward(at, there) {
                        let _ = ctx.step(wolf, direction);
                    }
                }
            }
            None => {
                if now.saturating_sub(memory.last_step_ms) >= millis(WANDER_EVERY) {
                    memory.last_step_ms = now;
                    let _ = ctx.set_private_state(wolf, memory.bytes());
                    let direction = Direction::ALL[ctx.random_below(4) as usize];
                    let _ = ctx.step(wolf, direction);
                }
            }
        }
    }

    fn spawn_wolf(ctx: &mut Context<'_>, at: Position) -> Result<EntityId, String> {
        ctx.spawn(WOLF, "wolf", at, health_state(WOLF_HP, WOLF_HP)).map_err(|e| e.to_string())
    }

    fn attack(ctx: &mut Context<'_>, actor: EntityId, target: Option<EntityId>) -> Reply {
        let Some(target) = target.and_then(|t| ctx.entity(t)) else {
            return Reply::rejected("attack what? (target an adjacent wolf)");
        };
        if target.kind != WOLF {
            return Reply::rejected("only wolves can be attacked");
        }
        let Some(from) = ctx.position(actor) else {
            return Reply::rejected("the attacker is out of the wolf's sight");
        };
        if chebyshev(from, target.position) > 1 {
            return Reply::rejected("too far: stand next to the wolf");
        }
        let (hp, max) = health(&target.state).unwrap_or((WOLF_HP, WOLF_HP));
        let hp = hp - ATTACK_DAMAGE;
        if hp <= 0 {
            ctx.event_around(target.id, DIED, b"");
            let _ = ctx.despawn(target.id);
            ctx.send(actor, target.id, MSG_KILLED, b"");
            return Reply::Done(b"killed".to_vec());
        }
        let _ = ctx.set_state(target.id, health_state(hp, max));
        Reply::Done(format!("{{\"hp\":{hp}}}").into_bytes())
    }

    /// The wolves owned here (not the other NPCs: flags).
    fn wolves(ctx: &Context<'_>) -> Vec<EntityId> {
        let mut wolves = ctx.npcs();
        wolves.retain(|npc| ctx.entity(*npc).is_some_and(|e| e.kind == WOLF));
        wolves
    }

    /// Summoned wolves owned here: `actor`'s, and everyone's.
    fn summoned(ctx: &Context<'_>, actor: EntityId) -> (usize, usize) {
        let mut mine = 0;
        let mut all = 0;
        for wolf in Self::wolves(ctx) {
            let summoner = Memory::read(ctx.private_state(wolf).unwrap_or_default()).summoner;
            if summoner != 0 {
                all += 1;
                mine += usize::from(summoner == actor.0);
            }
        }
        (mine, all)
    }

    fn summon(&mut self, ctx: &mut Context<'_>, actor: EntityId, payload: &[u8]) -> Reply {
        let Some(at) = ctx.position(actor) else { return Reply::rejected("summon from where?") };
        let (dx, dy) = std::str::from_utf8(payload)
            .ok()
            .and_then(|t| t.split_once(','))
            .and_then(|(x, y)| Some((x.trim().parse::<i64>().ok()?, y.trim().parse::<i64>().ok()?)))
            .unwrap_or((1, 0));
        if dx.abs() > 3 || dy.abs() > 3 {
            return Reply::rejected("a wolf comes at most 3 cells away");
        }
        let (x, y) = (i64::from(at.x) + dx, i64::from(at.y) + dy);
        let (width, height, _) = ctx.map();
        if x < 0 || y < 0 || x >= i64::from(width) || y >= i64::from(height) {
            return Reply::rejected("that cell is off the map");
        }
        let at = Position::new(x as u32, y as u32);
        if !ctx.owns(at) {
            return Reply::rejected("that cell is on another shard: summon nearer");
        }
        let (mine, all) = Self::summoned(ctx, actor);
        if let Err(refused) = self.summons.admit(ctx.now(), actor, mine, all) {
            return Reply::rejected(format!("no wolf: {refused}"));
        }
        match Self::spawn_wolf(ctx, at) {
            Ok(wolf) => {
                let memory = Memory { summoner: actor.0, ..Memory::default() };
                let _ = ctx.set_private_state(wolf, memory.bytes());
                Reply::Done(wolf.0.to_string().into_bytes())
            }
            Err(why) => Reply::Rejected(why),
        }
    }
}

impl Game for Wolves {
    fn tick(&mut self, ctx: &mut Context<'_>) {
        self.summons.forget_refilled(ctx.now());
        let wolves = Self::wolves(ctx);
        if wolves.len() < self.per_shard {
            if let Some(at) = ctx.random_cell() {
                let _ = Self::spawn_wolf(ctx, at);
            }
        }
        for wolf in wolves {
            self.hunt(ctx, wolf);
        }
        self.flags.tick(ctx);
    }

    fn player_joined(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        let has_health = ctx.entity(player).is_some_and(|e| health(&e.state).is_some());
        if !has_health {
            let _ = ctx.set_state(player, health_state(PLAYER_HP, PLAYER_HP));
        }
        self.flags.count_wanted(ctx, player);
    }

    fn arrived(&mut self, ctx: &mut Context<'_>, entity: EntityId) {
        if ctx.entity(entity).is_some_and(|e| e.is_player()) {
            self.flags.count_wanted(ctx, entity);
        }
    }

    fn action(&mut self, ctx: &mut Context<'_>, actor: EntityId, action: Action<'_>) -> Reply {
        match action.kind {
            ATTACK => Self::attack(ctx, actor, action.target),
            SUMMON => self.summon(ctx, actor, action.payload),
            PLANT => self.flags.plant(ctx, actor, action.payload),
            UPROOT => self.flags.uproot(ctx, actor, action.target),
            other => Reply::rejected(format!("unknown action {other}")),
        }
    }

    fn kv_answer(&mut self, ctx: &mut Context<'_>, ticket: KvTicket, key: &[u8], answer: KvAnswer) {
        let _ = key;
        self.flags.kv_answer(ctx, ticket, &answer);
    }

    fn message(
        &mut self,
        ctx: &mut Context<'_>,
        to: EntityId,
        from: EntityId,
        kind: u32,
        payload: &[u8],
    ) {
        match kind {
            MSG_BITE => {
                let Some(player) = ctx.entity(to).filter(|e| e.is_player()) else { return };
                let damage = i32::from(payload.first().copied().unwrap_or(1));
                let (hp, max) = health(&player.state).unwrap_or((PLAYER_HP, PLAYER_HP));
                let hp = hp - damage;
                ctx.event_to(to, Some(from), BITE, damage.to_string().as_bytes());
                if hp <= 0 {
                    ctx.event_to(to, None, DIED, b"");
                    ctx.event_around(to, RESPAWNED, b"");
                    let _ = ctx.set_state(to, health_state(max, max));
                } else {
                    let _ = ctx.set_state(to, health_state(hp, max));
                }
            }
            MSG_KILLED => {
                let before = kills(ctx.private_state(to).unwrap_or_default());
                let _ =
                    ctx.set_private_state(to, format!("{{\"kills\":{}}}", before + 1).into_bytes());
            }
            flags::MSG_FLAG_UPROOTED => self.flags.uprooted_elsewhere(ctx, to),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reads_back_what_it_writes() {
        assert_eq!(health(&health_state(7, 20)), Some((7, 20)));
        assert_eq!(health(&health_state(-2, 10)), Some((-2, 10)));
        assert_eq!(health(b""), None);
        assert_eq!(health(b"{\"hp\":x}"), None);
    }

    #[test]
    fn a_wolf_steps_along_the_larger_gap() {
        let at = Position::new(10, 10);
        assert_eq!(toward(at, Position::new(14, 11)), Some(Direction::Right));
        assert_eq!(toward(at, Position::new(9, 4)), Some(Direction::Up));
        assert_eq!(toward(at, at), None);
    }

    #[test]
    fn memory_and_kills_survive_their_bytes() {
        let memory = Memory { last_step_ms: 5, last_bite_ms: 1 << 40, summoner: 17 };
        assert_eq!(Memory::read(&memory.bytes()), memory);
        assert_eq!(Memory::read(b""), Memory::default());
        // A wolf handed over by a shard of the former version has no summoner: a
        // population wolf.
        let before = [5u64.to_le_bytes(), 1u64.to_le_bytes()].concat();
        assert_eq!(Memory::read(&before).summoner, 0);
        assert_eq!(kills(b"{\"kills\":12}"), 12);
        assert_eq!(kills(b""), 0);
    }
}
