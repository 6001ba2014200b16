//! Running a single node (`meridian shard`, `meridian gateway`): bind, announce, serve
//! until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

use crate::cli::{GatewayNode, ShardNode};

/// Resolves on SIGTERM (Kubernetes, `meridian up`) or SIGINT (Ctrl-C).
async fn terminated() {
    let mut term = signal(SignalKind::terminate()).expect("invariant: SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("invariant: SIGINT handler installs");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
}

/// Says that this node's resume key is its own random one (`--dev` without `--resume-key`).
fn warn_generated_resume_key(generated: bool) {
    if generated {
        warn!(
            "no --resume-key given: using a random resume key made at startup; resume tokens \
             will not survive a restart of this node and are refused by every other node (give \
             every node the same --resume-key / MERIDIAN_RESUME_KEY for that)"
        );
    }
}

/// Writes `value` to `path` atomically (write to a temporary file, then rename).
pub fn write_json_atomically(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

pub fn run_shard(node: ShardNode) -> anyhow::Result<()> {
    warn_generated_resume_key(node.resume_key_generated);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let grpc = tokio::net::TcpListener::bind(node.listen)
            .await
            .with_context(|| format!("binding gRPC listener {}", node.listen))?;
        let admin = tokio::net::TcpListener::bind(node.common.admin)
            .await
            .with_context(|| format!("binding admin listener {}", node.common.admin))?;
        if let Some(path) = &node.common.ready_file {
            let ready = json!({
                "id": node.config.id.0,
                "pid": std::process::id(),
                "grpc": grpc.local_addr()?.to_string(),
                "admin": admin.local_addr()?.to_string(),
            });
            write_json_atomically(path, &ready)?;
        }
        meridian_shard::run(node.config, grpc, admin, terminated()).await?;
        Ok(())
    })
}

pub fn run_gateway(mut node: GatewayNode) -> anyhow::Result<()> {
    warn_generated_resume_key(node.resume_key_generated);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        if let Some(address) = &node.store {
            let store = meridian_store::Store::open(address).await.context("--store")?;
            node.config.accounts =
                Some(meridian_gateway::accounts::Accounts(Arc::new(StoreAccounts(store))));
        }
        let game = meridian_gateway::bind_game_listener(node.listen)
            .map_err(|error| bind_failed("game", node.listen, "--listen", error))?;
        let quic = match &node.quic {
            Some((addr, cert, timeouts)) => {
                let front = match meridian_gateway::QuicFront::bind(*addr, cert, *timeouts) {
                    Ok(front) => front,
                    Err(meridian_gateway::QuicSetupError::Bind { addr, source }) => {
                        return Err(bind_failed("QUIC (UDP)", addr, "--quic", source));
                    }
                    Err(error) => {
                        return Err(anyhow::Error::new(error)
                            .context(format!("setting up the QUIC front on {addr}")));
                    }
                };
                info!(
                    quic = %front.local_addr()?,
                    sha256 = %front.cert().sha256,
                    self_signed = front.cert().pem.is_some(),
                    "QUIC certificate"
                );
                Some(front)
            }
            None => None,
        };
        let ws = match node.ws {
            Some(addr) => Some(
                meridian_gateway::WsFront::bind(addr)
                    .map_err(|error| bind_failed("WebSocket", addr, "--ws", error))?,
            ),
            None => None,
        };
        let admin = tokio::net::TcpListener::bind(node.common.admin)
            .await
            .with_context(|| format!("binding admin listener {}", node.common.admin))?;
        if let Some(path) = &node.common.ready_file {
            let mut ready = json!({
                "id": node.config.id.0,
                "pid": std::process::id(),
                "game": game.local_addr()?.to_string(),
                "admin": admin.local_addr()?.to_string(),
            });
            if let Some(front) = &quic {
                ready["quic"] = json!(front.local_addr()?.to_string());
                ready["quic_cert_sha256"] = json!(front.cert().sha256);
                if let Some(pem) = &front.cert().pem {
                    ready["quic_cert_pem"] = json!(pem);
                }
            }
            if let Some(front) = &ws {
                ready["ws"] = json!(front.local_addr()?.to_string());
            }
            write_json_atomically(path, &ready)?;
        }
        meridian_gateway::run(node.config, game, quic, ws, admin, terminated()).await?;
        Ok(())
    })
}

/// A gateway listener that could not be bound. A taken port (by another cluster's gateway
/// as much as by any other program: the gateway does not share a port it did not open)
/// names the port and the flag that chose it.
fn bind_failed(what: &str, addr: SocketAddr, flag: &str, error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::anyhow!(
            "the {what} port {port} is taken: something already holds {addr} (another \
             Meridian cluster?); stop it, or give {flag} another port",
            port = addr.port()
        )
    } else {
        anyhow::Error::new(error).context(format!("binding the {what} listener {addr} ({flag})"))
    }
}

/// The player store as the gateway's account lookup.
struct StoreAccounts(meridian_store::Store);

impl meridian_gateway::accounts::AccountStore for StoreAccounts {
    fn player<'a>(
        &'a self,
        account: &'a str,
        name: &'a str,
        new_id: u64,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<
                        meridian_gateway::accounts::AccountPlayer,
                        meridian_gateway::accounts::LookupError,
                    >,
                > + Send
                + 'a,
        >,
    > {
        use meridian_gateway::accounts::{AccountPlayer, LookupError, SavedCell};
        Box::pin(async move {
            match self.0.player(account, name, new_id).await {
                Ok(player) => Ok(AccountPlayer {
                    player_id: player.player_id,
                    name: player.name,
                    state: player.saved.as_ref().map(|s| s.state.clone()).unwrap_or_default(),
                    saved: player.saved.map(|s| SavedCell { at: s.at, generation: s.generation }),
                }),
                Err(meridian_store::StoreError::IdTaken(_)) => Err(LookupError::IdTaken),
                Err(error) => Err(LookupError::Unavailable(error.to_string())),
            }
        })
    }

    fn kind(&self) -> &'static str {
        self.0.kind()
    }
}
