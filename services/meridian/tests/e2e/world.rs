//! The rules of the world (DESIGN.md section 1) as clients see them: sight on login, moves in
//! and out of sight, the map edge, chat, logout and disconnects, and a shard border.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::pb::{Direction, Position};
use meridian_testkit::{deadline, Bot, ClusterOptions, Front, DEFAULT_WAIT};

use crate::{ack, chat_from, entered, left, seen_moving, with_cluster};

const MAP: u32 = 400;
const SIGHT: u32 = 20;

fn in_sight(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0.abs_diff(b.0) <= SIGHT && a.1.abs_diff(b.1) <= SIGHT
}

/// Logs in and checks the `Entered` that follow `LoginOk` are exactly `expected` (any order).
fn login_seeing(
    bot: &mut Bot,
    name: &str,
    at: (u32, u32),
    expected: &[&Bot],
) -> anyhow::Result<()> {
    let login = bot.login(name, Some(at))?;
    let want: Vec<_> = expected
        .iter()
        .map(|other| {
            let p = other.view().own_position().expect("invariant: expected bots are logged in");
            entered(other, p.0, p.1)
        })
        .collect();
    let mut got = login.after.clone();
    let mut missing = Vec::new();
    for message in want {
        match got.iter().position(|m| *m == message) {
            Some(i) => {
                got.remove(i);
            }
            None => missing.push(message),
        }
    }
    ensure!(
        missing.is_empty() && got.is_empty(),
        "{name} logging in at {at:?}: missing {missing:?}, unexpected {got:?} (all: {:?})",
        login.after
    );
    Ok(())
}

pub fn login_ok_and_sight_both_ways(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let mut alice = Bot::connect(addr)?;
        let login = alice.login("alice", Some((100, 100)))?;
        let ok = login.ok.clone();
        ensure!(ok.player_id >= 1, "player ids start at 1: {ok:?}");
        ensure!(
            ok.position == Some(Position { x: 100, y: 100 }),
            "dev-mode spawn honoured: {ok:?}"
        );
        ensure!(ok.map_width == MAP && ok.map_height == MAP, "400x400 map: {ok:?}");
        ensure!(ok.view_range == SIGHT, "view range 20: {ok:?}");
        ensure!(login.after.is_empty(), "alice is alone, yet got {:?}", login.after);

        // 20 apart along x: both see each other.
        let mut bob = Bot::connect(addr)?;
        login_seeing(&mut bob, "bob", (120, 100), &[&alice])?;
        alice.expect_messages(&[entered(&bob, 120, 100)])?;

        // 20 apart diagonally from alice, 20 apart along y from bob.
        let mut carol = Bot::connect(addr)?;
        login_seeing(&mut carol, "carol", (120, 120), &[&alice, &bob])?;
        alice.expect_messages(&[entered(&carol, 120, 120)])?;
        bob.expect_messages(&[entered(&carol, 120, 120)])?;

        // 21 apart from everyone: along x, along y, diagonally.
        let mut dave = Bot::connect(addr)?;
        login_seeing(&mut dave, "dave", (79, 100), &[])?;
        let mut erin = Bot::connect(addr)?;
        login_seeing(&mut erin, "erin", (100, 79), &[])?;
        let mut frank = Bot::connect(addr)?;
        login_seeing(&mut frank, "frank", (79, 79), &[])?;
        for bot in [&mut alice, &mut bob, &mut carol, &mut dave, &mut erin, &mut frank] {
            bot.expect_quiet().context("nobody 21 cells away is announced")?;
        }

        // Placement without a spawn: somewhere on the map, seeing exactly who is in sight.
        let mut gina = Bot::connect(addr)?;
        let login = gina.login("gina", None)?;
        let p = login.ok.position.context("LoginOk without a position")?;
        ensure!(p.x < MAP && p.y < MAP, "placed off the map: {p:?}");
        let expected: BTreeSet<u64> = [&alice, &bob, &carol, &dave, &erin, &frank]
            .iter()
            .filter(|b| in_sight(b.view().own_position().unwrap(), (p.x, p.y)))
            .map(|b| b.id())
            .collect();
        ensure!(
            login.entered_ids() == expected,
            "gina placed at {p:?} should see {expected:?}, got {:?}",
            login.after
        );

        let ids: BTreeSet<u64> =
            [&alice, &bob, &carol, &dave, &erin, &frank, &gina].iter().map(|b| b.id()).collect();
        ensure!(ids.len() == 7, "player ids are unique: {ids:?}");
        // Checked last so that a missing token does not hide the sight checks above.
        ensure!(!ok.resume_token.is_empty(), "LoginOk carries a resume token: {ok:?}");
        Ok(())
    })
}

