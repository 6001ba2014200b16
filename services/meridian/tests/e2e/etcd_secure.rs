//! A cluster on an etcd that trusts nobody (issue 15, item 3): TLS with client
//! certificates and etcd's own authentication, as a managed etcd or the chart's bundled one
//! runs. `meridian etcd-auth` turns authentication on (run twice: the chart runs it after
//! every upgrade). A shard and a gateway given `--etcd-ca/--etcd-cert/--etcd-key/--etcd-user`
//! (the password in the environment) register, serve a player and keep working past the
//! auth token's lifetime; a shard without the user is refused by etcd and says so.

use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::pb::Direction;
use meridian_testkit::{deadline, http_get, wait_until, Bot, SecureEtcd};

/// A node process, killed on drop.
struct Node {
    child: Child,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(dir: &Path, name: &str, args: Vec<OsString>, password: bool) -> anyhow::Result<Node> {
        let log = dir.join(format!("{name}.log"));
        let mut command = Command::new(crate::meridian_bin());
        command.args(args).stdin(Stdio::null());
        command.stdout(File::create(&log)?).stderr(File::create(dir.join(format!("{name}.err")))?);
        if password {
            let (name, value) = SecureEtcd::password_env();
            command.env(name, value);
        }
        let child = command.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Node { child, log })
    }

    fn logs(&self) -> String {
        let err = self.log.with_extension("err");
        format!(
            "{}{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(err).unwrap_or_default()
        )
    }
}

fn ready_addr(path: &Path, field: &str) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json[field].as_str()?.parse().ok()
}

fn ready_when_answers(admin: SocketAddr) -> bool {
    matches!(http_get(admin, "/readyz"), Ok((200, _)))
}

#[test]
fn a_cluster_runs_on_an_etcd_with_tls_and_authentication() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("meridian-etcd-secure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // Tokens live 2 s: the nodes outlive several of them below.
    let etcd = SecureEtcd::start(&dir.join("etcd"), 2)?;
    for run in 0..2 {
        let mut auth = Command::new(crate::meridian_bin());
        auth.arg("etcd-auth")
            .args(etcd.flags(true))
            .env(SecureEtcd::password_env().0, SecureEtcd::password_env().1);
        auth.env(SecureEtcd::root_password_env().0, SecureEtcd::root_password_env().1);
        let output = auth.output().context("running meridian etcd-auth")?;
        ensure!(
            output.status.success(),
            "etcd-auth run {run}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let common = |kind: &str, user: bool| -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![kind.into(), "--id".into(), "1".into()];
        args.extend(etcd.flags(user));
        for arg in ["--cluster", "secure", "--dev", "--listen", "127.0.0.1:0"] {
            args.push(arg.into());
        }
        args.extend(["--admin".into(), "127.0.0.1:0".into(), "--ready-file".into()]);
        args.push(dir.join(format!("{kind}.json")).into());
        args
    };

    // Without the user, etcd refuses the shard: it stops and says why.
    let mut anonymous = Node::start(&dir, "anonymous", common("shard", false), false)?;
    let mut exit = None;
    wait_until(deadline(Duration::from_secs(20)), "a shard without a user to stop", || {
        exit = anonymous.child.try_wait().ok().flatten();
        exit.is_some()
    })?;
    ensure!(exit.is_some_and(|e| !e.success()), "it failed: {exit:?}");
    let said = anonymous.logs();
    ensure!(
        said.contains("etcd") && (said.contains("permission") || said.contains("user")),
        "it names etcd's refusal: {said}"
    );
    let _ = std::fs::remove_file(dir.join("shard.json"));

    let shard = Node::start(&dir, "shard", common("shard", true), true)?;
    let gateway = Node::start(&dir, "gateway", common("gateway", true), true)?;
    let (shard_json, gateway_json) = (dir.join("shard.json"), dir.join("gateway.json"));
    let mut admins = Vec::new();
    for (node, path) in [(&shard, &shard_json), (&gateway, &gateway_json)] {
        let mut admin = None;
        let waited = wait_until(deadline(Duration::from_secs(30)), "the node to be ready", || {
            admin = ready_addr(path, "admin");
            admin.is_some_and(ready_when_answers)
        });
        waited.with_context(|| format!("its log: {}", node.logs()))?;
        admins.push(admin.expect("ready"));
    }
    let game = ready_addr(&gateway_json, "game").context("the gateway's game address")?;

    let mut alice = Bot::connect(game)?;
    alice.login("alice", Some((10, 10)))?;
    let mut at = alice.move_ok(Direction::Right, 1)?;
    ensure!(at == (11, 10), "moved: {at:?}");
    // Past two token lifetimes the nodes still talk to etcd (each refreshes its token), and
    // the player plays on. This part is about time passing (tokens expire every 2 s): five
    // moves a second for 5 s, each checked, with the nodes' readiness and the shard's lease.
    let until = Instant::now() + Duration::from_secs(5);
    let mut t = 1;
    while Instant::now() < until {
        t += 1;
        at = alice.move_ok(if t % 2 == 0 { Direction::Down } else { Direction::Up }, t)?;
        for admin in &admins {
            ensure!(ready_when_answers(*admin), "still ready at move {t}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(at.0 == 11, "played on: {at:?}");
    let registered = meridian_testkit::metric_total(admins[0], "meridian_shard_etcd_registered")?;
    ensure!(registered == 1.0, "the shard holds its lease: {registered}");
    let lapses =
        meridian_testkit::metric_total(admins[0], "meridian_shard_etcd_lease_expirations_total")?;
    ensure!(lapses == 0.0, "its lease never lapsed: {lapses}");
    let mut bob = Bot::connect(game)?;
    bob.login("bob", Some((12, 10)))?;
    drop((shard, gateway, etcd));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
