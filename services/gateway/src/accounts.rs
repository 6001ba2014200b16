//! Login tokens and the player store's interface are the core's
//! ([`meridian_gateway_core::accounts`], re-exported here); what reads files is here: the
//! JWKS file (`--jwks`), re-read when it changes ([`KeyFile::refresh`], every second from
//! the gateway's shell), its keys handed to the core's [`LoginKeys`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

pub use meridian_gateway_core::accounts::*;

/// A JWKS file, re-read when it changes.
pub struct KeyFile {
    path: PathBuf,
    dev_mode: bool,
    current: RwLock<(Option<SystemTime>, Arc<Keys>)>,
}

impl KeyFile {
    /// Reads the file now: a file that cannot be read or parsed at start is an error.
    pub fn open(path: &Path, dev_mode: bool) -> Result<KeyFile, String> {
        let (modified, keys) = read_keys(path, dev_mode)?;
        Ok(KeyFile {
            path: path.to_path_buf(),
            dev_mode,
            current: RwLock::new((modified, Arc::new(keys))),
        })
    }

    /// The keys in use.
    pub fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()).1)
    }

    /// Re-reads the file if its modification time changed. `Ok(true)` if new keys are in
    /// use; an error (the keys in use are kept) if the new file is unreadable or invalid.
    pub fn refresh(&self) -> Result<bool, String> {
        let modified = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        let known = self.current.read().unwrap_or_else(|p| p.into_inner()).0;
        if modified == known {
            return Ok(false);
        }
        let (modified, keys) = read_keys(&self.path, self.dev_mode)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (modified, Arc::new(keys));
        Ok(true)
    }
}

fn read_keys(path: &Path, dev_mode: bool) -> Result<(Option<SystemTime>, Keys), String> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let json = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let keys = Keys::from_jwks(&json).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((modified, if dev_mode { keys.with_dev_key() } else { keys }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    const NOW: u64 = 1_800_000_000;

    /// An ES256 key of the test's own: its signing key and its public JWK.
    fn es256_key(kid: &str) -> (EncodingKey, String) {
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let point = pair.public_key().as_ref();
        let (x, y) = (base64_url(&point[1..33]), base64_url(&point[33..65]));
        let jwk = format!(
            r#"{{"kty":"EC","crv":"P-256","x":"{x}","y":"{y}","kid":"{kid}","alg":"ES256","use":"sig"}}"#
        );
        (EncodingKey::from_ec_der(pkcs8.as_ref()), jwk)
    }

    fn es256_token(key: &EncodingKey, kid: &str, sub: &str) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_string());
        let claims = serde_json::json!({ "sub": sub, "exp": NOW + 60 });
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    }

    fn write_jwks(path: &Path, jwks: &[&str], modified: u64) {
        std::fs::write(path, format!(r#"{{"keys":[{}]}}"#, jwks.join(","))).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(modified);
        file.set_modified(at).unwrap();
    }

    /// Keys come from a JWKS file that is re-read when it changes: a key added is accepted
    /// without a restart, a key removed is refused, a broken file keeps the keys in use, and
    /// a token signed by another key under a known kid is a bad signature.
    #[test]
    fn keys_rotate_through_the_jwks_file() {
        let dir = std::env::temp_dir().join(format!("meridian-jwks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jwks.json");
        let ((a, a_jwk), (b, b_jwk), (c, _)) = (es256_key("a"), es256_key("b"), es256_key("c"));
        write_jwks(&path, &[&a_jwk], 1_000);
        let file = KeyFile::open(&path, false).unwrap();
        let check = |token: &str| file.keys().verify(token, NOW);
        assert_eq!(check(&es256_token(&a, "a", "alice")).unwrap().id, "alice");
        assert_eq!(
            check(&es256_token(&b, "b", "bob")),
            Err(TokenError::UnknownKey(Some("b".into())))
        );
        assert_eq!(check(&es256_token(&c, "a", "mallory")), Err(TokenError::Signature));
        assert_eq!(file.refresh(), Ok(false), "unchanged");

        write_jwks(&path, &[&a_jwk, &b_jwk], 2_000);
        assert_eq!(file.refresh(), Ok(true));
        assert_eq!(check(&es256_token(&b, "b", "bob")).unwrap().id, "bob");
        assert_eq!(check(&es256_token(&a, "a", "alice")).unwrap().id, "alice");

        write_jwks(&path, &[&b_jwk], 3_000);
        file.refresh().unwrap();
        assert_eq!(
            check(&es256_token(&a, "a", "alice")),
            Err(TokenError::UnknownKey(Some("a".into())))
        );

        std::fs::write(&path, "{not json").unwrap();
        assert!(file.refresh().is_err());
        assert_eq!(check(&es256_token(&b, "b", "bob")).unwrap().id, "bob", "the keys in use stay");
        let dev = mint_dev_token("eve", None, NOW, 60);
        assert!(check(&dev).is_err(), "the dev key outside dev mode");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
