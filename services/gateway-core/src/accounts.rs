//! Login tokens (DESIGN.md section 2b, "Accounts"): a JWT signed by the studio's login
//! service, checked against the public keys of a JWKS file. `sub` is the account, `name`
//! the display name, `exp` is enforced with [`CLOCK_SKEW`] of slack (and `nbf` when given).
//! Accepted algorithms: EdDSA (Ed25519), ES256, ES384 and RS256, each only with a key of its
//! own type; a key with a `kid` is used only for tokens naming that `kid`.
//!
//! The key file is re-read when it changes (`meridian-gateway`'s `KeyFile::refresh`, every
//! second from the gateway's shell, into [`LoginKeys::set`]), so keys rotate without a restart: publish the new key next to the old
//! one, switch the login service over, then drop the old key. A file that cannot be read
//! or parsed leaves the keys in use as they were (and is logged and counted).
//!
//! In dev mode a well-known development key ([`dev_jwk`]) is accepted as well, so that
//! `meridian token --sub alice` can mint tokens for a local cluster. It is public: it is never
//! accepted outside dev mode.
//!
//! Verification takes the time as an argument (the gateway's core reads no clock).

use std::sync::{Arc, RwLock};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, OctetKeyPairType};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Slack on `exp` and `nbf` for clocks that disagree a little.
pub const CLOCK_SKEW: u64 = 60;
/// Longest account id (`sub`) accepted.
pub const MAX_ACCOUNT_LEN: usize = 128;
/// The development key's id.
pub const DEV_KID: &str = "meridian-dev";
/// The development key's Ed25519 seed. Public on purpose: tokens it signs are only
/// accepted by gateways in dev mode.
const DEV_SEED: [u8; 32] = *b"meridian dev key: not a secret!!";

/// An account, as a verified token names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: String,
    /// The display name the token gives, if any.
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("token signed with {0:?}, which is not accepted")]
    Algorithm(Algorithm),
    #[error("no key for this token (kid {0:?})")]
    UnknownKey(Option<String>),
    #[error("bad signature")]
    Signature,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet")]
    NotYetValid,
    #[error("token has no usable sub (account)")]
    NoAccount,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The public keys tokens are checked against.
#[derive(Default)]
pub struct Keys {
    keys: Vec<Key>,
}

impl Keys {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys of a type this module does not
    /// accept are skipped; the count of usable ones is [`Keys::len`].
    pub fn from_jwks(json: &[u8]) -> Result<Keys, String> {
        let set: JwkSet = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        let mut keys = Keys::default();
        for jwk in &set.keys {
            keys.add(jwk)?;
        }
        Ok(keys)
    }

    /// The keys plus the development key (dev mode).
    pub fn with_dev_key(mut self) -> Keys {
        self.add(&dev_jwk()).expect("invariant: the dev key is a valid Ed25519 JWK");
        self
    }

    fn add(&mut self, jwk: &Jwk) -> Result<(), String> {
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::OctetKeyPair(p)
                if p.key_type == OctetKeyPairType::OctetKeyPair
                    && p.curve == EllipticCurve::Ed25519 =>
            {
                Algorithm::EdDSA
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P384 => {
                Algorithm::ES384
            }
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            _ => return Ok(()),
        };
        let key =
            DecodingKey::from_jwk(jwk).map_err(|e| format!("key {:?}: {e}", jwk.common.key_id))?;
        self.keys.push(Key { kid: jwk.common.key_id.clone(), algorithm, key });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks a token at `unix_now` (seconds).
    pub fn verify(&self, token: &str, unix_now: u64) -> Result<Account, TokenError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if !matches!(
            header.alg,
            Algorithm::EdDSA | Algorithm::ES256 | Algorithm::ES384 | Algorithm::RS256
        ) {
            return Err(TokenError::Algorithm(header.alg));
        }
        let candidates = self
            .keys
            .iter()
            .filter(|k| k.algorithm == header.alg && (header.kid.is_none() || k.kid == header.kid));
        // The clock is ours to read, not the library's: exp and nbf are checked below.
        let mut validation = Validation::new(header.alg);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let mut tried = false;
        let mut claims = None;
        for key in candidates {
            tried = true;
            match jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                }
                Err(e) => return Err(TokenError::Malformed(e.to_string())),
            }
        }
        let Some(claims) = claims else {
            return Err(if tried {
                TokenError::Signature
            } else {
                TokenError::UnknownKey(header.kid)
            });
        };
        match claims.exp {
            Some(exp) if exp.saturating_add(CLOCK_SKEW) >= unix_now => {}
            Some(_) => return Err(TokenError::Expired),
            None => return Err(TokenError::Malformed("no exp".into())),
        }
        if claims.nbf.is_some_and(|nbf| nbf > unix_now.saturating_add(CLOCK_SKEW)) {
            return Err(TokenError::NotYetValid);
        }
        let id = claims.sub.filter(|s| !s.is_empty() && s.len() <= MAX_ACCOUNT_LEN);
        let id = id.ok_or(TokenError::NoAccount)?;
        if id.chars().any(char::is_control) {
            return Err(TokenError::NoAccount);
        }
        Ok(Account { id, name: claims.name.filter(|n| !n.is_empty()) })
    }
}

/// The keys a gateway checks login tokens against: its JWKS file's (`--jwks`, which the
/// shell re-reads and [`LoginKeys::set`]s), and in dev mode the development key as well.
pub struct LoginKeys {
    current: RwLock<Arc<Keys>>,
}

impl LoginKeys {
    /// No key file's keys yet: in dev mode the development key, else none.
    pub fn new(dev_mode: bool) -> LoginKeys {
        let fixed = if dev_mode { Keys::default().with_dev_key() } else { Keys::default() };
        LoginKeys::with(Arc::new(fixed))
    }

