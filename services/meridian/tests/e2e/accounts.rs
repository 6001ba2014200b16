//! Accounts keep their player (issue 12): gateways given a player store (`--store`) look up
//! each login's account there. The same account gets the same `player_id` every time it
//! logs in, other accounts other ids; in dev mode the account of a Login without a token is
//! its name. Run with the SQLite default and with a real PostgreSQL of the test's own, which
//! is then stopped: logins get `UNAVAILABLE` (the connection stays open) until it is back.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::pb::{client_message::Kind as C, server_message::Kind as S, ErrorCode};
use meridian_testkit::pb::{ClientMessage, Direction, Login, Position};
use meridian_testkit::{Bot, ClusterOptions, GameAddr, Io, TempPostgres};

use crate::with_cluster;

/// Logs in on a fresh connection (token from `meridian token` unless `dev_name` is given,
/// then no token and that name); the LoginOk's player id, or the Error's code.
fn login(
    addr: GameAddr,
    account: &str,
    dev_name: Option<&str>,
) -> anyhow::Result<(Bot, Result<u64, i32>)> {
    let (bot, answer) = login_at(addr, account, dev_name, Some((20, 20)))?;
    Ok((bot, answer.map(|(id, _)| id)))
}

/// As [`login`], at `spawn` (None: wherever the cluster puts the player); the LoginOk's
/// player id and position.
#[allow(clippy::type_complexity)]
fn login_at(
    addr: GameAddr,
    account: &str,
    dev_name: Option<&str>,
    spawn: Option<(u32, u32)>,
) -> anyhow::Result<(Bot, Result<(u64, (u32, u32)), i32>)> {
    let token = match dev_name {
        Some(_) => String::new(),
        None => {
            let output = std::process::Command::new(crate::meridian_bin())
                .args(["token", "--sub", account])
                .output()?;
            String::from_utf8(output.stdout)?.trim().to_string()
        }
    };
    let name = dev_name.unwrap_or("client-name").to_string();
    let mut bot = Bot::connect(addr)?;
    let spawn = spawn.map(|(x, y)| Position { x, y });
    bot.send(&ClientMessage { kind: Some(C::Login(Login { name, spawn, token })) })?;
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        match bot.recv(by)?.kind {
            Some(S::LoginOk(ok)) => {
                let at = ok.position.map_or((0, 0), |p| (p.x, p.y));
                return Ok((bot, Ok((ok.player_id, at))));
            }
            Some(S::Error(e)) => return Ok((bot, Err(e.code))),
            _ => continue,
        }
    }
}

/// Logs in, then out (the server closes the connection), and returns the player id.
fn login_and_out(addr: GameAddr, account: &str, dev_name: Option<&str>) -> anyhow::Result<u64> {
    let (mut bot, answer) = login(addr, account, dev_name)?;
    let id = answer.map_err(|code| anyhow::anyhow!("{account}: Error {code}"))?;
    bot.send(&meridian_testkit::msg::logout())?;
    bot.expect_closed(Instant::now() + Duration::from_secs(10))?;
    Ok(id)
}

fn accounts_keep_their_ids(addr: GameAddr) -> anyhow::Result<()> {
    let alice = login_and_out(addr, "alice", None)?;
    ensure!(login_and_out(addr, "alice", None)? == alice, "alice again: the same player id");
    let bob = login_and_out(addr, "bob", None)?;
    ensure!(bob != alice, "bob is not alice: {bob}");
    let carol = login_and_out(addr, "", Some("carol"))?;
    ensure!(login_and_out(addr, "", Some("carol"))? == carol, "dev mode: the name's account");
    ensure!(carol != alice && carol != bob, "carol has her own id");
    Ok(())
}

/// A player that moved and logged out comes back where it left: its shard saved it.
fn a_returning_player_is_placed_where_it_left(addr: GameAddr) -> anyhow::Result<()> {
    let (mut bot, answer) = login_at(addr, "dora", None, None)?;
    let (id, start) = answer.map_err(|code| anyhow::anyhow!("dora: Error {code}"))?;
    let mut at = start;
    for client_time in 1..=3 {
        let direction = if start.0 < 200 { Direction::Right } else { Direction::Left };
        at = bot.move_ok(direction, client_time)?;
    }
    ensure!(at != start, "dora moved: {start:?} -> {at:?}");
    bot.send(&meridian_testkit::msg::logout())?;
    bot.expect_closed(Instant::now() + Duration::from_secs(10))?;
    let (_bot, again) = login_at(addr, "dora", None, None)?;
    let (again_id, again_at) = again.map_err(|code| anyhow::anyhow!("dora again: Error {code}"))?;
    ensure!(
        (again_id, again_at) == (id, at),
        "dora back as {again_id} at {again_at:?}, left as {id} at {at:?}"
    );
    Ok(())
}

