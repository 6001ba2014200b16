//! Login tokens on a real cluster (issue 12, DESIGN.md section 2b "Accounts"): gateways
//! started with `--jwks FILE` check every Login's token against the login service's keys.
//! A bad, expired or unknown-key token gets `INVALID_TOKEN` and the connection stays open;
//! a valid one logs in under the token's display name. Replacing the file rotates the keys
//! without a restart: the new key is taken, the dropped one refused. Dev mode still takes a
//! Login without a token, and the development key's tokens (`meridian token`).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use meridian_gateway::accounts::base64_url;
use meridian_testkit::pb::{client_message::Kind as C, server_message::Kind as S, ErrorCode};
use meridian_testkit::pb::{ClientMessage, Login, Position};
use meridian_testkit::{deadline, wait_until, Bot, ClusterOptions, Front};
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

use crate::with_cluster;

/// An ES256 key: what signs tokens, and its public JWK.
struct TestKey {
    kid: String,
    signer: EncodingKey,
    jwk: String,
}

impl TestKey {
    fn new(kid: &str) -> TestKey {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = pair.public_key().as_ref();
        let (x, y) = (base64_url(&point[1..33]), base64_url(&point[33..65]));
        let jwk = format!(
            r#"{{"kty":"EC","crv":"P-256","x":"{x}","y":"{y}","kid":"{kid}","alg":"ES256"}}"#
        );
        TestKey { kid: kid.into(), signer: EncodingKey::from_ec_der(pkcs8.as_ref()), jwk }
    }

    /// A token for `sub`, valid until `exp` (Unix seconds).
    fn token(&self, sub: &str, name: &str, exp: u64) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let claims = serde_json::json!({ "sub": sub, "name": name, "exp": exp });
        jsonwebtoken::encode(&header, &claims, &self.signer).unwrap()
    }
}

fn write_jwks(path: &Path, keys: &[&TestKey]) -> anyhow::Result<()> {
    let list: Vec<&str> = keys.iter().map(|k| k.jwk.as_str()).collect();
    // Written aside and renamed, as a secret mounted by Kubernetes changes: never half a file.
    let aside = path.with_extension("new");
    std::fs::write(&aside, format!(r#"{{"keys":[{}]}}"#, list.join(",")))?;
    std::fs::rename(&aside, path)?;
    Ok(())
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn login_with(name: &str, token: String, at: (u32, u32)) -> ClientMessage {
    let spawn = Some(Position { x: at.0, y: at.1 });
    ClientMessage { kind: Some(C::Login(Login { name: name.into(), spawn, token })) }
}

/// Sends a Login with `token`; Ok(player id) on LoginOk, Err(code) on an Error.
fn try_login(bot: &mut Bot, token: String, at: (u32, u32)) -> anyhow::Result<Result<u64, i32>> {
    bot.send(&login_with("from-client", token, at))?;
    let by = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let message = bot.recv(by)?;
        match message.kind {
            Some(S::LoginOk(ok)) => return Ok(Ok(ok.player_id)),
            Some(S::Error(e)) => return Ok(Err(e.code)),
            _ => continue,
        }
    }
}

pub fn login_tokens_are_checked_and_keys_rotate(io: Front) {
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("meridian-e2e-jwks-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwks = dir.join("jwks.json");
    let (old, new) = (TestKey::new("old"), TestKey::new("new"));
    write_jwks(&jwks, &[&old]).unwrap();
    let options = ClusterOptions::new(io).shards(1).arg("--jwks").arg(jwks.to_str().unwrap());
    with_cluster(options, |cluster| {
        let addr = cluster.client_addr(0);
        let now = unix_now();
        let invalid = ErrorCode::InvalidToken as i32;
        // One connection through every refusal: it stays open, and then logs in.
        let mut bot = Bot::connect(addr)?;
        ensure!(try_login(&mut bot, "garbage".into(), (50, 50))? == Err(invalid), "garbage");
        let expired = old.token("alice", "Alice", now - 3_600);
        ensure!(try_login(&mut bot, expired, (50, 50))? == Err(invalid), "expired");
        let unknown = new.token("alice", "Alice", now + 600);
        ensure!(try_login(&mut bot, unknown, (50, 50))? == Err(invalid), "unknown key");
        let valid = old.token("alice", "Alice of the Token", now + 600);
        ensure!(try_login(&mut bot, valid, (50, 50))?.is_ok(), "a valid token logs in");
        // Others see the token's display name, not the one the client sent.
        let mut watcher = Bot::connect(addr)?;
        let seen = watcher.login("watcher", Some((51, 50)))?;
        let names: Vec<String> = seen
            .after
            .iter()
            .filter_map(|m| match &m.kind {
                Some(S::Entered(e)) => Some(e.name.clone()),
                _ => None,
            })
            .collect();
        ensure!(names == ["Alice of the Token"], "the watcher sees {names:?}");

        // Rotation: the file now holds only the new key.
        write_jwks(&jwks, &[&new])?;
        let by = deadline(Duration::from_secs(15));
        wait_until(by, "a gateway to take the new key", || {
            let token = new.token("bob", "Bob", unix_now() + 600);
            Bot::connect(addr)
                .and_then(|mut bot| try_login(&mut bot, token, (60, 60)))
                .is_ok_and(|answer| answer.is_ok())
        })
        .context("after the JWKS file was replaced")?;
        let mut bot = Bot::connect(addr)?;
        let dropped = old.token("carol", "Carol", unix_now() + 600);
        ensure!(try_login(&mut bot, dropped, (70, 70))? == Err(invalid), "the dropped key");

        // Dev mode: no token, or the development key's.
        let mut bot = Bot::connect(addr)?;
        ensure!(try_login(&mut bot, String::new(), (80, 80))?.is_ok(), "dev mode without token");
        let output = std::process::Command::new(crate::meridian_bin())
            .args(["token", "--sub", "dave"])
            .output()?;
        let dev = String::from_utf8(output.stdout)?.trim().to_string();
        let mut bot = Bot::connect(addr)?;
        ensure!(try_login(&mut bot, dev, (90, 90))?.is_ok(), "the dev key's token");
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}
