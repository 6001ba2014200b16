//! Gateway death: clients reconnect to another gateway with their resume token and get
//! their player back at its last acknowledged position; forged and spent tokens are
//! refused; a resume while the old connection lives closes the old one.

use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_protocol::TokenKey;
use meridian_testkit::pb::{server_message::Kind as S, Direction, ErrorCode};
use meridian_testkit::{deadline, msg, Bot, ClusterOptions, Front, DEFAULT_WAIT};

use crate::with_cluster;

/// The resume-token key the cluster is started with, so the test can mint its own tokens.
pub(crate) const KEY_HEX: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

fn key() -> TokenKey {
    key_of(KEY_HEX)
}

pub(crate) fn is_left(message: &meridian_testkit::pb::ServerMessage, id: u64) -> bool {
    matches!(&message.kind, Some(S::Left(left)) if left.player_id == id)
}

pub(crate) fn is_entered(message: &meridian_testkit::pb::ServerMessage, id: u64) -> bool {
    matches!(&message.kind, Some(S::Entered(e)) if e.player_id == id)
}

fn expect_error(bot: &mut Bot, code: ErrorCode) -> anyhow::Result<()> {
    let got = bot.recv(deadline(DEFAULT_WAIT))?;
    ensure!(
        matches!(&got.kind, Some(S::Error(e)) if e.code == code as i32),
        "expected {code:?}, got {got:?}"
    );
    Ok(())
}

pub fn gateway_death_and_resume(io: Front) {
    let opts = ClusterOptions::new(io).gateways(2).arg("--resume-key").arg(KEY_HEX);
    with_cluster(opts, |cluster| {
        let mut alice = Bot::connect(cluster.client_addr(0))?;
        let alice_id = alice.login("alice", Some((50, 50)))?.player_id();
        let mut olga = Bot::connect(cluster.client_addr(1))?;
        olga.login("olga", Some((55, 50)))?;
        alice.ping_barrier()?;
        alice.move_ok(Direction::Right, 7)?;
        let token = alice.resume_token().to_vec();
        ensure!(!token.is_empty(), "LoginOk carried no resume token");

        // The gateway alice is on dies.
        let pid = cluster.gateway(0).pid;
        // SAFETY: signalling a process this test's cluster started, by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        olga.recv_until(deadline(Duration::from_millis(1500)), "alice's Left", |m| {
            is_left(m, alice_id)
        })?;
        drop(alice);

        // Forged tokens, and a genuine one the cluster did not issue last, are refused; the
        // connection stays usable.
        let mut mallory = Bot::connect(cluster.client_addr(1))?;
        let mut forged = token.clone();
        forged[3] ^= 0x40;
        mallory.send(&msg::resume(&forged))?;
        expect_error(&mut mallory, ErrorCode::InvalidToken)?;
        mallory.send(&msg::resume(&key().mint(alice_id, 1)))?;
        expect_error(&mut mallory, ErrorCode::InvalidToken)?;
        mallory.ping_barrier()?;

        // The real one brings alice back where she was acknowledged last, on gateway 2.
        let mut back = Bot::connect(cluster.client_addr(1))?;
        back.send(&msg::resume(&token))?;
        let first = back.recv(deadline(DEFAULT_WAIT))?;
        match &first.kind {
            Some(S::ViewReset(reset)) => {
                ensure!(reset.player_id == alice_id, "ViewReset for someone else: {reset:?}");
                let at = reset.position.context("position")?;
                ensure!((at.x, at.y) == (51, 50), "resumed at {at:?}, not the last ack (51, 50)");
            }
            other => anyhow::bail!("expected ViewReset first, got {other:?}"),
        }
        back.recv_until(deadline(DEFAULT_WAIT), "Entered of olga after ViewReset", |m| {
            matches!(&m.kind, Some(S::Entered(_)))
        })?;
        olga.recv_until(deadline(DEFAULT_WAIT), "alice's Entered again", |m| {
            is_entered(m, alice_id)
        })?;
        back.move_ok(Direction::Right, 8)?;

        // A token is good once: the one alice resumed with is refused now...
        let mut again = Bot::connect(cluster.client_addr(1))?;
        again.send(&msg::resume(&token))?;
        expect_error(&mut again, ErrorCode::InvalidToken)?;
        back.move_ok(Direction::Left, 9)?;
        // ...and the fresh one her ViewReset carried works. Resuming while that connection
        // lives closes it: never two alices.
        let fresh = back.resume_token().to_vec();
        ensure!(fresh != token, "the ViewReset carried no fresh token");
        again.send(&msg::resume(&fresh))?;
        again.recv_until(deadline(DEFAULT_WAIT), "ViewReset of the second resume", |m| {
            matches!(&m.kind, Some(S::ViewReset(_)))
        })?;
        back.expect_closed(deadline(DEFAULT_WAIT))?;
        again.move_ok(Direction::Right, 10)?;
        Ok(())
    })
}

pub(crate) fn key_of(hex: &str) -> TokenKey {
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    TokenKey::new(bytes).expect("long enough")
}
