//! The command line: every flag, its `MERIDIAN_*` fallback, and whole-config validation
//! that lists every problem at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};
use meridian_cluster::{GatewayId, ShardId};
use meridian_gateway::limits::{AddressBlock, Limits, Rate};
use meridian_gateway::{GatewayConfig, IoBackend, Placement, QuicCert, QuicTimeouts};
use meridian_protocol::{TokenKey, TokenKeys};
use meridian_shard::ShardConfig;
use meridian_world::WorldConfig;

/// The cluster name every command uses unless told otherwise (`--cluster`,
/// `MERIDIAN_CLUSTER`): `meridian up` names its cluster this, so `meridian status` after it
/// needs no `--cluster`.
pub const DEFAULT_CLUSTER: &str = "meridian";

/// The etcd endpoint every command uses unless told otherwise (`--etcd`, `MERIDIAN_ETCD`);
/// `meridian up` starts its etcd there when the port is free.
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";

/// How every DURATION flag is written, said at the end of each command's `--help`.
pub const DURATIONS: &str = "A DURATION is written 250ms, 30s, 1m30s or 2h (units ms, s, m, h, \
     summed); a bare number is seconds.";

#[derive(Parser, Debug)]
#[command(name = "meridian", version, about = "A seamless sharded MMO server cluster")]
pub struct Cli {
    /// Log JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "MERIDIAN_LOG_JSON")]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a whole local cluster: etcd, shards and gateways as child processes, dev mode on.
    #[command(after_help = DURATIONS)]
    Up(UpArgs),
    /// Run one gateway node.
    #[command(after_help = DURATIONS)]
    Gateway(Box<GatewayArgs>),
    /// Run one zone shard node.
    #[command(after_help = DURATIONS)]
    Shard(Box<ShardArgs>),
    /// Print members, health and the partition map from etcd (`--check`: exit non-zero if
    /// anything is wrong).
    #[command(after_help = "With --check, the exit code: 0 healthy; 1 a problem found (one \
        line each); 2 a bad command line; 3 the cluster could not be read from etcd.")]
    Status(StatusArgs),
    /// Ask a shard to hand off all its players and exit (what SIGTERM does too).
    #[command(after_help = DURATIONS)]
    Drain(DrainArgs),
    /// Look up, remove or move one account's player (the player store, and etcd for the
    /// shard holding it).
    Player(PlayerArgs),
    /// Print a login token for an account, signed with the public development key: accepted
    /// only by gateways in dev mode (`meridian up`), to try the token path locally.
    #[command(after_help = DURATIONS)]
    Token(TokenArgs),
    /// Turn etcd's authentication on for Meridian, or bring it up to date: a root user, a
    /// role that may read and write /meridian/ only, and --etcd-user with it (its password
    /// in MERIDIAN_ETCD_PASSWORD). Idempotent; the chart runs it after each install.
    EtcdAuth(EtcdAuthArgs),
}

#[derive(Args, Debug, Clone)]
pub struct EtcdAuthArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The password of etcd's root user (made with it if there is none).
    #[arg(long, env = "MERIDIAN_ETCD_ROOT_PASSWORD", hide_env_values = true)]
    pub root_password: String,
}

#[derive(Args, Debug, Clone)]
pub struct PlayerArgs {
    #[command(subcommand)]
    pub action: PlayerAction,
    /// The player store the cluster uses (as its shards' and gateways' `--store`).
    #[arg(long, env = "MERIDIAN_STORE", global = true)]
    pub store: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Subcommand, Debug, Clone)]
pub enum PlayerAction {
    /// The account's player: id, name, saved cell and generation, and where it is online.
    Show {
        /// The account (a login token's `sub`; in dev mode, the Login's name).
        account: String,
    },
    /// Take the player out of the world: its connection gets UNAVAILABLE with the reason
    /// and is closed (saved where it stood).
    Kick {
        /// The account (a login token's `sub`; in dev mode, the Login's name).
        account: String,
        /// Sent to the player's client with UNAVAILABLE.
        #[arg(long, default_value = "kicked by an operator")]
        reason: String,
    },
    /// Move the player to cell (X, Y): at once if it is online (the client gets ViewReset
    /// there), else where it comes back at its next login.
    Move {
        /// The account (a login token's `sub`; in dev mode, the Login's name).
        account: String,
        /// The cell's column (0 is the map's left edge).
        x: u32,
        /// The cell's row (0 is the map's top edge).
        y: u32,
    },
}

