//! Scenario 11: a player that reconnects over and over to get fresh chat budgets (issue 31
//! item 3: 299 resumes in 10 s gave one player 149 chats/s). It hops between two gateways,
//! half the time dropping its connection before it resumes on the other, half the time
//! resuming there while the old one is still open (the shard takes the player over), and
//! spends its whole burst on every connection. A listener in its sight counts what it
//! hears: no more than one connection's budget (2/s, burst 5) would allow.

use std::time::Instant;

use anyhow::ensure;
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{deadline, msg, Bot, Bystander, ClusterOptions, Io, DEFAULT_WAIT};

use crate::with_cluster;
use crate::BYSTANDER_HOME;

/// Connections the hopper goes through.
const HOPS: usize = 16;
/// The default chat limit (DESIGN.md section 2b).
const CHAT_BURST: f64 = 5.0;
const CHAT_RATE: f64 = 2.0;

pub fn reconnecting_buys_no_chats() {
    let opts = ClusterOptions::new(Io::Uring).shards(1).gateways(2);
    with_cluster(opts, |cluster| {
        let gateways = [cluster.game_addr(0), cluster.game_addr(1)];
        let bystander = Bystander::start(gateways[0], "bystander", BYSTANDER_HOME)?;
        let mut listener = Bot::connect(gateways[1])?;
        listener.login("listener", Some((100, 105)))?;
        let mut hopper = Bot::connect(gateways[0])?;
        let login = hopper.login("hopper", Some((100, 100)))?;
        ensure!(login.entered_ids().contains(&listener.id()), "the hopper sees the listener");
        let hopper_id = hopper.id();
        let started = Instant::now();
        let (mut sent, mut refused) = (0, 0);
        for hop in 0..HOPS {
            for n in 0..CHAT_BURST as usize {
                hopper.chat(&format!("hop {hop} chat {n}"))?;
                sent += 1;
            }
            // Every chat answered (its echo, or RATE_LIMITED) before the next connection.
            for message in hopper.ping_barrier()? {
                if let Some(S::Error(error)) = &message.kind {
                    ensure!(error.code == ErrorCode::RateLimited as i32, "{message:?}");
                    refused += 1;
                }
            }
            let token = hopper.resume_token().to_vec();
            let old = if hop % 2 == 0 {
                hopper.disconnect();
                None
            } else {
                Some(hopper)
            };
            let mut next = Bot::connect(gateways[(hop + 1) % 2])?;
            next.send(&msg::resume(&token))?;
            next.recv_until(deadline(DEFAULT_WAIT), "the ViewReset of a resume", |m| {
                matches!(m.kind, Some(S::ViewReset(_)))
            })?;
            if let Some(mut old) = old {
                // Taken over: the old connection is closed by the gateway.
                old.expect_closed(deadline(DEFAULT_WAIT))?;
            }
            hopper = next;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let heard = listener
            .ping_barrier()?
            .iter()
            .filter(|m| matches!(&m.kind, Some(S::Chat(chat)) if chat.player_id == hopper_id))
            .count();
        let allowed = CHAT_BURST + CHAT_RATE * elapsed + 1.0;
        eprintln!(
            "{HOPS} connections in {elapsed:.2} s: {sent} chats sent, {refused} refused, \
             {heard} heard (at most {allowed:.1} allowed)"
        );
        ensure!(
            heard as f64 <= allowed,
            "the listener heard {heard} chats in {elapsed:.2} s over {HOPS} connections; one \
             player's budget allows {allowed:.1}"
        );
        ensure!(refused + heard == sent, "every chat is heard or refused");
        hopper.move_ok(meridian_testkit::pb::Direction::Up, 1)?;
        bystander.finish()?;
        Ok(())
    })
}
