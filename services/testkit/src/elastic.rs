//! Changing a running cluster the way an operator (or a failure) does: shards that join
//! after `meridian up` ([`ExtraShard`]), `meridian drain` ([`drain_shard`]), etcd stopped
//! and started again ([`stop_etcd`], [`RestartedEtcd`]); and reading what the nodes say
//! about it: Prometheus counters ([`metric_total`]), `/readyz` ([`wait_ready`]), and who
//! owns how many players right now ([`loads`]).
//!
//! Every process started here is a child of the test, killed (by pid) and reaped when its
//! handle is dropped, and asked to die with the thread that started it
//! (`PR_SET_PDEATHSIG`), so a failing or killed test leaves nothing behind. Logs go to the
//! cluster's temp dir, which is kept when the test fails.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cluster::{Cluster, ShardInfo};
use crate::conservation::Sample;
use crate::http::http_get;
use crate::process::{process_alive, signal};
use crate::wait::{deadline, wait_until};

/// How long a node may take to write its ready file.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How much of a node's log a failure prints.
const LOG_TAIL_LINES: usize = 60;

/// Asks the kernel to SIGKILL the child when the thread that started it exits, so nothing
/// outlives a test that panicked before dropping its handles.
pub(crate) fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl between fork and exec touches no memory shared with the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

fn tail(path: &PathBuf) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Kills `child` (SIGKILL, by pid) if it still runs and reaps it.
fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = signal(child.id() as i32, libc::SIGKILL);
    child.wait().ok()
}

/// A shard started by the test on a running cluster (`meridian shard`), as Kubernetes
/// starts one when the StatefulSet scales out.
pub struct ExtraShard {
    info: ShardInfo,
    child: Option<Child>,
    log_path: PathBuf,
}

impl ExtraShard {
    /// Starts shard `id` on `cluster`'s etcd with the cluster's resume-token key (hex; the
    /// cluster must have been started with the same `--resume-key`) and lease TTL, and
    /// waits until it listens (its ready file). Joining the partition comes after that:
    /// wait for it with the partition map.
    pub fn start(
        cluster: &Cluster,
        id: u32,
        resume_key_hex: &str,
        lease_ttl: Duration,
    ) -> anyhow::Result<ExtraShard> {
        let mut command = Command::new(cluster.bin());
        command
            .args(["shard", "--id", &id.to_string()])
            .args(["--etcd", cluster.etcd_url(), "--cluster", cluster.cluster_name(), "--dev"])
            .args(["--lease-ttl", &format!("{}s", lease_ttl.as_secs().max(1))])
            .args(cluster.tls_args(&format!("shard-{id}"))?)
            // In the environment rather than on the command line, as `meridian up` does,
            // so `ps` does not show it.
            .env("MERIDIAN_RESUME_KEY", resume_key_hex);
        ExtraShard::spawn(cluster, id, command)
    }

    /// Starts shard `id` as the README says to add one to a cluster of `meridian up`:
    /// `meridian shard --join <data dir> --id N`, nothing else from the cluster given by
    /// the test, and waits until it listens.
    pub fn join(cluster: &Cluster, id: u32) -> anyhow::Result<ExtraShard> {
        let data_dir = cluster.data_dir().context("the ready file names no data directory")?;
        let mut command = Command::new(cluster.bin());
        command.args(["shard", "--id", &id.to_string(), "--join"]).arg(data_dir);
        ExtraShard::spawn(cluster, id, command)
    }

    /// Runs `command` (a `meridian shard` command line) on free loopback ports with a ready
    /// file and a log in the cluster's temp dir, and waits until it listens.
    fn spawn(cluster: &Cluster, id: u32, mut command: Command) -> anyhow::Result<ExtraShard> {
        let ready_path = cluster.dir().join(format!("extra-shard-{id}.json"));
        let log_path = cluster.dir().join(format!("extra-shard-{id}.log"));
        let _ = std::fs::remove_file(&ready_path);
        let log = File::create(&log_path)?;
        command
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--ready-file")
            .arg(&ready_path)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().with_context(|| format!("starting extra shard {id}"))?;
        let pid = child.id() as i32;
        let placeholder = ShardInfo {
            id,
            pid,
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let mut shard = ExtraShard { info: placeholder, child: Some(child), log_path };
        let waited = wait_until(
            deadline(READY_WITHIN),
            &format!("extra shard {id} to write its ready file"),
            || ready_path.exists() || !process_alive(pid),
        );
        if !process_alive(pid) {
            let status = shard.child.as_mut().and_then(kill_and_reap);
            bail!(
                "extra shard {id} exited with {status:?} before it was ready; its log:\n{}",
                shard.log_tail()
            );
        }
        waited.with_context(|| format!("its log:\n{}", shard.log_tail()))?;
        let text = std::fs::read_to_string(&ready_path)?;
        let ready: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}: {text}", ready_path.display()))?;
        let address = |name: &str| -> anyhow::Result<SocketAddr> {
            ready[name]
                .as_str()
                .and_then(|a| a.parse().ok())
                .with_context(|| format!("no {name} address in {text}"))
        };
        shard.info.grpc = address("grpc")?;
        shard.info.admin = address("admin")?;
        Ok(shard)
    }