#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// The account (the token's `sub`).
    #[arg(long)]
    pub sub: String,
    /// The display name (the token's `name`); without it, the Login's name is used.
    #[arg(long)]
    pub name: Option<String>,
    /// How long the token is valid.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub ttl: Duration,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlacementArg {
    RoundRobin,
    LeastLoaded,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Io {
    Uring,
    Epoll,
}

impl From<Io> for IoBackend {
    fn from(io: Io) -> Self {
        match io {
            Io::Uring => IoBackend::Uring,
            Io::Epoll => IoBackend::Epoll,
        }
    }
}

/// Flags every node shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Cluster name: the etcd key prefix is /meridian/<cluster>/.
    #[arg(long, env = "MERIDIAN_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// etcd endpoints, comma-separated.
    #[arg(long, env = "MERIDIAN_ETCD", value_delimiter = ',', default_value = DEFAULT_ETCD)]
    pub etcd: Vec<String>,
    #[command(flatten)]
    pub etcd_access: EtcdAccess,
    /// Admin HTTP address (/healthz, /readyz, /metrics).
    #[arg(long, env = "MERIDIAN_ADMIN", default_value = "127.0.0.1:0")]
    pub admin: SocketAddr,
    /// Admin address to advertise in etcd (default: the admin listener's address).
    #[arg(long, env = "MERIDIAN_ADVERTISE_ADMIN")]
    pub advertise_admin: Option<String>,
    /// How long a member's etcd lease lives without keep-alives (how fast a death is
    /// seen): whole seconds, 1s to 60s.
    #[arg(long, env = "MERIDIAN_LEASE_TTL", value_name = "DURATION", default_value = "3s",
          value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// Dev mode: Login.spawn is honoured.
    #[arg(long, env = "MERIDIAN_DEV")]
    pub dev: bool,
    /// Secret that signs resume tokens, hex (at least 32 hex digits), shared by every node
    /// of the cluster. Required unless --dev, where a fixed insecure key is the default.
    #[arg(long, env = "MERIDIAN_RESUME_KEY", hide_env_values = true)]
    pub resume_key: Option<String>,
    /// Keys of a rotation, hex, comma-separated: resume tokens they signed are still taken
    /// (new ones are signed with --resume-key). Rotate by giving every node the new key with
    /// the old one here, then, a resume window later, dropping the old one.
    #[arg(long, env = "MERIDIAN_RESUME_KEY_PREVIOUS", hide_env_values = true)]
    pub resume_key_previous: Option<String>,
    /// A secret the admin port's pages that name players or addresses ask for (a shard's
    /// `/players` and `/density`, a gateway's `/map` and `/map.json`): `Authorization:
    /// Bearer <token>`, or `?token=` in a browser's URL. The same on every node (gateways
    /// present it to shards). Without it those pages are served only in --dev; `/healthz`,
    /// `/readyz`, `/metrics` and `/play` are always open.
    #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Write {"id","pid",addresses} to this file once listening (for scripts and tests).
    #[arg(long, env = "MERIDIAN_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS and authentication for an etcd that asks for them (a managed etcd, the chart's).
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdAccess {
    /// The CA that issued etcd's server certificate (PEM): the --etcd endpoints are then
    /// `https://`. Read at each connection, so a renewed file is used from the next one.
    #[arg(long, global = true, env = "MERIDIAN_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// This node's client certificate (PEM), for an etcd started with --client-cert-auth.
    #[arg(long, global = true, env = "MERIDIAN_ETCD_CERT", requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "MERIDIAN_ETCD_KEY", requires_all = ["etcd_ca", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    /// An etcd user (etcd's authentication enabled); its password in
    /// MERIDIAN_ETCD_PASSWORD (or --etcd-password, which `ps` shows).
    #[arg(long, global = true, env = "MERIDIAN_ETCD_USER", requires = "etcd_password")]
    pub etcd_user: Option<String>,
    /// The --etcd-user's password; prefer MERIDIAN_ETCD_PASSWORD (a flag shows in `ps`).
    #[arg(
        long,
        global = true,
        env = "MERIDIAN_ETCD_PASSWORD",
        hide_env_values = true,
        requires = "etcd_user"
    )]
    pub etcd_password: Option<String>,
}

impl EtcdAccess {
    /// How to reach etcd at `endpoints` with these settings.
    pub fn etcd(&self, endpoints: &[String]) -> meridian_cluster::Etcd {
        let tls = self.etcd_ca.clone().map(|ca| meridian_cluster::EtcdTls {
            ca,
            identity: self.etcd_cert.clone().zip(self.etcd_key.clone()),
        });
        let user = self.etcd_user.clone().zip(self.etcd_password.clone());
        meridian_cluster::Etcd { endpoints: endpoints.to_vec(), tls, user }
    }

