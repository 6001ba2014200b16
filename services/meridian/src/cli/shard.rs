//! `meridian shard`'s flags (and the game's, which `up` takes too) and their validation
//! into a `ShardConfig`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use meridian_cluster::ShardId;
use meridian_shard::ShardConfig;
use meridian_world::WorldConfig;

use super::common::{admin_access, check_common, resume_keys, CommonArgs};
use super::{finish, parse_duration};

#[derive(Args, Debug, Clone)]
pub struct ShardArgs {
    /// This shard's id (unique in the cluster, > 0).
    #[arg(long, env = "MERIDIAN_SHARD_ID")]
    pub id: u32,
    /// gRPC listen address.
    #[arg(long, env = "MERIDIAN_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// gRPC address to advertise in etcd (default: the listener's address).
    #[arg(long, env = "MERIDIAN_ADVERTISE")]
    pub advertise: Option<String>,
    /// The world's width in cells (the same on every shard of the cluster).
    #[arg(long, env = "MERIDIAN_MAP_WIDTH", default_value_t = 400)]
    pub map_width: u32,
    /// The world's height in cells (the same on every shard of the cluster).
    #[arg(long, env = "MERIDIAN_MAP_HEIGHT", default_value_t = 400)]
    pub map_height: u32,
    /// How far a player sees, in cells (Chebyshev distance): it is told of every entity
    /// within this range and of none beyond.
    #[arg(long, env = "MERIDIAN_VIEW_RANGE", default_value_t = 20)]
    pub view_range: u32,
    /// Moves per second per player before RATE_LIMITED.
    #[arg(long, env = "MERIDIAN_MOVE_RATE", default_value_t = 20)]
    pub move_rate: u32,
    /// Seed for random spawns.
    #[arg(long, env = "MERIDIAN_SEED", default_value_t = 1)]
    pub seed: u64,
    /// How long after a connection drops its player can still be resumed.
    #[arg(long, env = "MERIDIAN_RESUME_WINDOW", value_name = "DURATION", default_value = "30s",
          value_parser = parse_duration)]
    pub resume_window: Duration,
    /// How long a drain (SIGTERM or `meridian drain`) may take before it is reported as
    /// incomplete and the shard exits non-zero.
    #[arg(long, env = "MERIDIAN_DRAIN_TIMEOUT", value_name = "DURATION", default_value = "60s",
          value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// The player store this shard saves its players in: `postgres://...` (or
    /// `postgresql://`), `sqlite:PATH` or a plain file path (the same one the gateways use);
    /// any other scheme is refused. Without it nothing is saved.
    #[arg(long, env = "MERIDIAN_STORE")]
    pub store: Option<String>,
    /// Time between saves of the players that moved (they are also saved when they log
    /// out or their connection drops).
    #[arg(long, env = "MERIDIAN_SAVE_INTERVAL", value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    pub save_interval: Duration,
    #[command(flatten)]
    pub game: GameArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Which game a shard runs.
#[derive(Args, Debug, Clone)]
pub struct GameArgs {
    /// The game the shards run: `none` (the world with no rules; actions are refused),
    /// `wolves` (the example game), or one a studio's own binary adds. Default: `none` for
    /// the stock binary, the studio's game for `meridian::run::<MyGame>()`.
    #[arg(long, env = "MERIDIAN_GAME")]
    pub game: Option<String>,
    /// The game's tick on every shard (NPC behaviour, state changes sent at most once per
    /// tick).
    #[arg(long, env = "MERIDIAN_GAME_TICK", value_name = "DURATION", default_value = "100ms",
          value_parser = parse_duration)]
    pub game_tick: Duration,
    /// NPCs one shard owns at most; the game's spawns past it are refused.
    #[arg(long, env = "MERIDIAN_MAX_NPCS", default_value_t = meridian_shard::types::DEFAULT_MAX_NPCS)]
    pub max_npcs: usize,
}

impl GameArgs {
    pub fn config(&self, problems: &mut Vec<String>) -> meridian_shard::GameConfig {
        let games = crate::games();
        let name = self.game.clone().unwrap_or_else(|| games.default_name().to_string());
        let Some(mut game) = games.get(&name) else {
            problems
                .push(format!("--game {name:?}: this binary knows {}", games.names().join(", ")));
            return meridian_shard::GameConfig::none();
        };
        if self.game_tick < Duration::from_millis(10) || self.game_tick > Duration::from_secs(10) {
            problems.push("--game-tick must be between 10ms and 10s".into());
        }
        game.tick = self.game_tick;
        game.max_npcs = self.max_npcs;
        game
    }
}

/// A validated shard configuration plus what only the binary needs.
pub struct ShardNode {
    pub config: ShardConfig,
    pub listen: SocketAddr,
    pub common: CommonArgs,
    /// `--dev` without `--resume-key`: the resume key is a random one of this process's.
    pub resume_key_generated: bool,
}

impl ShardArgs {
    pub fn validate(self) -> anyhow::Result<ShardNode> {
        let mut problems = Vec::new();
        check_common(&self.common, &mut problems);
        if self.id == 0 {
            problems.push("--id must be greater than 0".into());
        }
        let world = WorldConfig {
            width: self.map_width,
            height: self.map_height,
            view_range: self.view_range,
            move_rate: self.move_rate,
        };
        if let Err(error) = world.validate() {
            problems.push(error.to_string());
        }
        if self.listen.ip().is_unspecified() && self.advertise.is_none() {
            problems.push("--listen on an unspecified address needs --advertise".into());
        }
        let mut resume_key_generated = false;
        let resume_keys = resume_keys(&self.common, &mut resume_key_generated, &mut problems);
        let tls = self.common.tls.load(self.common.dev, &mut problems);
        let store = self.store.as_deref().and_then(|spec| {
            meridian_store::Address::parse(spec)
                .map_err(|e| problems.push(format!("--store: {e}")))
                .ok()
        });
        if self.save_interval < Duration::from_secs(1) {
            problems.push("--save-interval must be at least 1s".into());
        }
        let config = ShardConfig {
            resume_keys,
            admin: admin_access(&self.common),
            id: ShardId(self.id),
            cluster: self.common.cluster.clone(),
            etcd: self.common.etcd_access.etcd(&self.common.etcd),
            world,
            dev_mode: self.common.dev,
            lease_ttl: self.common.lease_ttl,
            seed: self.seed,
            drain_timeout: self.drain_timeout,
            resume_window: self.resume_window,
            advertise_admin: self.common.advertise_admin.clone(),
            advertise: self.advertise,
            store,
            save_interval: self.save_interval,
            game: self.game.config(&mut problems),
            tls,
        };
        let node =
            ShardNode { config, listen: self.listen, common: self.common, resume_key_generated };
        finish(node, problems)
    }
}
