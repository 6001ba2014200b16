//! `meridian shard`'s flags (and the game's, which `up` takes too) and their validation
//! into a `ShardConfig`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use clap::Args;
use meridian_cluster::ShardId;
use meridian_shard::ShardConfig;
use meridian_world::WorldConfig;

use super::common::{admin_access, check_common, resume_keys, CommonArgs};
use super::{finish, parse_duration, DEFAULT_CLUSTER, DEFAULT_ETCD};
use crate::join::JoinFile;

#[derive(Args, Debug, Clone)]
pub struct ShardArgs {
    /// This shard's id (unique in the cluster, > 0).
    #[arg(long, env = "MERIDIAN_SHARD_ID")]
    pub id: u32,
    /// Join the cluster of a running `meridian up` whose data directory this is (`up`
    /// prints it; `--data-dir` or its temporary one): the cluster name, etcd, lease TTL,
    /// resume keys, admin token, player store, game and resume window are the ones `up`
    /// gave its own shards (`<dir>/join.json`), and the cluster's development CA issues
    /// this shard's certificate. Only the flags not listed there apply (--store and --game
    /// given here win); --cluster, --etcd and --tls-* must not contradict it.
    #[arg(long, env = "MERIDIAN_JOIN", value_name = "DATA_DIR")]
    pub join: Option<std::path::PathBuf>,
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
    /// Takes what `join.json` in `dir` says (see `--join`), and a certificate naming this
    /// shard from the cluster's development CA.
    fn take_join(&mut self, dir: &Path, problems: &mut Vec<String>) {
        let join = match JoinFile::read(dir) {
            Ok(join) => join,
            Err(problem) => return problems.push(problem),
        };
        let common = &mut self.common;
        if common.cluster != DEFAULT_CLUSTER && common.cluster != join.cluster {
            problems.push(format!(
                "--cluster {:?} contradicts --join: the cluster there is {:?} (leave --cluster out)",
                common.cluster, join.cluster
            ));
        }
        if common.etcd != [DEFAULT_ETCD] && common.etcd != [join.etcd.clone()] {
            problems.push(format!(
                "--etcd {} contradicts --join: the cluster's etcd is {} (leave --etcd out)",
                common.etcd.join(","),
                join.etcd
            ));
        }
        let tls = &mut common.tls;
        if tls.tls_ca.is_some() || tls.tls_cert.is_some() || tls.tls_key.is_some() {
            problems.push(
                "--join issues this shard's certificate from the cluster's CA: leave out \
                 --tls-ca, --tls-cert and --tls-key"
                    .into(),
            );
        }
        match &join.tls_dir {
            Some(tls_dir) if tls.insecure_grpc => problems.push(format!(
                "--insecure-grpc contradicts --join: the cluster uses mutual TLS (its CA is in {})",
                tls_dir.display()
            )),
            Some(tls_dir) => {
                let name = format!("shard-{}", self.id);
                match meridian_tls::DevCa::open_or_create(tls_dir).and_then(|ca| ca.issue(&name)) {
                    Ok(files) => {
                        tls.tls_ca = Some(files.ca);
                        tls.tls_cert = Some(files.cert);
                        tls.tls_key = Some(files.key);
                    }
                    Err(error) => problems.push(format!(
                        "--join: the development CA in {} cannot issue {name}'s certificate: {error}",
                        tls_dir.display()
                    )),
                }
            }
            None => tls.insecure_grpc = true,
        }
        common.cluster = join.cluster.clone();
        common.etcd = vec![join.etcd.clone()];
        common.lease_ttl = join.lease_ttl();
        // `up`'s shards run in dev mode: this one too, or the gateways' spawns and the
        // shards' placements would differ between its region and theirs.
        common.dev = true;
        common.resume_keys.resume_key = Some(join.resume_key.clone());
        common.resume_keys.resume_key_previous =
            Some(join.resume_key_previous.clone()).filter(|keys| !keys.is_empty());
        if !join.admin_token.is_empty() {
            common.token.admin_token = Some(join.admin_token.clone());
        }
        if self.store.is_none() {
            self.store = join.store.clone();
            self.save_interval = Duration::from_millis(join.save_interval_ms);
        }
        if self.game.game.is_none() {
            self.game.game = join.game.clone();
            self.game.game_tick = Duration::from_millis(join.game_tick_ms);
            self.game.max_npcs = join.max_npcs;
        }
        self.resume_window = Duration::from_millis(join.resume_window_ms);
    }

    pub fn validate(mut self) -> anyhow::Result<ShardNode> {
        let mut problems = Vec::new();
        if let Some(dir) = self.join.clone() {
            self.take_join(&dir, &mut problems);
        }
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