    pub fn info(&self) -> &ShardInfo {
        &self.info
    }

    pub fn id(&self) -> u32 {
        self.info.id
    }

    pub fn admin(&self) -> SocketAddr {
        self.info.admin
    }

    /// Sends SIGTERM (what Kubernetes and `meridian up` send): the shard drains and exits.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let pid = self.info.pid;
        signal(pid, libc::SIGTERM)
            .with_context(|| format!("SIGTERM to extra shard {} (pid {pid})", self.info.id))
    }

    /// Waits for the shard to exit on its own (after a drain) and returns how it exited.
    pub fn wait_exit(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            bail!("extra shard {} was already reaped", self.info.id);
        };
        let mut status = None;
        let waited =
            wait_until(deadline(within), &format!("extra shard {} to exit", self.info.id), || {
                status = child.try_wait().ok().flatten();
                status.is_some()
            });
        waited.with_context(|| format!("its log:\n{}", self.log_tail()))?;
        self.child = None;
        Ok(status.expect("invariant: set when the wait succeeded"))
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log_path)
    }
}

impl Drop for ExtraShard {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill_and_reap(child);
        }
        if std::thread::panicking() {
            eprintln!(
                "---- extra shard {} log ({}, last {LOG_TAIL_LINES} lines) ----\n{}\n---- end ----",
                self.info.id,
                self.log_path.display(),
                self.log_tail()
            );
        }
    }
}

/// What `meridian drain --wait` printed, and how long it took.
#[derive(Debug, Clone)]
pub struct Drained {
    pub took: Duration,
    pub output: String,
}

/// Runs `meridian drain <id> --wait --timeout <timeout>` against `cluster` and waits for it
/// (a little longer than its own timeout); anything but exit 0 is an error with its output.
pub fn drain_shard(cluster: &Cluster, id: u32, timeout: Duration) -> anyhow::Result<Drained> {
    let out_path = cluster.dir().join(format!("drain-{id}.out"));
    let out = File::create(&out_path)?;
    let started = Instant::now();
    let mut command = Command::new(cluster.bin());
    command
        .args(["drain", &id.to_string(), "--wait"])
        .args(["--timeout", &format!("{}ms", timeout.as_millis())])
        .args(["--etcd", cluster.etcd_url(), "--cluster", cluster.cluster_name()])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    die_with_parent(&mut command);
    let mut child = command.spawn().context("starting `meridian drain`")?;
    let mut status = None;
    let waited = wait_until(
        deadline(timeout + Duration::from_secs(10)),
        &format!("`meridian drain {id} --wait` to exit"),
        || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        },
    );
    if waited.is_err() {
        kill_and_reap(&mut child);
    }
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    waited.with_context(|| format!("its output so far:\n{output}"))?;
    let status = status.expect("invariant: set when the wait succeeded");
    if !status.success() {
        bail!(
            "`meridian drain {id} --wait` exited with {status}, expected 0; its output:\n{output}"
        );
    }
    Ok(Drained { took: started.elapsed(), output })
}

/// SIGKILLs the etcd that `meridian up` started and waits until it is dead.
pub fn stop_etcd(cluster: &Cluster) -> anyhow::Result<()> {
    let pid = cluster.etcd_pid().context("the ready file names no etcd_pid")?;
    signal(pid, libc::SIGKILL).with_context(|| format!("SIGKILL to etcd (pid {pid})"))?;
    wait_until(deadline(Duration::from_secs(5)), &format!("etcd (pid {pid}) to die"), || {
        !process_alive(pid)
    })
}

/// etcd started again by the test, exactly as `meridian up` started it (same data dir,
/// same ports), after [`stop_etcd`]. Stopped (SIGTERM, then SIGKILL) when dropped: drop it
/// after the cluster, so the nodes can still revoke their leases while they stop.
pub struct RestartedEtcd {
    child: Option<Child>,
    log_path: PathBuf,
}

