//! `meridian up`: a whole cluster on this machine, every node its own child process.
//!
//! Starts etcd (in the data directory: `--data-dir`, or a temporary one), the shards, then
//! the gateways, with mutual TLS on every gRPC link (a development CA in `<data>/tls`
//! issues each node's certificate), all with the player store (an SQLite file in the data directory unless
//! `--store` says otherwise), waits until every node
//! answers `/readyz`, prints the addresses (and writes them as JSON with `--ready-file`),
//! and on SIGINT/SIGTERM stops gateways, shards and etcd in that order. Children get
//! SIGKILL if `up` itself dies, so nothing is left behind.
//!
//! It writes `<data>/join.json` (see `join.rs`) with what one more shard needs to join:
//! `meridian shard --join <data dir> --id N`, a process of its own that `up` does not stop.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::UpArgs;
use crate::node::write_json_atomically;

const START_DEADLINE: Duration = Duration::from_secs(30);
const STOP_DEADLINE: Duration = Duration::from_secs(5);

struct Node {
    name: String,
    child: Child,
    ready_file: PathBuf,
}

/// Children of `up`, stopped in reverse start order whatever way `run` ends.
struct Nodes {
    list: Vec<Node>,
    /// Ready files and other scratch: removed on stop.
    run_dir: PathBuf,
    /// etcd's data and the SQLite store: removed on stop only if `up` made it.
    data_dir: Option<PathBuf>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for node in self.list.iter_mut().rev() {
            // SAFETY: signalling our own child by the pid we spawned it with.
            unsafe { libc::kill(node.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_DEADLINE;
            loop {
                match node.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        eprintln!("meridian up: {} did not stop in time; killing it", node.name);
                        let _ = node.child.kill();
                        let _ = node.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
        if let Some(data_dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(data_dir);
        }
    }
}

/// A port nobody listens on for etcd, which cannot take an inherited listener: below the
/// kernel's ephemeral range, so etcd started again on it finds it free
/// (`meridian_cluster::listen_port`).
fn free_port() -> anyhow::Result<u16> {
    Ok(meridian_cluster::listen_port()?)
}

/// etcd's client port: `wanted` (the port every command looks at by default) if nobody
/// listens on it, else a free one.
fn etcd_client_port(wanted: u16) -> anyhow::Result<u16> {
    if wanted == 0 {
        return free_port();
    }
    match TcpListener::bind(("127.0.0.1", wanted)) {
        Ok(_probe) => Ok(wanted),
        Err(error) => {
            eprintln!("meridian up: port {wanted} is taken ({error}); etcd listens on a free port");
            free_port()
        }
    }
}

/// The `meridian status` command that shows this cluster: no flag that is the default.
fn status_command(cluster: &str, etcd_url: &str) -> String {
    let mut command = "meridian status".to_string();
    if cluster != crate::cli::DEFAULT_CLUSTER {
        command.push_str(&format!(" --cluster {cluster}"));
    }
    if etcd_url != crate::cli::DEFAULT_ETCD {
        command.push_str(&format!(" --etcd {etcd_url}"));
    }
    command
}

fn spawn(command: &mut Command, name: &str, ready_file: PathBuf) -> anyhow::Result<Node> {
    // SAFETY: prctl in the child between fork and exec touches no shared state.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = command.spawn().with_context(|| format!("starting {name}"))?;
    Ok(Node { name: name.to_string(), child, ready_file })
}

/// The first gateway's ports, tried before anything starts: a port something else holds
/// (another `meridian up` most often) is an error naming it and the flag, rather than a
/// gateway that dies after etcd and the shards started. The gateway checks again when it
/// binds (it never shares a port it did not open), so a port taken in between is still
/// refused.
fn check_ports_free(args: &UpArgs) -> anyhow::Result<()> {
    let loopback = std::net::Ipv4Addr::LOCALHOST;
    let mut taken = Vec::new();
    for (port, flag, what) in
        [(args.port, "--port", "game"), (args.ws_port, "--ws-port", "WebSocket")]
    {
        if port != 0 && TcpListener::bind((loopback, port)).is_err() {
            taken.push(format!("the {what} port {port} (TCP) is taken: give {flag} another"));
        }
    }
    if args.quic_port != 0 && std::net::UdpSocket::bind((loopback, args.quic_port)).is_err() {
        let port = args.quic_port;
        taken.push(format!("the QUIC port {port} (UDP) is taken: give --quic-port another"));
    }
    if taken.is_empty() {
        return Ok(());
    }
    bail!(
        "{} (another Meridian cluster? `meridian status` shows the one on the default etcd; 0 \
         takes any free port)",
        taken.join("; ")
    )
}

pub fn run(args: UpArgs) -> anyhow::Result<()> {
    check_ports_free(&args)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    let run_dir = std::env::temp_dir().join(format!("meridian-up-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&run_dir)?;
    let (data_dir, temporary) = match &args.data_dir {
        Some(dir) => (dir.clone(), false),
        None => (run_dir.join("data"), true),
    };
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize()?;
    let mut nodes = Nodes {
        list: Vec::new(),
        run_dir: run_dir.clone(),
        data_dir: temporary.then(|| data_dir.clone()),
    };
    let store = match args.store.as_deref() {
        Some("none") => None,
        Some(store) => Some(store.to_string()),
        None => Some(format!("sqlite:{}", data_dir.join("players.sqlite").display())),
    };
    let me = std::env::current_exe().context("locating the meridian binary")?;

    // etcd cannot take an inherited listener, so its ports are probed free and then bound
    // by etcd a moment later; another process (a parallel test's etcd) can take one in
    // between. A start that fails that way is retried on new ports.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // A PostgreSQL store is tried once here, before etcd and the nodes start: one that
    // does not answer is one error, not the same error from every shard and gateway.
    if let Some(spec) = store.as_deref().filter(|spec| !spec.starts_with("sqlite:")) {
        let address = meridian_store::Address::parse(spec)?;
        if matches!(address, meridian_store::Address::Postgres(_)) {
            runtime.block_on(meridian_store::Store::open(&address)).context("--store")?;
        }
    }
    let mut attempt = 0;
    let (etcd_url, etcd_args) = loop {
        attempt += 1;
        // The default port first (so `meridian status` finds etcd without --etcd); a retry
        // takes any.
        let wanted = if attempt == 1 { args.etcd_port } else { 0 };
        let (client_port, peer_port) = (etcd_client_port(wanted)?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        // The same directory every attempt (and every start with the same --data-dir): a
        // one-member etcd comes back from its data whatever ports it listens on now.
        let etcd_dir = data_dir.join("etcd");
        let mut etcd = Command::new(&args.etcd_bin);
        etcd.args(["--name", "up", "--data-dir"])
            .arg(&etcd_dir)
            .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("up={peer_url}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        // Kept for the ready file: a test that stops etcd starts it again exactly like this.
        let etcd_args: Vec<String> =
            etcd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        nodes.list.push(spawn(&mut etcd, "etcd", PathBuf::new()).with_context(|| {
            format!("is etcd installed? (apt-get install etcd-server; tried {:?})", args.etcd_bin)
        })?);
        match runtime.block_on(wait_for_etcd(&etcd_url, &mut nodes)) {
            Ok(()) => break (etcd_url, etcd_args),
            Err(error) if attempt < 5 => {
                eprintln!("meridian up: etcd did not start ({error:#}); retrying on other ports");
                if let Some(mut failed) = nodes.list.pop() {
                    let _ = failed.child.kill();
                    let _ = failed.child.wait();
                }
            }
            Err(error) => return Err(error),
        }
    };

    // One random resume-token key for the whole local cluster, passed in the environment
    // (not on the command line, where `ps` would show it).
    let resume_key = match &args.resume_keys.resume_key {
        Some(key) => key.clone(),
        None => random_hex_key()?,
    };
    let previous = args.resume_keys.resume_key_previous.clone().unwrap_or_default();
    let admin_token = args.token.admin_token.clone().unwrap_or_default();
    // The secure path is the one every local cluster and test takes: a development CA
    // issues each node a certificate naming it, and every gRPC link is mutual TLS.
    let tls_dir = data_dir.join("tls");
    let ca = meridian_tls::DevCa::open_or_create(&tls_dir)
        .with_context(|| format!("making a development CA in {}", tls_dir.display()))?;
    // What one more shard needs to join (`meridian shard --join <data dir>`): what the
    // shards below are given.
    let join_file = crate::join::JoinFile {
        cluster: args.cluster.clone(),
        etcd: etcd_url.clone(),
        lease_ttl_ms: args.lease_ttl.as_millis() as u64,
        tls_dir: (!args.insecure_grpc).then(|| tls_dir.clone()),
        resume_key: resume_key.clone(),
        resume_key_previous: previous.clone(),
        admin_token: admin_token.clone(),
        store: store.clone(),
        save_interval_ms: args.save_interval.as_millis() as u64,
        resume_window_ms: args.resume_window.as_millis() as u64,
        game: args.game.game.clone(),
        game_tick_ms: args.game.game_tick.as_millis() as u64,
        max_npcs: args.game.max_npcs,
    }
    .write(&data_dir)?;
    let tls = |command: &mut Command, name: &str| -> anyhow::Result<()> {
        if args.insecure_grpc {
            command.arg("--insecure-grpc");
            return Ok(());
        }
        let files = ca.issue(name).with_context(|| format!("issuing {name}'s certificate"))?;
        command.arg("--tls-ca").arg(&files.ca).arg("--tls-cert").arg(&files.cert);
        command.arg("--tls-key").arg(&files.key);
        Ok(())
    };
    let common = |command: &mut Command, ready: &Path| {
        command
            .env("MERIDIAN_RESUME_KEY", &resume_key)
            .env("MERIDIAN_RESUME_KEY_PREVIOUS", &previous)
            .env("MERIDIAN_ADMIN_TOKEN", &admin_token)
            .args(["--cluster", &args.cluster, "--etcd", &etcd_url, "--dev"])
            .args(["--lease-ttl", &duration_arg(args.lease_ttl), "--admin", "127.0.0.1:0"])
            .arg("--ready-file")
            .arg(ready);
    };
    for id in 1..=args.shards {
        let ready = run_dir.join(format!("shard-{id}.json"));
        let mut command = Command::new(&me);
        command.args(["shard", "--id", &id.to_string(), "--listen", "127.0.0.1:0"]);
        command.args(["--resume-window", &duration_arg(args.resume_window)]);
        if let Some(game) = &args.game.game {
            command.args(["--game", game]);
        }
        command.args(["--game-tick", &duration_arg(args.game.game_tick)]);
        command.args(["--max-npcs", &args.game.max_npcs.to_string()]);
        if let Some(store) = &store {
            command.args(["--store", store]);
            command.args(["--save-interval", &duration_arg(args.save_interval)]);
        }
        common(&mut command, &ready);
        tls(&mut command, &format!("shard-{id}"))?;
        nodes.list.push(spawn(&mut command, &format!("shard-{id}"), ready)?);
    }
    let quic_idle = args.quic_idle_timeout_ms.map_or(args.quic_idle_timeout, Duration::from_millis);
    let io = match args.io {
        crate::cli::Io::Uring => "uring",
        crate::cli::Io::Epoll => "epoll",
    };
    for id in 1..=args.gateways {
        let ready = run_dir.join(format!("gateway-{id}.json"));
        let port = if id == 1 { args.port } else { 0 };
        let quic_port = if id == 1 { args.quic_port } else { 0 };
        let ws_port = if id == 1 { args.ws_port } else { 0 };
        let mut command = Command::new(&me);
        command
            .args(["gateway", "--id", &id.to_string(), "--io", io])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--quic", &format!("127.0.0.1:{quic_port}")])
            .args(["--ws", &format!("127.0.0.1:{ws_port}")])
            .args(["--quic-idle-timeout", &duration_arg(quic_idle)])
            .args(["--quic-keep-alive", &duration_arg(quic_idle / 3)]);
        let exempt: Vec<&str> =
            args.limit_exempt.iter().map(|a| a.trim()).filter(|a| !a.is_empty()).collect();
        if !exempt.is_empty() {
            command.args(["--limit-exempt", &exempt.join(",")]);
        }
        if let Some(jwks) = &args.jwks {
            command.arg("--jwks").arg(jwks);
        }
        if let Some(store) = &store {
            command.args(["--store", store]);
        }
        common(&mut command, &ready);
        tls(&mut command, &format!("gateway-{id}"))?;
        nodes.list.push(spawn(&mut command, &format!("gateway-{id}"), ready)?);
    }

    let mut summary = runtime.block_on(wait_until_ready(&mut nodes, &args, &etcd_url))?;
    summary["etcd_pid"] = json!(nodes.list[0].child.id());
    summary["data_dir"] = json!(data_dir);
    summary["store"] = json!(store);
    // Where the development CA is: more nodes joining this cluster get their certificate
    // from it (`meridian_tls::DevCa`).
    summary["tls_dir"] = json!(tls_dir);
    summary["join_file"] = json!(join_file);
    summary["etcd_command"] =
        json!([args.etcd_bin.clone()].into_iter().chain(etcd_args).collect::<Vec<_>>());
    println!("meridian up: cluster {:?} is ready", args.cluster);
    println!("  etcd      {etcd_url}");
    if args.insecure_grpc {
        println!("  tls       none: gRPC links in the clear (--insecure-grpc)");
    } else {
        println!(
            "  tls       mutual TLS on every gRPC link (development CA in {})",
            tls_dir.display()
        );
    }
    match &store {
        Some(store) => println!("  store     {store}"),
        None => println!("  store     none: players are not saved"),
    }
    if temporary {
        println!("  data      {} (removed on stop; --data-dir DIR keeps it)", data_dir.display());
    } else {
        println!("  data      {}", data_dir.display());
    }
    for shard in summary["shards"].as_array().into_iter().flatten() {
        println!(
            "  shard-{}   grpc {}  admin {}",
            shard["id"],
            shard["grpc"].as_str().unwrap_or("?"),
            shard["admin"].as_str().unwrap_or("?")
        );
    }
    for gateway in summary["gateways"].as_array().into_iter().flatten() {
        println!(
            "  gateway-{} game {}  quic {}/udp  ws ws://{}/  admin {}",
            gateway["id"],
            gateway["game"].as_str().unwrap_or("?"),
            gateway["quic"].as_str().unwrap_or("?"),
            gateway["ws"].as_str().unwrap_or("?"),
            gateway["admin"].as_str().unwrap_or("?")
        );
        println!(
            "            quic certificate (self-signed, ALPN meridian/1) sha256 {}",
            gateway["quic_cert_sha256"].as_str().unwrap_or("?")
        );
    }
    if let Some(admin) = summary["gateways"][0]["admin"].as_str() {
        println!("  play:     http://{admin}/play   (in a browser, over the WebSocket front)");
    }
    println!("  status:   {}", status_command(&args.cluster, &etcd_url));
    println!(
        "  add:      meridian shard --join {} --id {}   (one more shard, as its own process)",
        data_dir.display(),
        args.shards + 1
    );
    let exempt: Vec<&str> =
        args.limit_exempt.iter().map(|a| a.trim()).filter(|a| !a.is_empty()).collect();
    if !exempt.is_empty() {
        println!(
            "  limits:   {} exempt from the per-address connection caps (dev cluster; --limit-exempt '' to enforce them)",
            exempt.join(", ")
        );
    }
    if let Some(admin) = summary["gateways"][0]["admin"].as_str() {
        println!("  live map: http://{admin}/map");
    }
    println!("Ctrl-C stops the cluster.");
    if let Some(path) = &args.ready_file {
        write_json_atomically(path, &summary)?;
    }

    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut child = signal(SignalKind::child())?;
        // A child that exited before the SIGCHLD handler was in place is found by this
        // first look; every later exit wakes the loop.
        reap_exited(&mut nodes);
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = child.recv() => reap_exited(&mut nodes),
            }
        }
        anyhow::Ok(())
    })?;
    println!("meridian up: stopping");
    drop(nodes);
    Ok(())
}

/// Reaps the nodes that exited while the cluster runs (a shard `meridian drain` emptied
/// exits 0), so none is left a zombie, and says so; they leave the list, so stopping does
/// not signal a pid that may since belong to another process.
fn reap_exited(nodes: &mut Nodes) {
    nodes.list.retain_mut(|node| match node.child.try_wait() {
        Ok(Some(status)) if status.success() => {
            println!("meridian up: {} exited ({status}; drained?); the rest go on", node.name);
            false
        }
        Ok(Some(status)) => {
            println!("meridian up: {} exited ({status}); the rest go on without it", node.name);
            false
        }
        Ok(None) | Err(_) => true,
    });
}

fn check_alive(nodes: &mut Nodes) -> anyhow::Result<()> {
    for node in &mut nodes.list {
        if let Some(status) = node.child.try_wait()? {
            bail!("{} exited during start-up ({status})", node.name);
        }
    }
    Ok(())
}

async fn wait_for_etcd(url: &str, nodes: &mut Nodes) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        check_alive(nodes)?;
        if let Ok(Ok(mut client)) = tokio::time::timeout(
            Duration::from_secs(1),
            meridian_cluster::connect(&meridian_cluster::Etcd::plain(vec![url.to_string()])),
        )
        .await
        {
            if client.get("/meridian/", None).await.is_ok() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("etcd at {url} did not become healthy within {START_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_until_ready(
    nodes: &mut Nodes,
    args: &UpArgs,
    etcd_url: &str,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + START_DEADLINE;
    let mut shards = Vec::new();
    let mut gateways = Vec::new();
    for index in 1..nodes.list.len() {
        loop {
            check_alive(nodes)?;
            let node = &nodes.list[index];
            let ready = std::fs::read(&node.ready_file)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            if let Some(ready) = ready {
                let admin = ready["admin"].as_str().unwrap_or_default().to_string();
                if meridian_observe::admin_get(&admin, "/readyz", Duration::from_secs(1))
                    .await
                    .map(|(code, _)| code)
                    == Some(200)
                {
                    if node.name.starts_with("shard") {
                        shards.push(ready);
                    } else {
                        gateways.push(ready);
                    }
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("{} was not ready within {START_DEADLINE:?}", nodes.list[index].name);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    Ok(json!({
        "cluster": args.cluster,
        "game": args.game.game.clone().unwrap_or_else(|| crate::games().default_name().to_string()),
        "etcd": etcd_url,
        "pid": std::process::id(),
        "shards": shards,
        "gateways": gateways,
    }))
}

/// `duration` as a flag's value, exactly (to the millisecond).
fn duration_arg(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

fn random_hex_key() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `up` on the default port with the default name prints a bare `meridian status`.
    #[test]
    fn the_status_command_names_only_what_is_not_a_default() {
        let default_etcd = crate::cli::DEFAULT_ETCD;
        assert_eq!(status_command("meridian", default_etcd), "meridian status");
        assert_eq!(
            status_command("meridian", "http://127.0.0.1:40001"),
            "meridian status --etcd http://127.0.0.1:40001"
        );
        assert_eq!(status_command("blue", default_etcd), "meridian status --cluster blue");
    }
}
