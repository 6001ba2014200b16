//! An etcd that trusts nobody, as a managed one or the chart's bundled one does: clients
//! over TLS only, each with a client certificate from its CA (`--client-cert-auth`). Its
//! authentication is turned on by the test (`meridian etcd-auth`, as the chart's Job does).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::deadline;
use crate::elastic::die_with_parent;

/// The user Meridian's nodes log in as, and its password.
pub const ETCD_USER: &str = "meridian";
pub const ETCD_PASSWORD: &str = "not-a-secret-in-tests";

/// A running secure etcd (killed on drop).
pub struct SecureEtcd {
    child: Child,
    /// `https://localhost:<port>`.
    pub url: String,
    /// The CA of etcd's server certificate and of the client certificates it takes.
    pub ca: PathBuf,
    /// A client certificate and key etcd takes.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl SecureEtcd {
    /// Starts etcd in `dir` with TLS and client certificates, an auth token (once
    /// authentication is on) living `token_ttl` seconds; returns once it answers.
    pub fn start(dir: &Path, token_ttl: u32) -> anyhow::Result<SecureEtcd> {
        std::fs::create_dir_all(dir)?;
        let ca = meridian_tls::DevCa::open_or_create(&dir.join("ca"))?;
        let server = ca.issue("localhost")?;
        let client = ca.issue("meridian-node")?;
        let port = meridian_cluster::listen_port()?;
        let peer = meridian_cluster::listen_port()?;
        let url = format!("https://localhost:{port}");
        let log = File::create(dir.join("etcd.log"))?;
        let mut command = Command::new("etcd");
        command
            .args(["--name", "secure", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &format!("https://127.0.0.1:{port}")])
            .args(["--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("secure=http://127.0.0.1:{peer}")])
            .arg("--cert-file")
            .arg(&server.cert)
            .arg("--key-file")
            .arg(&server.key)
            .arg("--trusted-ca-file")
            .arg(&server.ca)
            .arg("--client-cert-auth")
            .args(["--auth-token", "simple", "--auth-token-ttl", &token_ttl.to_string()])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut command);
        let child = command.spawn().context("starting etcd (apt-get install etcd-server)")?;
        let etcd = SecureEtcd { child, url, ca: server.ca, cert: client.cert, key: client.key };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(etcd.answers())?;
        Ok(etcd)
    }

    /// `meridian` flags to reach it; `user` adds `--etcd-user` (its password goes in the
    /// environment: see [`SecureEtcd::password_env`]).
    pub fn flags(&self, user: bool) -> Vec<std::ffi::OsString> {
        let mut flags: Vec<std::ffi::OsString> = vec![
            "--etcd".into(),
            self.url.clone().into(),
            "--etcd-ca".into(),
            self.ca.clone().into(),
            "--etcd-cert".into(),
            self.cert.clone().into(),
            "--etcd-key".into(),
            self.key.clone().into(),
        ];
        if user {
            flags.extend(["--etcd-user".into(), ETCD_USER.into()]);
        }
        flags
    }

    /// The environment variable that carries the password.
    pub fn password_env() -> (&'static str, &'static str) {
        ("MERIDIAN_ETCD_PASSWORD", ETCD_PASSWORD)
    }

    /// The environment variable that carries the root user's password (`meridian
    /// etcd-auth`).
    pub fn root_password_env() -> (&'static str, &'static str) {
        ("MERIDIAN_ETCD_ROOT_PASSWORD", "root-password-for-tests")
    }

    /// A client with the client certificate and no user (before authentication is on).
    async fn connect(&self) -> anyhow::Result<etcd_client::Client> {
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(&self.ca)?))
            .identity(etcd_client::Identity::from_pem(
                std::fs::read(&self.cert)?,
                std::fs::read(&self.key)?,
            ));
        let options = etcd_client::ConnectOptions::new()
            .with_tls(tls)
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        Ok(etcd_client::Client::connect([self.url.as_str()], Some(options)).await?)
    }

    /// Waits until etcd answers a TLS client with its certificate.
    async fn answers(&self) -> anyhow::Result<()> {
        let until = deadline(Duration::from_secs(20));
        let mut last = None;
        while std::time::Instant::now() < until {
            match self.connect().await {
                Ok(mut client) => match client.status().await {
                    Ok(_) => return Ok(()),
                    Err(error) => last = Some(error.to_string()),
                },
                Err(error) => last = Some(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("the secure etcd never answered: {last:?}")
    }
}

impl Drop for SecureEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
