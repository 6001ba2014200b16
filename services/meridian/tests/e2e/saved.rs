//! Player state that survives (issue 12, item 5): a whole cluster stopped and started again
//! with the same data directory brings every account back where it was; a shard killed
//! together with its player's gateway loses at most the moves since that player's last
//! save, the recovery-point objective README.md states.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{client_message::Kind as C, server_message::Kind as S};
use meridian_testkit::pb::{ClientMessage, Direction, Login};
use meridian_testkit::{Bot, Cluster, ClusterOptions, GameAddr, Io, TempPostgres};

use crate::meridian_bin;

/// A token of `meridian token` for `account`.
pub(crate) fn token(account: &str) -> anyhow::Result<String> {
    let output =
        std::process::Command::new(meridian_bin()).args(["token", "--sub", account]).output()?;
    ensure!(output.status.success(), "meridian token: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?.trim().to_string())
}

/// Logs `account` in with its token, without a spawn: the player goes where it was saved
/// (or where the cluster puts a new one). Returns the bot, its id and its cell.
fn log_in(addr: GameAddr, account: &str) -> anyhow::Result<(Bot, u64, (u32, u32))> {
    let mut bot = Bot::connect(addr)?;
    let login = Login { name: "n".into(), spawn: None, token: token(account)? };
    bot.send(&ClientMessage { kind: Some(C::Login(login)) })?;
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        match bot.recv(by).with_context(|| format!("{account}: waiting for LoginOk"))?.kind {
            Some(S::LoginOk(ok)) => {
                let at = ok.position.map_or((0, 0), |p| (p.x, p.y));
                return Ok((bot, ok.player_id, at));
            }
            Some(S::Error(e)) => bail!("{account}: Error {e:?}"),
            _ => continue,
        }
    }
}

/// Steps toward the map's middle column, so a walk never runs into the edge.
fn walk(
    bot: &mut Bot,
    from: (u32, u32),
    steps: u64,
    first_time: u64,
) -> anyhow::Result<Vec<(u32, u32)>> {
    let direction = if from.0 < 200 { Direction::Right } else { Direction::Left };
    let mut path = vec![from];
    for client_time in first_time..first_time + steps {
        path.push(bot.move_ok(direction, client_time)?);
    }
    Ok(path)
}

fn start(options: ClusterOptions) -> Cluster {
    Cluster::start(meridian_bin(), options).unwrap_or_else(|e| panic!("{e:?}"))
}

