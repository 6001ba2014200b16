//! Scenario 1: a logged-in player writes 4,000 chats (~1 MB) in one go while two players
//! stand in its sight. The chat limit (2/s, burst 5) answers the excess with RATE_LIMITED,
//! the input budget stops the gateway reading the rest, and the watchers get no more than
//! the limit allows, keep playing and are never cut.

use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::abuse::{
    cpu_used_over, metric_value, rss_bytes, sample_value, scrape, RawClient, RawRead,
};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::{Direction, ErrorCode, ServerMessage};
use meridian_testkit::{
    deadline, msg, wait_until, Bot, Bystander, ClusterOptions, Front, DEFAULT_WAIT,
};

use crate::common::with_cluster_alone;
use crate::BYSTANDER_HOME;

const FLOOD_CHATS: usize = 4_000;
/// How long the watchers play under the flood.
const WATCH_FOR: Duration = Duration::from_secs(3);
/// The default chat limit (DESIGN.md section 2b).
const CHAT_BURST: f64 = 5.0;
const CHAT_RATE: f64 = 2.0;
const MOST_RSS_GROWTH: u64 = 64 << 20;
/// CPU a quiet gateway may use over 2 s (its 250 ms tick costs next to nothing).
const MOST_IDLE_CPU: Duration = Duration::from_millis(400);

/// Chat `i` of the flood: numbered, padded to 250 bytes.
fn flood_text(i: usize) -> String {
    let mut text = format!("flood {i:04} ");
    text.extend(std::iter::repeat_n('x', 250 - text.len()));
    text
}

/// The flood's number of a chat text, if it is one.
fn flood_index(text: &str) -> Option<usize> {
    text.strip_prefix("flood ")?.get(..4)?.parse().ok()
}

/// What the flooder read back.
#[derive(Debug, Default)]
struct FlooderAnswers {
    rate_limited: usize,
    chat_limited: usize,
    other_errors: Vec<ServerMessage>,
    echoes: Vec<usize>,
    closed_by_gateway: bool,
}

