//! Scenario 8: names and chat with control characters or bidirectional formatting
//! characters ("Trojan Source") are refused with INVALID_ARGUMENT; the connection stays
//! open and nobody ever sees them.

use anyhow::{ensure, Context};
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{msg, Bot, Bystander, ClusterOptions, Front};

use crate::{with_cluster, BYSTANDER_HOME};

const BAD_NAMES: [&str; 6] =
    ["ann\u{202E}", "\u{202E}nna", "bell\u{7}", "new\nline", "iso\u{2066}late", "c1\u{85}"];

const BAD_CHATS: [&str; 7] = [
    "hi\u{7}",
    "\u{202E}txt.exe",
    "line\nbreak",
    "x\u{2067}y\u{2069}",
    "mark\u{200F}",
    "del\u{7F}",
    "\u{1B}[2Jcleared",
];

pub fn control_characters(front: Front) {
    with_cluster(ClusterOptions::new(front), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((150, 150)))?;

        let mut speaker = Bot::connect(addr)?;
        for name in BAD_NAMES {
            speaker.send(&msg::login(name, Some((152, 150))))?;
            speaker
                .expect_error(ErrorCode::InvalidArgument, 0)
                .with_context(|| format!("Login as {name:?}"))?;
            speaker.expect_quiet().with_context(|| format!("still open after Login {name:?}"))?;
        }
        observer.expect_quiet().context("no refused name ever enters the observer's view")?;

        let login = speaker.login("ann", Some((152, 150)))?;
        ensure!(login.entered_ids() == [observer.id()].into(), "ann sees the observer: {login:?}");
        let entered = meridian_protocol::server::entered(speaker.id(), 152, 150, "ann");
        observer.expect_messages(&[entered])?;

        for text in BAD_CHATS {
            speaker.chat(text)?;
            speaker
                .expect_error(ErrorCode::InvalidArgument, 0)
                .with_context(|| format!("Chat {text:?}"))?;
        }
        speaker.expect_quiet().context("still open after the refused chats")?;
        observer.expect_quiet().context("the observer hears none of the refused chats")?;

        // Text that only looks foreign is fine: right-to-left scripts, accents, emoji.
        let fine = "שלום, مرحبا, Zoë 👋";
        speaker.chat(fine)?;
        let chat = meridian_protocol::server::chat(speaker.id(), fine);
        speaker.expect_messages(std::slice::from_ref(&chat))?;
        observer.expect_messages(&[chat])?;
        speaker.move_ok(meridian_testkit::pb::Direction::Up, 1)?;
        bystander.finish()?;
        Ok(())
    })
}
