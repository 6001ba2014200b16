//! Target `resume_token`: `TokenKeys::mint` and `TokenKeys::verify` of `meridian-protocol`.
//!
//! Input: `key length (1) | key | player (8) | nonce (8) | flip (1) | candidate`. The key is
//! `16 + length % 64` bytes (zero-padded past the end of the input); integers are
//! little-endian; `candidate` (the rest) is handed to `verify` as a client would.
//!
//! Properties:
//! - `verify` never panics, whatever the bytes;
//! - it accepts a candidate only if the candidate is exactly what `mint` makes with one of
//!   the accepted keys for the player and nonce it carries; its error says which check
//!   failed (length/version, key id, signature), and a set without that key never
//!   accepts it;
//! - `mint` then `verify` round-trips, also through a set that has the key as its
//!   previous one (a rotation); a token with any one byte changed, or cut short, is
//!   refused.

use meridian_protocol::{Token, TokenError, TokenKey, TokenKeys, TOKEN_LEN};

use crate::Cursor;

/// Where the fields sit in a token (see `services/protocol/src/token.rs`).
const VERSION: u8 = 2;
const KEY_ID: std::ops::Range<usize> = 1..5;
const PLAYER: std::ops::Range<usize> = 5..13;
const NONCE: std::ops::Range<usize> = 13..21;

pub fn check(data: &[u8]) {
    let mut input = Cursor::new(data);
    let key_len = 16 + usize::from(input.u8() % 64);
    let mut secret = input.bytes(key_len).to_vec();
    secret.resize(key_len, 0);
    let player = input.u64();
    let nonce = input.u64();
    let flip = input.u8();
    let candidate = input.rest();

    for short in 0..16 {
        assert!(TokenKey::new(secret[..short].to_vec()).is_none(), "a {short}-byte key was taken");
    }
    let key = TokenKey::new(secret.clone()).expect("16 bytes or more make a key");
    let mut other_secret = secret.clone();
    other_secret[usize::from(flip) % key_len] ^= 0x5a;
    let other = TokenKey::new(other_secret).expect("same length");

    check_candidate(&key, &other, candidate);
    check_round_trip(&key, &other, player, nonce, flip);
}

fn field(candidate: &[u8], at: std::ops::Range<usize>) -> u64 {
    u64::from_le_bytes(candidate[at].try_into().expect("8 bytes"))
}

/// Whatever `verify` says about a candidate must be what its bytes deserve.
fn check_candidate(key: &TokenKey, other: &TokenKey, candidate: &[u8]) {
    let keys = TokenKeys::from(key.clone());
    let verdict = keys.verify(candidate);
    if candidate.len() != TOKEN_LEN || candidate[0] != VERSION {
        assert_eq!(verdict, Err(TokenError::Malformed), "a token of the wrong shape");
        return;
    }
    let (player, nonce) = (field(candidate, PLAYER), field(candidate, NONCE));
    let ours = key.mint(player, nonce);
    let expected = if candidate[KEY_ID] != ours[KEY_ID] {
        Err(TokenError::UnknownKey)
    } else if ours != candidate {
        Err(TokenError::BadSignature)
    } else {
        Ok(Token { player_id: player, nonce })
    };
    assert_eq!(verdict, expected, "verify judged a candidate wrongly");
    if expected.is_ok() && other.mint(player, nonce)[KEY_ID] != ours[KEY_ID] {
        let others = TokenKeys::from(other.clone());
        assert_eq!(others.verify(candidate), Err(TokenError::UnknownKey), "another key");
    }
}

fn check_round_trip(key: &TokenKey, other: &TokenKey, player: u64, nonce: u64, flip: u8) {
    let keys = TokenKeys::from(key.clone());
    let token = keys.mint(player, nonce);
    assert_eq!(token.len(), TOKEN_LEN);
    assert_eq!(token[0], VERSION);
    let said = Ok(Token { player_id: player, nonce });
    assert_eq!(keys.verify(&token), said, "mint then verify");
    let rotating = TokenKeys::new(other.clone(), vec![key.clone()]);
    assert_eq!(rotating.verify(&token), said, "the previous key of a rotation");
    let rotated = TokenKeys::from(other.clone());
    if other.id() != key.id() {
        assert_eq!(rotated.verify(&token), Err(TokenError::UnknownKey), "after the rotation");
    }

    let mut changed = token.clone();
    let at = usize::from(flip) % TOKEN_LEN;
    changed[at] ^= 1 << (flip % 8);
    let refused = match at {
        0 => TokenError::Malformed,
        _ if KEY_ID.contains(&at) => TokenError::UnknownKey,
        _ => TokenError::BadSignature,
    };
    assert_eq!(keys.verify(&changed), Err(refused), "byte {at} changed");
    assert_eq!(keys.verify(&token[..TOKEN_LEN - 1]), Err(TokenError::Malformed), "cut short");
    let mut longer = token.clone();
    longer.push(flip);
    assert_eq!(keys.verify(&longer), Err(TokenError::Malformed), "one byte too many");
}
