//! `meridian up`'s flags and their validation (`up.rs` runs the cluster they describe).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::common::{check_lease_ttl, resume_keys_of, AdminTokenArgs, ResumeKeyArgs};
use super::gateway::{quic_idle_timeout_in_range, shown, Io};
use super::shard::GameArgs;
use super::{finish, parse_duration, DEFAULT_CLUSTER};

/// `meridian up`'s flags. The resume keys and the admin token are the nodes' flags, worded
/// here for a cluster whose nodes `up` starts.
#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("resume_key", |arg| arg.help(
        "The resume-token key for every node (hex); a random one if not given")),
    mut_arg("resume_key_previous", |arg| arg.help(
        "Previous resume-token keys every node still takes (hex, comma-separated; see \
         `meridian shard --help`)")),
    mut_arg("admin_token", |arg| arg.help(
        "The admin token every node asks for on its pages that name players (see `meridian \
         shard --help`); without one they are open, as dev mode has them")),
)]
pub struct UpArgs {
    /// Zone shards; the map is split among them (4: a 2x2 grid with a four-way corner).
    #[arg(long, default_value_t = 4)]
    pub shards: u32,
    /// Gateways; every one serves the whole world (clients may connect to any).
    #[arg(long, default_value_t = 1)]
    pub gateways: u32,
    /// The gateways' event loop: io_uring (falling back to epoll where it is refused) or
    /// epoll.
    #[arg(long, value_enum, default_value = "uring")]
    pub io: Io,
    /// Game port of the first gateway (0: any free port).
    #[arg(long, default_value_t = 7777)]
    pub port: u16,
    /// QUIC (UDP) port of the first gateway (0: any free port); the others take any.
    #[arg(long, default_value_t = 7777)]
    pub quic_port: u16,
    /// WebSocket port of the first gateway (0: any free port); the others take any.
    #[arg(long, default_value_t = 7778)]
    pub ws_port: u16,
    /// The gateways' QUIC idle timeout (see `meridian gateway --help`); they ping quiet
    /// clients every third of it.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub quic_idle_timeout: Duration,
    /// The former --quic-idle-timeout, in milliseconds: still taken.
    #[arg(long, hide = true, value_name = "MS", conflicts_with = "quic_idle_timeout")]
    pub quic_idle_timeout_ms: Option<u64>,
    /// Cluster name (the etcd key prefix /meridian/<cluster>/): the default is every other
    /// command's, so `meridian status` finds this cluster without --cluster.
    #[arg(long, env = "MERIDIAN_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// The port etcd serves clients on, on 127.0.0.1: by default the one every other command
    /// looks at (so `meridian status` needs no --etcd); if it is taken, or with 0, any free
    /// port (`up` prints the --etcd to give).
    #[arg(long, default_value_t = 2379)]
    pub etcd_port: u16,
    /// Every node's etcd lease TTL (see `meridian shard --lease-ttl`): whole seconds, 1s to
    /// 60s.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// The etcd binary to start.
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: String,
    #[command(flatten)]
    pub game: GameArgs,
    /// How long after a connection drops its player can still be resumed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub resume_window: Duration,
    #[command(flatten)]
    pub resume_keys: ResumeKeyArgs,
    #[command(flatten)]
    pub token: AdminTokenArgs,
    /// Run the gRPC links in the clear instead of over mutual TLS (to measure what TLS
    /// costs; the benchmark suite does).
    #[arg(long)]
    pub insecure_grpc: bool,
    /// Write the cluster's addresses and pids as JSON here once everything is ready.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// A JWKS file of login keys for every gateway (see `meridian gateway --jwks`); the
    /// development key (`meridian token`) is accepted as well.
    #[arg(long)]
    pub jwks: Option<PathBuf>,
    /// The player store every shard and gateway uses: `sqlite:PATH` (or a plain file path),
    /// `postgres://...` / `postgresql://...`, or `none` (every login a new player, nothing
    /// saved); any other scheme is refused. Default: `sqlite:` a file in the data directory.
    #[arg(long)]
    pub store: Option<String>,
    /// Keep etcd's data and the player store here: stopping `up` and starting it again with
    /// the same directory brings the cluster back with every player where it was saved.
    /// Default: a temporary directory, removed when `up` stops.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Time between the shards' saves of players that moved (see `meridian shard
    /// --save-interval`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub save_interval: Duration,
    /// Addresses the gateways' per-address connection limits do not apply to: loopback by
    /// default, so local load tests with thousands of bots work; `--limit-exempt ''` to
    /// try the limits locally.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.0/8,::1")]
    pub limit_exempt: Vec<String>,
}

impl UpArgs {
    pub fn validate(self) -> anyhow::Result<UpArgs> {
        let mut problems = Vec::new();
        if self.shards == 0 || self.shards > 64 {
            problems.push(format!("--shards {} must be between 1 and 64", self.shards));
        }
        if self.gateways == 0 || self.gateways > 16 {
            problems.push(format!("--gateways {} must be between 1 and 16", self.gateways));
        }
        check_lease_ttl(self.lease_ttl, &mut problems);
        if self.save_interval < Duration::from_secs(1) {
            problems.push("--save-interval must be at least 1s".into());
        }
        // What the nodes would refuse is refused here, before etcd or any node starts. The
        // gateways' keep-alive is a third of the idle timeout: only the latter is `up`'s flag.
        let quic_idle =
            self.quic_idle_timeout_ms.map_or(self.quic_idle_timeout, Duration::from_millis);
        if !quic_idle_timeout_in_range(quic_idle) {
            problems.push(format!(
                "--quic-idle-timeout {} must be between 500ms and 10m",
                shown(quic_idle)
            ));
        }
        resume_keys_of(&self.resume_keys, true, &mut false, &mut problems);
        if let Some(path) = &self.jwks {
            if let Err(error) = meridian_gateway::accounts::KeyFile::open(path, true) {
                problems.push(format!("--jwks {error}"));
            }
        }
        if let Some(spec) = self.store.as_deref().filter(|spec| *spec != "none") {
            if let Err(error) = meridian_store::Address::parse(spec) {
                problems.push(format!("--store: {error}"));
            }
        }
        self.game.config(&mut problems);
        finish(self, problems)
    }
}
