//! Resume tokens: what `LoginOk.resume_token` carries and `Resume.token` gives back.
//!
//! `version (1) | player_id (u64 LE) | expires_at (unix seconds, u64 LE) | MAC (16)`, where
//! MAC is HMAC-SHA256 over everything before it, truncated to 128 bits, keyed by a secret
//! the servers share through configuration and clients never see. A client cannot forge
//! one for another player or extend its expiry.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const VERSION: u8 = 1;
const BODY_LEN: usize = 1 + 8 + 8;
const MAC_LEN: usize = 16;
/// Length of every token this version mints.
pub const TOKEN_LEN: usize = BODY_LEN + MAC_LEN;

/// Why a token is refused (`INVALID_TOKEN`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token has the wrong length or version")]
    Malformed,
    #[error("token signature does not match")]
    BadSignature,
    #[error("token expired")]
    Expired,
}

/// The shared secret that signs resume tokens.
#[derive(Clone)]
pub struct TokenKey(Vec<u8>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// At least 16 bytes of secret.
    pub fn new(secret: Vec<u8>) -> Option<TokenKey> {
        (secret.len() >= 16).then_some(TokenKey(secret))
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC_LEN] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("invariant: HMAC takes any key length");
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// A token for `player_id` valid until `expires_at` (unix seconds).
    pub fn mint(&self, player_id: u64, expires_at: u64) -> Vec<u8> {
        let mut token = Vec::with_capacity(TOKEN_LEN);
        token.push(VERSION);
        token.extend_from_slice(&player_id.to_le_bytes());
        token.extend_from_slice(&expires_at.to_le_bytes());
        let mac = self.mac(&token);
        token.extend_from_slice(&mac);
        token
    }

    /// The player a token names, if it is genuine and not expired at `now` (unix seconds).
    pub fn verify(&self, token: &[u8], now: u64) -> Result<u64, TokenError> {
        if token.len() != TOKEN_LEN || token[0] != VERSION {
            return Err(TokenError::Malformed);
        }
        let (body, mac) = token.split_at(BODY_LEN);
        let mut check =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("invariant: HMAC takes any key length");
        check.update(body);
        // Constant-time comparison of the truncated tag.
        check.verify_truncated_left(mac).map_err(|_| TokenError::BadSignature)?;
        let player_id = u64::from_le_bytes(body[1..9].try_into().expect("invariant: 8 bytes"));
        let expires_at = u64::from_le_bytes(body[9..17].try_into().expect("invariant: 8 bytes"));
        if now > expires_at {
            return Err(TokenError::Expired);
        }
        Ok(player_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> TokenKey {
        TokenKey::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn genuine_token_verifies_until_it_expires() {
        let token = key(1).mint(42, 1_000);
        assert_eq!(token.len(), TOKEN_LEN);
        assert_eq!(key(1).verify(&token, 999), Ok(42));
        assert_eq!(key(1).verify(&token, 1_000), Ok(42));
        assert_eq!(key(1).verify(&token, 1_001), Err(TokenError::Expired));
    }

    #[test]
    fn forgeries_are_refused() {
        let token = key(1).mint(42, 1_000);
        assert_eq!(key(2).verify(&token, 0), Err(TokenError::BadSignature), "other key");
        let mut other_player = token.clone();
        other_player[1] ^= 1;
        assert_eq!(key(1).verify(&other_player, 0), Err(TokenError::BadSignature));
        let mut later = token.clone();
        later[16] = 0xff;
        assert_eq!(key(1).verify(&later, 0), Err(TokenError::BadSignature), "extended expiry");
        assert_eq!(key(1).verify(&token[..20], 0), Err(TokenError::Malformed));
        assert_eq!(key(1).verify(&[], 0), Err(TokenError::Malformed));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(TokenKey::new(vec![0; 15]).is_none());
    }
}
