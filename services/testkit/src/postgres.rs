//! A PostgreSQL server of the test's own: Debian's `postgresql` binaries, `initdb` in a
//! temporary directory, listening on a free loopback port (and a socket in that directory),
//! trust authentication, stopped and removed when dropped. As root (CI), the server runs as
//! the `postgres` user the Debian package creates: PostgreSQL refuses to run as root.
//!
//! Tests run it with `fsync=off` (nothing they check needs the disk, and it is faster);
//! benchmarks of writes start it with [`TempPostgres::start_durable`], the server's own
//! defaults, so that a commit waits for the disk as it would in production.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context};

static NEXT: AtomicU64 = AtomicU64::new(1);

pub struct TempPostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    running: bool,
    /// Whether the server syncs its write-ahead log to disk (`fsync`).
    durable: bool,
}

impl TempPostgres {
    /// Creates a database cluster and starts its server (a few seconds), with `fsync=off`.
    pub fn start() -> anyhow::Result<TempPostgres> {
        TempPostgres::start_with(false)
    }

    /// The same with `fsync` on (the server's default): a commit is on disk when it returns.
    pub fn start_durable() -> anyhow::Result<TempPostgres> {
        TempPostgres::start_with(true)
    }

    fn start_with(durable: bool) -> anyhow::Result<TempPostgres> {
        let bin =
            find_bin().context("PostgreSQL's server binaries (Debian package `postgresql`)")?;
        let dir = std::env::temp_dir().join(format!(
            "meridian-pg-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        if is_root() {
            let status =
                Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status()?;
            if !status.success() {
                bail!("chown {} to postgres: {status}", dir.display());
            }
        }
        // Below the ephemeral range: a port just released from there can be taken by any
        // outgoing connection before the server binds it (CI), or while it is stopped.
        let port = meridian_cluster::listen_port()?;
        let mut pg = TempPostgres { dir, bin, port, running: false, durable };
        let data = pg.data();
        pg.run("initdb", &["-D", path_str(&data)?, "-A", "trust", "-U", "postgres", "--no-sync"])?;
        pg.start_server()?;
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's process id (its postmaster; the backends are its children), from the
    /// pid file in its data directory, while it runs.
    pub fn server_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Stops the server (`pg_ctl stop -m fast`); [`TempPostgres::restart`] starts it again
    /// on the same port with the same data.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.running {
            let data = self.data();
            self.run("pg_ctl", &["-D", path_str(&data)?, "-m", "fast", "-w", "stop"])?;
            self.running = false;
        }
        Ok(())
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.start_server()
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn start_server(&mut self) -> anyhow::Result<()> {
        let data = self.data();
        let log = self.dir.join("server.log");
        let fsync = if self.durable { "on" } else { "off" };
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={fsync}",
            self.port,
            path_str(&self.dir)?
        );
        self.run(
            "pg_ctl",
            &["-D", path_str(&data)?, "-l", path_str(&log)?, "-o", &options, "-w", "start"],
        )?;
        self.running = true;
        Ok(())
    }

    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let program = self.bin.join(tool);
        let mut command = if is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        let output = command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        if !output.status.success() {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            bail!(
                "{tool} {args:?}: {}\n{}{}\nserver log:\n{log}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if self.running {
            if let Ok(data) = path_str(&self.data()) {
                let _ = self.run("pg_ctl", &["-D", data, "-m", "immediate", "-w", "stop"]);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` in it.
fn find_bin() -> anyhow::Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).context("no /usr/lib/postgresql/*/bin/initdb")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}
