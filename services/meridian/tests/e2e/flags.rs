//! A persistent world (issue 34, item 4): wolves' flags (persistent entities) and each
//! player's flag count (the game's key-value space) survive kill -9 of the flag's shard,
//! a drain, a rolling restart of the shard holding it and a restart of the whole cluster on
//! the same store, on SQLite (the default) and on PostgreSQL. What is checked after each
//! step: exactly one shard owns the flag, its text is what was planted, a player standing
//! there sees it, and the store holds the flag (saved by its current owner) and the count.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use meridian_testkit::pb::{client_message::Kind as C, server_message::Kind as S};
use meridian_testkit::pb::{ClientMessage, Login};
use meridian_testkit::{
    deadline, drain_shard, http_get, msg, wait_until, Bot, Cluster, ClusterOptions, ExtraShard,
    GameAddr, Io, TempPostgres,
};

use meridian_wolves::{FLAG, PLANT, UPROOT};

use crate::game::listen;
use crate::meridian_bin;
use crate::saved::{token, TempDir};

/// Logs `account` in with its token, where it was saved (or where a new player goes); the
/// bot and its player id. Tried for 20 s: right after a kill or a restart the cluster may
/// not take logins yet.
fn log_in(addr: GameAddr, account: &str) -> anyhow::Result<(Bot, u64)> {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = (|| -> anyhow::Result<(Bot, u64)> {
            let mut bot = Bot::connect(addr)?;
            let login = Login { name: "n".into(), spawn: None, token: token(account)? };
            bot.send(&ClientMessage { kind: Some(C::Login(login)) })?;
            loop {
                match bot.recv(Instant::now() + Duration::from_secs(10))?.kind {
                    Some(S::LoginOk(ok)) => return Ok((bot, ok.player_id)),
                    Some(S::Error(e)) => bail!("{account}: Error {e:?}"),
                    _ => continue,
                }
            }
        })();
        match attempt {
            Ok(done) => return Ok(done),
            Err(error) if Instant::now() < by => {
                eprintln!("{account} not in yet: {error:#}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => return Err(error),
        }
    }
}

/// Sends an action and returns its answer: `Ok(payload)` for `ActionDone`, `Err` with the
/// error otherwise.
fn act(bot: &mut Bot, kind: u32, target: u64, payload: &[u8], t: u64) -> anyhow::Result<Vec<u8>> {
    bot.send(&msg::action(kind, target, payload, t))?;
    let got = bot.recv_until(deadline(Duration::from_secs(10)), "the action's answer", |m| {
        matches!(&m.kind, Some(S::ActionDone(d)) if d.client_time == t)
            || matches!(&m.kind, Some(S::Error(e)) if e.client_time == t)
    })?;
    match got.last().and_then(|m| m.kind.clone()) {
        Some(S::ActionDone(done)) => Ok(done.payload),
        other => bail!("action {kind} answered {other:?}"),
    }
}

/// Plants a flag where the bot stands; its id. A PLANT before the player's flag count is
/// read from the store (a round trip after the login) is refused "loading; try again",
/// and tried again.
fn plant(bot: &mut Bot, text: &str) -> anyhow::Result<u64> {
    let mut t = 100;
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        t += 1;
        match act(bot, PLANT, 0, text.as_bytes(), t) {
            Ok(id) => return Ok(String::from_utf8(id)?.parse()?),
            Err(error) if format!("{error:#}").contains("loading") && Instant::now() < by => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => return Err(error),
        }
    }
}

/// Which shards (ids) list `npc` among the NPCs they own, `extra` shards included.
fn owners_of(cluster: &Cluster, extra: &[&ExtraShard], npc: u64) -> Vec<u32> {
    let admins = cluster
        .shards()
        .iter()
        .map(|s| (s.id, s.admin))
        .chain(extra.iter().map(|s| (s.id(), s.admin())));
    let mut owners = Vec::new();
    for (id, admin) in admins {
        let Ok((200, body)) = http_get(admin, "/players") else { continue };
        let Ok(report) = serde_json::from_str::<serde_json::Value>(&body) else { continue };
        let listed = report["npcs"]
            .as_array()
            .is_some_and(|npcs| npcs.iter().any(|n| n["id"].as_u64() == Some(npc)));
        if listed {
            owners.push(id);
        }
    }
    owners
}

/// Waits until exactly one shard owns the flag, and returns it.
fn sole_owner(
    cluster: &Cluster,
    extra: &[&ExtraShard],
    flag: u64,
    not: &[u32],
) -> anyhow::Result<u32> {
    let mut owners = Vec::new();
    wait_until(deadline(Duration::from_secs(30)), "one live shard to own the flag", || {
        owners = owners_of(cluster, extra, flag);
        owners.len() == 1 && !not.contains(&owners[0])
    })
    .with_context(|| format!("owners now: {owners:?}"))?;
    Ok(owners[0])
}

