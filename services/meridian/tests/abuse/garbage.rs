//! Scenario 7: garbage and oversized frames. Random bytes that do not decode get MALFORMED
//! and the close; a length prefix over 4,096 gets FRAME_TOO_LARGE and the close before any
//! body is sent. A logged-in victim's observers see it leave; a bystander plays on.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_protocol::{decode_body, next_frame, DEFAULT_MAX_FRAME};
use meridian_testkit::abuse::RawClient;
use meridian_testkit::pb::{ClientMessage, ErrorCode};
use meridian_testkit::{
    deadline, msg, test_seed, Bot, Bystander, ClusterOptions, Front, Rng, DEFAULT_WAIT,
};

use crate::{with_cluster, BYSTANDER_HOME};

/// A frame body of random bytes that is not a `ClientMessage`.
fn garbage_body(rng: &mut Rng) -> Vec<u8> {
    loop {
        let len = rng.range(1, 300) as usize;
        let body: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        if decode_body::<ClientMessage>(&body).is_err() {
            return body;
        }
    }
}

/// Random bytes whose first frame the gateway must refuse (a bad or oversized prefix, or a
/// whole body that does not decode), with the code it refuses it with.
fn garbage_stream(rng: &mut Rng) -> (Vec<u8>, ErrorCode) {
    loop {
        let bytes: Vec<u8> = (0..64).map(|_| rng.below(256) as u8).collect();
        match next_frame(&bytes, DEFAULT_MAX_FRAME) {
            Err(error) => return (bytes, error.code()),
            Ok(Some(header)) if decode_body::<ClientMessage>(header.body(&bytes)).is_err() => {
                return (bytes, ErrorCode::Malformed)
            }
            // Incomplete (the gateway would wait for more) or a valid message: try again.
            Ok(_) => {}
        }
    }
}

pub fn garbage_frames(front: Front) {
    let seed = test_seed("garbage_frames", 0x6a7b_a6e5);
    let mut rng = Rng::new(seed);
    with_cluster(ClusterOptions::new(front), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((200, 200)))?;

        // Logged-in victims send a random body behind a correct prefix.
        for i in 0..4 {
            let body = garbage_body(&mut rng);
            let mut victim = Bot::connect(addr)?;
            victim.login(&format!("victim-{i}"), Some((205, 200)))?;
            let entered = meridian_protocol::server::entered(victim.id(), 205, 200, victim.label());
            observer.expect_messages(&[entered])?;
            let what = format!(
                "a random body of {} bytes (seed {seed}, victim {i}): {body:02x?}",
                body.len()
            );
            closed_with(&mut victim, &msg::raw_frame(&body), ErrorCode::Malformed, &what)?;
            let left = meridian_protocol::server::left(victim.id());
            let got = observer
                .recv(Instant::now() + Duration::from_secs(1))
                .with_context(|| format!("the observer expects Left within 1 s after {what}"))?;
            ensure!(got == left, "after {what}: expected {left:?}, got {got:?}");
        }

        // Anonymous connections send random bytes, prefix and all.
        for i in 0..6 {
            let (bytes, code) = garbage_stream(&mut rng);
            let mut raw = RawClient::connect(cluster.game_addr(0))?;
            raw.send_raw(&bytes)?;
            raw.expect_error_then_close(code)
                .with_context(|| format!("random bytes (seed {seed}, stream {i}): {bytes:02x?}"))?;
        }

        // Prefixes over the limit, with no body ever sent: logged in and not.
        for (i, len) in [4_097u64, 1 << 20, u64::MAX >> 1].into_iter().enumerate() {
            let mut victim = Bot::connect(addr)?;
            victim.login(&format!("big-{i}"), Some((205, 200)))?;
            let entered = meridian_protocol::server::entered(victim.id(), 205, 200, victim.label());
            observer.expect_messages(&[entered])?;
            let what = format!("the prefix of a {len}-byte frame");
            closed_with(&mut victim, &msg::varint(len), ErrorCode::FrameTooLarge, &what)?;
            let got = observer.recv(Instant::now() + Duration::from_secs(1))?;
            ensure!(got == meridian_protocol::server::left(victim.id()), "after {what}: {got:?}");

            let mut anonymous = RawClient::connect(cluster.game_addr(0))?;
            anonymous.send_raw(&msg::varint(len))?;
            anonymous
                .expect_error_then_close(ErrorCode::FrameTooLarge)
                .with_context(|| format!("{what}, before login"))?;
        }
        observer.expect_quiet()?;
        observer.move_ok(meridian_testkit::pb::Direction::Up, 1)?;
        bystander.wait_for_acks(2)?;
        bystander.finish()?;
        Ok(())
    })
}

/// `bytes` get `Error{code}` (client_time 0), then the close and nothing else.
fn closed_with(victim: &mut Bot, bytes: &[u8], code: ErrorCode, what: &str) -> anyhow::Result<()> {
    victim.send_raw(bytes)?;
    victim.expect_error(code, 0).with_context(|| format!("sending {what}"))?;
    let rest = victim
        .expect_closed(deadline(DEFAULT_WAIT))
        .with_context(|| format!("the close after {} for {what}", code.as_str_name()))?;
    ensure!(rest.is_empty(), "nothing after the error for {what}, got {rest:?}");
    Ok(())
}