    /// Endpoints and TLS agree: `https://` with a CA, `http://` without.
    fn check(&self, endpoints: &[String], problems: &mut Vec<String>) {
        let secure = endpoints.iter().filter(|e| e.starts_with("https://")).count();
        match (&self.etcd_ca, secure) {
            (Some(_), n) if n < endpoints.len() => {
                problems.push("--etcd-ca needs every --etcd endpoint to be https://".into())
            }
            (None, n) if n > 0 => problems.push("https:// etcd endpoints need --etcd-ca".into()),
            _ => {}
        }
    }
}

/// Mutual TLS on the gRPC links between nodes (gateway to shard, shard to shard).
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// The cluster CA's certificate (PEM): the only issuer trusted for other nodes. With
    /// --tls-cert and --tls-key, every gRPC link is mutual TLS; the three files are read
    /// again when they change (certificate rotation drops no player).
    #[arg(long, env = "MERIDIAN_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM, leaf first), issued by the cluster CA with a DNS
    /// subject alternative name naming the node: `shard-<id>` or `gateway-<id>`.
    #[arg(long, env = "MERIDIAN_TLS_CERT", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = "MERIDIAN_TLS_KEY", requires_all = ["tls_ca", "tls_cert"])]
    pub tls_key: Option<PathBuf>,
    /// Run the gRPC links in the clear, without the --tls-* files: only on a network where
    /// nothing untrusted can reach a shard's gRPC port. Implied by --dev.
    #[arg(long, env = "MERIDIAN_INSECURE_GRPC")]
    pub insecure_grpc: bool,
}

impl TlsArgs {
    /// The node's TLS, or none where the clear is allowed; a problem otherwise.
    pub fn load(
        &self,
        dev: bool,
        problems: &mut Vec<String>,
    ) -> Option<Arc<meridian_tls::NodeTls>> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => {
                let files =
                    meridian_tls::TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() };
                meridian_tls::NodeTls::load(files)
                    .map_err(|error| problems.push(format!("--tls-*: {error}")))
                    .ok()
            }
            _ if dev || self.insecure_grpc => None,
            _ => {
                problems.push(
                    "gRPC links need mutual TLS: --tls-ca, --tls-cert and --tls-key (or \
                     --insecure-grpc on a network nothing untrusted can reach)"
                        .into(),
                );
                None
            }
        }
    }
}

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
    /// The player store this shard saves its players in: `postgres://...` or `sqlite:PATH`
    /// (the same one the gateways use). Without it nothing is saved.
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

