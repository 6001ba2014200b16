//! The command line: every flag, its `MERIDIAN_*` fallback, and whole-config validation
//! that lists every problem at once.
//!
//! Where the flags are: this file has the commands, the operator commands' flags (`status`,
//! `drain`, `player`, `token`, `etcd-auth`) and what every command shares (the default
//! cluster and etcd, the duration format); `cli/common.rs` the flags every node takes, the
//! resume keys and the admin token (declared once, also for `up` and the operator
//! commands); `cli/shard.rs`, `cli/gateway.rs` and `cli/up.rs` each command's own flags and
//! their validation into a typed config.

mod common;
mod gateway;
mod shard;
mod up;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};

use common::{AdminTokenArgs, EtcdAccess};
pub use gateway::{GatewayArgs, GatewayNode, Io};
pub use shard::{ShardArgs, ShardNode};
pub use up::UpArgs;

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

/// Which cluster, in which etcd: what the operator commands need. They present the admin
/// token wherever they stand among a command's subcommands (`global`).
#[derive(Args, Debug, Clone)]
#[command(mut_arg("admin_token", |arg| arg.global(true).help(
    "The cluster's admin token, for the nodes' pages that name players (`/players`, \
     `/density`)")))]
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
    #[command(flatten)]
    pub token: AdminTokenArgs,
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

/// The value, or every problem found in the configuration at once.
fn finish<T>(value: T, problems: Vec<String>) -> anyhow::Result<T> {
    if problems.is_empty() {
        Ok(value)
    } else {
        bail!("invalid configuration:\n  - {}", problems.join("\n  - "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_protocol::{TokenKey, TokenKeys};

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

    /// `--dev` without `--resume-key` makes a random key per process, and says so; it never
    /// falls back to a key anyone can read (the fixed dev key this replaced is refused).
    #[test]
    fn dev_mode_without_a_resume_key_makes_a_random_one() {
        let one = shard(&["--dev"]).expect("valid");
        let two = shard(&["--dev"]).expect("valid");
        assert!(one.resume_key_generated && two.resume_key_generated);
        let (one, two) = (one.config.resume_keys, two.config.resume_keys);
        assert_ne!(one.current().id(), two.current().id(), "two nodes, two keys");
        assert!(two.verify(&one.mint(5, 6)).is_err(), "one node's token is refused by another");
        assert_eq!(one.verify(&one.mint(5, 6)).map(|t| t.nonce), Ok(6));
        let published = b"meridian-dev-mode-insecure-resume-key".to_vec();
        let published = TokenKeys::from(TokenKey::new(published).expect("a key"));
        assert!(one.verify(&published.mint(5, 6)).is_err(), "the old published key is refused");

        let given = shard(&["--dev", "--resume-key", KEY]).expect("valid");
        assert!(!given.resume_key_generated);
        let expected = TokenKey::new(vec![0xa1; 16]).expect("a key").id();
        assert_eq!(given.config.resume_keys.current().id(), expected);
    }

    /// The resume keys and the admin token, declared once, are read by every command that
    /// takes them: the operator commands' token also after a subcommand (it is global there).
    #[test]
    fn the_shared_flags_reach_every_command_that_takes_them() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).expect("parsed").command;
        let Command::Player(player) =
            parse(&["meridian", "player", "show", "someone", "--admin-token", "t"])
        else {
            unreachable!("parsed as player")
        };
        assert_eq!(player.cluster.token.admin_token.as_deref(), Some("t"));
        let up = ["meridian", "up", "--resume-key", KEY, "--resume-key-previous", OLD];
        let Command::Up(up) = parse(&[&up[..], &["--admin-token", "u"]].concat()) else {
            unreachable!("parsed as up")
        };
        assert_eq!(up.resume_keys.resume_key.as_deref(), Some(KEY));
        assert_eq!(up.resume_keys.resume_key_previous.as_deref(), Some(OLD));
        assert_eq!(up.token.admin_token.as_deref(), Some("u"));
        let node = shard(&["--dev", "--admin-token", "s"]).expect("valid");
        assert_eq!(node.common.token.admin_token.as_deref(), Some("s"));
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

    fn refused_as(command: &[&str]) -> String {
        let cli = Cli::try_parse_from(command).expect("parses");
        let refused = match cli.command {
            Command::Up(up) => up.validate().map(drop),
            Command::Gateway(gateway) => gateway.validate().map(drop),
            _ => unreachable!("up or gateway"),
        };
        format!("{:#}", refused.expect_err("refused"))
    }

    /// Issue 32: `up --quic-idle-timeout 0` complained about a `--quic-keep-alive 0ns` that
    /// was never given (`up` derives it), and only once etcd and the shards ran.
    #[test]
    fn a_zero_quic_idle_timeout_is_named_as_given() {
        let said = refused_as(&["meridian", "up", "--quic-idle-timeout", "0"]);
        assert!(said.contains("--quic-idle-timeout 0 must be between 500ms and 10m"), "{said}");
        assert!(!said.contains("keep-alive") && !said.contains("0ns"), "{said}");

        let gateway = ["meridian", "gateway", "--id", "1", "--dev", "--quic", "127.0.0.1:0"];
        let said = refused_as(&[&gateway[..], &["--quic-idle-timeout", "0"]].concat());
        assert!(said.contains("--quic-idle-timeout 0 must be between"), "{said}");
        assert!(!said.contains("--quic-keep-alive"), "the idle timeout is the problem: {said}");
        let said = refused_as(&[&gateway[..], &["--quic-keep-alive", "6s"]].concat());
        assert!(said.contains("--quic-keep-alive 6s must be above 0 and at most half"), "{said}");
    }
}
