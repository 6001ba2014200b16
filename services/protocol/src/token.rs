//! Resume tokens: what `LoginOk.resume_token` and `ViewReset.resume_token` carry and
//! `Resume.token` gives back.
//!
//! `version (1) | key id (4) | player_id (u64 LE) | nonce (u64 LE) | MAC (16)`, where MAC is
//! HMAC-SHA256 over everything before it, truncated to 128 bits, keyed by a secret the
//! servers share through configuration and clients never see. A client cannot forge one
//! for another player.
//!
//! A token is good for one resume: the shard holding the player keeps the nonce of the one
//! token it issued last and refuses any other, and each successful resume issues a fresh
//! one. It has no expiry of its own: the holder accepts it only while the player is there
//! to take back (connected, or parked within the resume window after its connection
//! dropped), so a token stops working when the window ends.
//!
//! The key id lets the cluster key be rotated: servers mint with the current key and
//! accept the current and the previous ones ([`TokenKeys`]) while clients still hold
//! tokens of the old.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const VERSION: u8 = 2;
const KEY_ID_LEN: usize = 4;
const BODY_LEN: usize = 1 + KEY_ID_LEN + 8 + 8;
const MAC_LEN: usize = 16;
/// Length of every token this version mints.
pub const TOKEN_LEN: usize = BODY_LEN + MAC_LEN;

/// Why a token is refused (`INVALID_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token has the wrong length or version")]
    Malformed,
    #[error("token was signed with a key this cluster no longer accepts")]
    UnknownKey,
    #[error("token signature does not match")]
    BadSignature,
}

/// What a genuine token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub player_id: u64,
    /// Which token of the player this is: only the last one issued is good.
    pub nonce: u64,
}

/// One secret that signs resume tokens.
#[derive(Clone)]
pub struct TokenKey {
    secret: Vec<u8>,
    id: [u8; KEY_ID_LEN],
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenKey(id {})", hex(&self.id))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(secret: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret).expect("invariant: HMAC takes any key length")
}

impl TokenKey {
    /// At least 16 bytes of secret.
    pub fn new(secret: Vec<u8>) -> Option<TokenKey> {
        if secret.len() < 16 {
            return None;
        }
        // The id is derived from the secret, so operators never manage ids, and says
        // nothing about it.
        let mut mac = hmac(&secret);
        mac.update(b"meridian resume key id");
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&mac.finalize().into_bytes()[..KEY_ID_LEN]);
        Some(TokenKey { secret, id })
    }

    /// The key's id, as tokens carry it (hex), for logs.
    pub fn id(&self) -> String {
        hex(&self.id)
    }

    /// A token for `player_id` with the given nonce.
    pub fn mint(&self, player_id: u64, nonce: u64) -> Vec<u8> {
        let mut token = Vec::with_capacity(TOKEN_LEN);
        token.push(VERSION);
        token.extend_from_slice(&self.id);
        token.extend_from_slice(&player_id.to_le_bytes());
        token.extend_from_slice(&nonce.to_le_bytes());
        let mut mac = hmac(&self.secret);
        mac.update(&token);
        token.extend_from_slice(&mac.finalize().into_bytes()[..MAC_LEN]);
        token
    }

    fn check(&self, body: &[u8], tag: &[u8]) -> Result<(), TokenError> {
        let mut mac = hmac(&self.secret);
        mac.update(body);
        // Constant-time comparison of the truncated tag.
        mac.verify_truncated_left(tag).map_err(|_| TokenError::BadSignature)
    }
}

/// The keys a node accepts tokens from: the current one, which it also mints with, and
/// the previous ones during a rotation.
#[derive(Clone, Debug)]
pub struct TokenKeys {
    current: TokenKey,
    previous: Vec<TokenKey>,
}

impl From<TokenKey> for TokenKeys {
    fn from(current: TokenKey) -> TokenKeys {
        TokenKeys { current, previous: Vec::new() }
    }
}

impl TokenKeys {
    pub fn new(current: TokenKey, previous: Vec<TokenKey>) -> TokenKeys {
        TokenKeys { current, previous }
    }

    pub fn current(&self) -> &TokenKey {
        &self.current
    }

    /// A token for `player_id` with the given nonce, signed with the current key.
    pub fn mint(&self, player_id: u64, nonce: u64) -> Vec<u8> {
        self.current.mint(player_id, nonce)
    }

    /// What a token says, if one of the accepted keys signed it.
    pub fn verify(&self, token: &[u8]) -> Result<Token, TokenError> {
        if token.len() != TOKEN_LEN || token[0] != VERSION {
            return Err(TokenError::Malformed);
        }
        let (body, tag) = token.split_at(BODY_LEN);
        let id = &body[1..1 + KEY_ID_LEN];
        let key = std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|key| key.id == id)
            .ok_or(TokenError::UnknownKey)?;
        key.check(body, tag)?;
        let field = |at: usize| {
            u64::from_le_bytes(body[at..at + 8].try_into().expect("invariant: 8 bytes"))
        };
        Ok(Token { player_id: field(1 + KEY_ID_LEN), nonce: field(1 + KEY_ID_LEN + 8) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> TokenKey {
        TokenKey::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn a_genuine_token_says_whose_and_which_it_is() {
        let keys = TokenKeys::from(key(1));
        let token = keys.mint(42, 7);
        assert_eq!(token.len(), TOKEN_LEN);
        assert_eq!(keys.verify(&token), Ok(Token { player_id: 42, nonce: 7 }));
    }

    #[test]
    fn forgeries_are_refused() {
        let keys = TokenKeys::from(key(1));
        let token = keys.mint(42, 7);
        let mut other_player = token.clone();
        other_player[1 + KEY_ID_LEN] ^= 1;
        assert_eq!(keys.verify(&other_player), Err(TokenError::BadSignature));
        let mut other_nonce = token.clone();
        other_nonce[1 + KEY_ID_LEN + 8] ^= 1;
        assert_eq!(keys.verify(&other_nonce), Err(TokenError::BadSignature), "another nonce");
        let mut other_tag = token.clone();
        other_tag[TOKEN_LEN - 1] ^= 1;
        assert_eq!(keys.verify(&other_tag), Err(TokenError::BadSignature));
        assert_eq!(keys.verify(&token[..20]), Err(TokenError::Malformed));
        assert_eq!(keys.verify(&[]), Err(TokenError::Malformed));
        // The first version (with an expiry, good any number of times) is no longer taken.
        let mut old = token.clone();
        old[0] = 1;
        assert_eq!(keys.verify(&old), Err(TokenError::Malformed));
    }

    #[test]
    fn a_rotation_accepts_the_previous_key_until_it_is_dropped() {
        let (old, new) = (key(1), key(2));
        assert_ne!(old.id(), new.id());
        let from_old = TokenKeys::from(old.clone()).mint(42, 7);
        let rotating = TokenKeys::new(new.clone(), vec![old]);
        assert_eq!(rotating.verify(&from_old), Ok(Token { player_id: 42, nonce: 7 }));
        assert_eq!(rotating.verify(&rotating.mint(42, 8)).map(|t| t.nonce), Ok(8));
        let rotated = TokenKeys::from(new);
        assert_eq!(rotated.verify(&from_old), Err(TokenError::UnknownKey));
        // A key that claims another key's id still has to sign like it.
        let mut forged = TokenKeys::from(key(3)).mint(42, 7);
        forged[1..1 + KEY_ID_LEN].copy_from_slice(&key(2).id);
        assert_eq!(rotated.verify(&forged), Err(TokenError::BadSignature));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(TokenKey::new(vec![0; 15]).is_none());
    }
}
