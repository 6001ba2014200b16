//! The flags every node takes (cluster, etcd and its access, admin port, lease, dev mode,
//! resume keys, admin token, ready file, TLS) and their checks; the resume keys and the
//! admin token are declared here once for every command that takes them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use meridian_protocol::{TokenKey, TokenKeys};

use super::{parse_duration, DEFAULT_CLUSTER, DEFAULT_ETCD};

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
    #[command(flatten)]
    pub resume_keys: ResumeKeyArgs,
    #[command(flatten)]
    pub token: AdminTokenArgs,
    /// Write {"id","pid",addresses} to this file once listening (for scripts and tests).
    #[arg(long, env = "MERIDIAN_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The resume-token keys, declared once for every command that takes them (`shard`,
/// `gateway`, and `up`, which words their help for itself and hands them to its nodes).
#[derive(Args, Debug, Clone, Default)]
pub struct ResumeKeyArgs {
    /// Secret that signs resume tokens, hex (at least 32 hex digits), shared by every node
    /// of the cluster. Required unless --dev, where a random key is made at startup (tokens
    /// then do not survive a restart and no other node takes them).
    #[arg(long, env = "MERIDIAN_RESUME_KEY", hide_env_values = true)]
    pub resume_key: Option<String>,
    /// Keys of a rotation, hex, comma-separated: resume tokens they signed are still taken
    /// (new ones are signed with --resume-key). Rotate by giving every node the new key with
    /// the old one here, then, a resume window later, dropping the old one.
    #[arg(long, env = "MERIDIAN_RESUME_KEY_PREVIOUS", hide_env_values = true)]
    pub resume_key_previous: Option<String>,
}

/// The admin token, declared once for every command that takes it (the nodes, `up`, and the
/// operator commands, which present it and word its help for themselves).
#[derive(Args, Debug, Clone, Default)]
pub struct AdminTokenArgs {
    /// A secret the admin port's pages that name players or addresses ask for (a shard's
    /// `/players` and `/density`, a gateway's `/map` and `/map.json`): `Authorization:
    /// Bearer <token>`, or `?token=` in a browser's URL. The same on every node (gateways
    /// present it to shards). Without it those pages are served only in --dev; `/healthz`,
    /// `/readyz`, `/metrics` and `/play` are always open.
    #[arg(long, env = "MERIDIAN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
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

pub(super) fn check_common(common: &CommonArgs, problems: &mut Vec<String>) {
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
pub(super) fn check_lease_ttl(ttl: Duration, problems: &mut Vec<String>) {
    if ttl.subsec_nanos() != 0 || ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
        problems.push(format!("--lease-ttl {ttl:?} must be whole seconds between 1s and 60s"));
    }
}

/// 32 random bytes from the kernel, for a resume-token key nobody was given.
fn random_resume_key() -> std::io::Result<TokenKey> {
    let mut bytes = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
    Ok(TokenKey::new(bytes).expect("invariant: 32 bytes is a long enough key"))
}

/// Who may read the admin port's private pages (see `--admin-token`).
pub(super) fn admin_access(common: &CommonArgs) -> meridian_observe::Private {
    meridian_observe::Private::from_config(common.token.admin_token.as_deref(), common.dev)
}

/// The resume-token keys. In dev mode with no `--resume-key`, the current key is a random
/// one made here, and `generated` is set so the node can say so: its tokens are then
/// refused by every other node and by itself after a restart. (It used to be a fixed key
/// published in this file, with which anyone could mint a token for any player.)
pub(super) fn resume_keys(
    common: &CommonArgs,
    generated: &mut bool,
    problems: &mut Vec<String>,
) -> TokenKeys {
    resume_keys_of(&common.resume_keys, common.dev, generated, problems)
}

/// The resume keys `keys` give (a random current one if none and `dev`), with a problem
/// for each that is not a key: also `up`'s check, before it starts anything.
pub(super) fn resume_keys_of(
    keys: &ResumeKeyArgs,
    dev: bool,
    generated: &mut bool,
    problems: &mut Vec<String>,
) -> TokenKeys {
    // Stands in for a key that was refused, so that every problem is still listed.
    let placeholder = || TokenKey::new(vec![0; 32]).expect("invariant: 32 bytes is long enough");
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
    let current = match &keys.resume_key {
        Some(hex) => parse("--resume-key", hex, problems).unwrap_or_else(placeholder),
        None if !dev => {
            problems.push("--resume-key (MERIDIAN_RESUME_KEY) is required outside --dev".into());
            placeholder()
        }
        None => match random_resume_key() {
            Ok(key) => {
                *generated = true;
                key
            }
            Err(error) => {
                problems.push(format!("making a random resume key (/dev/urandom): {error}"));
                placeholder()
            }
        },
    };
    let previous = keys
        .resume_key_previous
        .iter()
        .flat_map(|list| list.split(',').map(str::trim).filter(|hex| !hex.is_empty()))
        .filter_map(|hex| parse("--resume-key-previous", hex, problems))
        .collect();
    TokenKeys::new(current, previous)
}
