//! A QUIC client that stops reading is cut off once its output queue passes the gateway's
//! bound, exactly like a slow TCP client; its player leaves, and nobody else slows down.

use anyhow::{bail, ensure};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::quic::QuicOptions;
use meridian_testkit::{
    deadline, metric_total, msg, Bot, Bystander, ClusterOptions, Io, DEFAULT_WAIT,
};

use crate::{entered, with_cluster, BYSTANDER_HOME};

/// Chats sent per round; the speaker reads its own echoes between rounds.
const ROUND: usize = 64;
/// With 256-byte chats, 1 MiB of output (the gateway's default bound) is ~4,000 chats.
const MAX_CHATS: usize = 12_000;

#[test]
fn a_quic_client_that_stops_reading_is_cut_off() {
    // The speaker's chats are what fills the slow client's queue: the chat and input
    // limits (tested in the abuse target) are lifted so that one speaker can do it.
    let options = ClusterOptions::new(Io::Uring)
        .env("MERIDIAN_CHAT_RATE", "1000000")
        .env("MERIDIAN_CHAT_BURST", "1000000")
        .env("MERIDIAN_INPUT_FRAME_RATE", "1000000")
        .env("MERIDIAN_INPUT_BYTE_RATE", "100000000");
    with_cluster(options, |cluster| {
        let quic = cluster.quic_target(0);
        let bystander = Bystander::start(quic, "bystander", BYSTANDER_HOME)?;
        // A 4 KiB window: the gateway's stream blocks almost at once, so what the client
        // does not read piles up in the gateway's bounded output queue.
        let small = QuicOptions { receive_window: Some(4096), ..Default::default() };
        let mut slow = Bot::connect_with(quic, &small)?;
        slow.login("slow", Some((100, 100)))?;
        let mut speaker = Bot::connect(cluster.game_addr(0))?;
        let login = speaker.login("speaker", Some((101, 100)))?;
        ensure!(login.entered_ids() == [slow.id()].into(), "speaker sees slow: {login:?}");
        let slow_id = slow.id();
        let text = "x".repeat(256);
        let chats: Vec<_> = (0..ROUND).map(|_| msg::chat(&text)).collect();
        let mut sent = 0;
        let mut cut = false;
        while !cut {
            if sent >= MAX_CHATS {
                bail!("slow is still connected after {sent} chats of 256 bytes");
            }
            speaker.send_all(&chats)?;
            sent += ROUND;
            let mut echoes = 0;
            while echoes < ROUND {
                match speaker.recv(deadline(DEFAULT_WAIT))?.kind {
                    Some(S::Chat(_)) => echoes += 1,
                    Some(S::Left(left)) if left.player_id == slow_id => cut = true,
                    other => bail!("speaker got {other:?} while chatting"),
                }
            }
        }
        eprintln!("slow QUIC client cut off after {sent} chats (~{} KiB)", sent * 260 / 1024);
        let admin = cluster.gateway(0).admin;
        let cuts = metric_total(admin, "meridian_gateway_slow_clients_cut_total")?;
        ensure!(cuts >= 1.0, "the gateway counted {cuts} slow clients cut");
        // The slow client finds its connection closed once it reads again.
        slow.expect_closed(deadline(DEFAULT_WAIT))?;
        bystander.wait_for_acks(3)?;
        // The speaker plays on; a newcomer sees it and not the departed.
        let mut late = Bot::connect(quic)?;
        let login = late.login("late", Some((102, 100)))?;
        ensure!(login.entered_ids() == [speaker.id()].into(), "late: {login:?}");
        speaker.expect_messages(&[entered(&late, 102, 100)])?;
        bystander.finish()?;
        Ok(())
    })
}
