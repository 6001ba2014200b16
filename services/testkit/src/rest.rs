//! Bringing a run to rest and checking it: ping barriers on every bot until nothing more
//! arrives, then every view compared with the truth.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::bot::Bot;
use crate::fleet::{check_own_chats, Player};
use crate::truth::{summarize, Truth};
use crate::wait::{deadline, DEFAULT_WAIT};

/// A ping barrier on many bots at once: a Ping to each, then each one's Pong. Returns how
/// many other messages arrived before the Pongs.
pub fn ping_all<'a>(
    bots: impl IntoIterator<Item = &'a mut Bot>,
    within: Duration,
) -> anyhow::Result<usize> {
    let mut pending = Vec::new();
    for bot in bots {
        let t = bot.send_ping()?;
        pending.push((bot, t));
    }
    let by = deadline(within);
    let mut received = 0;
    for (bot, t) in pending {
        received += bot.recv_pong(t, by)?.len();
    }
    Ok(received)
}

/// The truth of a run: every player at the position its own acks put it.
pub fn truth_of(players: &[Player], view_range: u32) -> Truth {
    let mut truth = Truth::new(view_range);
    for p in players {
        truth.add(p.id(), &p.name, p.position());
    }
    truth
}

/// Brings the world to rest and checks it: ping barriers on every bot, round after round,
/// until every view equals the truth (everyone else within sight, at their real positions,
/// under their names) and a whole round brings nothing new; then each bot's end-of-stream
/// rules and its own chats. Cross-shard notifications may trail a barrier, so a round that
/// leaves views wrong is retried until `within` has passed, and then the differences are
/// reported, with the recent messages of a few of the bots concerned.
pub fn settle(players: &mut [Player], view_range: u32, within: Duration) -> anyhow::Result<Truth> {
    let truth = truth_of(players, view_range);
    let by = deadline(within);
    let mut pause = Duration::from_millis(10);
    loop {
        let received = ping_all(players.iter_mut().map(|p| &mut p.bot), DEFAULT_WAIT)?;
        let differences: Vec<(String, Vec<String>)> = players
            .iter()
            .map(|p| (p.name.clone(), truth.view_diff(p.id(), p.bot.view().others())))
            .filter(|(_, lines)| !lines.is_empty())
            .collect();
        if differences.is_empty() && received == 0 {
            break;
        }
        if Instant::now() >= by {
            let mut text = format!(
                "{} of {} views still differ from the truth {:.1} s after the last move \
                 (the last barrier round brought {received} messages):{}",
                differences.len(),
                players.len(),
                within.as_secs_f64(),
                summarize(&differences, 40)
            );
            for (name, _) in differences.iter().take(3) {
                if let Some(p) = players.iter().find(|p| &p.name == name) {
                    text.push_str(&format!("\n{:#}", p.bot.report("its view differs")));
                }
            }
            bail!(text);
        }
        if received == 0 {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
    let ids = truth.ids();
    for p in players.iter() {
        if let Some(check) = p.bot.stream_check() {
            check.check_final(&ids).map_err(|e| p.bot.report(&format!("{e:#}")))?;
        }
        check_own_chats(&p.bot, &p.chats_sent)?;
    }
    Ok(truth)
}
