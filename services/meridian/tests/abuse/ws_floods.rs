//! Issue 31: floods of WebSocket frames that are no message by themselves. An attacker on
//! the WebSocket front writes, as fast as the socket takes them, either empty non-final
//! fragments of a message that never ends, or pings (reading every pong it is sent). Every
//! frame is paid for from the connection's input budget (100 frames/s, burst 200) before
//! the gateway reads it, so reading pauses: TCP flow control stops the attacker's writes,
//! or, past what the gateway may hold for it, it is cut with RATE_LIMITED. The gateway
//! never reads more of those frames than the budget pays for (counted in
//! `ws_frames_in_total`), its memory stays bounded, and a bystander playing on the same
//! gateway is answered every move, in order, as ever.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::abuse::{metric_value, rss_bytes};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::{ErrorCode, ServerMessage};
use meridian_testkit::{deadline, wait_until, Bystander, ClusterOptions, Front, DEFAULT_WAIT};

use crate::common::{with_cluster_alone, GATEWAY_TICK, SCHEDULING_SLACK};
use crate::BYSTANDER_HOME;

const FLOOD_FOR: Duration = Duration::from_secs(4);
/// The input budget the gateways are started with: frames per second, and the burst.
const FRAME_RATE: f64 = 100.0;
const FRAME_BURST: f64 = 200.0;
/// A free-running loopback write moves gigabytes in 4 s (issue 31: 10.7 GB in 15 s from
/// four connections); a flow-controlled one the kernel's buffers and what the gateway
/// holds (at most 256 KiB) - a few megabytes.
const MOST_WRITTEN: u64 = 64 << 20;
const MOST_RSS_GROWTH: u64 = 64 << 20;
/// The attacker never logs in: it is closed at this deadline if not before.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

const FIN: u8 = 0x80;
const CONTINUATION: u8 = 0x0;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xa;

/// What the attacker sends, over and over.
#[derive(Debug, Clone, Copy)]
enum Flood {
    /// Empty continuations of a binary message that is never finished.
    Fragments,
    /// Pings with an 8-byte payload.
    Pings,
}

impl Flood {
    /// The metric label of the frames it sends.
    fn kind(self) -> &'static str {
        match self {
            Flood::Fragments => "fragment",
            Flood::Pings => "ping",
        }
    }
}

pub fn ws_fragment_flood(front: Front) {
    flood(front, Flood::Fragments);
}

pub fn ws_ping_flood(front: Front) {
    flood(front, Flood::Pings);
}

/// A client frame, masked as clients must.
fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x5a, 0x01, 0xc3, 0x77];
    assert!(payload.len() < 126);
    let mut frame = vec![first, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// A TCP connection to `addr` through its WebSocket upgrade.
fn upgraded(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&addr, DEFAULT_WAIT)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(DEFAULT_WAIT))?;
    stream.write_all(
        b"GET /play HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )?;
    // Byte by byte, so nothing after the answer's headers is taken from the reader.
    let mut answer = Vec::new();
    let mut byte = [0u8];
    while !answer.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).context("reading the upgrade's answer")?;
        answer.push(byte[0]);
        ensure!(answer.len() < 4096, "no end to the upgrade's answer");
    }
    ensure!(answer.starts_with(b"HTTP/1.1 101 "), "{}", String::from_utf8_lossy(&answer));
    Ok(stream)
}

/// What the attacker was sent.
#[derive(Debug, Default)]
struct Heard {
    pongs: u64,
    messages: Vec<ServerMessage>,
    /// A close frame came (the gateway closed the session).
    close: bool,
    /// The gateway closed the connection (EOF or a reset).
    ended: bool,
}

