//! A game across shard borders, end to end: `meridian up --game wolves` on 4 shards (the map
//! in quadrants: shard 1 owns x < 200, y < 200 and shard 3 x >= 200, y < 200; too few
//! players for the balancer to move the borders), bots that summon wolves, flee, fight and
//! watch. Wolves come only when summoned (`MERIDIAN_WOLVES_PER_SHARD=0`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{server_message::Kind as S, Direction, ErrorCode, ServerMessage};
use meridian_testkit::{deadline, http_get, msg, wait_until, Bot, Cluster, ClusterOptions, Io};
use meridian_wolves::{health, ATTACK, BITE, SUMMON, WOLF};

use crate::with_cluster;

fn wolves_on_four_shards() -> ClusterOptions {
    ClusterOptions::new(Io::Uring)
        .shards(4)
        .arg("--game")
        .arg("wolves")
        .env("MERIDIAN_WOLVES_PER_SHARD", "0")
}

/// Summons a wolf at `(dx, dy)` from the bot; its id.
fn summon(bot: &mut Bot, dx: i32, dy: i32, client_time: u64) -> anyhow::Result<u64> {
    bot.send(&msg::action(SUMMON, 0, format!("{dx},{dy}").as_bytes(), client_time))?;
    let got = bot.recv_until(deadline(Duration::from_secs(5)), "the summon's answer", |m| {
        answers(m, client_time)
    })?;
    match &got.last().and_then(|m| m.kind.clone()) {
        Some(S::ActionDone(done)) => {
            let id = String::from_utf8_lossy(&done.payload).parse().context("a wolf's id")?;
            Ok(id)
        }
        other => bail!("{} summoning a wolf: {other:?}", bot.label()),
    }
}

/// Whether `message` answers the action or move sent with `client_time`.
fn answers(message: &ServerMessage, client_time: u64) -> bool {
    match &message.kind {
        Some(S::ActionDone(done)) => done.client_time == client_time,
        Some(S::Error(error)) => error.client_time == client_time,
        Some(S::Moved(moved)) => moved.client_time == client_time,
        _ => false,
    }
}

/// Reads what comes for `period`; the messages.
pub(crate) fn listen(bot: &mut Bot, period: Duration) -> anyhow::Result<Vec<ServerMessage>> {
    let until = Instant::now() + period;
    let mut got = Vec::new();
    while let Some(message) = bot.recv_timeout(until)? {
        got.push(message);
    }
    Ok(got)
}

/// Bites from `wolf` among `messages`.
fn bites(messages: &[ServerMessage], wolf: u64) -> usize {
    messages
        .iter()
        .filter(|m| matches!(&m.kind, Some(S::Event(e)) if e.kind == BITE && e.source == wolf))
        .count()
}

/// `Entered` and `Left` about `entity` among `messages`, in order.
fn arrivals_and_departures(messages: &[ServerMessage], entity: u64) -> Vec<&'static str> {
    messages
        .iter()
        .filter_map(|m| match &m.kind {
            Some(S::Entered(e)) if e.player_id == entity => Some("entered"),
            Some(S::Left(l)) if l.player_id == entity => Some("left"),
            _ => None,
        })
        .collect()
}

/// Which shards list `npc` among the NPCs they own (`/players`).
fn owners_of(cluster: &Cluster, npc: u64) -> anyhow::Result<Vec<u32>> {
    let mut owners = Vec::new();
    for shard in cluster.shards() {
        let Ok((200, body)) = http_get(shard.admin, "/players") else { continue };
        let report: serde_json::Value = serde_json::from_str(&body)?;
        let npcs = report["npcs"].as_array().with_context(|| format!("npcs in {report}"))?;
        if npcs.iter().any(|n| n["id"].as_u64() == Some(npc)) {
            owners.push(shard.id);
        }
    }
    Ok(owners)
}

fn shard_id_owning(cluster: &Cluster, x: u32, y: u32) -> anyhow::Result<u32> {
    let status = cluster.status_json()?;
    let regions = status["partition"]["regions"].as_array().context("regions in the status")?;
    for region in regions {
        let get = |k: &str| region[k].as_u64().unwrap_or(0) as u32;
        if (get("x0")..get("x1")).contains(&x) && (get("y0")..get("y1")).contains(&y) {
            return Ok(get("shard"));
        }
    }
    bail!("no region holds ({x}, {y}): {status}")
}

