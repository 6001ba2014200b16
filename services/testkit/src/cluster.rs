//! A whole local cluster, `meridian up` with its own etcd, started on free ports for one test
//! and torn down with it.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::bot::GameAddr;
use crate::process::{process_alive, signal, signal_group};
use crate::quic::QuicTarget;
use crate::wait::{deadline, wait_until};

/// The cluster name `meridian up` (and every other command) uses unless told otherwise.
pub const DEFAULT_CLUSTER: &str = "meridian";

/// The lease TTL `meridian up` uses unless told otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);

/// How long `meridian up` may take to write its ready file.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long `meridian up` may take to stop after SIGTERM before its group is killed. It
/// stops the gateways, then the shards one after another, and each shard may rightly take
/// up to 5 s for its last saves (`FINAL_SAVES_WITHIN`) and 5 s for an etcd request on its
/// way out (deregistering); CI once saw a 2-shard cluster take more than 10 s on a disk
/// whose fsyncs took 1.5 s. This bound is for a hang, not for a slow disk.
const STOP_WITHIN: Duration = Duration::from_secs(30);
/// How long a test that already failed gives `meridian up` to exit after SIGTERM.
const FORCED_STOP_WITHIN: Duration = Duration::from_secs(3);
/// How long `meridian status` may take.
const STATUS_WITHIN: Duration = Duration::from_secs(10);
/// How much of a log a failure prints.
const LOG_TAIL_LINES: usize = 200;

static NEXT_CLUSTER: AtomicU64 = AtomicU64::new(1);

/// The gateway's client I/O backend (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    Uring,
    Epoll,
}

impl Io {
    pub fn as_arg(self) -> &'static str {
        match self {
            Io::Uring => "uring",
            Io::Epoll => "epoll",
        }
    }
}

/// How test bots reach the gateways: the TCP game port or the QUIC front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Quic,
    Ws,
}

/// A gateway backend and the transport bots use: what a scenario is run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    pub io: Io,
    pub transport: Transport,
}

impl Front {
    pub fn quic(io: Io) -> Front {
        Front { io, transport: Transport::Quic }
    }

    pub fn ws(io: Io) -> Front {
        Front { io, transport: Transport::Ws }
    }
}

impl From<Io> for Front {
    fn from(io: Io) -> Front {
        Front { io, transport: Transport::Tcp }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub shards: usize,
    pub gateways: usize,
    pub io: Io,
    /// What [`Cluster::client_addr`] hands out.
    pub transport: Transport,
    /// Appended to the `meridian up` command line (e.g. `--lease-ttl 2`).
    pub extra_args: Vec<String>,
    /// Set in the environment of `meridian up`, which the nodes it starts inherit: the
    /// way to give every gateway (or shard) a `MERIDIAN_*` setting `up` has no flag for.
    pub env: Vec<(String, String)>,
    /// The cluster's name (its etcd prefix); a fresh unique one if not given. A test that
    /// starts the same cluster again (same `--data-dir`) gives the same name both times.
    pub name: Option<String>,
    /// Start `meridian up` without `--cluster`, so it names the cluster its default (which
    /// is then [`Cluster::cluster_name`]). Each `up` has its own etcd, so tests that do this
    /// side by side do not meet.
    pub default_name: bool,
}

impl ClusterOptions {
    /// One shard, one gateway.
    pub fn new(front: impl Into<Front>) -> Self {
        let Front { io, transport } = front.into();
        ClusterOptions {
            shards: 1,
            gateways: 1,
            io,
            transport,
            extra_args: Vec::new(),
            env: Vec::new(),
            name: None,
            default_name: false,
        }
    }