pub fn chat_flood(front: Front) {
    with_cluster_alone(ClusterOptions::new(front), |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut flooder = RawClient::connect(addr)?;
        let (ok, _) = flooder.login("flooder", Some((100, 100)))?;
        let flooder_id = ok.player_id;
        let mut watchers = [Bot::connect(addr)?, Bot::connect(addr)?];
        watchers[0].login("watcher-a", Some((105, 100)))?;
        let login = watchers[1].login("watcher-b", Some((100, 105)))?;
        ensure!(login.entered_ids().contains(&flooder_id), "watcher-b sees the flooder: {login:?}");
        watchers[0].ping_barrier()?;
        ensure!(watchers[0].view().sees(flooder_id), "watcher-a sees the flooder");

        let pid = cluster.gateway(0).pid;
        let rss_before = rss_bytes(pid)?;
        let before = scrape(admin)?;
        let cuts_before = sample_value(&before, "meridian_gateway_slow_clients_cut_total", &[])?;
        let limited_before =
            sample_value(&before, "meridian_gateway_rate_limited_total", &[("kind", "chat")])?;

        let wire: Vec<u8> =
            (0..FLOOD_CHATS).flat_map(|i| msg::frame(&msg::chat(&flood_text(i)))).collect();
        let flood_bytes = wire.len();
        let mut writer_stream = flooder.try_clone_stream()?;
        writer_stream.set_write_timeout(Some(Duration::from_secs(15)))?;
        let closer = flooder.try_clone_stream()?;
        let started = Instant::now();
        let writer = thread::spawn(move || {
            let result = writer_stream.write_all(&wire);
            (result.map_err(|e| e.to_string()), started.elapsed())
        });
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || -> anyhow::Result<FlooderAnswers> {
                let mut answers = FlooderAnswers::default();
                loop {
                    let read = flooder.read(Instant::now() + Duration::from_millis(100))?;
                    match read {
                        RawRead::Message(message) => match message.kind {
                            Some(S::Error(e))
                                if e.code == ErrorCode::RateLimited as i32
                                    && e.client_time == 0 =>
                            {
                                answers.rate_limited += 1;
                                if e.detail == "chat rate limit" {
                                    answers.chat_limited += 1;
                                }
                            }
                            Some(S::Error(_)) => answers.other_errors.push(message),
                            Some(S::Chat(chat)) => {
                                answers.echoes.extend(flood_index(&chat.text));
                            }
                            _ => {}
                        },
                        RawRead::Closed => {
                            answers.closed_by_gateway = !stop.load(Ordering::Relaxed);
                            return Ok(answers);
                        }
                        RawRead::TimedOut if stop.load(Ordering::Relaxed) => return Ok(answers),
                        RawRead::TimedOut => {}
                    }
                }
            })
        };

        // The watchers play on: every move acknowledged, the flooder's chats counted.
        let mut heard: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        let mut flooder_left = [false, false];
        let mut client_time = 0;
        while started.elapsed() < WATCH_FOR {
            client_time += 1;
            let direction = if client_time % 2 == 1 { Direction::Down } else { Direction::Up };
            for (i, watcher) in watchers.iter_mut().enumerate() {
                let answer = watcher.move_(direction, client_time)?;
                answer
                    .ack()
                    .with_context(|| format!("{} moving under the chat flood", watcher.label()))?;
                collect(&answer.others, flooder_id, &mut heard[i], &mut flooder_left[i])?;
            }
            // Paces the watchers' moves (about 6/s, under their move limit): waits for nothing.
            thread::sleep(Duration::from_millis(150));
        }
        for (i, watcher) in watchers.iter_mut().enumerate() {
            let rest = watcher.ping_barrier()?;
            collect(&rest, flooder_id, &mut heard[i], &mut flooder_left[i])?;
        }
        let watched = started.elapsed();

        stop.store(true, Ordering::Relaxed);
        let _ = closer.shutdown(Shutdown::Both);
        let (written, write_took) = writer.join().expect("the writer thread does not panic");
        let answers = reader.join().expect("the reader thread does not panic")?;
        let after = scrape(admin)?;
        let floods_cut = sample_value(&after, "meridian_gateway_input_floods_cut_total", &[])?
            - sample_value(&before, "meridian_gateway_input_floods_cut_total", &[])?;
        eprintln!(
            "chat flood ({front:?}): {flood_bytes} bytes, write {} after {:.1} s; flooder got {} RATE_LIMITED ({} chat limit), {} echoes, closed by the gateway: {} (input floods cut: {floods_cut}); watchers heard {:?} chats in {:.1} s",
            match &written { Ok(()) => "completed".to_string(), Err(e) => format!("failed ({e})") },
            write_took.as_secs_f64(),
            answers.rate_limited,
            answers.chat_limited,
            answers.echoes.len(),
            answers.closed_by_gateway,
            [heard[0].len(), heard[1].len()],
            watched.as_secs_f64(),
        );

        // The flooder: the excess refused with RATE_LIMITED, client_time 0, nothing else.
        ensure!(
            answers.other_errors.is_empty(),
            "the flooder got other errors: {:?}",
            answers.other_errors
        );
        ensure!(
            answers.chat_limited > 0,
            "the flooder got no RATE_LIMITED for its chats: {answers:?}"
        );

        // The watchers: at most the burst plus the rate over the time watched (the bucket was
        // full when the flood began, and a chat is heard after it is accepted), at least the
        // burst, in the order sent, and the same for both.
        let most = (CHAT_BURST + CHAT_RATE * watched.as_secs_f64()).floor() as usize + 1;
        for (i, chats) in heard.iter().enumerate() {
            let name = watchers[i].label();
            ensure!(
                chats.len() <= most,
                "{name} heard {} of the flooder's chats in {:.1} s; the limit allows at most {most}: {chats:?}",
                chats.len(),
                watched.as_secs_f64()
            );
            if !flooder_left[i] {
                ensure!(
                    chats.len() >= CHAT_BURST as usize,
                    "{name} heard less than the burst: {chats:?}"
                );
                ensure!(
                    chats[..5] == [0, 1, 2, 3, 4],
                    "{name}: the burst is the first five chats: {chats:?}"
                );
            }
            ensure!(
                chats.windows(2).all(|w| w[0] < w[1]),
                "{name} heard chats out of order: {chats:?}"
            );
        }
        let shorter = heard[0].len().min(heard[1].len());
        ensure!(
            heard[0][..shorter] == heard[1][..shorter],
            "the watchers heard different chats: {heard:?}"
        );
        ensure!(
            answers.echoes.len() <= most,
            "the flooder's own echoes past the limit: {:?}",
            answers.echoes
        );

        let cuts = sample_value(&after, "meridian_gateway_slow_clients_cut_total", &[])?;
        ensure!(
            cuts == cuts_before,
            "slow clients cut went from {cuts_before} to {cuts}: a watcher was cut"
        );
        let limited =
            sample_value(&after, "meridian_gateway_rate_limited_total", &[("kind", "chat")])?;
        ensure!(
            limited - limited_before >= answers.chat_limited as f64,
            "rate_limited{{kind=\"chat\"}} moved by {} but the flooder read {} chat-limit refusals",
            limited - limited_before,
            answers.chat_limited
        );
        // The flooder is gone (its reading may have been paused with most of the flood still
        // in the kernel): the gateway lets go of it, and of what it had buffered.
        wait_until(deadline(DEFAULT_WAIT), "the gateway to drop the flooder's connection", || {
            metric_value(admin, "meridian_gateway_connections", &[]).is_ok_and(|open| open <= 3.0)
        })?;
        let rss_after = rss_bytes(pid)?;
        ensure!(
            rss_after.saturating_sub(rss_before) < MOST_RSS_GROWTH,
            "the gateway's RSS grew from {rss_before} to {rss_after} bytes"
        );
        let acks = bystander.finish()?;
        ensure!(acks > 10, "the bystander played through the flood ({acks} acks)");
        drop(watchers);
        let idle = cpu_used_over(pid, Duration::from_secs(2))?;
        ensure!(idle < MOST_IDLE_CPU, "the gateway used {idle:?} of CPU in 2 s after the flood");
        Ok(())
    })
}

/// Adds the flooder's chats among `messages` to `heard`; anything but chats, moves and the
/// flooder leaving is an error (nothing else happens near the watchers).
fn collect(
    messages: &[ServerMessage],
    flooder: u64,
    heard: &mut Vec<usize>,
    flooder_left: &mut bool,
) -> anyhow::Result<()> {
    for message in messages {
        match &message.kind {
            Some(S::Chat(chat)) if chat.player_id == flooder => match flood_index(&chat.text) {
                Some(i) => heard.push(i),
                None => bail!("a chat from the flooder that it never sent: {chat:?}"),
            },
            Some(S::Moved(_)) => {}
            Some(S::Left(left)) if left.player_id == flooder => *flooder_left = true,
            _ => bail!("a watcher got {message:?} during the chat flood"),
        }
    }
    Ok(())
}