pub fn moves_into_and_out_of_sight(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let mut alice = Bot::connect(addr)?;
        login_seeing(&mut alice, "alice", (100, 100), &[])?;
        let mut bob = Bot::connect(addr)?;
        login_seeing(&mut bob, "bob", (79, 100), &[])?;
        let mut carol = Bot::connect(addr)?;
        login_seeing(&mut carol, "carol", (121, 121), &[])?;

        // bob: 21 -> 20 along x. Both get Entered; the mover's ack and its Entered may come
        // in either order.
        bob.send_move(Direction::Right, 1)?;
        bob.expect_messages(&[ack(&bob, 80, 100, 1), entered(&alice, 100, 100)])?;
        alice.expect_messages(&[entered(&bob, 80, 100)])?;

        // In sight: the observer gets Moved with client_time 0, the mover its ack.
        bob.send_move(Direction::Right, 2)?;
        bob.expect_messages(&[ack(&bob, 81, 100, 2)])?;
        alice.expect_messages(&[seen_moving(&bob, 81, 100)])?;
        alice.send_move(Direction::Left, 1)?;
        alice.expect_messages(&[ack(&alice, 99, 100, 1)])?;
        bob.expect_messages(&[seen_moving(&alice, 99, 100)])?;
        alice.send_move(Direction::Right, 2)?;
        alice.expect_messages(&[ack(&alice, 100, 100, 2)])?;
        bob.expect_messages(&[seen_moving(&alice, 100, 100)])?;
        bob.send_move(Direction::Left, 3)?;
        bob.expect_messages(&[ack(&bob, 80, 100, 3)])?;
        alice.expect_messages(&[seen_moving(&bob, 80, 100)])?;

        // 20 -> 21: Left both ways.
        bob.send_move(Direction::Left, 4)?;
        bob.expect_messages(&[ack(&bob, 79, 100, 4), left(&alice)])?;
        alice.expect_messages(&[left(&bob)])?;

        // carol, 21 away diagonally: still 21 along x after moving up, then 20 both ways.
        carol.send_move(Direction::Up, 1)?;
        carol.expect_messages(&[ack(&carol, 121, 120, 1)])?;
        alice.expect_quiet()?;
        carol.send_move(Direction::Left, 2)?;
        carol.expect_messages(&[ack(&carol, 120, 120, 2), entered(&alice, 100, 100)])?;
        alice.expect_messages(&[entered(&carol, 120, 120)])?;
        // And out again along y.
        carol.send_move(Direction::Down, 3)?;
        carol.expect_messages(&[ack(&carol, 120, 121, 3), left(&alice)])?;
        alice.expect_messages(&[left(&carol)])?;

        bob.expect_quiet()?;
        ensure!(alice.view().others().is_empty(), "alice sees nobody: {:?}", alice.view());
        Ok(())
    })
}

pub fn clamped_moves_at_the_edge(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        for (corner, observer_at, blocked, free, after_free) in [
            ((0, 0), (10, 10), [Direction::Up, Direction::Left], Direction::Right, (1, 0)),
            (
                (399, 399),
                (390, 390),
                [Direction::Down, Direction::Right],
                Direction::Left,
                (398, 399),
            ),
        ] {
            let mut mover = Bot::connect(addr)?;
            login_seeing(&mut mover, &format!("mover-{}", corner.0), corner, &[])?;
            let mut observer = Bot::connect(addr)?;
            login_seeing(&mut observer, &format!("observer-{}", corner.0), observer_at, &[&mover])?;
            mover.expect_messages(&[entered(&observer, observer_at.0, observer_at.1)])?;

            for (t, direction) in (1..).zip(blocked) {
                // Acknowledged with the unchanged position.
                mover.send_move(direction, t)?;
                mover.expect_messages(&[ack(&mover, corner.0, corner.1, t)])?;
            }
            observer.expect_quiet().context("observers get nothing for a clamped move")?;

            // Per subject, notifications keep the subject's event order: had anything been
            // sent for the clamped moves, it would arrive before this one.
            mover.send_move(free, 3)?;
            mover.expect_messages(&[ack(&mover, after_free.0, after_free.1, 3)])?;
            observer.expect_messages(&[seen_moving(&mover, after_free.0, after_free.1)])?;
        }
        Ok(())
    })
}