    /// No `--cluster`: the cluster gets `meridian up`'s default name.
    pub fn default_name(mut self) -> Self {
        self.default_name = true;
        self
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    pub fn gateways(mut self, gateways: usize) -> Self {
        self.gateways = gateways;
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sets `key=value` in the environment of `meridian up` and so of every node it starts
    /// (e.g. `MERIDIAN_IDLE_TIMEOUT=2s` for the gateways).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A shard as the ready file describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct ShardInfo {
    pub id: u32,
    pub pid: i32,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

/// A gateway as the ready file describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayInfo {
    pub id: u32,
    pub pid: i32,
    pub game: SocketAddr,
    pub admin: SocketAddr,
    /// The QUIC front (UDP) and its dev certificate.
    #[serde(default)]
    pub quic: Option<SocketAddr>,
    #[serde(default)]
    pub quic_cert_sha256: Option<String>,
    #[serde(default)]
    pub quic_cert_pem: Option<String>,
    /// The WebSocket front (TCP).
    #[serde(default)]
    pub ws: Option<SocketAddr>,
}

#[derive(Debug, Clone, Deserialize)]
struct ReadyFile {
    cluster: String,
    etcd: String,
    shards: Vec<ShardInfo>,
    gateways: Vec<GatewayInfo>,
    /// The pid of the etcd `up` started, and its argv (to start it again, same data dir
    /// and ports, after a test has stopped it).
    #[serde(default)]
    etcd_pid: Option<i32>,
    #[serde(default)]
    etcd_command: Option<Vec<String>>,
    /// The development CA's directory: nodes a test starts on the cluster take their
    /// certificate from it.
    #[serde(default)]
    tls_dir: Option<PathBuf>,
    /// The data directory (`meridian shard --join` takes it).
    #[serde(default)]
    data_dir: Option<PathBuf>,
}

/// How a command exited and what it printed.
#[derive(Debug)]
pub struct CommandRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running `meridian up`.
///
/// Dropping it stops the cluster: SIGTERM to `up`, a bounded wait, then SIGKILL to its whole
/// process group (etcd, shards and gateways included). When the thread is panicking, or the
/// cluster failed, the tail of the log is printed and the temp dir kept, with its path.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    log_path: PathBuf,
    name: String,
    up: Option<Child>,
    ready: ReadyFile,
    transport: Transport,
    /// Per gateway, its QUIC front with the certificate parsed once.
    quic_targets: Vec<Option<QuicTarget>>,
    status_runs: AtomicU64,
    failed: bool,
}

impl Cluster {
    /// Runs `bin up` with `opts` on port 0 and waits until its ready file says every node is
    /// up. `bin` is `env!("CARGO_BIN_EXE_meridian")` in the binary's integration tests.
    pub fn start(bin: &Path, opts: ClusterOptions) -> anyhow::Result<Cluster> {
        let n = NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let name = match (&opts.name, opts.default_name) {
            (_, true) => DEFAULT_CLUSTER.to_string(),
            (Some(name), false) => name.clone(),
            (None, false) => format!("test-{pid}-{n}"),
        };
        let dir = std::env::temp_dir().join(format!("meridian-{name}-{pid}-{n}-{nanos:09}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log_path = dir.join("up.log");
        let ready_path = dir.join("ready.json");
        let log = File::create(&log_path)?;

        let mut command = Command::new(bin);
        command
            .arg("up")
            .args(["--shards", &opts.shards.to_string()])
            .args(["--gateways", &opts.gateways.to_string()])
            .args(["--io", opts.io.as_arg()])
            .args(["--port", "0", "--quic-port", "0", "--ws-port", "0", "--etcd-port", "0"])
            .arg("--ready-file")
            .arg(&ready_path)
            .args((!opts.default_name).then_some(["--cluster", &name]).into_iter().flatten())
            .args(&opts.extra_args)
            .envs(opts.env.iter().map(|(key, value)| (key, value)))
            // The log is a file: plain text is easier to read in a failure report.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group, so a test can kill everything it started and nothing else.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let spawned = command.spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e).with_context(|| format!("starting {} up", bin.display()));
            }
        };
        let placeholder = ReadyFile {
            cluster: name.clone(),
            etcd: String::new(),
            shards: Vec::new(),
            gateways: Vec::new(),
            etcd_pid: None,
            etcd_command: None,
            tls_dir: None,
            data_dir: None,
        };
        let mut cluster = Cluster {
            bin: bin.to_path_buf(),
            dir,
            log_path,
            name,
            up: Some(child),
            ready: placeholder,
            transport: opts.transport,
            quic_targets: Vec::new(),
            status_runs: AtomicU64::new(0),
            failed: false,
        };
        // From here on a failure drops `cluster`, which kills what was started and prints
        // the log.
        match cluster.wait_ready(&ready_path, &opts) {
            Ok(ready) => {
                cluster.quic_targets = ready
                    .gateways
                    .iter()
                    .map(|g| match (g.quic, g.quic_cert_pem.as_deref()) {
                        (Some(addr), Some(pem)) => QuicTarget::from_pem(addr, pem).map(Some),
                        _ => Ok(None),
                    })
                    .collect::<anyhow::Result<_>>()?;
                cluster.ready = ready;
                Ok(cluster)
            }
            Err(e) => {
                cluster.failed = true;
                Err(e.context(format!("starting `meridian up` ({})", cluster.describe(&opts))))
            }
        }
    }

