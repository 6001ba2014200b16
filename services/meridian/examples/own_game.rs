//! A studio's own server binary: the whole `meridian` command line, its shards running the
//! studio's game. Here the game is a small one: every player that logs in is greeted with
//! a `GameEvent`, and an action of kind 1 answers with the shard's clock.
//!
//! `cargo run --example own_game -- up` runs a local cluster of it.

use meridian_game::{Action, Context, EntityId, Game, Reply};

#[derive(Default)]
struct Greeter;

impl Game for Greeter {
    fn player_joined(&mut self, ctx: &mut Context<'_>, player: EntityId) {
        ctx.event_to(player, None, 1, b"welcome");
    }

    fn action(&mut self, ctx: &mut Context<'_>, _: EntityId, action: Action<'_>) -> Reply {
        match action.kind {
            1 => Reply::Done(ctx.now().as_millis().to_string().into_bytes()),
            other => Reply::rejected(format!("no action {other} here")),
        }
    }
}

fn main() -> std::process::ExitCode {
    meridian::run::<Greeter>()
}
