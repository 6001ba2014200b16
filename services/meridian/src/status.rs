//! `meridian status`: the cluster as etcd sees it.

use anyhow::Context;
use meridian_cluster::{ClusterKeys, ClusterWatch};
use serde_json::json;

use crate::cli::StatusArgs;

/// How long a shard may take to answer `/readyz`.
const READYZ_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.web {
        return serve_map(&args, addr);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (view, health) = runtime.block_on(async {
        let client = meridian_cluster::connect(&args.cluster.etcd_access.etcd(&args.cluster.etcd))
            .await
            .with_context(|| format!("connecting to etcd at {}", args.cluster.etcd.join(",")))?;
        let watch = ClusterWatch::start(client, ClusterKeys::new(&args.cluster.cluster)).await?;
        let view = watch.current();
        // Health as each shard reports it on its admin port (/readyz).
        let mut health = std::collections::BTreeMap::new();
        for shard in view.shards.values() {
            health.insert(
                shard.id.0,
                meridian_observe::admin_get(&shard.admin, "/readyz", READYZ_WITHIN)
                    .await
                    .map(|(code, _)| code),
            );
        }
        anyhow::Ok((view, health))
    })?;
    if args.json {
        let value = json!({
            "cluster": args.cluster.cluster,
            "shards": view.shards.values().map(|shard| {
                let mut entry = serde_json::to_value(shard).unwrap_or_default();
                entry["ready"] = json!(health.get(&shard.id.0) == Some(&Some(200)));
                entry
            }).collect::<Vec<_>>(),
            "gateways": view.gateways.values().collect::<Vec<_>>(),
            "partition": view.partition,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("cluster {}", args.cluster.cluster);
    println!("shards ({}):", view.shards.len());
    for shard in view.shards.values() {
        let health = match health.get(&shard.id.0) {
            Some(Some(200)) => "ready",
            Some(Some(_)) => "not-ready",
            _ => "unreachable",
        };
        println!(
            "  {:<10} {:<9} {:<11} players {:<6} grpc {}  admin {}",
            shard.id.to_string(),
            format!("{:?}", shard.state).to_lowercase(),
            health,
            shard.players,
            shard.grpc,
            shard.admin
        );
    }
    println!("gateways ({}):", view.gateways.len());
    for gateway in view.gateways.values() {
        let quic = gateway.quic.as_deref().map(|q| format!("  quic {q}/udp")).unwrap_or_default();
        println!("  {:<10} game {}{quic}  admin {}", gateway.id, gateway.game, gateway.admin);
    }
    match &view.partition {
        None => println!("partition: none published yet"),
        Some(map) => {
            println!("partition: epoch {} ({}x{})", map.epoch, map.width, map.height);
            for region in &map.regions {
                println!(
                    "  {:<10} x {}..{}  y {}..{}",
                    region.shard, region.x0, region.x1, region.y0, region.y1
                );
            }
        }
    }
    Ok(())
}

/// `meridian status --web ADDR`: the gateways' live map, served from this process's own view
/// of etcd (it routes nothing, so shard health comes from their `/readyz` alone).
fn serve_map(args: &StatusArgs, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = meridian_cluster::connect(&args.cluster.etcd_access.etcd(&args.cluster.etcd))
            .await
            .with_context(|| format!("connecting to etcd at {}", args.cluster.etcd.join(",")))?;
        let keys = ClusterKeys::new(&args.cluster.cluster);
        let watch = ClusterWatch::start(client, keys).await?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} for the live map"))?;
        let map = meridian_gateway::map::LiveMap::new(
            args.cluster.cluster.clone(),
            None,
            watch.view(),
            std::sync::Arc::new(|_| None),
            args.cluster.admin_token.clone(),
        );
        println!("live map: http://{}/map (Ctrl-C stops)", listener.local_addr()?);
        let ready: meridian_observe::Readiness = std::sync::Arc::new(|| Ok(()));
        let registry = meridian_observe::Registry::default();
        tokio::select! {
            // Served on the operator's own machine: open to whoever can reach it there.
            _ = {
                let access = meridian_observe::Access::new(
                    meridian_observe::Private::Open,
                    &[],
                    &registry,
                );
                meridian_observe::serve_admin_with(listener, registry, ready, map.routes(), access)
            } => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        anyhow::Ok(())
    })
}