    fn describe(&self, opts: &ClusterOptions) -> String {
        format!(
            "{} shards, {} gateways, --io {}, cluster {}, log {}",
            opts.shards,
            opts.gateways,
            opts.io.as_arg(),
            self.name,
            self.log_path.display()
        )
    }

    fn wait_ready(
        &mut self,
        ready_path: &Path,
        opts: &ClusterOptions,
    ) -> anyhow::Result<ReadyFile> {
        let up = self.up.as_mut().expect("invariant: `up` is running until stopped");
        let pid = up.id() as i32;
        let waited = wait_until(deadline(READY_WITHIN), "the ready file of `meridian up`", || {
            ready_path.exists() || !process_alive(pid)
        });
        if !process_alive(pid) {
            let status = kill_group_and_reap(up);
            self.up = None;
            bail!("`meridian up` exited with {status} before writing its ready file");
        }
        waited?;
        let text = std::fs::read_to_string(ready_path)
            .with_context(|| format!("reading {}", ready_path.display()))?;
        let ready: ReadyFile = serde_json::from_str(&text)
            .with_context(|| format!("parsing the ready file {}: {text}", ready_path.display()))?;
        if ready.cluster != self.name {
            bail!("the ready file names cluster {:?}, expected {:?}", ready.cluster, self.name);
        }
        if ready.shards.len() != opts.shards || ready.gateways.len() != opts.gateways {
            bail!(
                "the ready file lists {} shards and {} gateways, expected {} and {}: {text}",
                ready.shards.len(),
                ready.gateways.len(),
                opts.shards,
                opts.gateways
            );
        }
        Ok(ready)
    }

    /// Where bots reach gateway `index` over the transport the options chose.
    pub fn client_addr(&self, index: usize) -> GameAddr {
        match self.transport {
            Transport::Tcp => GameAddr::Tcp(self.game_addr(index)),
            Transport::Quic => GameAddr::Quic(self.quic_target(index)),
            Transport::Ws => GameAddr::Ws(self.ws_addr(index)),
        }
    }

    /// The WebSocket front of gateway `index` (`meridian up` always starts one).
    ///
    /// # Panics
    /// If that gateway has none.
    pub fn ws_addr(&self, index: usize) -> SocketAddr {
        self.ready.gateways[index]
            .ws
            .expect("meridian up starts a WebSocket front on every gateway")
    }

    /// The QUIC front of gateway `index`, with the certificate to trust.
    ///
    /// # Panics
    /// If that gateway has no QUIC front: `meridian up` always starts one.
    pub fn quic_target(&self, index: usize) -> QuicTarget {
        self.quic_targets
            .get(index)
            .copied()
            .flatten()
            .unwrap_or_else(|| panic!("gateway {index} has no QUIC front in the ready file"))
    }

    /// The game (client) port of gateway `index` (0-based, in ready-file order).
    pub fn game_addr(&self, index: usize) -> SocketAddr {
        self.gateway(index).game
    }

    /// Shard `index` (0-based, in ready-file order; its `id` is the cluster's shard id).
    pub fn shard(&self, index: usize) -> &ShardInfo {
        &self.ready.shards[index]
    }

    pub fn shards(&self) -> &[ShardInfo] {
        &self.ready.shards
    }

    /// Gateway `index` (0-based, in ready-file order).
    pub fn gateway(&self, index: usize) -> &GatewayInfo {
        &self.ready.gateways[index]
    }

    pub fn gateways(&self) -> &[GatewayInfo] {
        &self.ready.gateways
    }

    pub fn etcd_url(&self) -> &str {
        &self.ready.etcd
    }

    pub fn cluster_name(&self) -> &str {
        &self.name
    }

