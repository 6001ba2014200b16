//! Scenario 6: a player that never reads, among busy players (four chatters and a mover in
//! its sight). Its output queue passes the gateway's bound and it is cut off; it leaves the
//! world, and the players around it and a bystander far away are not slowed or cut.
//!
//! Chats, not moves, make the output: what a client does not read first fills the
//! gateway's side of its socket (a fixed 128 KiB send buffer) and its own small receive
//! buffer before the gateway's queue grows, and chats fill them in a few thousand where
//! moves would take tens of thousands.
//!
//! Scenario 6b: many such clients at once, with the gateway's side of their sockets read
//! from `/proc/net/tcp`: the kernel holds no more for each than its fixed send buffer
//! (issue 31, item 7).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use meridian_testkit::abuse::{metric_value, RawClient, RawOptions};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::Direction;
use meridian_testkit::{
    deadline, msg, wait_until, Bot, Bystander, ClusterOptions, Front, DEFAULT_WAIT,
};

use crate::common::with_cluster_alone;
use crate::BYSTANDER_HOME;

/// The output bound for this cluster: 256 KiB instead of 1 MiB, so the cut comes sooner.
const MAX_OUTPUT: usize = 256 * 1024;
/// Chats sent per round; a chatter reads its own echoes between rounds.
const ROUND: usize = 64;
/// Around the sluggard at (100, 100), 15 cells off on both axes: each sees it and the
/// mover, none sees another (30 apart).
const CHATTERS_AT: [(u32, u32); 4] = [(85, 85), (115, 85), (85, 115), (115, 115)];
/// How long the chatters may take to get the sluggard cut (about a second here).
const CUT_WITHIN: Duration = Duration::from_secs(15);

/// A cluster whose output bound is [`MAX_OUTPUT`] and whose chatters may chat as fast as
/// the tests need (the default is 2/s) and send that much (the default input budget is
/// 100 frames and 64 KiB a second).
fn chatty_cluster(front: Front) -> ClusterOptions {
    ClusterOptions::new(front)
        .env("MERIDIAN_MAX_OUTPUT", MAX_OUTPUT.to_string())
        .env("MERIDIAN_CHAT_RATE", "100000")
        .env("MERIDIAN_CHAT_BURST", "100000")
        .env("MERIDIAN_INPUT_FRAME_RATE", "100000")
        .env("MERIDIAN_INPUT_BYTE_RATE", "67108864")
}

