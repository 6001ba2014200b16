//! `meridian status`: the cluster as etcd sees it; with `--check`, whether it is healthy,
//! as an exit code for scripts and probes.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use meridian_cluster::{ClusterKeys, ClusterView, ClusterWatch, GatewayId, ShardId};
use serde_json::json;

use crate::cli::StatusArgs;

/// How long a shard may take to answer `/readyz`.
const READYZ_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// `meridian status --check` exit codes (also in `meridian status --help`).
pub const CHECK_HEALTHY: u8 = 0;
/// At least one problem was found; each is printed on a line of its own.
pub const CHECK_UNHEALTHY: u8 = 1;
/// The cluster could not be read from etcd (unreachable, refused, TLS or authentication).
/// 2 is clap's, for a bad command line.
pub const CHECK_NO_ETCD: u8 = 3;

/// What `/readyz` answered: its status code and body, or `None` if the node did not answer
/// within [`READYZ_WITHIN`].
type Readyz = Option<(u16, String)>;

/// The cluster as etcd lists it, and what each node's `/readyz` says.
struct Observed {
    view: ClusterView,
    shards: BTreeMap<ShardId, Readyz>,
    gateways: BTreeMap<GatewayId, Readyz>,
}

/// An etcd failure as a person reads it: what was being done, the error once, and, when
/// etcd did not answer, whether it runs where it was looked for.
fn etcd_failed(
    what: &str,
    etcd: &meridian_cluster::Etcd,
    error: meridian_cluster::ClusterError,
) -> anyhow::Error {
    match error {
        meridian_cluster::ClusterError::Unreachable(_) => {
            anyhow::anyhow!("{what}: {error}; {}", etcd.running_at())
        }
        error => anyhow::Error::new(error).context(what.to_string()),
    }
}

async fn observe(args: &StatusArgs) -> anyhow::Result<Observed> {
    let etcd = args.cluster.etcd_access.etcd(&args.cluster.etcd);
    let client = meridian_cluster::connect(&etcd)
        .await
        .map_err(|error| etcd_failed("connecting to etcd", &etcd, error))?;
    let watch = ClusterWatch::start(client, ClusterKeys::new(&args.cluster.cluster))
        .await
        .map_err(|error| {
            etcd_failed(&format!("reading cluster {:?}", args.cluster.cluster), &etcd, error)
        })?;
    let view = watch.current();
    // Health as each node reports it on its admin port (/readyz), asked all at once.
    let readyz = |admin: String| async move {
        meridian_observe::admin_get(&admin, "/readyz", READYZ_WITHIN).await
    };
    let shard_answers = futures_join(view.shards.values().map(|s| (s.id, readyz(s.admin.clone()))));
    let gateway_answers =
        futures_join(view.gateways.values().map(|g| (g.id, readyz(g.admin.clone()))));
    let (shards, gateways) = tokio::join!(shard_answers, gateway_answers);
    Ok(Observed { view, shards, gateways })
}

/// Awaits every `(key, future)` side by side.
async fn futures_join<K: Ord, F: std::future::Future<Output = Readyz> + Send + 'static>(
    pending: impl Iterator<Item = (K, F)>,
) -> BTreeMap<K, Readyz> {
    let mut tasks = Vec::new();
    for (key, future) in pending {
        tasks.push((key, tokio::spawn(future)));
    }
    let mut answers = BTreeMap::new();
    for (key, task) in tasks {
        answers.insert(key, task.await.ok().flatten());
    }
    answers
}

/// Everything wrong with the cluster, one line each: a shard or gateway that is not ready
/// or does not answer, no gateway at all, no partition, or cells no registered shard owns.
fn problems(observed: &Observed) -> Vec<String> {
    let mut problems = Vec::new();
    let view = &observed.view;
    let why = |answer: &Readyz| match answer {
        Some((200, _)) => None,
        Some((code, body)) => Some(format!("not ready ({code}: {})", body.trim())),
        None => Some(format!("unreachable (no answer to /readyz within {READYZ_WITHIN:?})")),
    };
    for shard in view.shards.values() {
        let answer = observed.shards.get(&shard.id).cloned().flatten();
        if let Some(why) = why(&answer) {
            problems.push(format!("{}: {why} at admin {}", shard.id, shard.admin));
        }
    }
    if view.gateways.is_empty() {
        problems.push("no gateway is registered: players cannot connect".into());
    }
    for gateway in view.gateways.values() {
        let answer = observed.gateways.get(&gateway.id).cloned().flatten();
        if let Some(why) = why(&answer) {
            problems.push(format!("{}: {why} at admin {}", gateway.id, gateway.admin));
        }
    }
    match &view.partition {
        None => problems.push("no partition map is published: no cell has an owner".into()),
        Some(map) => {
            for region in &map.regions {
                if !view.shards.contains_key(&region.shard) {
                    problems.push(format!(
                        "region x {}..{} y {}..{} belongs to {}, which is not registered",
                        region.x0, region.x1, region.y0, region.y1, region.shard
                    ));
                }
            }
            if let Some((x, y)) = unowned_cell(map) {
                problems.push(format!(
                    "partition epoch {}: cell ({x}, {y}) has no owner (the regions do not cover \
                     the {}x{} map)",
                    map.epoch, map.width, map.height
                ));
            }
        }
    }
    problems
}