    /// The pid of the etcd `meridian up` started, from its ready file.
    pub fn etcd_pid(&self) -> Option<i32> {
        self.ready.etcd_pid
    }

    /// The command line (argv, program first) that starts etcd again exactly as `meridian
    /// up` did: same data dir, same ports.
    pub fn etcd_command(&self) -> Option<&[String]> {
        self.ready.etcd_command.as_deref()
    }

    /// Flags giving a node named `name` (`shard-5`) a certificate from the cluster's
    /// development CA, as `meridian up` gives its own nodes.
    pub fn tls_args(&self, name: &str) -> anyhow::Result<Vec<std::ffi::OsString>> {
        let files = self.tls_files(name)?;
        Ok(vec![
            "--tls-ca".into(),
            files.ca.into(),
            "--tls-cert".into(),
            files.cert.into(),
            "--tls-key".into(),
            files.key.into(),
        ])
    }

    /// A certificate naming `name` (`gateway-9`) from the cluster's development CA, made
    /// now (again, if there was one: a renewal, as cert-manager does it in place).
    pub fn tls_files(&self, name: &str) -> anyhow::Result<meridian_tls::TlsFiles> {
        let dir = self.ready.tls_dir.as_deref().context("the cluster has no development CA")?;
        Ok(meridian_tls::DevCa::open_or_create(dir)?.issue(name)?)
    }

    /// The cluster's data directory, as `meridian up` printed it (what `meridian shard
    /// --join` takes).
    pub fn data_dir(&self) -> Option<&Path> {
        self.ready.data_dir.as_deref()
    }

    /// The `meridian` binary this cluster runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The cluster's temp dir (its log, the ready file): kept when the test fails, so files
    /// a test writes here (the logs of nodes it starts itself) are kept with it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid of `meridian up` itself, while it runs.
    pub fn up_pid(&self) -> Option<i32> {
        self.up.as_ref().map(|child| child.id() as i32)
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// SIGKILLs shard `index` and waits until the process is dead (it may stay a zombie
    /// until `up` reaps it, which is dead enough for any test).
    pub fn kill_shard(&self, index: usize) -> anyhow::Result<()> {
        let shard = self.shard(index);
        signal(shard.pid, libc::SIGKILL)
            .with_context(|| format!("SIGKILL to shard {} (pid {})", shard.id, shard.pid))?;
        wait_until(
            deadline(Duration::from_secs(5)),
            &format!("shard {} (pid {}) to die after SIGKILL", shard.id, shard.pid),
            || !process_alive(shard.pid),
        )
    }

    /// SIGKILL to gateway `index`; returns once it is gone.
    pub fn kill_gateway(&self, index: usize) -> anyhow::Result<()> {
        let gateway = self.gateway(index);
        signal(gateway.pid, libc::SIGKILL)
            .with_context(|| format!("SIGKILL to gateway {} (pid {})", gateway.id, gateway.pid))?;
        wait_until(
            deadline(Duration::from_secs(5)),
            &format!("gateway {} (pid {}) to die after SIGKILL", gateway.id, gateway.pid),
            || !process_alive(gateway.pid),
        )
    }

    /// Runs `meridian status --etcd URL --cluster NAME --json` and parses what it prints.
    pub fn status_json(&self) -> anyhow::Result<serde_json::Value> {
        let run = self.run_meridian(&[
            "status",
            "--etcd",
            self.etcd_url(),
            "--cluster",
            &self.name,
            "--json",
        ])?;
        let CommandRun { status, stdout, stderr } = run;
        if !status.success() {
            bail!(
                "`meridian status --json` exited with {status}; stderr: {stderr}; stdout: {stdout}"
            );
        }
        serde_json::from_str(&stdout)
            .with_context(|| format!("`meridian status --json` printed no JSON: {stdout:?}"))
    }

    /// Runs this cluster's `meridian` binary with `args` (an operator command: `status`,
    /// `drain`, ...) and returns how it exited and what it printed; an error if it does not
    /// exit within 10 s.
    pub fn run_meridian(&self, args: &[&str]) -> anyhow::Result<CommandRun> {
        let run = self.status_runs.fetch_add(1, Ordering::Relaxed);
        let out_path = self.dir.join(format!("command-{run}.out"));
        let err_path = self.dir.join(format!("command-{run}.err"));
        let mut child = Command::new(&self.bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out_path)?)
            .stderr(File::create(&err_path)?)
            .spawn()
            .with_context(|| format!("starting `meridian {}`", args.join(" ")))?;
        let mut status = None;
        let what = format!("`meridian {}` to exit", args.join(" "));
        let waited = wait_until(deadline(STATUS_WITHIN), &what, || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        if waited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        waited.with_context(|| format!("it hung; its stderr: {stderr}"))?;
        let stdout = std::fs::read_to_string(&out_path)?;
        let status = status.expect("invariant: set when the wait succeeded");
        Ok(CommandRun { status, stdout, stderr })
    }

    /// Stops the cluster as an operator would (SIGTERM to `up`) and checks that it went well:
    /// `up` exits 0 within the deadline and no node it started is left running.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let result = self.stop_gracefully();
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        let Some(mut up) = self.up.take() else {
            bail!("`meridian up` had already exited");
        };
        let pid = up.id() as i32;
        if !process_alive(pid) {
            let status = kill_group_and_reap(&mut up);
            bail!("`meridian up` exited on its own with {status} before the test stopped it");
        }
        signal(pid, libc::SIGTERM)?;
        let waited =
            wait_until(deadline(STOP_WITHIN), "`meridian up` to exit after SIGTERM", || {
                !process_alive(pid)
            });
        if waited.is_err() {
            kill_group_and_reap(&mut up);
            return waited;
        }
        let left: Vec<String> = self
            .ready
            .shards
            .iter()
            .map(|s| (format!("shard {}", s.id), s.pid))
            .chain(self.ready.gateways.iter().map(|g| (format!("gateway {}", g.id), g.pid)))
            .filter(|(_, pid)| process_alive(*pid))
            .map(|(what, pid)| format!("{what} (pid {pid})"))
            .collect();
        // Whatever is left of the group goes now, so a failing check leaks nothing.
        let exit = kill_group_and_reap(&mut up);
        if !exit.success() {
            bail!("`meridian up` exited with {exit} after SIGTERM, expected 0");
        }
        if !left.is_empty() {
            bail!("still running after `meridian up` exited: {}", left.join(", "));
        }
        Ok(())
    }