/// Reads everything the gateway sends the attacker until it closes or `stop` is set.
fn read_all(mut stream: TcpStream, stop: Arc<AtomicBool>) -> anyhow::Result<Heard> {
    use prost::Message as _;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut heard = Heard::default();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) && !heard.ended {
        match stream.read(&mut chunk) {
            Ok(0) => heard.ended = true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => heard.ended = true,
        }
        // Server frames are not masked; the gateway's are at most 4096 bytes.
        let mut at = 0;
        while buf.len() >= at + 2 {
            let (opcode, short) = (buf[at] & 0x0f, usize::from(buf[at + 1] & 0x7f));
            let (len, size) = match short {
                126 if buf.len() >= at + 4 => {
                    (usize::from(u16::from_be_bytes([buf[at + 2], buf[at + 3]])), 4)
                }
                126 => break,
                127 => bail!("a server frame over 64 KiB"),
                short => (short, 2),
            };
            if buf.len() < at + size + len {
                break;
            }
            let payload = &buf[at + size..at + size + len];
            match opcode {
                PONG => heard.pongs += 1,
                BINARY => heard.messages.push(ServerMessage::decode(payload)?),
                CLOSE => heard.close = true,
                other => bail!("a server frame with opcode {other:#x}"),
            }
            at += size + len;
        }
        buf.drain(..at);
    }
    Ok(heard)
}

/// Closes `stream` with a reset, as a client that goes away with unread input does.
fn reset(stream: TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket and a `linger` that outlives the call.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// Waits until `stream` can take more bytes, or `within` passes.
fn wait_writable(stream: &TcpStream, within: Duration) {
    let mut poll = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    let ms = within.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut poll, 1, ms) };
}