#[derive(Args, Debug, Clone)]
pub struct GatewayArgs {
    /// This gateway's id (unique in the cluster, > 0).
    #[arg(long, env = "MERIDIAN_GATEWAY_ID")]
    pub id: u32,
    /// Client TCP listen address.
    #[arg(long, env = "MERIDIAN_LISTEN", default_value = "0.0.0.0:7777")]
    pub listen: SocketAddr,
    /// Game address to advertise in etcd (default: the listener's address).
    #[arg(long, env = "MERIDIAN_ADVERTISE")]
    pub advertise: Option<String>,
    /// The login service's public keys (a JWKS file), checked on every Login's token and
    /// re-read when the file changes. Outside dev mode every Login needs a token signed by
    /// one of them; in dev mode a Login without a token is the account named by its name.
    #[arg(long, env = "MERIDIAN_JWKS")]
    pub jwks: Option<std::path::PathBuf>,
    /// The player store: `postgres://...` (a cluster) or `sqlite:PATH` (one machine). Each
    /// account then keeps its player id across logins. Without it every login is a new
    /// player.
    #[arg(long, env = "MERIDIAN_STORE")]
    pub store: Option<String>,
    /// Event loop: io_uring (falls back to epoll if unavailable) or epoll.
    #[arg(long, env = "MERIDIAN_IO", value_enum, default_value = "uring")]
    pub io: Io,
    /// Where new logins go: round-robin over healthy shards, or the least loaded.
    #[arg(long, env = "MERIDIAN_PLACEMENT", value_enum, default_value = "round-robin")]
    pub placement: PlacementArg,
    /// Worker threads (default: one per core).
    #[arg(long, env = "MERIDIAN_WORKERS")]
    pub workers: Option<usize>,
    /// Largest client frame body in bytes.
    #[arg(long, env = "MERIDIAN_MAX_FRAME", default_value_t = meridian_protocol::DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
    /// Bytes of unsent output per client before it is disconnected as too slow.
    #[arg(long, env = "MERIDIAN_MAX_OUTPUT", default_value_t = 1 << 20)]
    pub max_output: usize,
    /// WebSocket front: TCP listen address (`ws://ADDR/`, any path; one binary message per
    /// protobuf body, no length prefix; for browsers). No WebSocket front if not given.
    #[arg(long, env = "MERIDIAN_WS")]
    pub ws: Option<SocketAddr>,
    /// QUIC front: UDP listen address (ALPN meridian/1). No QUIC front if not given.
    #[arg(long, env = "MERIDIAN_QUIC")]
    pub quic: Option<SocketAddr>,
    /// QUIC certificate chain, PEM (leaf first). Required with --quic unless --dev, where a
    /// self-signed certificate is generated at start.
    #[arg(long, env = "MERIDIAN_QUIC_CERT")]
    pub quic_cert: Option<PathBuf>,
    /// QUIC private key, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "MERIDIAN_QUIC_KEY")]
    pub quic_key: Option<PathBuf>,
    /// How long a QUIC client may send no packet before it is dropped (its player leaves
    /// the world): 500ms to 10m.
    #[arg(long, env = "MERIDIAN_QUIC_IDLE_TIMEOUT", value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    pub quic_idle_timeout: Duration,
    /// The former --quic-idle-timeout, in milliseconds (MERIDIAN_QUIC_IDLE_TIMEOUT_MS):
    /// still taken, so existing scripts keep working.
    #[arg(
        long,
        env = "MERIDIAN_QUIC_IDLE_TIMEOUT_MS",
        hide = true,
        value_name = "MS",
        conflicts_with = "quic_idle_timeout"
    )]
    pub quic_idle_timeout_ms: Option<u64>,
    /// Silence after which the gateway pings a QUIC client: at most half the idle timeout.
    #[arg(long, env = "MERIDIAN_QUIC_KEEP_ALIVE", value_name = "DURATION", default_value = "3s",
          value_parser = parse_duration)]
    pub quic_keep_alive: Duration,
    /// The former --quic-keep-alive, in milliseconds (MERIDIAN_QUIC_KEEP_ALIVE_MS): still
    /// taken.
    #[arg(
        long,
        env = "MERIDIAN_QUIC_KEEP_ALIVE_MS",
        hide = true,
        value_name = "MS",
        conflicts_with = "quic_keep_alive"
    )]
    pub quic_keep_alive_ms: Option<u64>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What one client, one address and all clients together may cost a gateway (README.md,
/// "Limits"). Durations are written `250ms`, `30s`, `2m`, `1m30s`.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Moves per second per player (burst the same) before RATE_LIMITED.
    #[arg(long, env = "MERIDIAN_MOVE_RATE", default_value_t = 20)]
    pub move_rate: u32,
    /// Chats per second per player before RATE_LIMITED.
    #[arg(long, env = "MERIDIAN_CHAT_RATE", default_value_t = 2)]
    pub chat_rate: u32,
    /// Chats a player may send at once before the chat rate applies.
    #[arg(long, env = "MERIDIAN_CHAT_BURST", default_value_t = 5)]
    pub chat_burst: u32,
    /// Game actions per second per player before RATE_LIMITED.
    #[arg(long, env = "MERIDIAN_ACTION_RATE", default_value_t = 10)]
    pub action_rate: u32,
    /// Game actions a player may send at once before the action rate applies.
    #[arg(long, env = "MERIDIAN_ACTION_BURST", default_value_t = 20)]
    pub action_burst: u32,
    /// Frames per second per connection, of every kind (burst twice that); past it the
    /// gateway stops reading the connection until the budget refills.
    #[arg(long, env = "MERIDIAN_INPUT_FRAME_RATE", default_value_t = 100)]
    pub input_frame_rate: u32,
    /// Bytes per second per connection (burst twice that), the same way.
    #[arg(long, env = "MERIDIAN_INPUT_BYTE_RATE", default_value_t = 64 * 1024)]
    pub input_byte_rate: u32,
    /// A connection with no Login or Resume by then is closed (NOT_LOGGED_IN).
    #[arg(long, env = "MERIDIAN_LOGIN_TIMEOUT", value_name = "DURATION", default_value = "10s",
          value_parser = parse_duration)]
    pub login_timeout: Duration,
    /// A logged-in client that sends nothing (not even Ping) for this long is closed.
    #[arg(long, env = "MERIDIAN_IDLE_TIMEOUT", value_name = "DURATION", default_value = "120s",
          value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Client connections on this gateway (also capped by the open-files limit less a
    /// reserve of 512); past it new ones get UNAVAILABLE "server full".
    #[arg(long, env = "MERIDIAN_MAX_CONNECTIONS", default_value_t = 100_000)]
    pub max_connections: usize,
    /// Connections from one address (an IPv6 /64 counts as one address).
    #[arg(long, env = "MERIDIAN_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 256)]
    pub max_connections_per_address: usize,
    /// New connections per second from one address (burst five times that).
    #[arg(long, env = "MERIDIAN_CONNECT_RATE", default_value_t = 20)]
    pub connect_rate: u32,
    /// Addresses or CIDR blocks the per-address limits do not apply to, comma-separated
    /// (load generators, a proxy that does its own limiting).
    #[arg(long, env = "MERIDIAN_LIMIT_EXEMPT", value_delimiter = ',')]
    pub limit_exempt: Vec<AddressBlock>,
    /// Bytes of output queued for all clients together; past it the largest queues are
    /// cut first and no connection is accepted until it drains.
    #[arg(long, env = "MERIDIAN_MAX_OUTPUT_TOTAL", default_value_t = 512 << 20)]
    pub max_output_total: usize,
}