    /// Teardown after a failure or a panic: a short chance to stop cleanly (so the nodes
    /// flush their logs), then SIGKILL to the whole group.
    fn force_stop(&mut self) {
        let Some(mut up) = self.up.take() else { return };
        let pid = up.id() as i32;
        if process_alive(pid) {
            let _ = signal(pid, libc::SIGTERM);
            let _ = wait_until(deadline(FORCED_STOP_WITHIN), "`meridian up` to exit", || {
                !process_alive(pid)
            });
        }
        kill_group_and_reap(&mut up);
    }

    /// Marks the cluster as failed without panicking (for a failure kept to be reported
    /// later): when it is dropped, the tail of its log is printed and its temp dir kept.
    pub fn mark_failed(&mut self) {
        self.failed = true;
    }

    /// The last lines of `up`'s log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_else(|e| format!("({e})"));
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        lines[from..].join("\n")
    }
}

/// SIGKILLs what is left of `up`'s process group (etcd, shards, gateways, and `up` itself if
/// it still runs), then reaps `up` and returns how it exited. Called while `up` is not yet
/// reaped, so its pid, which is the group's id, cannot have been reused.
fn kill_group_and_reap(up: &mut Child) -> ExitStatus {
    let _ = signal_group(up.id() as i32, libc::SIGKILL);
    match up.wait() {
        Ok(status) => status,
        Err(e) => panic!("invariant: `meridian up` is our unreaped child, yet wait failed: {e}"),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let started = Instant::now();
        self.force_stop();
        if self.failed || std::thread::panicking() {
            eprintln!(
                "---- meridian up log ({}, last {LOG_TAIL_LINES} lines; temp dir kept: {}) ----\n{}\n---- end of log (teardown took {:.1} s) ----",
                self.name,
                self.dir.display(),
                self.log_tail(),
                started.elapsed().as_secs_f64()
            );
        } else if std::env::var_os("MERIDIAN_TEST_KEEP").is_some() {
            eprintln!("cluster {} kept in {}", self.name, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
