//! `meridian token`: a login token for an account, signed with the development key, that a
//! dev-mode gateway's key set accepts and one without the dev key refuses.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use meridian_gateway::accounts::{Account, Keys, TokenError};

#[test]
fn a_dev_token_names_its_account_and_only_dev_mode_takes_it() {
    let output = Command::new(crate::meridian_bin())
        .args(["token", "--sub", "alice", "--name", "Alice", "--ttl", "10m"])
        .output()
        .expect("meridian token runs");
    assert!(output.status.success(), "meridian token: {output:?}");
    let token = String::from_utf8(output.stdout).expect("UTF-8").trim().to_string();
    assert_eq!(token.matches('.').count(), 2, "a JWT: header.claims.signature: {token}");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let dev = Keys::default().with_dev_key();
    let expected = Account { id: "alice".into(), name: Some("Alice".into()) };
    assert_eq!(dev.verify(&token, now), Ok(expected));
    assert_eq!(dev.verify(&token, now + 600 + 3_600), Err(TokenError::Expired));
    assert!(Keys::default().verify(&token, now).is_err(), "outside dev mode: no dev key");
}