#[test]
fn accounts_keep_their_player_ids_and_cells_in_sqlite() {
    let dir = std::env::temp_dir().join(format!("meridian-e2e-store-{}", std::process::id()));
    let store = format!("sqlite:{}", dir.join("players.db").display());
    let options = ClusterOptions::new(Io::Uring).shards(2).arg("--store").arg(store);
    with_cluster(options, |cluster| {
        accounts_keep_their_ids(cluster.client_addr(0))?;
        a_returning_player_is_placed_where_it_left(cluster.client_addr(0))
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn accounts_keep_their_player_ids_in_postgres_and_logins_wait_out_an_outage() {
    let mut pg = TempPostgres::start().expect("a PostgreSQL server of the test's own");
    let options = ClusterOptions::new(Io::Uring).shards(1).arg("--store").arg(pg.url());
    with_cluster(options, |cluster| {
        let addr = cluster.client_addr(0);
        accounts_keep_their_ids(addr)?;
        let alice = login_and_out(addr, "alice", None)?;
        pg.stop()?;
        let (mut bot, answer) = login(addr, "alice", None)?;
        ensure!(answer == Err(ErrorCode::Unavailable as i32), "store down: {answer:?}");
        pg.restart()?;
        // The same connection, still open, logs in once the store is back.
        let token = String::from_utf8(
            std::process::Command::new(crate::meridian_bin())
                .args(["token", "--sub", "alice"])
                .output()?
                .stdout,
        )?;
        let login = Login { name: "a".into(), spawn: None, token: token.trim().into() };
        bot.send(&ClientMessage { kind: Some(C::Login(login)) })?;
        let by = Instant::now() + Duration::from_secs(10);
        let id = loop {
            match bot.recv(by).context("after the store came back")?.kind {
                Some(S::LoginOk(ok)) => break ok.player_id,
                Some(S::Error(e)) => anyhow::bail!("after the store came back: {e:?}"),
                _ => continue,
            }
        };
        ensure!(id == alice, "alice keeps her id across the outage: {id} != {alice}");
        a_returning_player_is_placed_where_it_left(addr)
    });
}

/// Waits for `bot`'s Error REPLACED and the close after it.
fn expect_replaced(bot: &mut Bot, who: &str) -> anyhow::Result<()> {
    let by = Instant::now() + Duration::from_secs(10);
    let rest = bot.expect_closed(by).with_context(|| format!("{who}: closed after REPLACED"))?;
    let replaced = rest
        .iter()
        .any(|m| matches!(&m.kind, Some(S::Error(e)) if e.code == ErrorCode::Replaced as i32));
    ensure!(replaced, "{who}: closed without REPLACED; got {rest:?}");
    Ok(())
}

/// One account is online once (DESIGN 2b, Accounts): a second login of the account, here
/// through another gateway, takes the player over where it stands; the first connection
/// gets REPLACED and is closed. A login after a dropped connection takes over the parked
/// player the same way, and a third login replaces the second.
#[test]
fn a_second_login_of_an_account_replaces_the_first() {
    let options = ClusterOptions::new(Io::Uring).shards(2).gateways(2);
    with_cluster(options, |cluster| {
        let (first_gw, second_gw) = (cluster.client_addr(0), cluster.client_addr(1));
        let (mut first, answer) = login_at(first_gw, "erin", None, None)?;
        let (id, start) = answer.map_err(|code| anyhow::anyhow!("erin: Error {code}"))?;
        let mut at = start;
        for client_time in 1..=3 {
            let direction = if start.0 < 200 { Direction::Right } else { Direction::Left };
            at = first.move_ok(direction, client_time)?;
        }
        let (mut second, again) = login_at(second_gw, "erin", None, None)?;
        let again = again.map_err(|code| anyhow::anyhow!("erin again: Error {code}"))?;
        ensure!(again == (id, at), "the second login took over {again:?}, erin was {id} at {at:?}");
        expect_replaced(&mut first, "the first connection")?;
        // The second connection plays on.
        let direction = if at.0 < 200 { Direction::Right } else { Direction::Left };
        let moved = second.move_ok(direction, 1)?;
        ensure!(moved != at, "the second connection moves the player: {at:?} -> {moved:?}");
        // Dropped (no logout): parked, then taken over by the next login.
        drop(second);
        let (mut third, answer) = login_at(first_gw, "erin", None, None)?;
        let third_at = answer.map_err(|code| anyhow::anyhow!("erin, third: Error {code}"))?;
        ensure!(third_at == (id, moved), "after a drop: {third_at:?}, expected {:?}", (id, moved));
        let (_fourth, answer) = login_at(second_gw, "erin", None, None)?;
        ensure!(answer == Ok((id, moved)), "the fourth login: {answer:?}");
        expect_replaced(&mut third, "the third connection")
    });
}

/// Issue 31 item 4: two logins of one new account at once, through two gateways, spawning
/// in two shards' regions. Each gateway finds the player nowhere and places its login, so
/// both are seated; the shards' claims end the older one (REPLACED, closed) and the later
/// plays on. Five accounts, each raced once.
#[test]
fn racing_logins_of_a_new_account_end_as_one_player() {
    let options = ClusterOptions::new(Io::Uring).shards(2).gateways(2);
    with_cluster(options, |cluster| {
        let gateways = [cluster.client_addr(0), cluster.client_addr(1)];
        for round in 0..5u32 {
            let name = format!("racer-{round}");
            let start = std::sync::Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = [(0usize, (50u32, 200u32)), (1, (350, 200))]
                .into_iter()
                .map(|(gateway, spawn)| {
                    let (start, name, addr) = (start.clone(), name.clone(), gateways[gateway]);
                    std::thread::spawn(move || {
                        start.wait();
                        login_at(addr, &name, Some(&name), Some(spawn))
                    })
                })
                .collect();
            let mut bots = Vec::new();
            let mut ids = Vec::new();
            let mut answers = Vec::new();
            for racer in racers {
                let (bot, answer) = racer.join().expect("the racer thread ends")?;
                answers.push(answer);
                match answer {
                    Ok((id, _)) => ids.push(id),
                    // Placed after the other's claim arrived: refused at once.
                    Err(code) => {
                        ensure!(code == ErrorCode::Replaced as i32, "{name}: Error {code}")
                    }
                }
                bots.push(bot);
            }
            ensure!(!ids.is_empty(), "{name}: neither login got LoginOk");
            ensure!(ids.windows(2).all(|w| w[0] == w[1]), "{name}: two player ids {ids:?}");
            // Whichever lost hears REPLACED and is closed; read both until one has.
            let by = Instant::now() + Duration::from_secs(10);
            let mut loser = None;
            while loser.is_none() && Instant::now() < by {
                for (i, bot) in bots.iter_mut().enumerate() {
                    let soon = Instant::now() + Duration::from_millis(50);
                    match bot.recv_timeout(soon) {
                        Ok(Some(m)) if matches!(&m.kind, Some(S::Error(e)) if e.code == ErrorCode::Replaced as i32) =>
                        {
                            loser = Some(i);
                        }
                        Ok(_) => {}
                        // Closed: refused at login (its REPLACED was read above).
                        Err(_) => loser = Some(i),
                    }
                    if loser.is_some() {
                        break;
                    }
                }
            }
            let loser = loser.with_context(|| format!("{name}: both logins still play"))?;
            let mut winner = bots.swap_remove(1 - loser);
            // The later login plays on as the one player of the account.
            if let Err(error) = winner.move_ok(Direction::Up, 1) {
                anyhow::bail!(
                    "{name}: the winner moves (logins {answers:?}, loser {loser}): {error:#}"
                );
            }
            let (_again, answer) = login_at(gateways[0], &name, Some(&name), None)?;
            ensure!(
                answer.map(|(id, _)| id) == Ok(ids[0]),
                "{name}: a later login finds the one player: {answer:?}"
            );
            expect_replaced(&mut winner, "the winner, taken over by the later login")?;
        }
        Ok(())
    });
}
