//! A connection that resumes and closes at once leaves no frozen player behind (TCP only:
//! over QUIC a close right after a write may discard the write, so the race cannot be set
//! up there).

use std::time::Duration;

use meridian_testkit::pb::{server_message::Kind as S, Direction};
use meridian_testkit::{deadline, msg, Bot, ClusterOptions, Front, DEFAULT_WAIT};

use crate::failover::{is_entered, is_left, KEY_HEX};
use crate::with_cluster;

/// A connection that sends Resume and closes before any answer: the shard that restored the
/// player on it must let it go again (parked for the resume window), or the player would
/// stand frozen in the world, seen by everyone, until the next resume.
pub fn resume_on_a_connection_that_closes_at_once(io: Front) {
    let opts = ClusterOptions::new(io).arg("--resume-key").arg(KEY_HEX);
    with_cluster(opts, |cluster| {
        let mut alice = Bot::connect(cluster.client_addr(0))?;
        let alice_id = alice.login("alice", Some((50, 50)))?.player_id();
        let token = alice.resume_token().to_vec();
        let mut olga = Bot::connect(cluster.client_addr(0))?;
        olga.login("olga", Some((55, 50)))?;
        alice.disconnect();
        olga.recv_until(deadline(DEFAULT_WAIT), "alice's Left", |m| is_left(m, alice_id))?;

        let mut brief = Bot::connect(cluster.client_addr(0))?;
        brief.send(&msg::resume(&token))?;
        brief.disconnect();
        olga.recv_until(deadline(DEFAULT_WAIT), "alice restored on the brief connection", |m| {
            is_entered(m, alice_id)
        })?;
        olga.recv_until(deadline(Duration::from_secs(2)), "alice's Left again", |m| {
            is_left(m, alice_id)
        })?;

        // Parked, not gone: the token still brings her back.
        let mut back = Bot::connect(cluster.client_addr(0))?;
        back.send(&msg::resume(&token))?;
        back.recv_until(deadline(DEFAULT_WAIT), "ViewReset", |m| {
            matches!(&m.kind, Some(S::ViewReset(_)))
        })?;
        olga.recv_until(deadline(DEFAULT_WAIT), "alice back", |m| is_entered(m, alice_id))?;
        back.move_ok(Direction::Right, 1)?;
        Ok(())
    })
}