pub fn chat_reaches_those_in_sight(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let mut alice = Bot::connect(addr)?;
        login_seeing(&mut alice, "alice", (100, 100), &[])?;
        let mut bob = Bot::connect(addr)?;
        login_seeing(&mut bob, "bob", (120, 100), &[&alice])?;
        // carl sees bob (1 away) but not alice (21 away).
        let mut carl = Bot::connect(addr)?;
        login_seeing(&mut carl, "carl", (121, 100), &[&bob])?;
        alice.expect_messages(&[entered(&bob, 120, 100)])?;
        bob.expect_messages(&[entered(&carl, 121, 100)])?;

        let text = "hello from alice, grüße ✓";
        alice.chat(text)?;
        alice.expect_messages(&[chat_from(&alice, text)])?;
        bob.expect_messages(&[chat_from(&alice, text)])?;
        carl.expect_quiet().context("chat is not heard 21 cells away")?;

        bob.chat("bob here")?;
        for bot in [&mut alice, &mut carl] {
            bot.expect_messages(&[chat_from(&bob, "bob here")])?;
        }
        bob.expect_messages(&[chat_from(&bob, "bob here")])?;

        carl.chat("carl here")?;
        carl.expect_messages(&[chat_from(&carl, "carl here")])?;
        bob.expect_messages(&[chat_from(&carl, "carl here")])?;
        alice.expect_quiet()?;
        Ok(())
    })
}

pub fn logout_and_abrupt_disconnects(io: Front) {
    with_cluster(ClusterOptions::new(io), |cluster| {
        let addr = cluster.client_addr(0);
        let mut observer = Bot::connect(addr)?;
        login_seeing(&mut observer, "observer", (110, 100), &[])?;
        let mut alice = Bot::connect(addr)?;
        login_seeing(&mut alice, "alice", (100, 100), &[&observer])?;
        // bob is 20 from alice, carl 10 from everyone.
        let mut bob = Bot::connect(addr)?;
        login_seeing(&mut bob, "bob", (120, 100), &[&observer, &alice])?;
        let mut carl = Bot::connect(addr)?;
        login_seeing(&mut carl, "carl", (110, 110), &[&observer, &alice, &bob])?;
        observer.expect_messages(&[
            entered(&alice, 100, 100),
            entered(&bob, 120, 100),
            entered(&carl, 110, 110),
        ])?;
        alice.expect_messages(&[entered(&bob, 120, 100), entered(&carl, 110, 110)])?;
        bob.expect_messages(&[entered(&carl, 110, 110)])?;

        // Logout: observers get Left, then the server closes the connection.
        alice.send(&meridian_testkit::msg::logout())?;
        for bot in [&mut observer, &mut bob, &mut carl] {
            bot.expect_messages(&[left(&alice)])?;
        }
        let before_close = alice.expect_closed(deadline(DEFAULT_WAIT))?;
        ensure!(
            before_close.is_empty(),
            "nothing is owed to a client that logged out, got {before_close:?}"
        );

        // A clean close without Logout (FIN): Left within a second.
        let bob_id = bob.id();
        let closed_at = std::time::Instant::now();
        bob.disconnect();
        for bot in [&mut observer, &mut carl] {
            let got = bot.recv(closed_at + Duration::from_secs(1)).with_context(|| {
                format!("{} expecting Left for bob within 1 s of his disconnect", bot.label())
            })?;
            ensure!(
                got == meridian_protocol::server::left(bob_id),
                "expected Left bob, got {got:?}"
            );
        }

        // A reset (a crashed client): Left within a second.
        let carl_id = carl.id();
        let reset_at = std::time::Instant::now();
        carl.reset()?;
        let got = observer
            .recv(reset_at + Duration::from_secs(1))
            .context("observer expecting Left for carl within 1 s of his connection reset")?;
        ensure!(got == meridian_protocol::server::left(carl_id), "expected Left carl, got {got:?}");

        observer.expect_quiet()?;
        ensure!(observer.view().others().is_empty(), "{:?}", observer.view());
        Ok(())
    })
}