impl LimitArgs {
    fn limits(&self, max_frame: usize, max_output: usize, problems: &mut Vec<String>) -> Limits {
        for (flag, value) in [
            ("--move-rate", self.move_rate),
            ("--chat-rate", self.chat_rate),
            ("--chat-burst", self.chat_burst),
            ("--action-rate", self.action_rate),
            ("--action-burst", self.action_burst),
            ("--input-frame-rate", self.input_frame_rate),
            ("--connect-rate", self.connect_rate),
        ] {
            if value == 0 {
                problems.push(format!("{flag} must be above 0"));
            }
        }
        // The byte budget's burst must hold the largest frame, or that frame never passes.
        let largest = max_frame + meridian_protocol::MAX_PREFIX_BYTES;
        if (self.input_byte_rate as usize) * 2 < largest {
            problems.push(format!(
                "--input-byte-rate {} must be at least half a largest frame ({largest} bytes)",
                self.input_byte_rate
            ));
        }
        if self.login_timeout.is_zero() || self.idle_timeout.is_zero() {
            problems.push("--login-timeout and --idle-timeout must be above 0".into());
        }
        if self.max_connections == 0 || self.max_connections_per_address == 0 {
            problems
                .push("--max-connections and --max-connections-per-address must be above 0".into());
        }
        if self.max_output_total < max_output {
            problems.push(format!(
                "--max-output-total {} must be at least --max-output {max_output}",
                self.max_output_total
            ));
        }
        Limits {
            moves: Rate::new(self.move_rate, self.move_rate),
            chats: Rate::new(self.chat_rate, self.chat_burst),
            actions: Rate::new(self.action_rate, self.action_burst),
            input_frames: Rate::new(self.input_frame_rate, self.input_frame_rate.saturating_mul(2)),
            input_bytes: Rate::new(self.input_byte_rate, self.input_byte_rate.saturating_mul(2)),
            login_timeout: self.login_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            connect_rate: Rate::new(self.connect_rate, self.connect_rate.saturating_mul(5)),
            exempt: self.limit_exempt.clone(),
            max_output_total: self.max_output_total,
        }
    }
}

/// A humane duration: `250ms`, `30s`, `2m`, `1h`, or a sum such as `1m30s`; a bare number
/// is seconds (what the duration flags took before they took units).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err("\"\": expected a duration, as in 250ms, 30s, 1m30s".into());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{text:?}: expected a number, as in 250ms, 30s, 1m30s"));
        }
        let number: u64 = rest[..digits].parse().map_err(|e| format!("{text:?}: {e}"))?;
        rest = &rest[digits..];
        if rest.is_empty() && total.is_zero() && digits == text.len() {
            return Ok(Duration::from_secs(number));
        }
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            "" => {
                return Err(format!("{text:?}: a unit is needed after each number (ms, s, m, h)"))
            }
            other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h)")),
        };
        total = total.saturating_add(part);
        rest = &rest[unit..];
    }
    Ok(total)
}

