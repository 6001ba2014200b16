//! Target `resume_token`: `TokenKey::mint` and `TokenKey::verify` of `meridian-protocol`.
//!
//! Input: `key length (1) | key | now (8) | player (8) | expires_at (8) | flip (1) | candidate`.
//! The key is `16 + length % 64` bytes (zero-padded past the end of the input); integers
//! are little-endian; `candidate` (the rest) is handed to `verify` as a client would.
//!
//! Properties:
//! - `verify` never panics, whatever the bytes and `now`;
//! - it accepts a candidate only if the candidate is exactly what `mint` makes with the
//!   same key for the player and expiry it carries, and not after that expiry; its error
//!   says which check failed (length/version, signature, expiry), and another key
//!   never accepts it;
//! - `mint` then `verify` round-trips, until the expiry and not after; a token with any
//!   one byte changed, or cut short, is refused.

use meridian_protocol::{TokenError, TokenKey, TOKEN_LEN};

use crate::Cursor;

/// Where the fields sit in a token (see `services/protocol/src/token.rs`).
const VERSION: u8 = 1;
const BODY_LEN: usize = 17;

pub fn check(data: &[u8]) {
    let mut input = Cursor::new(data);
    let key_len = 16 + usize::from(input.u8() % 64);
    let mut secret = input.bytes(key_len).to_vec();
    secret.resize(key_len, 0);
    let now = input.u64();
    let player = input.u64();
    let expires_at = input.u64();
    let flip = input.u8();
    let candidate = input.rest();

    for short in 0..16 {
        assert!(TokenKey::new(secret[..short].to_vec()).is_none(), "a {short}-byte key was taken");
    }
    let key = TokenKey::new(secret.clone()).expect("16 bytes or more make a key");
    let mut other_secret = secret.clone();
    other_secret[usize::from(flip) % key_len] ^= 0x5a;
    let other = TokenKey::new(other_secret).expect("same length");

    check_candidate(&key, &other, candidate, now);
    check_round_trip(&key, &other, player, expires_at, now, flip);
}

/// Whatever `verify` says about a candidate must be what its bytes deserve.
fn check_candidate(key: &TokenKey, other: &TokenKey, candidate: &[u8], now: u64) {
    let verdict = key.verify(candidate, now);
    if candidate.len() != TOKEN_LEN || candidate[0] != VERSION {
        assert_eq!(verdict, Err(TokenError::Malformed), "a token of the wrong shape");
        return;
    }
    let player = u64::from_le_bytes(candidate[1..9].try_into().expect("8 bytes"));
    let expires_at = u64::from_le_bytes(candidate[9..BODY_LEN].try_into().expect("8 bytes"));
    let genuine = key.mint(player, expires_at) == candidate;
    let expected = match (genuine, now > expires_at) {
        (false, _) => Err(TokenError::BadSignature),
        (true, true) => Err(TokenError::Expired),
        (true, false) => Ok(player),
    };
    assert_eq!(verdict, expected, "verify judged a candidate wrongly");
    if genuine {
        assert_eq!(other.verify(candidate, now), Err(TokenError::BadSignature), "another key");
    }
}

fn check_round_trip(
    key: &TokenKey,
    other: &TokenKey,
    player: u64,
    expires_at: u64,
    now: u64,
    flip: u8,
) {
    let token = key.mint(player, expires_at);
    assert_eq!(token.len(), TOKEN_LEN);
    assert_eq!(token[0], VERSION);
    let expected = if now > expires_at { Err(TokenError::Expired) } else { Ok(player) };
    assert_eq!(key.verify(&token, now), expected, "mint then verify");
    assert_eq!(key.verify(&token, expires_at), Ok(player), "valid at its expiry second");
    if let Some(after) = expires_at.checked_add(1) {
        assert_eq!(key.verify(&token, after), Err(TokenError::Expired), "expired just after");
    }
    assert_eq!(other.verify(&token, 0), Err(TokenError::BadSignature), "another key");

    let mut changed = token.clone();
    let at = usize::from(flip) % TOKEN_LEN;
    changed[at] ^= 1 << (flip % 8);
    let refused = if at == 0 { TokenError::Malformed } else { TokenError::BadSignature };
    assert_eq!(key.verify(&changed, 0), Err(refused), "byte {at} changed");
    assert_eq!(key.verify(&token[..TOKEN_LEN - 1], 0), Err(TokenError::Malformed), "cut short");
    let mut longer = token.clone();
    longer.push(flip);
    assert_eq!(key.verify(&longer, 0), Err(TokenError::Malformed), "one byte too many");
}