/// The store as the cluster's shards use it.
struct StoreView {
    store: meridian_store::Store,
    runtime: tokio::runtime::Runtime,
}

impl StoreView {
    fn open(address: &str) -> anyhow::Result<StoreView> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let address = meridian_store::Address::parse(address)?;
        let store = runtime.block_on(meridian_store::Store::open(&address))?;
        Ok(StoreView { store, runtime })
    }

    /// Waits until the store holds the flag with `text`, last saved by `owner`, and the
    /// player's count is `count`.
    fn wait_for(
        &self,
        flag: u64,
        text: &str,
        owner: u32,
        player: u64,
        count: &str,
    ) -> anyhow::Result<()> {
        let key = format!("flags/{player}");
        let mut seen = String::new();
        wait_until(
            deadline(Duration::from_secs(15)),
            "the store to hold the flag and its count",
            || {
                let rows = self.runtime.block_on(self.store.entities()).unwrap_or_default();
                let row = rows.iter().find(|r| r.id == flag);
                let stored =
                    self.runtime.block_on(self.store.kv_get(key.as_bytes())).ok().flatten();
                let value = stored.map(|e| String::from_utf8_lossy(&e.value).to_string());
                seen = format!("{:?}, {key} = {value:?}", row.map(|r| (r.kind, &r.state, r.shard)));
                row.is_some_and(|r| {
                    r.kind == FLAG && r.state == text.as_bytes() && r.shard == owner
                }) && value.as_deref() == Some(count)
            },
        )
        .with_context(|| format!("the store holds {seen}"))
    }

    fn holds(&self, flag: u64) -> anyhow::Result<bool> {
        Ok(self.runtime.block_on(self.store.entities())?.iter().any(|r| r.id == flag))
    }
}

/// `bot` sees the flag with its text (reading what comes, up to 10 s).
fn sees_flag(bot: &mut Bot, flag: u64, text: &str) -> anyhow::Result<()> {
    wait_until(deadline(Duration::from_secs(10)), "the player to see the flag", || {
        let _ = listen(bot, Duration::from_millis(100));
        bot.view().others().get(&flag).is_some_and(|f| f.kind == FLAG && f.state == text.as_bytes())
    })
    .with_context(|| format!("{} sees {:?}", bot.label(), bot.view().others().get(&flag)))
}

fn options(name: &str, data: &Path, store: Option<&str>) -> ClusterOptions {
    let mut options = ClusterOptions::new(Io::Uring)
        .shards(2)
        .name(name)
        .arg("--game")
        .arg("wolves")
        .env("MERIDIAN_WOLVES_PER_SHARD", "0")
        .arg("--data-dir")
        .arg(data.display().to_string())
        .arg("--lease-ttl")
        .arg("2s")
        .arg("--save-interval")
        .arg("1s");
    if let Some(url) = store {
        options = options.arg("--store").arg(url);
    }
    options
}

/// Waits until the partition gives shard `id` a region.
fn wait_in_partition(cluster: &Cluster, id: u32) -> anyhow::Result<()> {
    wait_until(deadline(Duration::from_secs(30)), &format!("shard {id} to own cells"), || {
        cluster.status_json().is_ok_and(|status| {
            status["partition"]["regions"]
                .as_array()
                .is_some_and(|r| r.iter().any(|region| region["shard"].as_u64() == Some(id.into())))
        })
    })
}