    pub fn with(keys: Arc<Keys>) -> LoginKeys {
        LoginKeys { current: RwLock::new(keys) }
    }

    /// The keys in use.
    pub fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Uses `keys` from now on (a key file that changed).
    pub fn set(&self, keys: Arc<Keys>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = keys;
    }
}

/// Unix time from the core's `Instant`s: a wall-clock reading taken once, at start.
#[derive(Debug, Clone, Copy)]
pub struct UnixClock {
    at: std::time::Instant,
    /// Milliseconds since the Unix epoch at `at`.
    unix_ms: u64,
}

impl UnixClock {
    /// `unix` seconds since the Unix epoch at `at` (the shell reads both clocks once).
    pub fn new(at: std::time::Instant, unix: u64) -> UnixClock {
        UnixClock::with_millis(at, unix.saturating_mul(1000))
    }

    /// `unix_ms` milliseconds since the Unix epoch at `at`.
    pub fn with_millis(at: std::time::Instant, unix_ms: u64) -> UnixClock {
        UnixClock { at, unix_ms }
    }

    /// Seconds since the Unix epoch at `now`.
    pub fn unix_at(&self, now: std::time::Instant) -> u64 {
        self.unix_ms_at(now) / 1000
    }

    /// Milliseconds since the Unix epoch at `now`.
    pub fn unix_ms_at(&self, now: std::time::Instant) -> u64 {
        self.unix_ms + now.saturating_duration_since(self.at).as_millis() as u64
    }
}

/// The development key's public JWK.
pub fn dev_jwk() -> Jwk {
    use ring::signature::KeyPair;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&DEV_SEED)
        .expect("invariant: any 32 bytes are an Ed25519 seed");
    let x = base64_url(pair.public_key().as_ref());
    let json =
        format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"{DEV_KID}","alg":"EdDSA"}}"#);
    serde_json::from_str(&json).expect("invariant: a well-formed JWK")
}

/// A token signed with the development key (`meridian token`): accepted in dev mode only.
pub fn mint_dev_token(account: &str, name: Option<&str>, unix_now: u64, ttl_secs: u64) -> String {
    // PKCS#8 v1 of an Ed25519 seed: a fixed prefix, then the seed.
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(&DEV_SEED);
    let key = EncodingKey::from_ed_der(&der);
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(DEV_KID.to_string());
    let claims = Claims {
        sub: Some(account.to_string()),
        exp: Some(unix_now + ttl_secs),
        nbf: None,
        name: name.map(str::to_string),
    };
    jsonwebtoken::encode(&header, &claims, &key).expect("invariant: the dev key signs")
}

/// Unpadded base64url (RFC 4648 section 5), as JWTs and JWKs spell their bytes.
pub fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_dev_token_is_accepted_with_the_dev_key_only() {
        let token = mint_dev_token("alice", Some("Alice"), NOW, 3600);
        let dev = Keys::default().with_dev_key();
        let account = dev.verify(&token, NOW).unwrap();
        assert_eq!(account, Account { id: "alice".into(), name: Some("Alice".into()) });
        assert_eq!(
            Keys::default().verify(&token, NOW),
            Err(TokenError::UnknownKey(Some(DEV_KID.into())))
        );
    }

    #[test]
    fn exp_is_enforced_with_a_little_slack() {
        let token = mint_dev_token("alice", None, NOW, 10);
        let dev = Keys::default().with_dev_key();
        assert!(dev.verify(&token, NOW + 10 + CLOCK_SKEW).is_ok());
        assert_eq!(dev.verify(&token, NOW + 11 + CLOCK_SKEW), Err(TokenError::Expired));
    }

    #[test]
    fn a_tampered_or_garbage_token_is_refused() {
        let token = mint_dev_token("alice", None, NOW, 10);
        let dev = Keys::default().with_dev_key();
        let (head, _) = token.rsplit_once('.').unwrap();
        let forged = format!("{head}.{}", base64_url(&[7; 64]));
        assert_eq!(dev.verify(&forged, NOW), Err(TokenError::Signature));
        assert!(matches!(dev.verify("not a token", NOW), Err(TokenError::Malformed(_))));
        assert!(matches!(dev.verify("", NOW), Err(TokenError::Malformed(_))));
    }

    #[test]
    fn base64_url_has_no_padding() {
        assert_eq!(base64_url(b"f"), "Zg");
        assert_eq!(base64_url(b"fo"), "Zm8");
        assert_eq!(base64_url(b"foo"), "Zm9v");
        assert_eq!(base64_url(&[0xfb, 0xff]), "-_8");
    }
}

/// An account's player as the player store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountPlayer {
    pub player_id: u64,
    pub name: String,
    /// Where and under which ownership generation it was last saved, if ever.
    pub saved: Option<SavedCell>,
    /// The game's private state of the player, as last saved.
    pub state: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedCell {
    pub at: (u32, u32),
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// The id offered for a new account belongs to another account.
    IdTaken,
    /// The store cannot be reached or failed; why.
    Unavailable(String),
}

/// Where the gateway finds each account's player: the player store, which the binary
/// wires in (`meridian gateway --store`), so this crate names no storage of its own.
pub trait AccountStore: Send + Sync + 'static {
    /// The account's player; a new account's is created with `new_id` and `name`.
    fn player<'a>(
        &'a self,
        account: &'a str,
        name: &'a str,
        new_id: u64,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<AccountPlayer, LookupError>> + Send + 'a>,
    >;

    /// For logs: which kind of store.
    fn kind(&self) -> &'static str;
}

/// A shared [`AccountStore`], as the gateway's configuration carries it.
#[derive(Clone)]
pub struct Accounts(pub Arc<dyn AccountStore>);

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Accounts({})", self.0.kind())
    }
}
