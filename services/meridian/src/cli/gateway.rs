//! `meridian gateway`'s flags (its event loop, fronts, placement and limits) and their
//! validation into a `GatewayConfig`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use meridian_cluster::GatewayId;
use meridian_gateway::limits::{AddressBlock, Limits, Rate};
use meridian_gateway::{GatewayConfig, IoBackend, Placement, QuicCert, QuicTimeouts};

use super::common::{admin_access, check_common, resume_keys, CommonArgs};
use super::{finish, parse_duration};

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
    /// The player store: `postgres://...` or `postgresql://...` (a cluster), `sqlite:PATH` or
    /// a plain file path (one machine); any other scheme is refused. Each account then keeps
    /// its player id across logins. Without it every login is a new player.
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
    /// `--dev` without `--resume-key`: the resume key is a random one of this process's.
    pub resume_key_generated: bool,
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
        let mut resume_key_generated = false;
        let resume_keys = resume_keys(&self.common, &mut resume_key_generated, &mut problems);
        let tls = self.common.tls.load(self.common.dev, &mut problems);
        let limits = self.limits.limits(self.max_frame, self.max_output, &mut problems);
        // Read now so that a missing or broken key file is refused before anything starts;
        // the gateway reads it again when it runs (and whenever it changes).
        if let Some(path) = &self.jwks {
            if let Err(error) = meridian_gateway::accounts::KeyFile::open(path, self.common.dev) {
                problems.push(format!("--jwks {error}"));
            }
        }
        let store = self.store.as_deref().and_then(|spec| {
            meridian_store::Address::parse(spec)
                .map_err(|e| problems.push(format!("--store: {e}")))
                .ok()
        });
        // The former millisecond flags, where given, stand for the new ones.
        let idle = self.quic_idle_timeout_ms.map_or(self.quic_idle_timeout, Duration::from_millis);
        let keep_alive =
            self.quic_keep_alive_ms.map_or(self.quic_keep_alive, Duration::from_millis);
        let quic = self.quic.map(|addr| {
            let timeouts = QuicTimeouts { idle, keep_alive };
            if !quic_idle_timeout_in_range(idle) {
                problems.push(format!(
                    "--quic-idle-timeout {} must be between 500ms and 10m",
                    shown(idle)
                ));
            } else if keep_alive.is_zero() || keep_alive * 2 > idle {
                // Only against an idle timeout that is itself right: a wrong one is the
                // problem to fix, and the keep-alive is then judged against the new one.
                problems.push(format!(
                    "--quic-keep-alive {} must be above 0 and at most half the idle timeout ({})",
                    shown(keep_alive),
                    shown(idle)
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
            resume_key_generated,
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

/// The QUIC idle timeouts a gateway takes (`up` checks its own flag against it too).
pub fn quic_idle_timeout_in_range(idle: Duration) -> bool {
    (Duration::from_millis(500)..=Duration::from_secs(600)).contains(&idle)
}

/// A duration as a flag's value is written: `0` rather than `0ns`.
pub(super) fn shown(duration: Duration) -> String {
    if duration.is_zero() {
        "0".into()
    } else {
        format!("{duration:?}")
    }
}