fn flood(front: Front, flood: Flood) {
    let opts = ClusterOptions::new(front)
        .env("MERIDIAN_INPUT_FRAME_RATE", (FRAME_RATE as u32).to_string())
        .env("MERIDIAN_LOGIN_TIMEOUT", format!("{}s", LOGIN_TIMEOUT.as_secs()));
    with_cluster_alone(opts, |cluster| {
        let gateway = cluster.gateway(0);
        let counted =
            |name: &str, labels: &[(&str, &str)]| metric_value(gateway.admin, name, labels);
        let bystander = Bystander::start(cluster.game_addr(0), "bystander", BYSTANDER_HOME)?;
        bystander.wait_for_acks(3)?;
        let rss_before = rss_bytes(gateway.pid)?;
        let paused_before = counted("meridian_gateway_reads_paused_total", &[])?;
        let cuts_before = counted("meridian_gateway_input_floods_cut_total", &[])?;
        let kind = [("kind", flood.kind())];
        let read_before = counted("meridian_gateway_ws_frames_in_total", &kind)?;

        // The budget is the connection's from its accept on: the gateway can have read at
        // most the burst and the rate over the time since (measured generously, from
        // before the connect to after the count is read).
        let connecting = Instant::now();
        let stream = upgraded(cluster.ws_addr(0))?;
        let stop = Arc::new(AtomicBool::new(false));
        let reader: JoinHandle<anyhow::Result<Heard>> = {
            let (stream, stop) = (stream.try_clone()?, stop.clone());
            std::thread::spawn(move || read_all(stream, stop))
        };
        let chunk: Vec<u8> = match flood {
            Flood::Fragments => {
                (&stream).write_all(&masked(BINARY, &[])).context("the first fragment")?;
                (0..8192).flat_map(|_| masked(CONTINUATION, &[])).collect()
            }
            Flood::Pings => {
                (0..8192u64).flat_map(|t| masked(FIN | PING, &t.to_be_bytes())).collect()
            }
        };
        stream.set_nonblocking(true)?;
        let acks_at_start = bystander.acks();
        let started = Instant::now();
        let mut written = 0u64;
        let mut offset = 0;
        let mut write_failed = None;
        while started.elapsed() < FLOOD_FOR && written < MOST_WRITTEN {
            match (&stream).write(&chunk[offset..]) {
                Ok(n) => {
                    written += n as u64;
                    offset = (offset + n) % chunk.len();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait_writable(&stream, Duration::from_millis(20))
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    write_failed = Some(e);
                    break;
                }
            }
        }
        let flooded = started.elapsed();
        let read = counted("meridian_gateway_ws_frames_in_total", &kind)? - read_before;
        // The loop may have read its clock for the accept up to a tick before the connect.
        let since = connecting.elapsed() + GATEWAY_TICK;
        let most_read = FRAME_BURST + FRAME_RATE * since.as_secs_f64();
        let rss_after = rss_bytes(gateway.pid)?;
        let cut_since = || -> anyhow::Result<bool> {
            Ok(counted("meridian_gateway_input_floods_cut_total", &[])? > cuts_before)
        };
        let cut = cut_since()?;
        let bystander_acks = bystander.acks() - acks_at_start;
        eprintln!(
            "ws {} flood ({front:?}): {written} bytes written in {:.1} s ({}); the gateway read {read} of them (the budget allows {most_read:.0}); bystander {bystander_acks} acks meanwhile; gateway RSS {} -> {} KiB",
            flood.kind(),
            flooded.as_secs_f64(),
            match (&write_failed, cut) {
                (Some(e), _) => format!("cut: {e}"),
                (None, true) => "cut".to_string(),
                (None, false) => "flow-controlled, never cut".to_string(),
            },
            rss_before / 1024,
            rss_after / 1024,
        );
        ensure!(
            written < MOST_WRITTEN,
            "the attacker wrote {written} bytes in {flooded:?}: nothing slowed it"
        );
        ensure!(
            read <= most_read,
            "the gateway read {read} {} frames; the budget pays for at most {most_read:.0}",
            flood.kind()
        );
        let paused = counted("meridian_gateway_reads_paused_total", &[])?;
        ensure!(paused > paused_before, "reads_paused_total stayed at {paused}: never paused");
        ensure!(
            rss_after.saturating_sub(rss_before) < MOST_RSS_GROWTH,
            "the gateway's RSS grew from {rss_before} to {rss_after} bytes"
        );

        // Cut: it was told RATE_LIMITED, then closed. Not cut: it is told nothing, and goes
        // away with a reset.
        if cut {
            wait_until(deadline(DEFAULT_WAIT), "the cut attacker's connection to close", || {
                reader.is_finished()
            })?;
        }
        stop.store(true, Ordering::Relaxed);
        let heard = reader.join().map_err(|_| anyhow::anyhow!("the reader panicked"))??;
        let cut_late = !cut && cut_since()?;
        if cut {
            let refused: Vec<_> = heard
                .messages
                .iter()
                .filter_map(|m| match &m.kind {
                    Some(S::Error(e)) => Some(e.code),
                    _ => None,
                })
                .collect();
            ensure!(
                refused == [ErrorCode::RateLimited as i32] && heard.close && heard.ended,
                "the cut attacker was told {refused:?} (close frame: {}, closed: {})",
                heard.close,
                heard.ended
            );
        } else if !cut_late {
            ensure!(heard.messages.is_empty() && !heard.ended, "not cut, yet told {heard:?}");
        }
        // (Cut between the two looks, by what was on its way when the writes stopped: what
        // it was told is not waited for.)
        // Pongs answer pings read, counted when they are read, before their pongs are written.
        // The reader heard pongs until it stopped, after `read` was sampled (the budget
        // refills meanwhile), so they are held against what was read by then.
        let read_by_now = counted("meridian_gateway_ws_frames_in_total", &kind)? - read_before;
        ensure!(
            heard.pongs as f64 <= read_by_now,
            "{} pongs for {read_by_now} pings read",
            heard.pongs
        );
        // An epoll gateway that stopped reading the attacker sees its reset only once the
        // budget has paid for what waits; the login deadline closes it at the latest.
        reset(stream);
        let gone_by = connecting + LOGIN_TIMEOUT + GATEWAY_TICK + SCHEDULING_SLACK;
        wait_until(
            gone_by.max(deadline(DEFAULT_WAIT)),
            "the gateway to drop the attacker's connection",
            || counted("meridian_gateway_connections", &[]).is_ok_and(|open| open <= 1.0),
        )?;
        bystander.finish().context("the bystander, after the flood")?;
        Ok(())
    })
}
