//! Every flag is checked before anything starts (issue 32): a bad `--store`, `--resume-key`
//! or `--jwks` makes `meridian up` (and a node) exit non-zero with every problem listed,
//! before etcd or any node runs, leaving no file, folder or temporary directory behind.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context};
use meridian_testkit::{deadline, wait_until};

use crate::meridian_bin;

/// What one run left: how it exited, what it said, and what is in its folders.
#[derive(Debug)]
struct Refused {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// What the run left in its working directory and in its TMPDIR.
    left: Vec<PathBuf>,
}

/// Runs `meridian args` in a fresh working directory with a fresh TMPDIR; an error if it
/// does not exit within 10 s (a start that went on to wait for etcd).
fn run_in_empty_dirs(args: &[&str]) -> anyhow::Result<Refused> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let root = std::env::temp_dir().join(format!("meridian-flags-{}-{nanos}", std::process::id()));
    let (cwd, tmp) = (root.join("cwd"), root.join("tmp"));
    std::fs::create_dir_all(&cwd)?;
    std::fs::create_dir_all(&tmp)?;
    let (out_path, err_path) = (root.join("stdout"), root.join("stderr"));
    let mut child = Command::new(meridian_bin())
        .args(args)
        .current_dir(&cwd)
        .env("TMPDIR", &tmp)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .process_group(0)
        .spawn()
        .context("starting meridian")?;
    let mut status = None;
    let exited = wait_until(deadline(Duration::from_secs(10)), "meridian to exit", || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if exited.is_err() {
        // Its own process group: whatever it started goes too.
        // SAFETY: kill(2) on the process group of a child this test spawned.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
    }
    let stderr = std::fs::read_to_string(&err_path)?;
    exited
        .with_context(|| format!("`meridian {}` did not exit; stderr: {stderr}", args.join(" ")))?;
    let mut left = Vec::new();
    for dir in [&cwd, &tmp] {
        for entry in std::fs::read_dir(dir)? {
            left.push(entry?.path());
        }
    }
    let refused = Refused {
        status: status.expect("invariant: set when the wait succeeded"),
        stdout: std::fs::read_to_string(&out_path)?,
        stderr,
        left,
    };
    std::fs::remove_dir_all(&root)?;
    Ok(refused)
}

fn ensure_refused(run: &Refused, says: &[&str]) -> anyhow::Result<()> {
    ensure!(!run.status.success(), "must exit non-zero: {run:?}");
    // Once, by the command itself: not by each node `up` started and saw exit.
    ensure!(
        run.stderr.matches("invalid configuration").count() == 1,
        "refused once, as configuration: {run:?}"
    );
    ensure!(!run.stderr.contains("exited during start-up"), "no node was started: {run:?}");
    for text in says {
        ensure!(run.stderr.contains(text), "the message says {text:?}: {run:?}");
    }
    ensure!(run.left.is_empty(), "nothing is left behind: {run:?}");
    ensure!(!run.stdout.contains("is ready"), "nothing started: {run:?}");
    Ok(())
}

fn check(checked: anyhow::Result<()>) {
    if let Err(error) = checked {
        panic!("{error:#}");
    }
}