/// A wolf chases a player from shard 1 into shard 3 and keeps biting on the other side;
/// observers on both sides see one continuous wolf, with no `Left`/`Entered` flicker as it
/// is handed over.
#[test]
fn a_wolf_chases_a_player_across_a_border_and_keeps_biting() {
    with_cluster(wolves_on_four_shards(), |cluster| {
        ensure!(shard_id_owning(cluster, 199, 100)? != shard_id_owning(cluster, 200, 100)?);
        let mut carol = Bot::connect(cluster.client_addr(0))?;
        carol.login("carol", Some((185, 100)))?;
        let mut dave = Bot::connect(cluster.client_addr(0))?;
        dave.login("dave", Some((215, 100)))?;
        let mut alice = Bot::connect(cluster.client_addr(0))?;
        alice.login("alice", Some((196, 100)))?;
        let wolf = summon(&mut alice, -3, 0, 1)?;
        let mut seen = listen(&mut alice, Duration::from_millis(500))?;
        // Alice flees east one cell per 500 ms, into shard 3's region, and stops at 206.
        let mut t = 10;
        while alice.view().own_position().is_some_and(|(x, _)| x < 206) {
            t += 1;
            alice.send(&msg::move_(Direction::Right, t))?;
            seen.extend(listen(&mut alice, Duration::from_millis(500))?);
        }
        // The wolf follows her over the border...
        wait_until(deadline(Duration::from_secs(5)), "the wolf to cross the border", || {
            seen.extend(listen(&mut alice, Duration::from_millis(100)).unwrap_or_default());
            alice.view().position_of(wolf).is_some_and(|(x, _)| x >= 200)
        })?;
        let wolf_at = alice.view().position_of(wolf).context("the wolf in alice's view")?;
        let owner = shard_id_owning(cluster, wolf_at.0, wolf_at.1)?;
        wait_until(deadline(Duration::from_secs(3)), "shard 3 to own the wolf", || {
            owners_of(cluster, wolf).is_ok_and(|o| o == [owner])
        })?;
        // ...and goes on biting there: bites and health changes keep coming.
        let hp_before = health(alice.view().own_state()).context("alice's health")?.0;
        let after = listen(&mut alice, Duration::from_secs(4))?;
        ensure!(
            bites(&after, wolf) >= 2,
            "alice was bitten {} times in 4 s after the wolf crossed: {after:?}",
            bites(&after, wolf)
        );
        let hp_after = health(alice.view().own_state()).context("alice's health")?.0;
        ensure!(hp_after != hp_before, "alice's health stays at {hp_before} while the wolf bites");
        ensure!(bites(&seen, wolf) >= 1, "bitten before the border too: {seen:?}");

        // Carol (west) saw the wolf the whole time; Dave (east) from when it came into his
        // sight: each exactly one Entered, never a Left.
        let carol_saw = listen(&mut carol, Duration::from_millis(500))?;
        ensure!(
            arrivals_and_departures(&carol_saw, wolf) == ["entered"],
            "carol saw the wolf come and go: {:?}",
            arrivals_and_departures(&carol_saw, wolf)
        );
        let dave_saw = listen(&mut dave, Duration::from_millis(500))?;
        ensure!(
            arrivals_and_departures(&dave_saw, wolf) == ["entered"],
            "dave saw the wolf come and go: {:?}",
            arrivals_and_departures(&dave_saw, wolf)
        );
        let entered = dave_saw.iter().find_map(|m| match &m.kind {
            Some(S::Entered(e)) if e.player_id == wolf => Some(e.clone()),
            _ => None,
        });
        let entered = entered.context("dave's Entered for the wolf")?;
        ensure!(entered.kind == WOLF, "a wolf enters as kind {WOLF}: {entered:?}");
        ensure!(health(&entered.state).is_some(), "with its health: {entered:?}");
        Ok(())
    })
}

