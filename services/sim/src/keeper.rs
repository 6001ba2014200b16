//! The game the simulated shards run when a run has persistent entities
//! (`Settings::entities`): while the workload plays, each shard now and then plants a
//! persistent stone on a cell of its own (three per life at most), steps one of its NPCs a
//! cell (across a border: a handoff), gives it a new private state, or uproots one. Its
//! randomness is the core's, so a seed replays it. It stops when the workload does, so the
//! cluster can settle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use meridian_game::{Context, Direction, Game};

/// The kind of the stones.
const STONE: u32 = 7;
const PLANTED_PER_LIFE: u32 = 3;

pub(crate) struct Keeper {
    pub playing: Arc<AtomicBool>,
    pub planted: u32,
    pub steps: u64,
}

impl Game for Keeper {
    fn tick(&mut self, ctx: &mut Context<'_>) {
        if !self.playing.load(Ordering::Relaxed) {
            return;
        }
        let roll = ctx.random_below(100);
        let npcs = ctx.npcs();
        if roll < 6 && self.planted < PLANTED_PER_LIFE {
            let Some(at) = ctx.random_cell() else { return };
            let state = format!("stone of shard {}", ctx.shard()).into_bytes();
            if ctx.spawn_persistent(STONE, "stone", at, state).is_ok() {
                self.planted += 1;
            }
        } else if roll < 25 && !npcs.is_empty() {
            let npc = npcs[ctx.random_below(npcs.len() as u64) as usize];
            self.steps += 1;
            let _ = ctx.set_private_state(npc, self.steps.to_le_bytes().to_vec());
            let direction = Direction::ALL[ctx.random_below(4) as usize];
            let _ = ctx.step(npc, direction);
        } else if roll == 99 && !npcs.is_empty() {
            let npc = npcs[ctx.random_below(npcs.len() as u64) as usize];
            let _ = ctx.despawn(npc);
        }
    }
}
