//! Every error code of the protocol table (DESIGN.md section 2) with what happens to the
//! connection after it, while a bystander on the same gateway keeps playing undisturbed.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{Direction, ErrorCode};
use meridian_testkit::{
    deadline, msg, wait_until, Answer, Bot, Bystander, ClusterOptions, Front, DEFAULT_LEASE_TTL,
    DEFAULT_WAIT,
};

use crate::{ack, chat_from, entered, left, seen_moving, with_cluster, BYSTANDER_HOME};

/// Time for etcd to expire a lease and the gateways to react, on top of the lease TTL.
const SLACK: Duration = Duration::from_secs(2);

/// After an error that keeps the connection open, it still works: a Ping is answered.
fn still_open(bot: &mut Bot, after: &str) -> anyhow::Result<()> {
    bot.expect_quiet().with_context(|| format!("the connection still works after {after}"))
}

pub fn errors_before_login_keep_the_connection(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut bot = Bot::connect(addr)?;
        still_open(&mut bot, "connecting (Ping is answered before login)")?;

        bot.send(&msg::move_(Direction::Up, 7))?;
        bot.expect_error(ErrorCode::NotLoggedIn, 7).context("Move before Login")?;
        still_open(&mut bot, "NOT_LOGGED_IN for a Move")?;
        bot.send(&msg::chat("hello?"))?;
        bot.expect_error(ErrorCode::NotLoggedIn, 0).context("Chat before Login")?;
        still_open(&mut bot, "NOT_LOGGED_IN for a Chat")?;

        let too_long_ascii = "n".repeat(33);
        let too_long_utf8 = "€".repeat(11); // 11 characters, 33 bytes
        let refused_logins = [
            ("an empty name", "", Some((50, 50))),
            ("a 33-byte name", too_long_ascii.as_str(), Some((50, 50))),
            ("a 33-byte name of 11 characters", too_long_utf8.as_str(), Some((50, 50))),
            ("a spawn at x = 400", "x", Some((400, 0))),
            ("a spawn at y = 400", "y", Some((0, 400))),
        ];
        for (what, name, spawn) in refused_logins {
            bot.send(&msg::login(name, spawn))?;
            bot.expect_error(ErrorCode::InvalidArgument, 0)
                .with_context(|| format!("Login with {what}"))?;
            still_open(&mut bot, &format!("INVALID_ARGUMENT for a Login with {what}"))?;
        }
        bot.send(&msg::no_kind())?;
        bot.expect_error(ErrorCode::InvalidArgument, 0).context("a ClientMessage with no kind")?;
        still_open(&mut bot, "INVALID_ARGUMENT for a message with no kind")?;

        bot.send(&msg::resume(b"not a token the server issued"))?;
        bot.expect_error(ErrorCode::InvalidToken, 0).context("Resume with a made-up token")?;
        still_open(&mut bot, "INVALID_TOKEN")?;
        bystander.wait_for_acks(2)?;

        // None of that logged the connection in or broke it: a login at the limits works,
        // and so does a move.
        let name = "n".repeat(32);
        let login = bot.login(&name, Some((399, 399)))?;
        ensure!(login.after.is_empty(), "nobody near (399, 399): {:?}", login.after);
        ensure!(bot.move_ok(Direction::Up, 1)? == (399, 398), "moved up from (399, 399)");

        let acks = bystander.finish()?;
        ensure!(acks > 0, "the bystander played");
        Ok(())
    })
}