pub fn never_reading_client(front: Front) {
    let opts = chatty_cluster(front);
    with_cluster_alone(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let cuts_before = metric_value(admin, "meridian_gateway_slow_clients_cut_total", &[])?;
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let small = RawOptions { receive_buffer: Some(4096), ..Default::default() };
        let mut sluggard = RawClient::connect_with(addr, small)?;
        let (ok, _) = sluggard.login("sluggard", Some((100, 100)))?;
        let sluggard_id = ok.player_id;

        // A mover in its sight, on its own thread: every move acknowledged; the chats and
        // the sluggard leaving are all it may hear besides.
        let mut mover = Bot::connect(addr)?;
        mover.login("mover", Some((100, 102)))?;
        let mover_id = mover.id();
        let stop = Arc::new(AtomicBool::new(false));
        let moved = Arc::new(AtomicU64::new(0));
        let mover = {
            let (stop, moved) = (Arc::clone(&stop), Arc::clone(&moved));
            thread::spawn(move || -> anyhow::Result<(u64, Bot)> {
                let mut t = 0;
                while !stop.load(Ordering::Relaxed) {
                    t += 1;
                    let direction = if t % 2 == 1 { Direction::Right } else { Direction::Left };
                    let answer = mover.move_(direction, t)?;
                    answer.ack()?;
                    let mut heard = answer.others;
                    // Reads on between moves: a player that pauses reading while four others
                    // chat as fast as they can would be cut off too.
                    let next = Instant::now() + Duration::from_millis(60);
                    while let Some(message) = mover.recv_timeout(next)? {
                        heard.push(message);
                    }
                    for message in &heard {
                        match &message.kind {
                            Some(S::Chat(_)) | Some(S::Entered(_)) => {}
                            Some(S::Left(left)) if left.player_id == sluggard_id => {}
                            _ => bail!("the mover got {message:?}"),
                        }
                    }
                    moved.fetch_add(1, Ordering::Relaxed);
                }
                Ok((t, mover))
            })
        };

        let mover_moves = |more: u64, when: &str| {
            let target = moved.load(Ordering::Relaxed) + more;
            wait_until(
                deadline(DEFAULT_WAIT),
                &format!("the mover to move {more} times {when}"),
                || moved.load(Ordering::Relaxed) >= target || mover.is_finished(),
            )
        };
        mover_moves(3, "before the chatters start")?;

        // Chatters around it, each in its sight and in the mover's, none in another's (so
        // each chat goes to three players, not to every chatter). All log in before any
        // chats: two chatters alone can get the sluggard cut before a slow third logs in.
        let mut logged_in = Vec::new();
        let mut chatter_ids = Vec::new();
        for (n, at) in CHATTERS_AT.into_iter().enumerate() {
            let mut chatter = Bot::connect(addr)?;
            let login = chatter.login(&format!("chatter-{n}"), Some(at))?;
            ensure!(
                login.entered_ids().contains(&sluggard_id),
                "chatter-{n} sees the sluggard: {login:?}"
            );
            chatter_ids.push(chatter.id());
            logged_in.push(chatter);
        }
        let cut = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut chatters = Vec::new();
        for chatter in logged_in {
            let (stop, cut) = (Arc::clone(&stop), Arc::clone(&cut));
            chatters.push(thread::spawn(move || {
                chat_until_cut(chatter, sluggard_id, mover_id, &stop, &cut)
            }));
        }
        let waited =
            wait_until(started + CUT_WITHIN, "the gateway to cut the sluggard off", || {
                cut.load(Ordering::Relaxed)
                    || mover.is_finished()
                    || chatters.iter().any(|c| c.is_finished())
            });
        let took = started.elapsed();
        let moved_after = if waited.is_ok() { mover_moves(3, "after the cut") } else { Ok(()) };
        stop.store(true, Ordering::Relaxed);
        // The mover's failure first: a chatter sees the mover leave when it fails.
        let (moves, mut mover) = mover.join().expect("the mover thread does not panic")?;
        let mut sent = 0;
        let mut chatters_back = Vec::new();
        for chatter in chatters {
            let (chats, bot) = chatter.join().expect("a chatter thread does not panic")?;
            sent += chats;
            chatters_back.push(bot);
        }
        waited?;
        moved_after?;
        eprintln!(
            "never-reading client ({front:?}): cut after {:.1} s and {sent} chats (~{} KiB); the mover moved {moves} times",
            took.as_secs_f64(),
            sent * 262 / 1024
        );
        let cuts = metric_value(admin, "meridian_gateway_slow_clients_cut_total", &[])?;
        ensure!(
            cuts - cuts_before == 1.0,
            "slow_clients_cut_total moved by {}",
            cuts - cuts_before
        );
        // Reading at last, it finds the connection closed.
        sluggard.expect_closed(deadline(DEFAULT_WAIT)).map(|_| ())?;

        mover.ping_barrier()?;
        ensure!(!mover.view().sees(sluggard_id), "the sluggard left the mover's view");
        for (chatter, id) in chatters_back.iter_mut().zip(&chatter_ids) {
            ensure!(mover.view().sees(*id), "the mover still sees {}", chatter.label());
            chatter.move_ok(Direction::Up, 1)?;
        }
        bystander.finish()?;
        Ok(())
    })
}

/// Chats in rounds of [`ROUND`], reading its echoes between rounds, until the sluggard
/// leaves (then sets `cut`) or `stop` is set; returns the chats sent and the bot.
fn chat_until_cut(
    mut chatter: Bot,
    sluggard: u64,
    mover: u64,
    stop: &AtomicBool,
    cut: &AtomicBool,
) -> anyhow::Result<(usize, Bot)> {
    let text = "z".repeat(256);
    let chats: Vec<_> = (0..ROUND).map(|_| msg::chat(&text)).collect();
    let own = chatter.id();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) && !cut.load(Ordering::Relaxed) {
        chatter.send_all(&chats)?;
        sent += ROUND;
        let mut echoes = 0;
        while echoes < ROUND {
            let message = chatter.recv(deadline(DEFAULT_WAIT))?;
            match &message.kind {
                Some(S::Chat(chat)) if chat.player_id == own => echoes += 1,
                Some(S::Left(left)) if left.player_id == sluggard => {
                    cut.store(true, Ordering::Relaxed)
                }
                Some(S::Moved(moved)) if moved.player_id == mover => {}
                _ => bail!("{} got {message:?} while chatting", chatter.label()),
            }
        }
    }
    Ok((sent, chatter))
}

/// Non-readers for [`many_never_reading_clients`]: enough that the kernel's default send
/// buffers (up to 4 MiB each) would show, few enough for a small machine.
const NON_READERS: usize = 24;
/// What the kernel may hold for one client socket of the gateway: the fixed `SO_SNDBUF`
/// (64 KiB asked, 128 KiB granted) and a segment's slack.
const KERNEL_SEND_QUEUE_MAX: u64 = 128 * 1024 + 16 * 1024;

