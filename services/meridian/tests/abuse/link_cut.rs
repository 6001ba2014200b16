//! Scenario 9: a gateway's relay links broken while both processes live. Gateway 2 is
//! stopped (SIGSTOP) while players on gateway 1 chat in the sight of P, a player on gateway
//! 2, so the shard has output for gateway 2 every round. The shard lets go of gateway 2's
//! links, one per lane: it hears no heartbeat on them for 3 s (or, on a machine that fills
//! the socket buffers first, their queue of 1,024 batches fills and it cuts them rather than
//! wait), and gateway 1's links stay open. Continued (SIGCONT), gateway 2 finds its links
//! closed, connects again and restores P on the shard: P gets `ViewReset`, then `Entered`
//! for everyone in sight, and its moves are acknowledged again.
//!
//! Why chats, and many small writes: they keep the shard writing to the stopped gateway
//! every few milliseconds, so its links are let go under load, not on an idle shard.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::abuse::{metric_value, RawClient, RawRead, StoppedProcess};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::{Direction, ServerMessage};
use meridian_testkit::{deadline, msg, wait_until, Bot, Bystander, ClusterOptions, Io};

use crate::common::with_cluster_alone;
use crate::BYSTANDER_HOME;

const P_AT: (u32, u32) = (100, 100);
/// Around P, 15 cells off on both axes: each sees P, none sees another (30 apart).
const CHATTERS_AT: [(u32, u32); 4] = [(85, 85), (115, 85), (85, 115), (115, 115)];
/// Chats per write and the pause between writes, per chatter: frequent small writes, so
/// the shard runs many rounds (each a batch for the stopped gateway's queue).
const CHATS_PER_WRITE: usize = 2;
const WRITE_EVERY: Duration = Duration::from_millis(2);
/// How long the shard may take to give up on the stopped gateway.
const CUT_WITHIN: Duration = Duration::from_secs(12);
const LINKS_CUT: &str = "meridian_shard_gateway_links_cut_total";
const LINKS_SILENT: &str = "meridian_shard_relay_links_silent_total";
const LINKS_OPEN: &str = "meridian_shard_gateway_links";

/// Links the shard has let go of a gateway that did not keep up or went quiet.
fn links_let_go(admin: SocketAddr) -> anyhow::Result<f64> {
    Ok(metric_value(admin, LINKS_CUT, &[])? + metric_value(admin, LINKS_SILENT, &[])?)
}

/// A chatter on gateway 1: a thread that writes chats until told to stop, and one that
/// reads its echoes; the reader hands the client back when stopped, so the chatter stays
/// in the world.
struct Chatter {
    writer: JoinHandle<anyhow::Result<u64>>,
    reader: JoinHandle<anyhow::Result<Heard>>,
}

/// What a chatter read while chatting.
struct Heard {
    client: RawClient,
    echoes: u64,
    /// It saw P leave (when the shard cut P's link).
    p_left: bool,
}

fn start_chatter(
    addr: SocketAddr,
    at: (u32, u32),
    n: usize,
    p: u64,
    stop: &Arc<AtomicBool>,
    sent: &Arc<AtomicU64>,
) -> anyhow::Result<(Chatter, u64)> {
    let mut client = RawClient::connect(addr)?;
    let (ok, _) = client.login(&format!("chatter-{n}"), Some(at))?;
    let mut stream: TcpStream = client.try_clone_stream()?;
    let text = format!("{n}{}", "c".repeat(255));
    let wire: Vec<u8> = (0..CHATS_PER_WRITE).flat_map(|_| msg::frame(&msg::chat(&text))).collect();
    let writer = {
        let (stop, sent) = (Arc::clone(stop), Arc::clone(sent));
        thread::spawn(move || -> anyhow::Result<u64> {
            let mut chats = 0;
            while !stop.load(Ordering::Relaxed) {
                stream.write_all(&wire).context("a chatter writing")?;
                chats += CHATS_PER_WRITE as u64;
                sent.fetch_add(CHATS_PER_WRITE as u64, Ordering::Relaxed);
                // Paces the chatters' writes: waits for nothing.
                thread::sleep(WRITE_EVERY);
            }
            Ok(chats)
        })
    };
    let reader = {
        let stop = Arc::clone(stop);
        thread::spawn(move || -> anyhow::Result<Heard> {
            let (mut echoes, mut p_left) = (0, false);
            loop {
                match client.read(Instant::now() + Duration::from_millis(100))? {
                    RawRead::Message(message) => match &message.kind {
                        Some(S::Chat(_)) => echoes += 1,
                        Some(S::Left(left)) if left.player_id == p => p_left = true,
                        Some(S::Error(e)) => bail!("chatter-{n} got {e:?}"),
                        _ => {}
                    },
                    RawRead::Closed => bail!("chatter-{n} was disconnected"),
                    RawRead::TimedOut if stop.load(Ordering::Relaxed) => {
                        return Ok(Heard { client, echoes, p_left })
                    }
                    RawRead::TimedOut => {}
                }
            }
        })
    };
    Ok((Chatter { writer, reader }, ok.player_id))
}