pub fn errors_after_login_keep_the_connection(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut alice = Bot::connect(addr)?;
        alice.login("alice", Some((50, 50)))?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((60, 50)))?;
        alice.expect_messages(&[entered(&observer, 60, 50)])?;

        // A second Login is refused and changes nothing: alice is still where she was.
        alice.send(&msg::login("alice-again", Some((10, 10))))?;
        alice.expect_error(ErrorCode::AlreadyLoggedIn, 0).context("a second Login")?;
        alice.send_move(Direction::Right, 1)?;
        alice.expect_messages(&[ack(&alice, 51, 50, 1)])?;
        observer.expect_messages(&[seen_moving(&alice, 51, 50)])?;

        // Moves with no direction or an unknown one: refused with their client_time.
        for (t, direction) in [(2, 0), (3, 5), (4, 99), (5, -1)] {
            alice.send(&msg::move_raw(direction, t))?;
            alice
                .expect_error(ErrorCode::InvalidArgument, t)
                .with_context(|| format!("Move with direction {direction}"))?;
        }
        still_open(&mut alice, "INVALID_ARGUMENT for moves")?;

        let refused_chats = [
            ("an empty chat", String::new()),
            ("a 257-byte chat", "x".repeat(257)),
            ("a 258-byte chat of 86 characters", "€".repeat(86)),
        ];
        for (what, text) in &refused_chats {
            alice.chat(text)?;
            alice.expect_error(ErrorCode::InvalidArgument, 0).with_context(|| what.to_string())?;
        }
        alice.send(&msg::no_kind())?;
        alice.expect_error(ErrorCode::InvalidArgument, 0).context("no kind, logged in")?;
        still_open(&mut alice, "INVALID_ARGUMENT for chats and a message with no kind")?;
        observer.expect_quiet().context("nothing refused reaches an observer")?;

        // At the limit: 256 bytes are delivered.
        let longest = "y".repeat(256);
        alice.chat(&longest)?;
        alice.expect_messages(&[chat_from(&alice, &longest)])?;
        observer.expect_messages(&[chat_from(&alice, &longest)])?;

        // A token the server did not issue, on a fresh connection: alice's with a bit
        // flipped (or a made-up one if hers is empty, which the login test reports), and an
        // empty one.
        let mut forged = alice.resume_token().to_vec();
        match forged.last_mut() {
            Some(byte) => *byte ^= 0x01,
            None => forged = b"made-up token".to_vec(),
        }
        let mut stranger = Bot::connect(addr)?;
        for (what, token) in [("a forged token", forged), ("an empty token", Vec::new())] {
            stranger.send(&msg::resume(&token))?;
            stranger.expect_error(ErrorCode::InvalidToken, 0).with_context(|| what.to_string())?;
            still_open(&mut stranger, &format!("INVALID_TOKEN for {what}"))?;
        }
        observer.expect_quiet().context("a refused Resume brings nobody back")?;

        alice.send_move(Direction::Left, 6)?;
        alice.expect_messages(&[ack(&alice, 50, 50, 6)])?;
        observer.expect_messages(&[seen_moving(&alice, 50, 50)])?;
        bystander.wait_for_acks(2)?;
        bystander.finish()?;

        // UNAVAILABLE: with the only shard dead, moves and logins are refused and the
        // connections stay open.
        let killed_at = Instant::now();
        cluster.kill_shard(0)?;
        for t in [7, 8] {
            // The gateway may only learn of the death when the shard's lease expires.
            alice.send_move(Direction::Right, t)?;
            let answer = alice.recv_answer(killed_at + DEFAULT_LEASE_TTL + SLACK, t)?;
            ensure!(
                answer.error()? == ErrorCode::Unavailable,
                "move {t} with the shard dead: {answer:?}"
            );
            still_open(&mut alice, "UNAVAILABLE for a move")?;
        }
        let mut late = Bot::connect(addr)?;
        late.send(&msg::login("late", Some((200, 200))))?;
        late.expect_error(ErrorCode::Unavailable, 0).context("Login with the shard dead")?;
        still_open(&mut late, "UNAVAILABLE for a Login")?;
        Ok(())
    })
}

pub fn rate_limit(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut racer = Bot::connect(addr)?;
        racer.login("racer", Some((150, 150)))?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((165, 150)))?;
        racer.expect_messages(&[entered(&observer, 165, 150)])?;

        // 30 moves back to back: one answer each, in order; the first 20 applied, the rest
        // RATE_LIMITED and not applied.
        let moves: Vec<_> = (1..=30).map(|t| msg::move_(Direction::Right, t)).collect();
        racer.send_all(&moves)?;
        let until = deadline(DEFAULT_WAIT);
        for t in 1..=30u64 {
            let answer = racer.recv_answer(until, t)?;
            ensure!(answer.others.is_empty(), "only answers expected, got {:?}", answer.others);
            let expected = if t <= 20 {
                Answer::Ack((150 + t as u32, 150))
            } else {
                Answer::Error(ErrorCode::RateLimited, String::new())
            };
            let same = match (&answer.answer, &expected) {
                (Answer::Ack(a), Answer::Ack(b)) => a == b,
                (Answer::Error(a, _), Answer::Error(b, _)) => a == b,
                _ => false,
            };
            ensure!(same, "move {t} of 30 back to back: expected {expected:?}, got {answer:?}");
        }
        racer.expect_quiet()?;
        // The observer saw the 20 applied moves, in order, and nothing of the refused ones.
        for x in 151..=170 {
            let got = observer.recv(deadline(DEFAULT_WAIT))?;
            ensure!(got == seen_moving(&racer, x, 150), "expected racer at x = {x}, got {got:?}");
        }
        observer.expect_quiet()?;
        bystander.wait_for_acks(2)?;

        // As the budget refills, moves are accepted again, from where the 20th left off (a
        // refused move spends nothing, so retrying does not delay it).
        let mut t = 100;
        let mut last = None;
        wait_until(deadline(Duration::from_secs(3)), "a move accepted after the burst", || {
            t += 1;
            let answer = racer.move_(Direction::Right, t);
            let refused = matches!(
                &answer,
                Ok(a) if matches!(a.answer, Answer::Error(ErrorCode::RateLimited, _))
            );
            last = Some(answer);
            !refused
        })?;
        let answer = last.context("no move was sent")??;
        match answer.answer {
            Answer::Ack(position) => {
                ensure!(position == (171, 150), "refused moves were applied: {answer:?}")
            }
            _ => bail!("a move after the burst: {answer:?}"),
        }
        observer.expect_messages(&[seen_moving(&racer, 171, 150)])?;
        bystander.finish()?;
        Ok(())
    })
}