fn the_flag_and_its_count_survive_everything(name: &str, data: &Path, store: Option<&str>) {
    let address = store.map_or_else(
        || format!("sqlite:{}", data.join("players.sqlite").display()),
        str::to_string,
    );
    let text = "here we stand";
    let cluster = Cluster::start(meridian_bin(), options(name, data, store))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let run = || -> anyhow::Result<(u64, u64)> {
        let view = StoreView::open(&address)?;
        let (mut ann, ann_id) = log_in(cluster.client_addr(0), "flag-ann")?;
        let flag = plant(&mut ann, text)?;
        let first = sole_owner(&cluster, &[], flag, &[])?;
        eprintln!("flag {flag} planted on shard {first}");
        view.wait_for(flag, text, first, ann_id, "1").context("planted")?;

        // kill -9 of the flag's shard: the shard that takes its cells claims it from the store.
        let index = cluster.shards().iter().position(|s| s.id == first).context("its shard")?;
        cluster.kill_shard(index)?;
        let second = sole_owner(&cluster, &[], flag, &[first]).context("after kill -9")?;
        eprintln!("shard {first} killed: shard {second} owns the flag");
        view.wait_for(flag, text, second, ann_id, "1").context("claimed after kill -9")?;
        drop(ann);
        let (mut ann, _) = log_in(cluster.client_addr(0), "flag-ann")?;
        sees_flag(&mut ann, flag, text).context("after kill -9")?;

        // A drain: a joining shard takes the region, and the flag is handed to it.
        let mut joined = ExtraShard::join(&cluster, 10)?;
        wait_in_partition(&cluster, 10)?;
        drain_shard(&cluster, second, Duration::from_secs(30))?;
        let third = sole_owner(&cluster, &[&joined], flag, &[second]).context("after the drain")?;
        ensure!(third == 10, "the joined shard owns the flag, not {third}");
        eprintln!("shard {second} drained: shard 10 owns the flag");
        view.wait_for(flag, text, 10, ann_id, "1").context("after the drain")?;

        // A rolling restart of the shard holding it: another joins, it is stopped (SIGTERM)
        // and started again with the same id.
        let relief = ExtraShard::join(&cluster, 11)?;
        wait_in_partition(&cluster, 11)?;
        joined.terminate()?;
        joined.wait_exit(Duration::from_secs(30))?;
        let fourth = sole_owner(&cluster, &[&relief], flag, &[10]).context("shard 10 stopped")?;
        eprintln!("shard 10 stopped: shard {fourth} owns the flag");
        view.wait_for(flag, text, fourth, ann_id, "1").context("shard 10 stopped")?;
        let back = ExtraShard::join(&cluster, 10)?;
        wait_in_partition(&cluster, 10)?;
        sole_owner(&cluster, &[&relief, &back], flag, &[]).context("shard 10 back")?;
        sees_flag(&mut ann, flag, text).context("after the rolling restart")?;
        // The extra shards leave by SIGTERM too, the last shard of the cluster last: with
        // nobody to hand it to, it saves the flag where it stands before it exits.
        drop(ann);
        for mut extra in [back, relief] {
            extra.terminate()?;
            extra.wait_exit(Duration::from_secs(30))?;
        }
        view.wait_for(flag, text, 11, ann_id, "1").context("the last shard stopped")?;
        Ok((flag, ann_id))
    };
    let outcome = run();
    let stopped = cluster.stop();
    let (flag, ann_id) = outcome.unwrap_or_else(|e| panic!("{e:?}"));
    stopped.unwrap_or_else(|e| panic!("stopping the cluster: {e:?}"));

    // The whole cluster again, on the same store: the flag comes back, once, and its count.
    let cluster = Cluster::start(meridian_bin(), options(name, data, store))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let run = || -> anyhow::Result<()> {
        let view = StoreView::open(&address)?;
        let owner =
            sole_owner(&cluster, &[], flag, &[]).context("after the whole cluster restarted")?;
        eprintln!("the whole cluster restarted: shard {owner} owns the flag");
        view.wait_for(flag, text, owner, ann_id, "1")
            .context("after the whole cluster restarted")?;
        let (mut ann, again) = log_in(cluster.client_addr(0), "flag-ann")?;
        ensure!(again == ann_id, "the same player");
        sees_flag(&mut ann, flag, text).context("after the whole cluster restarted")?;
        // And it goes when its planter uproots it, count and all.
        act(&mut ann, UPROOT, flag, b"", 2).context("uprooting")?;
        eprintln!("uprooted");
        wait_until(
            deadline(Duration::from_secs(15)),
            "the flag out of the store, the count 0",
            || {
                let count =
                    view.runtime.block_on(view.store.kv_get(format!("flags/{ann_id}").as_bytes()));
                let count = count.ok().flatten().map(|e| e.value);
                !view.holds(flag).unwrap_or(true) && count.as_deref() == Some(&b"0"[..])
            },
        )?;
        ensure!(owners_of(&cluster, &[], flag).is_empty(), "no shard owns it any more");
        Ok(())
    };
    let outcome = run();
    let stopped = cluster.stop();
    outcome.unwrap_or_else(|e| panic!("{e:?}"));
    stopped.unwrap_or_else(|e| panic!("stopping the cluster: {e:?}"));
}

#[test]
fn a_flag_and_its_count_survive_kill_drain_rolling_and_whole_restarts_on_sqlite() {
    let data = TempDir::new("flags-sqlite");
    let name = format!("flags-sqlite-{}", std::process::id());
    the_flag_and_its_count_survive_everything(&name, data.path(), None);
}

#[test]
fn a_flag_and_its_count_survive_kill_drain_rolling_and_whole_restarts_on_postgres() {
    let pg = TempPostgres::start().expect("a PostgreSQL server of the test's own");
    let data = TempDir::new("flags-postgres");
    let name = format!("flags-postgres-{}", std::process::id());
    the_flag_and_its_count_survive_everything(&name, data.path(), Some(pg.url().as_str()));
}