impl RestartedEtcd {
    /// Starts it and waits until it answers `/health` on its client URL.
    pub fn start(cluster: &Cluster, within: Duration) -> anyhow::Result<RestartedEtcd> {
        let argv = cluster.etcd_command().context("the ready file has no etcd_command")?;
        let (program, args) = argv.split_first().context("an empty etcd_command")?;
        let log_path = cluster.dir().join("etcd-restarted.log");
        let log = File::create(&log_path)?;
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().with_context(|| format!("starting etcd again: {argv:?}"))?;
        let etcd = RestartedEtcd { child: Some(child), log_path };
        let url = cluster.etcd_url();
        let address = url
            .trim_start_matches("http://")
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("etcd's client URL {url:?} is not host:port"))?;
        let mut last = String::new();
        wait_until(deadline(within), &format!("the restarted etcd at {url} to be healthy"), || {
            match http_get(address, "/health") {
                Ok((200, body)) if body.contains("true") => true,
                Ok((code, body)) => {
                    last = format!("{code} {body}");
                    false
                }
                Err(e) => {
                    last = format!("{e:#}");
                    false
                }
            }
        })
        .with_context(|| format!("last answer: {last}; its log:\n{}", tail(&etcd.log_path)))?;
        Ok(etcd)
    }
}

impl Drop for RestartedEtcd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pid = child.id() as i32;
        let _ = signal(pid, libc::SIGTERM);
        let _ =
            wait_until(deadline(Duration::from_secs(3)), "etcd to stop", || !process_alive(pid));
        kill_and_reap(&mut child);
        if std::thread::panicking() {
            eprintln!(
                "---- restarted etcd log ({}) ----\n{}\n---- end ----",
                self.log_path.display(),
                tail(&self.log_path)
            );
        }
    }
}

/// The sum of every sample of the metric `name` (all label sets) on a node's `/metrics`.
pub fn metric_total(admin: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let (code, body) = http_get(admin, "/metrics")?;
    if code != 200 {
        bail!("GET /metrics on {admin} answered {code}");
    }
    let mut total = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let metric = series.split('{').next().unwrap_or(series);
        if metric == name {
            let value: f64 =
                value.parse().with_context(|| format!("{admin} /metrics: bad line {line:?}"))?;
            *total.get_or_insert(0.0) += value;
        }
    }
    total.with_context(|| format!("no metric {name} on {admin} /metrics"))
}

/// Waits until every node answers `/readyz` with 200; the error lists those that did not,
/// with their last answer.
pub fn wait_ready(nodes: &[(String, SocketAddr)], within: Duration) -> anyhow::Result<()> {
    let mut not_ready: Vec<String> = Vec::new();
    wait_until(deadline(within), "every node to answer /readyz with 200", || {
        not_ready = nodes
            .iter()
            .filter_map(|(name, admin)| match http_get(*admin, "/readyz") {
                Ok((200, _)) => None,
                Ok((code, body)) => Some(format!("{name}: {code} {}", body.trim())),
                Err(e) => Some(format!("{name}: {e:#}")),
            })
            .collect();
        not_ready.is_empty()
    })
    .with_context(|| format!("not ready: {not_ready:?}"))
}

/// Players per shard right now, from every shard's `/players` (a player in the middle of a
/// handoff counts once, for the shard listing its highest generation). Every shard asked
/// appears, with 0 if it owns nobody.
pub fn loads(shards: &[(u32, SocketAddr)]) -> anyhow::Result<BTreeMap<u32, usize>> {
    let sample = Sample::take(shards)?;
    let mut counts: BTreeMap<u32, usize> = shards.iter().map(|(id, _)| (*id, 0)).collect();
    for (shard, _) in sample.owners().into_values() {
        *counts.entry(shard).or_default() += 1;
    }
    Ok(counts)
}

/// The busiest shard's load over the mean: 1.0 is perfectly even.
pub fn load_ratio(loads: &BTreeMap<u32, usize>) -> f64 {
    let total: usize = loads.values().sum();
    if loads.is_empty() || total == 0 {
        return 1.0;
    }
    let mean = total as f64 / loads.len() as f64;
    *loads.values().max().expect("invariant: not empty") as f64 / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_ratio_is_the_busiest_over_the_mean() {
        let even = BTreeMap::from([(1, 10), (2, 10)]);
        assert!((load_ratio(&even) - 1.0).abs() < 1e-9);
        let crowded = BTreeMap::from([(1, 120), (2, 0), (3, 0), (4, 0)]);
        assert!((load_ratio(&crowded) - 4.0).abs() < 1e-9);
        assert!((load_ratio(&BTreeMap::new()) - 1.0).abs() < 1e-9);
    }
}
