//! A rotation of the cluster's resume-token key keeps the previous key's tokens working
//! until the previous key is dropped.

use anyhow::{ensure, Context};
use meridian_testkit::pb::{server_message::Kind as S, ErrorCode};
use meridian_testkit::{deadline, msg, Bot, ClusterOptions, Front, DEFAULT_WAIT};

use crate::failover::{key_of, KEY_HEX};
use crate::with_cluster;

/// The key a rotation replaces ([`KEY_HEX`] is the new one).
const OLD_KEY_HEX: &str = "01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d01d0";

/// A token issued before a key rotation: signed with the old key, for the player and the
/// nonce the cluster holds (read from the token it issued with the new one), as a client
/// that logged in before the rotation would hold. Every node of a cluster started with
/// `--resume-key-previous OLD` takes it; one started without, no longer.
pub fn resume_tokens_of_the_previous_key_work_during_a_rotation_only(io: Front) {
    for (previous, works) in [(Some(OLD_KEY_HEX), true), (None, false)] {
        let mut opts = ClusterOptions::new(io).arg("--resume-key").arg(KEY_HEX);
        if let Some(old) = previous {
            opts = opts.arg("--resume-key-previous").arg(old);
        }
        with_cluster(opts, |cluster| {
            let mut alice = Bot::connect(cluster.client_addr(0))?;
            let alice_id = alice.login("alice", Some((50, 50)))?.player_id();
            let issued = meridian_protocol::TokenKeys::from(key_of(KEY_HEX))
                .verify(alice.resume_token())
                .context("the cluster signs with --resume-key")?;
            let before_rotation = key_of(OLD_KEY_HEX).mint(alice_id, issued.nonce);
            alice.disconnect();

            let mut back = Bot::connect(cluster.client_addr(0))?;
            back.send(&msg::resume(&before_rotation))?;
            let first = back.recv(deadline(DEFAULT_WAIT))?;
            match (&first.kind, works) {
                (Some(S::ViewReset(reset)), true) => {
                    ensure!(reset.player_id == alice_id, "ViewReset for someone else: {reset:?}");
                }
                (Some(S::Error(e)), false) if e.code == ErrorCode::InvalidToken as i32 => {}
                (other, _) => anyhow::bail!(
                    "with --resume-key-previous {previous:?}: expected {}, got {other:?}",
                    if works { "ViewReset" } else { "INVALID_TOKEN" }
                ),
            }
            Ok(())
        });
    }
}