/// Issue 31, item 7: clients that never read, within every rate limit, cost the host no
/// kernel memory the gateway does not account for. 24 of them with small receive buffers
/// sit in a chatter's sight; the chatter chats until the gateway cuts every one of them
/// (their output budgets spent). Meanwhile the gateway's side of each of their sockets
/// (`/proc/net/tcp`'s send queue) never holds more than its fixed send buffer: with the
/// kernel's default buffer it reached ~4 MiB per socket before the gateway's own queue
/// grew at all. A bystander far away is not slowed or cut.
pub fn many_never_reading_clients(front: Front) {
    let opts = chatty_cluster(front);
    with_cluster_alone(opts, |cluster| {
        let addr = cluster.game_addr(0);
        let admin = cluster.gateway(0).admin;
        let cuts_before = metric_value(admin, "meridian_gateway_slow_clients_cut_total", &[])?;
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let small = RawOptions { receive_buffer: Some(4096), ..Default::default() };
        let mut non_readers = Vec::new();
        let mut ports = Vec::new();
        for n in 0..NON_READERS {
            let mut client = RawClient::connect_with(addr, small)?;
            // In a 6 x 4 block around the chatter at (100, 100): all in its sight.
            let at = (97 + (n % 6) as u32, 98 + (n / 6) as u32);
            client.login(&format!("sluggard-{n}"), Some(at))?;
            ports.push(client.stream().local_addr()?.port());
            non_readers.push(client);
        }
        let mut chatter = Bot::connect(addr)?;
        chatter.login("chatter", Some((100, 100)))?;
        ensure!(
            chatter.view().others().len() >= NON_READERS,
            "the chatter sees every non-reader: {} of {NON_READERS}",
            chatter.view().others().len()
        );
        let text = "z".repeat(256);
        let chats: Vec<_> = (0..ROUND).map(|_| msg::chat(&text)).collect();
        let own = chatter.id();
        let started = Instant::now();
        let mut most = 0u64;
        let mut sent = 0;
        let mut left = 0;
        while left < NON_READERS {
            ensure!(
                started.elapsed() < CUT_WITHIN,
                "{left} of {NON_READERS} non-readers cut after {sent} chats in {CUT_WITHIN:?}"
            );
            chatter.send_all(&chats)?;
            sent += ROUND;
            let mut echoes = 0;
            while echoes < ROUND {
                let message = chatter.recv(deadline(DEFAULT_WAIT))?;
                match &message.kind {
                    Some(S::Chat(chat)) if chat.player_id == own => echoes += 1,
                    Some(S::Left(_)) => left += 1,
                    _ => bail!("the chatter got {message:?} while chatting"),
                }
            }
            most =
                most.max(gateway_send_queues(addr.port(), &ports)?.into_iter().max().unwrap_or(0));
        }
        let took = started.elapsed();
        eprintln!(
            "{NON_READERS} never-reading clients ({front:?}): all cut after {:.1} s and {sent} chats; \
             the largest kernel send queue on the gateway's side: {most} bytes",
            took.as_secs_f64()
        );
        ensure!(
            most > 0,
            "the gateway's sockets to the non-readers never queued a byte: the probe reads nothing"
        );
        ensure!(
            most <= KERNEL_SEND_QUEUE_MAX,
            "a gateway socket to a non-reader held {most} bytes in the kernel \
             (at most {KERNEL_SEND_QUEUE_MAX} expected: the fixed SO_SNDBUF)"
        );
        let cuts = metric_value(admin, "meridian_gateway_slow_clients_cut_total", &[])?;
        ensure!(
            cuts - cuts_before == NON_READERS as f64,
            "slow_clients_cut_total moved by {}, not {NON_READERS}",
            cuts - cuts_before
        );
        for mut client in non_readers {
            client.expect_closed(deadline(DEFAULT_WAIT)).map(|_| ())?;
        }
        chatter.move_ok(Direction::Up, 1)?;
        bystander.finish()?;
        Ok(())
    })
}

/// The send queues (`tx_queue`, bytes) of the gateway's TCP sockets on `local_port` whose
/// far end is one of `remote_ports`, from `/proc/net/tcp`.
fn gateway_send_queues(local_port: u16, remote_ports: &[u16]) -> anyhow::Result<Vec<u64>> {
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let port = |address: &str| {
        address.rsplit_once(':').and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    let mut queues = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote), Some(queue)) =
            (fields.get(1), fields.get(2), fields.get(4))
        else {
            continue;
        };
        if port(local) != Some(local_port)
            || !port(remote).is_some_and(|p| remote_ports.contains(&p))
        {
            continue;
        }
        let tx = queue.split_once(':').and_then(|(tx, _)| u64::from_str_radix(tx, 16).ok());
        queues.extend(tx);
    }
    Ok(queues)
}