#[derive(Args, Debug, Clone)]
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
    /// The resume-token key for every node (hex); a random one if not given.
    #[arg(long, env = "MERIDIAN_RESUME_KEY", hide_env_values = true)]
    pub resume_key: Option<String>,
    /// Previous resume-token keys every node still takes (hex, comma-separated; see
    /// `meridian shard --help`).
    #[arg(long, env = "MERIDIAN_RESUME_KEY_PREVIOUS", hide_env_values = true)]
    pub resume_key_previous: Option<String>,
    /// The admin token every node asks for on its pages that name players (see `meridian
    /// shard --help`); without one they are open, as dev mode has them.
    #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
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
    /// The player store every shard and gateway uses: `sqlite:PATH`, `postgres://...`, or
    /// `none` (every login a new player, nothing saved). Default: `sqlite:` a file in the
    /// data directory.
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

/// Which cluster, in which etcd: what the operator commands need.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Cluster name: the etcd key prefix is /meridian/<cluster>/ (`meridian up` uses the
    /// same default).
    #[arg(long, env = "MERIDIAN_CLUSTER", default_value = DEFAULT_CLUSTER, global = true)]
    pub cluster: String,
    /// etcd endpoints, comma-separated.
    #[arg(long, global = true, env = "MERIDIAN_ETCD", value_delimiter = ',',
          default_value = DEFAULT_ETCD)]
    pub etcd: Vec<String>,
    #[command(flatten)]
    pub etcd_access: EtcdAccess,
    /// The cluster's admin token, for the nodes' pages that name players (`/players`,
    /// `/density`).
    #[arg(long, global = true, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// The shard to drain (or --id, as a Kubernetes preStop hook passes it).
    #[arg(required_unless_present = "id", conflicts_with = "id")]
    pub shard: Option<u32>,
    /// The shard to drain, as a flag (MERIDIAN_SHARD_ID, which a shard's pod has set).
    #[arg(long, env = "MERIDIAN_SHARD_ID")]
    pub id: Option<u32>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Wait until the shard has handed off its players and left, printing progress.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit 1) after this long.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Serve the live map (`/map`, `/map.json`) on this address instead of printing, until
    /// Ctrl-C; port 0 picks a free port (the URL is printed). Open on a loopback address;
    /// on any other, only with --admin-token, which it then asks for.
    #[arg(long, value_name = "ADDR", conflicts_with = "json")]
    pub web: Option<SocketAddr>,
    /// Check the cluster instead of printing it, for scripts and probes: print one line per
    /// problem (a shard or gateway not ready or not answering, no gateway registered, no
    /// partition, a cell no registered shard owns) and exit 1 if there is any, 3 if etcd
    /// cannot be read, 0 (with a one-line summary) if all is well.
    #[arg(long, conflicts_with_all = ["json", "web"])]
    pub check: bool,
}

fn check_common(common: &CommonArgs, problems: &mut Vec<String>) {
    if common.cluster.is_empty() || common.cluster.contains('/') {
        problems
            .push(format!("--cluster {:?} must be non-empty and contain no '/'", common.cluster));
    }
    if common.etcd.is_empty() || common.etcd.iter().any(|e| e.is_empty()) {
        problems.push("--etcd needs at least one endpoint".into());
    }
    common.etcd_access.check(&common.etcd, problems);
    check_lease_ttl(common.lease_ttl, problems);
}

/// etcd leases live whole seconds.
fn check_lease_ttl(ttl: Duration, problems: &mut Vec<String>) {
    if ttl.subsec_nanos() != 0 || ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
        problems.push(format!("--lease-ttl {ttl:?} must be whole seconds between 1s and 60s"));
    }
}

/// The key used in dev mode when none is given. Never use it in production: it is public.
const DEV_RESUME_KEY: &[u8] = b"meridian-dev-mode-insecure-resume-key";

/// Who may read the admin port's private pages (see `--admin-token`).
fn admin_access(common: &CommonArgs) -> meridian_observe::Private {
    meridian_observe::Private::from_config(common.admin_token.as_deref(), common.dev)
}

fn resume_keys(common: &CommonArgs, problems: &mut Vec<String>) -> TokenKeys {
    let fallback =
        || TokenKey::new(DEV_RESUME_KEY.to_vec()).expect("invariant: dev key is long enough");
    let parse = |flag: &str, hex: &str, problems: &mut Vec<String>| {
        let bytes: Option<Vec<u8>> = hex
            .len()
            .is_multiple_of(2)
            .then(|| {
                let digit = |i: usize| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok();
                (0..hex.len()).step_by(2).map(digit).collect()
            })
            .flatten();
        let key = bytes.and_then(TokenKey::new);
        if key.is_none() {
            problems.push(format!("{flag} must be at least 32 hex digits"));
        }
        key
    };
    let current = match &common.resume_key {
        Some(hex) => parse("--resume-key", hex, problems).unwrap_or_else(fallback),
        None => {
            if !common.dev {
                problems
                    .push("--resume-key (MERIDIAN_RESUME_KEY) is required outside --dev".into());
            }
            fallback()
        }
    };
    let previous = common
        .resume_key_previous
        .iter()
        .flat_map(|list| list.split(',').map(str::trim).filter(|hex| !hex.is_empty()))
        .filter_map(|hex| parse("--resume-key-previous", hex, problems))
        .collect();
    TokenKeys::new(current, previous)
}

