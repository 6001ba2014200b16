//! Scenario 8: names and chat with control characters or bidirectional formatting
//! characters ("Trojan Source") are refused with INVALID_ARGUMENT; the connection stays
//! open and nobody ever sees them. Names that would render like another player's (zero-width
//! and invisible characters, blank fillers, line separators, homoglyphs of another script,
//! stray spaces) are refused the same way, and a name sent in fullwidth letters is shown
//! normalised (issue 31, item 8).

use anyhow::{ensure, Context};
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{msg, Bot, Bystander, ClusterOptions, Front};

use crate::{with_cluster, BYSTANDER_HOME};

const BAD_NAMES: [&str; 6] =
    ["ann\u{202E}", "\u{202E}nna", "bell\u{7}", "new\nline", "iso\u{2066}late", "c1\u{85}"];

const BAD_CHATS: [&str; 9] = [
    "hi\u{7}",
    "\u{202E}txt.exe",
    "line\nbreak",
    "x\u{2067}y\u{2069}",
    "mark\u{200F}",
    "del\u{7F}",
    "\u{1B}[2Jcleared",
    "gg\u{2028}[server] ann was banned",
    "para\u{2029}graph",
];

/// Names that render as "ann" (or nearly) without being "ann".
const IMPERSONATIONS: [&str; 14] = [
    "an\u{200B}n",
    "a\u{200C}nn",
    "ann\u{200D}",
    "an\u{2060}n",
    "\u{FEFF}ann",
    "an\u{AD}n",
    "ann\u{2028}",
    "ann\u{2029}",
    "ann\u{3164}",
    "\u{FFA0}ann",
    "\u{430}nn",
    "\u{3B1}nn",
    "ann ",
    "a\u{2800}nn",
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

pub fn impersonating_names(front: Front) {
    with_cluster(ClusterOptions::new(front), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((150, 150)))?;
        let mut ann = Bot::connect(addr)?;
        ann.login("ann", Some((151, 150)))?;
        let entered = meridian_protocol::server::entered(ann.id(), 151, 150, "ann");
        observer.expect_messages(&[entered])?;

        let mut impostor = Bot::connect(addr)?;
        for name in IMPERSONATIONS {
            impostor.send(&msg::login(name, Some((152, 150))))?;
            impostor
                .expect_error(ErrorCode::InvalidArgument, 0)
                .with_context(|| format!("Login as {name:?}"))?;
            impostor.expect_quiet().with_context(|| format!("still open after Login {name:?}"))?;
        }
        observer.expect_quiet().context("no look-alike of ann enters the observer's view")?;
        ann.expect_quiet().context("ann is neither replaced nor joined by a look-alike")?;

        // Fullwidth letters are taken, and shown as the letters they stand for: the view
        // holds "BOB", never "ＢＯＢ" beside a "BOB".
        let login = impostor.login("ＢＯＢ", Some((152, 150)))?;
        ensure!(login.entered_ids() == [observer.id(), ann.id()].into(), "{login:?}");
        let entered = meridian_protocol::server::entered(impostor.id(), 152, 150, "BOB");
        observer.expect_messages(&[entered])?;
        impostor.chat("ann\u{2028}[server] ann was banned")?;
        impostor.expect_error(ErrorCode::InvalidArgument, 0).context("a chat with U+2028")?;
        observer.expect_quiet().context("the observer's view is observer, ann and BOB")?;
        impostor.move_ok(meridian_testkit::pb::Direction::Up, 1)?;
        bystander.finish()?;
        Ok(())
    })
}