pub fn a_broken_gateway_link_restores_its_players() {
    // The chatters may chat and send as fast as the test needs; P may be sent everything
    // the stopped gateway finds waiting when it is continued.
    let opts = ClusterOptions::new(Io::Uring)
        .gateways(2)
        .env("MERIDIAN_CHAT_RATE", "100000")
        .env("MERIDIAN_CHAT_BURST", "100000")
        .env("MERIDIAN_INPUT_FRAME_RATE", "100000")
        .env("MERIDIAN_INPUT_BYTE_RATE", "67108864")
        .env("MERIDIAN_MAX_OUTPUT", (64 << 20).to_string());
    with_cluster_alone(opts, |cluster| {
        let first = cluster.game_addr(0);
        let second = cluster.gateway(1).clone();
        let shard_admin = cluster.shard(0).admin;
        let bystander = Bystander::start(first, "bystander", BYSTANDER_HOME)?;
        let mut p = Bot::connect(second.game)?;
        p.login("p", Some(P_AT))?;

        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let let_go_before = links_let_go(shard_admin)?;
        // Both gateways have a link per lane, as many lanes each.
        let per_gateway = metric_value(shard_admin, LINKS_OPEN, &[])? / 2.0;
        let stopped = StoppedProcess::stop(second.pid)?;
        let stopped_at = Instant::now();
        let mut chatters = Vec::new();
        let mut chatter_ids = BTreeSet::new();
        let mut started = Ok(());
        for (n, at) in CHATTERS_AT.into_iter().enumerate() {
            match start_chatter(first, at, n, p.id(), &stop, &sent) {
                Ok((chatter, id)) => {
                    chatters.push(chatter);
                    chatter_ids.insert(id);
                }
                Err(e) => {
                    started = Err(e);
                    break;
                }
            }
        }
        let mut cut = false;
        let waited = started.and_then(|()| {
            wait_until(
                stopped_at + CUT_WITHIN,
                "the shard to let go of the stopped gateway 2's links",
                || {
                    // Gateway 2's links gone, gateway 1's still open.
                    cut = metric_value(shard_admin, LINKS_OPEN, &[])
                        .is_ok_and(|open| open == per_gateway);
                    // A chatter that stopped on its own failed: say why at once.
                    cut || chatters.iter().any(|c| c.writer.is_finished() || c.reader.is_finished())
                },
            )
        });
        let cut_after = stopped_at.elapsed();
        stop.store(true, Ordering::Relaxed);
        let mut echoes = 0;
        let mut heard = Vec::new();
        for chatter in chatters {
            chatter.writer.join().expect("a chatter's writer does not panic")?;
            let chatter = chatter.reader.join().expect("a chatter's reader does not panic")?;
            echoes += chatter.echoes;
            heard.push(chatter);
        }
        waited?;
        ensure!(cut, "the chatters stopped before the links were let go");
        eprintln!(
            "link cut: the shard let go of gateway 2's {per_gateway} links {:.1} s after SIGSTOP, after {} chats ({echoes} echoes on gateway 1)",
            cut_after.as_secs_f64(),
            sent.load(Ordering::Relaxed)
        );
        // Each link let go is counted once or, when its queue filled just as it went
        // silent, twice (cut by the world task, and silent on its socket).
        let let_go = links_let_go(shard_admin)?;
        let open = metric_value(shard_admin, LINKS_OPEN, &[])?;
        ensure!(
            let_go >= let_go_before + per_gateway && open == per_gateway,
            "links let go went from {let_go_before} to {let_go}, {open} open: only gateway 2's"
        );
        // A move P sends while its gateway is stopped: read after the link is gone, it gets
        // exactly one answer like any other (refused, or acknowledged after the restore).
        p.send_move(Direction::Down, 1)?;
        stopped.resume()?;

        // P first gets what was on its way, then the ViewReset of its restore.
        let got = p.recv_until(deadline(Duration::from_secs(15)), "ViewReset", |m| {
            matches!(m.kind, Some(S::ViewReset(_)))
        })?;
        let reset = got.last().expect("invariant: recv_until returns the match last");
        let restored = match &reset.kind {
            Some(S::ViewReset(r)) => r.position.map(|at| (r.player_id, (at.x, at.y))),
            _ => None,
        };
        ensure!(restored == Some((p.id(), P_AT)), "P restored where it stood: {reset:?}");
        ensure!(
            p.resume_token() == &reset_token(reset)[..],
            "a restore hands a fresh resume token, which the bot keeps: {reset:?}"
        );
        let before: Vec<_> = got.iter().filter(|m| !matches!(m.kind, Some(S::Chat(_)))).collect();
        eprintln!(
            "link cut: P read {} messages before its ViewReset; not chats: {before:?}",
            got.len()
        );
        let after = p.ping_barrier()?;
        let entered: BTreeSet<u64> = after
            .iter()
            .filter_map(|m| match &m.kind {
                Some(S::Entered(e)) => Some(e.player_id),
                _ => None,
            })
            .collect();
        ensure!(
            entered == chatter_ids,
            "after ViewReset P gets Entered for the chatters {chatter_ids:?}; P is {}; before the ViewReset (not chats): {before:?}; after: {after:?}",
            p.id()
        );
        let answers: Vec<(bool, &ServerMessage)> = got
            .iter()
            .map(|m| (false, m))
            .chain(after.iter().map(|m| (true, m)))
            .filter(|(_, m)| match &m.kind {
                Some(S::Moved(moved)) => moved.player_id == p.id() && moved.client_time == 1,
                Some(S::Error(e)) => e.client_time == 1,
                _ => false,
            })
            .collect();
        let mut at = P_AT;
        match answers[..] {
            [(after_reset, answer)] => match &answer.kind {
                Some(S::Moved(_)) => {
                    ensure!(after_reset, "move 1 acknowledged before the ViewReset: {answer:?}");
                    at = (P_AT.0, P_AT.1 + 1);
                    ensure!(
                        *answer == meridian_protocol::server::moved(p.id(), at.0, at.1, 1),
                        "move 1: {answer:?}"
                    );
                }
                _ => ensure!(!after_reset, "move 1 refused after the ViewReset: {answer:?}"),
            },
            _ => bail!(
                "move 1, sent while gateway 2 was stopped, was answered {} times: {answers:?}",
                answers.len()
            ),
        }
        eprintln!("link cut: the move sent during the stop was answered {:?}", answers[0].1);
        // The chatters saw P leave when its link was cut, and come back.
        let p_entered = meridian_protocol::server::entered(p.id(), P_AT.0, P_AT.1, "p");
        for (n, chatter) in heard.iter_mut().enumerate() {
            ensure!(chatter.p_left, "chatter-{n} saw P leave when its link was cut");
            let got = chatter.client.ping_barrier()?;
            ensure!(
                got.contains(&p_entered),
                "chatter-{n} sees P again: {:?}",
                got.iter().filter(|m| !matches!(m.kind, Some(S::Chat(_)))).collect::<Vec<_>>()
            );
        }
        let moved = p.move_ok(Direction::Right, 2).context("P's first move after the restore")?;
        ensure!(moved == (at.0 + 1, at.1), "P moved from {at:?} to {moved:?}");
        p.move_ok(Direction::Left, 3)?;
        bystander.finish().context("the bystander on gateway 1 played through it")?;
        Ok(())
    })
}

/// The resume token a ViewReset carries.
fn reset_token(message: &meridian_testkit::pb::ServerMessage) -> Vec<u8> {
    match &message.kind {
        Some(S::ViewReset(reset)) => reset.resume_token.clone(),
        _ => Vec::new(),
    }
}