/// A cell of the map that no region covers, if there is one. The map is cut along every
/// region's edges into blocks that are each wholly in or out of every region, so one test
/// per block suffices whatever the map's size.
fn unowned_cell(map: &meridian_cluster::PartitionMap) -> Option<(u32, u32)> {
    let cuts = |edges: &mut Vec<u32>, limit: u32| {
        edges.retain(|&e| e < limit);
        edges.push(0);
        edges.sort_unstable();
        edges.dedup();
    };
    let mut xs: Vec<u32> = map.regions.iter().flat_map(|r| [r.x0, r.x1]).collect();
    let mut ys: Vec<u32> = map.regions.iter().flat_map(|r| [r.y0, r.y1]).collect();
    cuts(&mut xs, map.width);
    cuts(&mut ys, map.height);
    for &x in &xs {
        for &y in &ys {
            if map.owner_of(x, y).is_none() {
                return Some((x, y));
            }
        }
    }
    None
}

/// `meridian status --check`: one line per problem and a non-zero exit if there is any (see
/// the `CHECK_*` codes), a one-line summary and 0 if there is none.
pub fn check(args: StatusArgs) -> ExitCode {
    let observed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(observe(&args)));
    let observed = match observed {
        Ok(observed) => observed,
        Err(error) => {
            println!("cannot check cluster {:?}: {error:#}", args.cluster.cluster);
            return ExitCode::from(CHECK_NO_ETCD);
        }
    };
    let problems = problems(&observed);
    if problems.is_empty() {
        let view = &observed.view;
        let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        println!(
            "ok: cluster {:?}, {} and {} ready, partition epoch {} covers the map",
            args.cluster.cluster,
            count(view.shards.len(), "shard"),
            count(view.gateways.len(), "gateway"),
            view.partition.as_ref().map_or(0, |p| p.epoch)
        );
        return ExitCode::from(CHECK_HEALTHY);
    }
    for problem in &problems {
        println!("{problem}");
    }
    ExitCode::from(CHECK_UNHEALTHY)
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.web {
        return serve_map(&args, addr);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let Observed { view, shards: health, .. } = runtime.block_on(observe(&args))?;
    if args.json {
        let value = json!({
            "cluster": args.cluster.cluster,
            "etcd": args.cluster.etcd,
            "shards": view.shards.values().map(|shard| {
                let mut entry = serde_json::to_value(shard).unwrap_or_default();
                let ready = health.get(&shard.id).is_some_and(|a| matches!(a, Some((200, _))));
                entry["ready"] = json!(ready);
                entry
            }).collect::<Vec<_>>(),
            "gateways": view.gateways.values().collect::<Vec<_>>(),
            "partition": view.partition,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    // Which cluster and which etcd: `status` with no flags reads the defaults (port 2379,
    // cluster "meridian"), which may be another local cluster than the one meant.
    println!(
        "cluster {} in etcd at {} (--cluster NAME, --etcd URL for another)",
        args.cluster.cluster,
        args.cluster.etcd.join(",")
    );
    if view.shards.is_empty() && view.gateways.is_empty() {
        println!(
            "  nothing is registered under this name in this etcd: is the cluster called \
             something else (--cluster), or served by another etcd (--etcd)?"
        );
    }
    println!("shards ({}):", view.shards.len());
    for shard in view.shards.values() {
        let health = match health.get(&shard.id) {
            Some(Some((200, _))) => "ready",
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
/// On a loopback address the map is open (the operator's own machine); on any other it
/// names players to whoever can reach it, so it asks for the admin token.
fn serve_map(args: &StatusArgs, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let private = match (addr.ip().is_loopback(), args.cluster.token.admin_token.as_deref()) {
        (true, _) => meridian_observe::Private::Open,
        (false, Some(token)) if !token.is_empty() => {
            meridian_observe::Private::Token(std::sync::Arc::from(token))
        }
        (false, _) => anyhow::bail!(
            "--web {addr} is not a loopback address: the live map names players, so it needs \
             --admin-token (MERIDIAN_ADMIN_TOKEN) to serve them there; or serve it on \
             127.0.0.1"
        ),
    };
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
            args.cluster.token.admin_token.clone(),
        );
        println!("live map: http://{}/map (Ctrl-C stops)", listener.local_addr()?);
        let ready: meridian_observe::Readiness = std::sync::Arc::new(|| Ok(()));
        let registry = meridian_observe::Registry::default();
        tokio::select! {
            _ = {
                let access = meridian_observe::Access::new(private, &[], &registry);
                meridian_observe::serve_admin_with(listener, registry, ready, map.routes(), access)
            } => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        anyhow::Ok(())
    })
}