fn finish<T>(value: T, problems: Vec<String>) -> anyhow::Result<T> {
    if problems.is_empty() {
        Ok(value)
    } else {
        bail!("invalid configuration:\n  - {}", problems.join("\n  - "))
    }
}

/// A validated shard configuration plus what only the binary needs.
pub struct ShardNode {
    pub config: ShardConfig,
    pub listen: SocketAddr,
    pub common: CommonArgs,
}

pub struct GatewayNode {
    pub config: GatewayConfig,
    /// The player store, opened when the node starts (`config.accounts` then).
    pub store: Option<meridian_store::Address>,
    pub listen: SocketAddr,
    /// The QUIC front's address, certificate and timeouts, if it is on.
    pub quic: Option<(SocketAddr, QuicCert, QuicTimeouts)>,
    /// The WebSocket front's address, if it is on.
    pub ws: Option<SocketAddr>,
    pub common: CommonArgs,
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
        let resume_keys = resume_keys(&self.common, &mut problems);
        let tls = self.common.tls.load(self.common.dev, &mut problems);
        let store = self.store.as_deref().and_then(|spec| {
            meridian_store::Address::parse(spec)
                .map_err(|e| problems.push(format!("--store {spec:?}: {e}")))
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
        finish(ShardNode { config, listen: self.listen, common: self.common }, problems)
    }
}

impl GatewayArgs {
    pub fn validate(self) -> anyhow::Result<GatewayNode> {
        let mut problems = Vec::new();
        check_common(&self.common, &mut problems);
        if self.id == 0 {
            problems.push("--id must be greater than 0".into());
        }
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        if workers == 0 || workers > 256 {
            problems.push(format!("--workers {workers} must be between 1 and 256"));
        }
        if self.max_frame < 64 || self.max_frame > 1 << 20 {
            problems.push(format!("--max-frame {} must be between 64 and 1048576", self.max_frame));
        }
        if self.max_output < 4 * self.max_frame {
            problems.push(format!("--max-output {} must be at least 4 frames", self.max_output));
        }
        let resume_keys = resume_keys(&self.common, &mut problems);
        let tls = self.common.tls.load(self.common.dev, &mut problems);
        let limits = self.limits.limits(self.max_frame, self.max_output, &mut problems);
        let store = self.store.as_deref().and_then(|spec| {
            meridian_store::Address::parse(spec)
                .map_err(|e| problems.push(format!("--store {spec:?}: {e}")))
                .ok()
        });
        // The former millisecond flags, where given, stand for the new ones.
        let idle = self.quic_idle_timeout_ms.map_or(self.quic_idle_timeout, Duration::from_millis);
        let keep_alive =
            self.quic_keep_alive_ms.map_or(self.quic_keep_alive, Duration::from_millis);
        let quic = self.quic.map(|addr| {
            let timeouts = QuicTimeouts { idle, keep_alive };
            if idle < Duration::from_millis(500) || idle > Duration::from_secs(600) {
                problems
                    .push(format!("--quic-idle-timeout {idle:?} must be between 500ms and 10m"));
            }
            if keep_alive.is_zero() || keep_alive * 2 > idle {
                problems.push(format!(
                    "--quic-keep-alive {keep_alive:?} must be above 0 and at most half the idle \
                     timeout"
                ));
            }
            let cert = match (self.quic_cert.clone(), self.quic_key.clone()) {
                (Some(cert), Some(key)) => QuicCert::Files { cert, key },
                (None, None) if self.common.dev => {
                    let mut names = vec!["localhost".to_string()];
                    if !addr.ip().is_unspecified() {
                        names.push(addr.ip().to_string());
                    }
                    if let Some(host) = self.advertise.as_deref().and_then(advertised_host) {
                        names.push(host);
                    }
                    QuicCert::SelfSigned { names }
                }
                (None, None) => {
                    problems.push("--quic needs --quic-cert and --quic-key (or --dev)".into());
                    QuicCert::SelfSigned { names: Vec::new() }
                }
                _ => {
                    problems.push("--quic-cert and --quic-key go together".into());
                    QuicCert::SelfSigned { names: Vec::new() }
                }
            };
            (addr, cert, timeouts)
        });
        if self.quic.is_none() && (self.quic_cert.is_some() || self.quic_key.is_some()) {
            problems.push("--quic-cert/--quic-key without --quic".into());
        }
        let config = GatewayConfig {
            advertise_admin: self.common.advertise_admin.clone(),
            placement: match self.placement {
                PlacementArg::RoundRobin => Placement::RoundRobin,
                PlacementArg::LeastLoaded => Placement::LeastLoaded,
            },
            resume_keys,
            admin: admin_access(&self.common),
            id: GatewayId(self.id),
            cluster: self.common.cluster.clone(),
            etcd: self.common.etcd_access.etcd(&self.common.etcd),
            io: self.io.into(),
            workers,
            max_frame: self.max_frame,
            max_output_bytes: self.max_output,
            limits,
            dev_mode: self.common.dev,
            lease_ttl: self.common.lease_ttl,
            advertise: self.advertise,
            jwks: self.jwks,
            accounts: None,
            tls,
        };
        let node = GatewayNode {
            config,
            store,
            listen: self.listen,
            quic,
            ws: self.ws,
            common: self.common,
        };
        finish(node, problems)
    }
}

/// The host part of an advertised `host:port`, for the dev certificate's names.
fn advertised_host(advertise: &str) -> Option<String> {
    let (host, _port) = advertise.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
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
        self.game.config(&mut problems);
        finish(self, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn shard(args: &[&str]) -> anyhow::Result<ShardNode> {
        let mut all = vec!["meridian", "shard", "--id", "1", "--etcd", "http://127.0.0.1:2379"];
        all.extend_from_slice(args);
        let Command::Shard(shard) = Cli::try_parse_from(all)?.command else {
            unreachable!("parsed as a shard")
        };
        shard.validate()
    }

    const KEY: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    const OLD: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

    #[test]
    fn a_rotation_takes_the_previous_keys_and_names_a_bad_one() {
        let previous = format!("{OLD}, ");
        let node =
            shard(&["--insecure-grpc", "--resume-key", KEY, "--resume-key-previous", &previous])
                .expect("valid");
        let old = TokenKeys::from(TokenKey::new(vec![0xb2; 16]).expect("a key"));
        let keys = node.config.resume_keys;
        assert_eq!(keys.verify(&old.mint(5, 6)).map(|t| t.nonce), Ok(6), "the previous key");
        assert_eq!(keys.current().id(), TokenKey::new(vec![0xa1; 16]).expect("a key").id());

        let refused = |args: &[&str]| match shard(args) {
            Ok(_) => panic!("{args:?} taken"),
            Err(error) => format!("{error:#}"),
        };
        let said = refused(&["--resume-key", KEY, "--resume-key-previous", "b2b2,zz"]);
        assert!(said.contains("--resume-key-previous must be at least 32 hex digits"), "{said}");
        let said = refused(&["--resume-key", "a1"]);
        assert!(said.contains("--resume-key must be at least 32"), "{said}");
    }

    /// Outside dev mode a node needs its TLS files for the gRPC links, or says it runs them
    /// in the clear; files that do not load are named; https etcd needs its CA.
    #[test]
    fn grpc_links_need_tls_or_an_explicit_opt_out() {
        let refused = |args: &[&str]| match shard(args) {
            Ok(_) => panic!("{args:?} taken"),
            Err(error) => format!("{error:#}"),
        };
        let said = refused(&["--resume-key", KEY]);
        assert!(said.contains("gRPC links need mutual TLS: --tls-ca"), "{said}");
        assert!(shard(&["--resume-key", KEY, "--insecure-grpc"]).is_ok(), "an explicit opt-out");
        assert!(shard(&["--dev"]).is_ok(), "dev mode");
        let missing =
            ["--tls-ca", "/nonexistent/ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem"];
        let mut args = vec!["--resume-key", KEY];
        args.extend(missing);
        let said = refused(&args);
        assert!(said.contains("cannot read /nonexistent/ca.pem"), "{said}");
        let said = refused(&["--resume-key", KEY, "--tls-ca", "ca.pem"]);
        assert!(said.contains("--tls-cert"), "the three go together: {said}");
        let https = ["--dev", "--etcd", "https://etcd:2379"];
        assert!(refused(&https).contains("https:// etcd endpoints need --etcd-ca"));
        let plain_with_ca = ["--dev", "--etcd-ca", "ca.pem"];
        assert!(refused(&plain_with_ca)
            .contains("--etcd-ca needs every --etcd endpoint to be https://"));
    }
}
