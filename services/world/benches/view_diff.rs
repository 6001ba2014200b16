//! Micro-benchmarks of the view-diff hot path: one player steps among its neighbours and
//! the world produces every notification that step causes.
//!
//! `cargo bench -p meridian-world --bench view_diff`. The crowd size is the number of
//! other players in sight; each iteration is one move (and its notifications, counted).

use std::sync::Arc;
use std::time::Duration;

use divan::{black_box, Bencher};
use meridian_world::{Direction, Envelope, PlayerId, Position, World, WorldConfig};

fn main() {
    divan::main();
}

/// A world with one player at each of `cells` and the mover (id 1) at `mover_at`.
fn world_with(cells: impl Iterator<Item = Position>, mover_at: Position) -> (World, PlayerId) {
    let mut world = World::new(WorldConfig::default());
    let mut out = Vec::new();
    let mover = PlayerId(1);
    let everyone = cells.enumerate().map(|(i, at)| (PlayerId(i as u64 + 2), at));
    for (id, at) in everyone.chain([(mover, mover_at)]) {
        world
            .login(id, Arc::from(format!("bot-{}", id.0)), at, Duration::ZERO, &mut out)
            .expect("invariant: a fresh id on the map");
    }
    (world, mover)
}

/// A world with `crowd` players spread over a 21x21 square around (200, 200), all in
/// sight of one another, and the mover at the centre.
fn crowded_world(crowd: u64) -> (World, PlayerId) {
    let cells =
        (0..crowd).map(|i| Position::new(190 + (i % 21) as u32, 190 + ((i / 21) % 21) as u32));
    world_with(cells, Position::new(200, 200))
}

/// The mover steps right and back: every neighbour stays in sight, so each step is one ack
/// plus one `Moved` per neighbour.
#[divan::bench(args = [10, 100, 1000])]
fn step_within_a_crowd(bencher: Bencher, crowd: u64) {
    let (mut world, mover) = crowded_world(crowd);
    let mut out: Vec<Envelope> = Vec::with_capacity(2 * crowd as usize + 8);
    let mut tick = 0u64;
    bencher.counter(divan::counter::ItemsCount::new(crowd + 1)).bench_local(|| {
        tick += 1;
        out.clear();
        let direction = if tick.is_multiple_of(2) { Direction::Left } else { Direction::Right };
        // One second apart, so the move budget never refuses a step.
        let now = Duration::from_secs(tick);
        let to = world.move_player(mover, direction, tick, now, &mut out);
        black_box((to, out.len()))
    });
}

/// The mover walks along a line of players spaced one per column: each step brings one
/// into sight and drops one out of it (`Entered` and `Left` both ways), the diff's
/// expensive case.
#[divan::bench(args = [100, 400])]
fn step_along_a_line(bencher: Bencher, line: u64) {
    let cells = (0..line).map(|i| Position::new((i % 400) as u32, 100));
    let (mut world, mover) = world_with(cells, Position::new(100, 101));
    let mut out = Vec::new();
    let mut tick = 0u64;
    bencher.bench_local(|| {
        tick += 1;
        out.clear();
        // 40 steps right, then 40 back, forever.
        let direction =
            if (tick / 40).is_multiple_of(2) { Direction::Right } else { Direction::Left };
        let to = world.move_player(mover, direction, tick, Duration::from_secs(tick), &mut out);
        black_box((to, out.len()))
    });
}