/// `up` with its ports on 0, so a run that wrongly starts does not meet another test's.
fn up(extra: &[&str]) -> Vec<String> {
    let ports = ["up", "--port", "0", "--quic-port", "0", "--ws-port", "0", "--etcd-port", "0"];
    ports.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run_up(extra: &[&str]) -> anyhow::Result<Refused> {
    let args = up(extra);
    run_in_empty_dirs(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn up_refuses_a_store_of_unknown_scheme_before_it_starts() {
    check((|| {
        let run = run_up(&["--store", "bogus:xyz"])?;
        ensure_refused(&run, &["--store", "\"bogus:xyz\"", "unknown scheme", "sqlite:PATH"])?;
        let run = run_up(&["--store", "postgress://me@db/game"])?;
        ensure_refused(&run, &["\"postgress://me@db/game\"", "postgres://"])?;
        Ok(())
    })());
}

#[test]
fn nodes_refuse_a_store_of_unknown_scheme() {
    let nowhere = "http://127.0.0.1:9";
    check((|| {
        for node in [["shard", "--id", "1"], ["gateway", "--id", "1"]] {
            let mut args = node.to_vec();
            args.extend(["--dev", "--etcd", nowhere, "--listen", "127.0.0.1:0"]);
            args.extend(["--admin", "127.0.0.1:0", "--store", "postgress://me@db/game"]);
            let run = run_in_empty_dirs(&args)?;
            ensure_refused(&run, &["--store", "unknown scheme \"postgress\""])?;
        }
        Ok(())
    })());
}

#[test]
fn up_refuses_a_bad_resume_key_and_a_missing_jwks_before_it_starts() {
    check((|| {
        let run = run_up(&["--resume-key", "xyz"])?;
        ensure_refused(&run, &["--resume-key must be at least 32 hex digits"])?;
        let run = run_up(&["--jwks", "/missing/keys.json"])?;
        ensure_refused(&run, &["--jwks /missing/keys.json"])?;
        // Every problem at once, one line each.
        let run = run_up(&[
            "--resume-key",
            "xyz",
            "--jwks",
            "/missing/keys.json",
            "--store",
            "bogus:xyz",
        ])?;
        ensure_refused(&run, &["--resume-key", "--jwks", "--store"])?;
        ensure!(run.stderr.matches("\n  - ").count() == 3, "three problems listed: {run:?}");
        Ok(())
    })());
}

#[test]
fn a_gateway_refuses_a_missing_jwks_before_it_looks_for_etcd() {
    check((|| {
        // etcd is nowhere: a gateway that got as far as looking for it would wait, not exit.
        let run = run_in_empty_dirs(&[
            "gateway",
            "--id",
            "1",
            "--dev",
            "--etcd",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--jwks",
            "/missing/keys.json",
        ])?;
        ensure_refused(&run, &["--jwks /missing/keys.json"])?;
        Ok(())
    })());
}

/// A PostgreSQL store that does not answer is one error from `up`, before it starts etcd
/// or a node (not the same error from every shard and gateway).
#[test]
fn up_tries_a_postgres_store_once_before_it_starts() {
    check((|| {
        let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let store = format!("postgres://meridian@{nowhere}/game");
        let run = run_up(&["--store", &store])?;
        ensure!(!run.status.success(), "must exit non-zero: {run:?}");
        ensure!(run.stderr.matches("player store unavailable").count() == 1, "once: {run:?}");
        ensure!(run.stderr.matches("Connection refused").count() == 1, "once: {run:?}");
        ensure!(run.stderr.contains("--store"), "names the flag: {run:?}");
        ensure!(!run.stderr.contains("exited during start-up"), "no node was started: {run:?}");
        ensure!(run.left.is_empty(), "nothing is left behind: {run:?}");
        Ok(())
    })());
}

/// `shard --join DIR` (issue 32): a directory without `up`'s join file, or flags that
/// contradict the file, are refused before the shard looks for etcd.
#[test]
fn a_shard_refuses_a_join_dir_without_the_file_or_flags_that_contradict_it() {
    check((|| {
        let run = run_in_empty_dirs(&["shard", "--id", "3", "--join", "/nowhere"])?;
        ensure_refused(&run, &["--join /nowhere", "data directory of a running `meridian up`"])?;

        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        let dir =
            std::env::temp_dir().join(format!("meridian-join-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = serde_json::json!({
            "cluster": "blue", "etcd": "http://127.0.0.1:9", "lease_ttl_ms": 3000,
            "tls_dir": null, "resume_key": "ab".repeat(32), "store": null,
            "save_interval_ms": 10000, "resume_window_ms": 30000, "game": null,
            "game_tick_ms": 100, "max_npcs": 100,
        });
        std::fs::write(dir.join("join.json"), file.to_string())?;
        let join = dir.to_str().context("a UTF-8 path")?;
        let args = ["shard", "--id", "3", "--join", join, "--cluster", "red"];
        let tls =
            ["--tls-ca", "ca.pem", "--tls-cert", "shard-3.pem", "--tls-key", "shard-3-key.pem"];
        let run =
            run_in_empty_dirs(&[&args[..], &["--etcd", "http://127.0.0.1:10"], &tls].concat())?;
        std::fs::remove_dir_all(&dir)?;
        let says = [
            "--cluster \"red\" contradicts --join",
            "--etcd http://127.0.0.1:10",
            "leave out --tls-ca, --tls-cert and --tls-key",
        ];
        ensure_refused(&run, &says)?;
        // The three, and the files that are not there.
        ensure!(run.stderr.matches("\n  - ").count() == 4, "four problems listed: {run:?}");
        Ok(())
    })());
}