/// 12 accounts log in and walk; half log out, half are still connected when the cluster is
/// stopped (Ctrl-C, as an operator would). Started again on the same data directory, every
/// account logs in with its player id, at the cell it was last acknowledged at.
fn restart_keeps_every_player(options: impl Fn() -> ClusterOptions) {
    let cluster = start(options());
    let addr = cluster.client_addr(0);
    let mut left = Vec::new();
    let mut connected = Vec::new();
    for n in 0..12 {
        let account = format!("restart-{n}");
        let (mut bot, id, at) = log_in(addr, &account).unwrap_or_else(|e| panic!("{e:?}"));
        let path = walk(&mut bot, at, 3 + n % 4, 1).unwrap_or_else(|e| panic!("{e:?}"));
        let last = *path.last().expect("the walk's start at least");
        if n % 2 == 0 {
            bot.send(&meridian_testkit::msg::logout()).expect("logout sent");
            bot.expect_closed(Instant::now() + Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{account}: {e:?}"));
        } else {
            connected.push(bot);
        }
        left.push((account, id, last));
    }
    cluster.stop().unwrap_or_else(|e| panic!("stopping the cluster: {e:?}"));
    drop(connected);

    let cluster = start(options());
    let addr = cluster.client_addr(0);
    let mut wrong = Vec::new();
    for (account, id, last) in &left {
        let (_bot, again, at) = log_in(addr, account).unwrap_or_else(|e| panic!("{e:?}"));
        if (again, at) != (*id, *last) {
            wrong.push(format!("{account}: back as {again} at {at:?}, left as {id} at {last:?}"));
        }
    }
    cluster.stop().unwrap_or_else(|e| panic!("stopping the cluster again: {e:?}"));
    assert!(wrong.is_empty(), "after the restart:\n{}", wrong.join("\n"));
}

pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(what: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("meridian-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_whole_cluster_restart_brings_every_player_back_with_the_sqlite_default() {
    let data = TempDir::new("restart-sqlite");
    let dir = data.path().display().to_string();
    let name = format!("restart-sqlite-{}", std::process::id());
    restart_keeps_every_player(|| {
        ClusterOptions::new(Io::Uring).shards(2).name(&name).arg("--data-dir").arg(dir.clone())
    });
    assert!(data.path().join("players.sqlite").exists(), "the default store is in the data dir");
}

#[test]
fn a_whole_cluster_restart_brings_every_player_back_from_postgres() {
    let pg = TempPostgres::start().expect("a PostgreSQL server of the test's own");
    let data = TempDir::new("restart-postgres");
    let dir = data.path().display().to_string();
    let name = format!("restart-postgres-{}", std::process::id());
    restart_keeps_every_player(|| {
        ClusterOptions::new(Io::Uring)
            .shards(2)
            .name(&name)
            .arg("--data-dir")
            .arg(dir.clone())
            .arg("--store")
            .arg(pg.url())
    });
}

/// Polls the store until it holds `cell` for `player`.
fn wait_saved(store: &meridian_store::Store, player: u64, cell: (u32, u32)) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        let saved = runtime.block_on(store.load(player))?.and_then(|p| p.saved).map(|s| s.at);
        if saved == Some(cell) {
            return Ok(());
        }
        ensure!(Instant::now() < by, "player {player}: the store holds {saved:?}, not {cell:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The owning shard and the player's gateway are killed together (SIGKILL) after the
/// player walked on past its last save: logging in again through the other gateway, it is
/// back at a cell of its walk no older than that save. Alone, a dead shard loses nothing
/// acknowledged (see `failover`): the gateway restores the player where it was.
#[test]
fn a_shard_killed_with_its_gateway_loses_at_most_the_moves_since_the_last_save() {
    let data = TempDir::new("rpo");
    let options = ClusterOptions::new(Io::Uring)
        .shards(2)
        .gateways(2)
        .arg("--data-dir")
        .arg(data.path().display().to_string())
        .arg("--save-interval")
        .arg("1s");
    crate::with_cluster(options, |cluster| {
        let path = data.path().join("players.sqlite");
        let store = tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(
            meridian_store::Store::open(&meridian_store::Address::parse(&format!(
                "sqlite:{}",
                path.display()
            ))?),
        )?;
        let (mut bot, id, at) = log_in(cluster.client_addr(0), "rpo")?;
        let before = walk(&mut bot, at, 4, 1)?;
        let saved = *before.last().expect("a walk");
        wait_saved(&store, id, saved).context("the periodic save of the first walk")?;
        let after = walk(&mut bot, saved, 4, 5)?;
        // Which shard owns the player now: the one whose /players lists it.
        let owner = (0..cluster.shards().len())
            .find(|&i| {
                let admin = cluster.shard(i).admin;
                meridian_testkit::http_get(admin, "/players")
                    .is_ok_and(|(_, body)| body.contains(&format!("\"id\":{id},")))
            })
            .context("no shard lists the player")?;
        cluster.kill_gateway(0)?;
        cluster.kill_shard(owner)?;
        drop(bot);
        // Through the other gateway once the dead shard's region has a new owner.
        let by = Instant::now() + Duration::from_secs(20);
        let (_bot, again, at) = loop {
            match log_in(cluster.client_addr(1), "rpo") {
                Ok(answer) => break answer,
                Err(error) if Instant::now() < by => {
                    eprintln!("not yet: {error:#}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(error) => return Err(error),
            }
        };
        ensure!(again == id, "the same player: {again} != {id}");
        ensure!(
            after.contains(&at),
            "back at {at:?}: not a cell of the walk since the last save ({after:?})"
        );
        Ok(())
    });
}

/// The sum of a counter family's samples with `label` in a node's /metrics.
fn metric(admin: std::net::SocketAddr, name: &str, label: &str) -> anyhow::Result<f64> {
    let (_, body) = meridian_testkit::http_get(admin, "/metrics")?;
    Ok(body
        .lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// PostgreSQL stopped for 10 s under load (issue 12): 20 players keep walking and every
/// move is answered; the shards' saves fail and wait; half the players log out meanwhile.
/// Once the store is back the saves catch up: it holds every player's last cell, and the
/// ones that left log in there.
#[test]
fn the_store_stopped_for_10_s_under_load_costs_the_players_nothing() {
    let mut pg = TempPostgres::start().expect("a PostgreSQL server of the test's own");
    let options = ClusterOptions::new(Io::Uring)
        .shards(2)
        .arg("--store")
        .arg(pg.url())
        .arg("--save-interval")
        .arg("1s");
    crate::with_cluster(options, |cluster| {
        let addr = cluster.client_addr(0);
        let mut bots = Vec::new();
        for n in 0..20u32 {
            let mut bot = Bot::connect(addr)?;
            let name = format!("outage-{n}");
            let spawn = (30 + (n % 5) * 60, 30 + (n / 5) * 60);
            let id = bot.login(&name, Some(spawn))?.ok.player_id;
            bots.push((bot, name, id, spawn));
        }
        let mut client_time = 0;
        let mut step = |bots: &mut Vec<(Bot, String, u64, (u32, u32))>| -> anyhow::Result<()> {
            client_time += 1;
            let direction = if client_time % 2 == 1 { Direction::Right } else { Direction::Left };
            for (bot, name, _, at) in bots.iter_mut() {
                *at = bot.move_ok(direction, client_time).with_context(|| name.clone())?;
            }
            Ok(())
        };
        step(&mut bots)?;
        pg.stop()?;
        let stopped = Instant::now();
        let mut moves = 0;
        let mut gone = Vec::new();
        while stopped.elapsed() < Duration::from_secs(10) {
            step(&mut bots)?;
            moves += bots.len();
            if stopped.elapsed() > Duration::from_secs(3) && gone.is_empty() {
                // Half of them log out while the store is down: each connection closes
                // (after its save waited 5 s), the save waits on.
                for (mut bot, name, id, at) in bots.drain(10..) {
                    bot.send(&meridian_testkit::msg::logout())?;
                    gone.push((bot, name, id, at));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let failed: f64 = (0..cluster.shards().len())
            .map(|i| metric(cluster.shard(i).admin, "meridian_shard_saves_total", "failed"))
            .sum::<anyhow::Result<f64>>()?;
        ensure!(failed > 0.0, "saves failed while the store was down");
        eprintln!("{moves} moves answered while the store was down; {failed} saves failed");
        for (bot, name, ..) in &mut gone {
            bot.expect_closed(Instant::now() + Duration::from_secs(10))
                .with_context(|| format!("{name}: closed after its logout"))?;
        }
        pg.restart()?;
        let store = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(meridian_store::Store::open(&meridian_store::Address::parse(&pg.url())?))?;
        for (_, name, id, at) in bots.iter().chain(gone.iter()) {
            wait_saved(&store, *id, *at).with_context(|| format!("{name}'s saves caught up"))?;
        }
        for (_, name, id, at) in &gone {
            let mut bot = Bot::connect(addr)?;
            let ok = bot.login(name, None)?.ok;
            let back = ok.position.map(|p| (p.x, p.y));
            ensure!(
                (ok.player_id, back) == (*id, Some(*at)),
                "{name} back as {} at {back:?}, left as {id} at {at:?}",
                ok.player_id
            );
        }
        Ok(())
    });
}

/// An old owner's late save does not win (issue 12, fencing): the player's shard is paused
/// (SIGSTOP) past its lease with a save of the player still waiting for a stopped store;
/// the gateway restores the player on the other shard, which saves it (a newer generation)
/// once the store is back. Woken, the old shard sends its waiting save: the store refuses
/// it, and the player comes back where the new owner saved it.
#[test]
fn a_paused_shards_late_save_does_not_roll_a_player_back() {
    let mut pg = TempPostgres::start().expect("a PostgreSQL server of the test's own");
    let options = ClusterOptions::new(Io::Uring)
        .shards(2)
        .arg("--store")
        .arg(pg.url())
        .arg("--save-interval")
        .arg("1s");
    crate::with_cluster(options, |cluster| {
        let store = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(meridian_store::Store::open(&meridian_store::Address::parse(&pg.url())?))?;
        let mut bot = Bot::connect(cluster.client_addr(0))?;
        let id = bot.login("fence", Some((100, 100)))?.ok.player_id;
        let at = bot.move_ok(Direction::Right, 1)?;
        wait_saved(&store, id, at)?;
        let owner = (0..cluster.shards().len())
            .find(|&i| {
                meridian_testkit::http_get(cluster.shard(i).admin, "/players")
                    .is_ok_and(|(_, body)| body.contains(&format!("\"id\":{id},")))
            })
            .context("no shard lists the player")?;
        let old = cluster.shard(owner).clone();
        pg.stop()?;
        let stale = bot.move_ok(Direction::Right, 2)?;
        // The old owner's save of `stale` fails and waits for the store.
        let by = Instant::now() + Duration::from_secs(10);
        while metric(old.admin, "meridian_shard_saves_total", "failed")? == 0.0 {
            ensure!(Instant::now() < by, "the old owner tried to save the player");
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: signalling a process this test's cluster started, by its pid.
        ensure!(unsafe { libc::kill(old.pid, libc::SIGSTOP) } == 0, "SIGSTOP");
        let resumed = (|| -> anyhow::Result<(u32, u32)> {
            bot.recv_until(Instant::now() + Duration::from_secs(20), "the restore", |m| {
                matches!(m.kind, Some(S::ViewReset(_)))
            })?;
            let newer = bot.move_ok(Direction::Down, 3)?;
            pg.restart()?;
            wait_saved(&store, id, newer).context("the new owner's save")?;
            Ok(newer)
        })();
        // SAFETY: as above.
        unsafe { libc::kill(old.pid, libc::SIGCONT) };
        let newer = resumed?;
        // Paused, not dead: its kernel still took connections, so no gateway took it for
        // dead at once; its lease ran out instead.
        let detected = crate::shard_failure::deaths_detected(cluster)?;
        ensure!(detected == 0.0, "a paused shard was proven dead {detected} times");
        let by = Instant::now() + Duration::from_secs(15);
        while metric(old.admin, "meridian_shard_saves_total", "refused")? == 0.0 {
            ensure!(Instant::now() < by, "the old owner's late save was sent and refused");
            std::thread::sleep(Duration::from_millis(100));
        }
        let saved = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(store.load(id))?
            .and_then(|p| p.saved)
            .context("a saved player")?;
        ensure!(
            saved.at == newer,
            "the store holds {:?}, not the new owner's {newer:?} (stale {stale:?})",
            saved.at
        );
        Ok(())
    });
}