/// Sends `bytes`, expects `code` and then the close; the observer gets Left within a second.
fn refused_and_closed(
    victim: &mut Bot,
    observer: Option<&mut Bot>,
    bytes: &[u8],
    code: ErrorCode,
    what: &str,
) -> anyhow::Result<()> {
    victim.send_raw(bytes)?;
    victim.expect_error(code, 0).with_context(|| format!("sending {what}"))?;
    let rest = victim.expect_closed(deadline(DEFAULT_WAIT)).with_context(|| {
        format!("the connection closed after {} for {what}", code.as_str_name())
    })?;
    let closed_at = Instant::now();
    ensure!(rest.is_empty(), "nothing after the error for {what}, got {rest:?}");
    if let Some(observer) = observer {
        let expected = left(victim);
        let got = observer.recv(closed_at + Duration::from_secs(1)).with_context(|| {
            format!("observer expecting Left within 1 s of the close for {what}")
        })?;
        ensure!(got == expected, "expected {expected:?} after {what}, got {got:?}");
    }
    Ok(())
}

pub fn closing_errors(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let bystander = Bystander::start(addr, "bystander", BYSTANDER_HOME)?;
        let mut observer = Bot::connect(addr)?;
        observer.login("observer", Some((200, 200)))?;

        let malformed: [(&str, &[u8]); 4] = [
            ("bad protobuf (field 1 with wire type 7)", &[0x0f, 0x01]),
            ("bad protobuf (a length-delimited field cut short)", &[0x0a, 0x05, 0x01]),
            ("a wrong wire type (field 2, move, as a varint)", &[0x10, 0x01]),
            ("invalid UTF-8 in Chat.text", &[0x1a, 0x03, 0x0a, 0x01, 0xff]),
        ];
        for (i, (what, body)) in malformed.into_iter().enumerate() {
            let mut victim = Bot::connect(addr)?;
            victim.login(&format!("victim-{i}"), Some((205, 200)))?;
            let victim_entered = entered(&victim, 205, 200);
            observer.expect_messages(&[victim_entered])?;
            let frame = msg::raw_frame(body);
            refused_and_closed(
                &mut victim,
                Some(&mut observer),
                &frame,
                ErrorCode::Malformed,
                what,
            )?;
            bystander.wait_for_acks(2).with_context(|| format!("after {what}"))?;
        }

        // Before login too: invalid UTF-8 in Login.name.
        let mut anonymous = Bot::connect(addr)?;
        let frame = msg::raw_frame(&[0x0a, 0x03, 0x0a, 0x01, 0xff]);
        refused_and_closed(
            &mut anonymous,
            None,
            &frame,
            ErrorCode::Malformed,
            "invalid UTF-8 in Login.name",
        )?;

        // A 4096-byte body is allowed...
        let mut big = Bot::connect(addr)?;
        big.send_raw(&msg::padded_ping_frame(4242, 4096))?;
        let got = big.recv(deadline(DEFAULT_WAIT)).context("a Ping padded to 4096 bytes")?;
        ensure!(got == meridian_protocol::server::pong(4242), "expected Pong 4242, got {got:?}");
        still_open(&mut big, "a 4096-byte frame")?;

        // ...4097 is refused as soon as the prefix is read: no body is ever sent.
        let mut victim = Bot::connect(addr)?;
        victim.login("victim-big", Some((205, 200)))?;
        let victim_entered = entered(&victim, 205, 200);
        observer.expect_messages(&[victim_entered])?;
        refused_and_closed(
            &mut victim,
            Some(&mut observer),
            &msg::varint(4097),
            ErrorCode::FrameTooLarge,
            "the prefix of a 4097-byte frame",
        )?;
        let mut anonymous = Bot::connect(addr)?;
        refused_and_closed(
            &mut anonymous,
            None,
            &msg::varint(1 << 40),
            ErrorCode::FrameTooLarge,
            "the prefix of a 2^40-byte frame, before login",
        )?;
        bystander.wait_for_acks(2)?;

        observer.expect_quiet()?;
        big.login("big", Some((100, 100)))?;
        big.move_ok(Direction::Down, 1)?;
        bystander.finish()?;
        Ok(())
    })
}
