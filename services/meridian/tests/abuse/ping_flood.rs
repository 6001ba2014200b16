//! Scenario 2: a logged-in player writes Pings as fast as the socket takes them for 4 s and
//! never reads. The input budget (100 frames/s) pauses reading, so TCP flow control stops
//! its writes (or, past what the gateway may hold for it, it is cut with RATE_LIMITED),
//! while a bystander's moves are answered as fast as before and the gateway's memory and
//! idle CPU stay bounded.

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use meridian_testkit::abuse::{cpu_used_over, metric_value, rss_bytes, RawClient, RawRead};
use meridian_testkit::pb::server_message::Kind as S;
use meridian_testkit::pb::ErrorCode;
use meridian_testkit::{deadline, msg, wait_until, Bystander, ClusterOptions, Front, DEFAULT_WAIT};

use crate::common::with_cluster_alone;
use crate::BYSTANDER_HOME;

const FLOOD_FOR: Duration = Duration::from_secs(4);
/// The bystander's pace under attack is measured over at least this long.
const MEASURE_AT_LEAST: Duration = Duration::from_secs(2);
/// A free-running loopback write moves gigabytes in 4 s; a flow-controlled one the kernel's
/// buffers and what the gateway holds (at most 256 KiB) - a few megabytes.
const MOST_WRITTEN: u64 = 64 << 20;
const MOST_RSS_GROWTH: u64 = 64 << 20;
/// CPU a quiet gateway may use over 2 s (its 250 ms tick costs next to nothing).
const MOST_IDLE_CPU: Duration = Duration::from_millis(400);

/// Waits until `stream` can take more bytes, or `within` passes.
fn wait_writable(stream: &TcpStream, within: Duration) {
    let mut poll = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    let ms = within.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut poll, 1, ms) };
}

/// Acknowledged moves per second over `over`.
fn ack_rate(bystander: &Bystander, over: Duration) -> f64 {
    let before = bystander.acks();
    let started = Instant::now();
    // The window the rate is measured over: waits for nothing.
    std::thread::sleep(over);
    (bystander.acks() - before) as f64 / started.elapsed().as_secs_f64()
}

pub fn ping_flood(front: Front) {
    with_cluster_alone(ClusterOptions::new(front), |cluster| {
        let addr = cluster.game_addr(0);
        let gateway = cluster.gateway(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        bystander.wait_for_acks(3)?;
        let calm = ack_rate(&bystander, Duration::from_secs(1));
        let rss_before = rss_bytes(gateway.pid)?;
        let paused_before =
            metric_value(gateway.admin, "meridian_gateway_reads_paused_total", &[])?;

        let mut pinger = RawClient::connect(addr)?;
        pinger.login("pinger", Some((100, 100)))?;
        let stream = pinger.try_clone_stream()?;
        stream.set_nonblocking(true)?;
        // Whole frames, so wrapping around keeps the stream well framed.
        let chunk: Vec<u8> = (1..=8192u64).flat_map(|t| msg::frame(&msg::ping(t))).collect();
        let acks_at_start = bystander.acks();
        let started = Instant::now();
        let mut written = 0u64;
        let mut offset = 0;
        let mut cut = None;
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
                    cut = Some((e, started.elapsed()));
                    break;
                }
            }
        }
        let flooded = started.elapsed();
        // A flood cut off at once (io_uring may read megabytes before its reading stops, and
        // then cuts the client) still gets its bystander measured over two seconds.
        if let Some(rest) = MEASURE_AT_LEAST.checked_sub(flooded) {
            // The rest of the measuring window: waits for nothing.
            std::thread::sleep(rest);
        }
        let during = (bystander.acks() - acks_at_start) as f64 / started.elapsed().as_secs_f64();
        let rss_after = rss_bytes(gateway.pid)?;
        eprintln!(
            "ping flood ({front:?}): {written} bytes written in {:.1} s ({}); bystander {calm:.1} acks/s before, {during:.1} during; gateway RSS {} -> {} KiB",
            flooded.as_secs_f64(),
            match &cut {
                Some((e, at)) => format!("cut after {:.2} s: {e}", at.as_secs_f64()),
                None => "never cut".to_string(),
            },
            rss_before / 1024,
            rss_after / 1024,
        );
        ensure!(
            written < MOST_WRITTEN,
            "the pinger wrote {written} bytes in {flooded:?}: nothing slowed it"
        );
        ensure!(
            during >= calm / 2.0,
            "the bystander's acks slowed from {calm:.1}/s to {during:.1}/s under the ping flood"
        );
        ensure!(
            rss_after.saturating_sub(rss_before) < MOST_RSS_GROWTH,
            "the gateway's RSS grew from {rss_before} to {rss_after} bytes"
        );
        let paused = metric_value(gateway.admin, "meridian_gateway_reads_paused_total", &[])?;
        ensure!(paused > paused_before, "reads_paused_total stayed at {paused}");

        // What the pinger was told: Pongs, and if it was cut, RATE_LIMITED and the close.
        stream.set_nonblocking(false)?;
        if cut.is_some() {
            let until = deadline(DEFAULT_WAIT);
            let mut last = None;
            loop {
                match pinger.read(until)? {
                    RawRead::Message(message) => match &message.kind {
                        Some(S::Pong(_)) => {}
                        Some(S::Error(e))
                            if e.code == ErrorCode::RateLimited as i32 && e.client_time == 0 =>
                        {
                            last = Some(message)
                        }
                        _ => bail!("the cut pinger read {message:?}"),
                    },
                    RawRead::Closed => break,
                    RawRead::TimedOut => bail!("the cut pinger's connection is still open"),
                }
            }
            ensure!(last.is_some(), "the pinger was cut without RATE_LIMITED");
        }
        // Closed with unread Pongs (a reset): the gateway lets go of it, even with its
        // reading paused.
        drop(stream);
        drop(pinger);
        wait_until(deadline(DEFAULT_WAIT), "the gateway to drop the pinger's connection", || {
            metric_value(gateway.admin, "meridian_gateway_connections", &[])
                .is_ok_and(|open| open <= 1.0)
        })?;

        bystander.finish()?;
        let idle = cpu_used_over(gateway.pid, Duration::from_secs(2))?;
        eprintln!("ping flood ({front:?}): gateway CPU over 2 s idle: {idle:?}");
        ensure!(idle < MOST_IDLE_CPU, "the gateway used {idle:?} of CPU in 2 s with nothing to do");
        Ok(())
    })
}