/// A player on shard 3 kills a wolf that stands on shard 1: each attack is carried out by
/// the wolf's shard and answered through the player's, in order.
#[test]
fn a_player_kills_a_wolf_standing_across_a_border() {
    with_cluster(wolves_on_four_shards(), |cluster| {
        let mut bob = Bot::connect(cluster.client_addr(0))?;
        bob.login("bob", Some((199, 150)))?;
        let wolf = summon(&mut bob, -1, 0, 1)?;
        // Bob steps over the border; the wolf follows to the last cell of its side.
        bob.send(&msg::move_(Direction::Right, 2))?;
        let mut seen = Vec::new();
        wait_until(deadline(Duration::from_secs(5)), "the wolf at the border", || {
            seen.extend(listen(&mut bob, Duration::from_millis(100)).unwrap_or_default());
            bob.view().own_position() == Some((200, 150))
                && bob.view().position_of(wolf) == Some((199, 150))
        })?;
        ensure!(owners_of(cluster, wolf)? == [shard_id_owning(cluster, 199, 150)?]);
        let mut answers_got = Vec::new();
        for t in 10..13 {
            bob.send(&msg::action(ATTACK, wolf, b"", t))?;
            let got =
                bob.recv_until(deadline(Duration::from_secs(5)), "the attack's answer", |m| {
                    answers(m, t)
                })?;
            seen.extend(got.iter().cloned());
            match &got.last().and_then(|m| m.kind.clone()) {
                Some(S::ActionDone(done)) => {
                    answers_got.push(String::from_utf8_lossy(&done.payload).into_owned())
                }
                other => bail!("attack {t}: {other:?}"),
            }
        }
        ensure!(
            answers_got == [r#"{"hp":6}"#, r#"{"hp":2}"#, "killed"],
            "the wolf's health as the attacks landed: {answers_got:?}"
        );
        seen.extend(listen(&mut bob, Duration::from_millis(500))?);
        ensure!(
            arrivals_and_departures(&seen, wolf).last() == Some(&"left"),
            "the dead wolf leaves bob's view: {seen:?}"
        );
        ensure!(owners_of(cluster, wolf)?.is_empty(), "no shard owns the dead wolf");
        Ok(())
    })
}

/// A shard holding NPCs and players is killed with SIGKILL: its players are restored as
/// always (ViewReset); a wolf that stood near a border comes back on the new owner of its
/// cell, restored from the neighbour's copy (same id, same kind and health); one deep inside
/// the dead shard's region, mirrored nowhere, is gone (the game's population repopulates).
#[test]
fn npcs_near_a_border_come_back_after_their_shard_is_killed() {
    let opts = wolves_on_four_shards().arg("--lease-ttl").arg("2s");
    with_cluster(opts, |cluster| {
        let west = shard_id_owning(cluster, 100, 100)?;
        let index = cluster.shards().iter().position(|s| s.id == west).context("shard 1")?;
        let mut eve = Bot::connect(cluster.client_addr(0))?;
        eve.login("eve", Some((194, 100)))?;
        let mut gina = Bot::connect(cluster.client_addr(0))?;
        gina.login("gina", Some((100, 100)))?;
        let near = summon(&mut eve, 3, 0, 1)?;
        let deep = summon(&mut gina, 3, 0, 1)?;
        listen(&mut eve, Duration::from_millis(800))?;
        listen(&mut gina, Duration::from_millis(300))?;
        ensure!(owners_of(cluster, near)? == [west] && owners_of(cluster, deep)? == [west]);

        cluster.kill_shard(index)?;
        let mut eve_got = Vec::new();
        wait_until(deadline(Duration::from_secs(20)), "eve restored, seeing her wolf", || {
            eve_got.extend(listen(&mut eve, Duration::from_millis(200)).unwrap_or_default());
            let reset = eve_got.iter().any(|m| matches!(m.kind, Some(S::ViewReset(_))));
            reset && eve.view().sees(near)
        })?;
        let owners: BTreeMap<u64, Vec<u32>> =
            [(near, owners_of(cluster, near)?), (deep, owners_of(cluster, deep)?)].into();
        ensure!(owners[&near].len() == 1, "the near wolf has one owner: {owners:?}");
        ensure!(!owners[&near].contains(&west), "not the dead shard: {owners:?}");
        ensure!(owners[&deep].is_empty(), "the deep wolf died with its shard: {owners:?}");
        let seen = &eve.view().others()[&near];
        ensure!(seen.kind == WOLF && health(&seen.state).is_some(), "as it was: {seen:?}");
        // It is alive: it goes on biting eve.
        let later = listen(&mut eve, Duration::from_secs(3))?;
        ensure!(bites(&later, near) >= 1, "the restored wolf bites: {later:?}");
        Ok(())
    })
}

/// NPCs drain with their shard: `meridian drain` hands them to the shards that take its
/// region, like its players, and nothing of them is lost.
#[test]
fn npcs_are_drained_with_their_shard() {
    with_cluster(wolves_on_four_shards(), |cluster| {
        let west = shard_id_owning(cluster, 100, 100)?;
        let mut hana = Bot::connect(cluster.client_addr(0))?;
        hana.login("hana", Some((100, 100)))?;
        let wolf = summon(&mut hana, 0, 3, 1)?;
        ensure!(owners_of(cluster, wolf)? == [west]);
        meridian_testkit::drain_shard(cluster, west, Duration::from_secs(30))?;
        wait_until(deadline(Duration::from_secs(10)), "another shard to own the wolf", || {
            owners_of(cluster, wolf).is_ok_and(|o| o.len() == 1 && o[0] != west)
        })?;
        let got = listen(&mut hana, Duration::from_millis(500))?;
        ensure!(
            arrivals_and_departures(&got, wolf).is_empty(),
            "hana saw the wolf leave or come back while it changed shards: {got:?}"
        );
        ensure!(hana.view().sees(wolf), "and still sees it");
        Ok(())
    })
}

/// SUMMON has a budget (issue 31, item 9): 3 at once, then 1 a second, and at most 5
/// summoned wolves alive per player, so a real cluster refuses the sixth summon of a player
/// whose five wolves live, and counts the refusals with the shard's rejected actions.
#[test]
fn a_player_may_have_five_summoned_wolves_and_no_sixth() {
    with_cluster(wolves_on_four_shards(), |cluster| {
        let mut kim = Bot::connect(cluster.client_addr(0))?;
        kim.login("kim", Some((100, 100)))?;
        let offsets = [(3, 0), (3, 1), (3, -1), (-3, 0), (-3, 1)];
        let mut wolves = Vec::new();
        let mut too_fast = 0;
        let mut client_time = 0;
        let mut answer = |kim: &mut Bot, (dx, dy): (i32, i32)| {
            client_time += 1;
            let t = client_time;
            kim.send(&msg::action(SUMMON, 0, format!("{dx},{dy}").as_bytes(), t))?;
            let got =
                kim.recv_until(deadline(Duration::from_secs(5)), "an answer", |m| answers(m, t))?;
            anyhow::Ok(got.last().and_then(|m| m.kind.clone()))
        };
        // Summons as fast as it is allowed to, waiting for the rate where it must.
        let until = deadline(Duration::from_secs(10));
        while wolves.len() < offsets.len() {
            ensure!(Instant::now() < until, "five wolves within 10 s: {wolves:?}");
            match answer(&mut kim, offsets[wolves.len()])? {
                Some(S::ActionDone(done)) => wolves.push(String::from_utf8(done.payload)?),
                Some(S::Error(error)) if error.detail.contains("too fast") => {
                    too_fast += 1;
                    listen(&mut kim, Duration::from_millis(200))?;
                }
                other => bail!("summon {}: {other:?}", wolves.len() + 1),
            }
        }
        ensure!(too_fast >= 1, "the fourth summon, at once, is too fast");
        // A second later the rate has a token again, but five are alive.
        listen(&mut kim, Duration::from_millis(1100))?;
        match answer(&mut kim, (0, 3))? {
            Some(S::Error(error)) => ensure!(
                error.code == ErrorCode::Rejected as i32 && error.detail.contains("5 alive"),
                "the sixth: {error:?}"
            ),
            other => bail!("the sixth summon was not refused: {other:?}"),
        }
        let mut rejected = 0;
        for shard in cluster.shards() {
            let Ok((200, body)) = http_get(shard.admin, "/metrics") else { continue };
            rejected += body
                .lines()
                .filter(|l| l.starts_with("meridian_shard_actions_rejected_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        ensure!(rejected > too_fast, "{rejected} rejected actions counted, {too_fast} + 1 sent");
        Ok(())
    })
}

/// A player's private game state (the wolves' kill count) moves with it across a border
/// and is saved with it in the player store when it logs out.
#[test]
fn a_players_private_state_moves_with_it_and_is_saved() {
    let data = std::env::temp_dir().join(format!("meridian-e2e-game-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let store = format!("sqlite:{}", data.join("players.sqlite").display());
    let opts = wolves_on_four_shards().arg("--data-dir").arg(data.display().to_string());
    with_cluster(opts, |cluster| {
        let mut ivy = Bot::connect(cluster.client_addr(0))?;
        ivy.login("ivy", Some((199, 150)))?;
        let wolf = summon(&mut ivy, -1, 0, 1)?;
        for t in 2..5 {
            ivy.send(&msg::action(ATTACK, wolf, b"", t))?;
            ivy.recv_until(deadline(Duration::from_secs(5)), "the attack's answer", |m| {
                answers(m, t)
            })?;
        }
        // Over the border: shard 3 owns ivy now, and the kill she made on shard 1 with her.
        ensure!(ivy.move_ok(Direction::Right, 5)? == (200, 150));
        ivy.send(&msg::logout())?;
        ivy.expect_closed(deadline(Duration::from_secs(10)))?;
        let output = std::process::Command::new(crate::meridian_bin())
            .args(["player", "show", "ivy", "--store", &store])
            .args(["--cluster", cluster.cluster_name(), "--etcd", cluster.etcd_url()])
            .output()?;
        let shown = String::from_utf8_lossy(&output.stdout).into_owned();
        let kills = r#"{"kills":1}"#.len();
        ensure!(
            shown.contains(&format!("state {kills} bytes")),
            "ivy's kill saved with her: {shown}"
        );
        Ok(())
    })
}
