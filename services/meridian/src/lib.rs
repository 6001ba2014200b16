//! `meridian`: one binary for every Meridian role. [`run_with`] parses and validates the
//! command line (flags with `MERIDIAN_*` environment fallbacks), sets up tracing, and hands
//! a typed config to the library crates; it holds no logic of its own beyond that.
//!
//! A studio builds its own server binary around its game the same way the stock one is
//! built: `fn main() -> ExitCode { meridian::run::<MyGame>() }`. That binary has every
//! command of the stock one (`up`, `shard`, `gateway`, `status`, ...), and its shards run
//! `MyGame` unless `--game` says otherwise.

mod cli;
mod drain;
mod etcd_auth;
mod join;
mod node;
mod player;
mod status;
mod up;

use std::sync::OnceLock;

use clap::Parser;
use meridian_game::{Game, GameFactory};

/// The games a binary can run, by the name `--game` gives, and the one its shards run by
/// default.
#[derive(Clone)]
pub struct Games {
    games: Vec<(String, GameFactory)>,
    default: String,
}

impl Games {
    /// The stock binary's: no rules by default, and the example game `wolves`, keeping
    /// `MERIDIAN_WOLVES_PER_SHARD` wolves per shard (read here, in the binary: the game's
    /// library takes it as configuration).
    pub fn stock() -> Games {
        let per_shard = std::env::var("MERIDIAN_WOLVES_PER_SHARD").ok();
        Games { games: Vec::new(), default: "none".into() }.with(
            "wolves",
            meridian_wolves::Wolves::factory(wolves_per_shard(per_shard.as_deref())),
        )
    }

    /// Adds a game under `name`.
    pub fn with(mut self, name: &str, factory: GameFactory) -> Games {
        self.games.push((name.to_string(), factory));
        self
    }

    /// Makes `name` the game shards run when `--game` is not given.
    pub fn default_to(mut self, name: &str) -> Games {
        self.default = name.to_string();
        self
    }

    /// The game called `name` (`none`: no rules).
    pub fn get(&self, name: &str) -> Option<meridian_shard::GameConfig> {
        if name == "none" {
            return Some(meridian_shard::GameConfig::none());
        }
        let (_, factory) = self.games.iter().find(|(n, _)| n == name)?;
        Some(meridian_shard::GameConfig::new(name, factory.clone()))
    }

    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// Every name `--game` accepts.
    pub fn names(&self) -> Vec<String> {
        std::iter::once("none".to_string())
            .chain(self.games.iter().map(|(n, _)| n.clone()))
            .collect()
    }
}

/// The wolves each shard keeps, from `MERIDIAN_WOLVES_PER_SHARD`'s value: the game's
/// default when it is unset or not a number.
fn wolves_per_shard(value: Option<&str>) -> usize {
    value.and_then(|v| v.parse().ok()).unwrap_or(meridian_wolves::DEFAULT_PER_SHARD)
}

static GAMES: OnceLock<Games> = OnceLock::new();

/// The games of this binary (the stock ones until [`run_with`] is called).
pub(crate) fn games() -> &'static Games {
    GAMES.get_or_init(Games::stock)
}

/// Runs the binary with `G` as its game: `meridian::run::<MyGame>()` in a studio's `main`.
/// Its shards run `G` (named `game`) unless `--game` picks another.
pub fn run<G: Game + Default + 'static>() -> std::process::ExitCode {
    run_with(Games::stock().with("game", meridian_game::factory::<G>()).default_to("game"))
}

/// The command line as clap describes it: every command, flag and help text (for tests
/// and for generating shell completions).
pub fn command() -> clap::Command {
    <cli::Cli as clap::CommandFactory>::command()
}

/// Runs the binary (every command) with these games.
pub fn run_with(games: Games) -> std::process::ExitCode {
    let _ = GAMES.set(games);
    meridian_observe::set_build_info(env!("CARGO_PKG_VERSION"), env!("MERIDIAN_BUILD_COMMIT"));
    let cli = cli::Cli::parse();
    meridian_observe::init_tracing(cli.log_json);
    // Every node serves many sockets: the soft open-files limit (often 1024) goes up to the
    // hard one before anything opens.
    if let Err(error) = meridian_gateway::raise_open_files_limit() {
        tracing::warn!(%error, "cannot raise the open-files limit");
    }
    let result = match cli.command {
        cli::Command::Shard(args) => (*args).validate().and_then(node::run_shard),
        cli::Command::Gateway(args) => args.validate().and_then(node::run_gateway),
        cli::Command::Up(args) => args.validate().and_then(up::run),
        cli::Command::Status(args) if args.check => return status::check(args),
        cli::Command::Status(args) => status::run(args),
        cli::Command::Drain(args) => drain::run(args),
        cli::Command::Player(args) => player::run(args),
        cli::Command::EtcdAuth(args) => etcd_auth::run(args),
        cli::Command::Token(args) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let token = meridian_gateway::accounts::mint_dev_token(
                &args.sub,
                args.name.as_deref(),
                now,
                args.ttl.as_secs(),
            );
            println!("{token}");
            Ok(())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("meridian: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wolves_per_shard;
    use meridian_wolves::DEFAULT_PER_SHARD;

    #[test]
    fn wolves_per_shard_is_the_number_given_or_the_games_default() {
        assert_eq!(wolves_per_shard(Some("6")), 6);
        assert_eq!(wolves_per_shard(Some("0")), 0);
        assert_eq!(wolves_per_shard(Some("many")), DEFAULT_PER_SHARD);
        assert_eq!(wolves_per_shard(None), DEFAULT_PER_SHARD);
        assert_eq!(DEFAULT_PER_SHARD, 40, "README and BENCHMARKS.md say 40");
    }
}
