//! `<data dir>/join.json`: what a node needs to join a cluster of `meridian up` by hand
//! (`meridian shard --join <data dir>`). `up` writes it when it starts; `--join` reads it.
//!
//! It holds secrets (the resume-token key, the admin token) and points at the development
//! CA's key, so it is written readable by its owner only, like that key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The file's name in the data directory.
pub const JOIN_FILE: &str = "join.json";

/// What `up` gave its own shards, for one more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinFile {
    pub cluster: String,
    /// The etcd `up` started (`http://127.0.0.1:PORT`).
    pub etcd: String,
    pub lease_ttl_ms: u64,
    /// The development CA's directory (`<data>/tls`): it issues the joining node's
    /// certificate. None: the cluster's gRPC links are in the clear (`up --insecure-grpc`).
    pub tls_dir: Option<PathBuf>,
    /// The resume-token key every node of the cluster signs and checks with (hex).
    pub resume_key: String,
    #[serde(default)]
    pub resume_key_previous: String,
    #[serde(default)]
    pub admin_token: String,
    /// The player store (`--store`), if players are saved.
    pub store: Option<String>,
    pub save_interval_ms: u64,
    pub resume_window_ms: u64,
    /// The game the shards run (`--game`); None: the binary's default.
    pub game: Option<String>,
    pub game_tick_ms: u64,
    pub max_npcs: usize,
}

impl JoinFile {
    /// Writes the file into `dir`, readable by its owner only, atomically (a node that
    /// reads it meanwhile sees the old file or the new one).
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(JOIN_FILE);
        let tmp = dir.join(format!("{JOIN_FILE}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        file.write_all(&serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
        Ok(path)
    }

    /// The file in `dir`, or why not, worded for `--join`'s problem list.
    pub fn read(dir: &Path) -> Result<JoinFile, String> {
        let path = dir.join(JOIN_FILE);
        let text = std::fs::read(&path).map_err(|error| {
            format!(
                "--join {}: cannot read {} ({error}): give the data directory of a running \
                 `meridian up` (it writes {JOIN_FILE} there when it starts)",
                dir.display(),
                path.display()
            )
        })?;
        serde_json::from_slice(&text)
            .map_err(|error| format!("--join: {} does not parse: {error}", path.display()))
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_goes_back_and_forth_and_only_its_owner_reads_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("meridian-join-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = JoinFile {
            cluster: "blue".into(),
            etcd: "http://127.0.0.1:2379".into(),
            lease_ttl_ms: 3000,
            tls_dir: Some(dir.join("tls")),
            resume_key: "ab".repeat(32),
            resume_key_previous: String::new(),
            admin_token: String::new(),
            store: Some("sqlite:/tmp/players.sqlite".into()),
            save_interval_ms: 10_000,
            resume_window_ms: 30_000,
            game: None,
            game_tick_ms: 100,
            max_npcs: 20_000,
        };
        let path = file.write(&dir).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(JoinFile::read(&dir).unwrap(), file);
        let missing = JoinFile::read(&dir.join("nowhere")).unwrap_err();
        assert!(missing.contains("data directory of a running `meridian up`"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
