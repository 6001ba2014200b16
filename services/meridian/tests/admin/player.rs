//! `meridian player show|kick|move ACCOUNT` against a running cluster with the SQLite store:
//! show finds the account and where it is online; move teleports an online player (the
//! client gets ViewReset at the cell and plays on from there) and places an offline one
//! where its next login finds it; kick closes the connection with UNAVAILABLE and the reason.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use meridian_testkit::pb::{server_message::Kind as S, Direction, ErrorCode};
use meridian_testkit::{deadline, wait_until, Bot, Cluster, ClusterOptions, Io};

/// Runs `meridian player ARGS...` against `cluster`; its stdout, or why it failed.
fn player(cluster: &Cluster, store: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(crate::meridian_bin())
        .arg("player")
        .args(args)
        .args(["--store", store, "--cluster", cluster.cluster_name(), "--etcd", cluster.etcd_url()])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "meridian player {args:?}: {}; stdout {stdout}; stderr {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

#[test]
fn an_operator_shows_moves_and_kicks_a_player() {
    let data = std::env::temp_dir().join(format!("meridian-admin-player-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let store = format!("sqlite:{}", data.join("players.sqlite").display());
    let options =
        ClusterOptions::new(Io::Uring).shards(2).arg("--data-dir").arg(data.display().to_string());
    let cluster =
        Cluster::start(crate::meridian_bin(), options).unwrap_or_else(|e| panic!("{e:?}"));
    let result = (|| -> anyhow::Result<()> {
        let mut bot = Bot::connect(cluster.client_addr(0))?;
        let id = bot.login("gina", Some((100, 100)))?.ok.player_id;
        let shown = player(&cluster, &store, &["show", "gina"])?;
        ensure!(shown.contains(&format!("player    {id}")), "show names the player: {shown}");
        ensure!(shown.contains("at (100, 100)"), "show says where it is online: {shown}");

        // Online: moved at once, across the border to the other shard's region.
        let moved = player(&cluster, &store, &["move", "gina", "300", "120"])?;
        ensure!(moved.contains("moved to (300, 120)"), "{moved}");
        let by = Instant::now() + Duration::from_secs(10);
        let got = bot.recv_until(by, "the ViewReset of the move", |m| {
            matches!(&m.kind, Some(S::ViewReset(v)) if v.position.is_some_and(|p| (p.x, p.y) == (300, 120)))
        })?;
        ensure!(!got.is_empty(), "a ViewReset at the new cell");
        let at = bot.move_ok(Direction::Down, 1)?;
        ensure!(at == (300, 121), "plays on from the new cell: {at:?}");

        let kicked = player(&cluster, &store, &["kick", "gina", "--reason", "botting"])?;
        ensure!(kicked.contains("kicked"), "{kicked}");
        let rest = bot.expect_closed(Instant::now() + Duration::from_secs(10))?;
        let told = rest.iter().any(|m| {
            matches!(&m.kind, Some(S::Error(e))
                if e.code == ErrorCode::Unavailable as i32 && e.detail.contains("botting"))
        });
        ensure!(told, "the kicked client is told why: {rest:?}");
        // The kick's save goes to the store from the shard's saver, a moment later.
        let mut shown = Ok(String::new());
        let saved = wait_until(deadline(Duration::from_secs(10)), "the kick's save", || {
            shown = player(&cluster, &store, &["show", "gina"]);
            shown.as_ref().map_or(true, |s| s.contains("at (300, 121)"))
        });
        let shown = shown?;
        saved.with_context(|| format!("saved where it stood: {shown}"))?;
        ensure!(shown.contains("online    no"), "after the kick: {shown}");

        // Offline: placed where its next login finds it.
        let placed = player(&cluster, &store, &["move", "gina", "10", "20"])?;
        ensure!(placed.contains("comes back at (10, 20)"), "{placed}");
        let mut back = Bot::connect(cluster.client_addr(0))?;
        let ok = back.login("gina", None)?.ok;
        let at = ok.position.map(|p| (p.x, p.y));
        ensure!((ok.player_id, at) == (id, Some((10, 20))), "back as {} at {at:?}", ok.player_id);
        let missing = Command::new(crate::meridian_bin())
            .args(["player", "show", "nobody", "--store", &store])
            .args(["--cluster", cluster.cluster_name(), "--etcd", cluster.etcd_url()])
            .output()
            .context("meridian player show nobody")?;
        ensure!(!missing.status.success(), "an unknown account is an error");
        ensure!(String::from_utf8_lossy(&missing.stderr).contains("no account"), "{missing:?}");
        Ok(())
    })();
    let stopped = cluster.stop();
    let _ = std::fs::remove_dir_all(&data);
    result.unwrap_or_else(|e| panic!("{e:?}"));
    stopped.unwrap_or_else(|e| panic!("stopping: {e:?}"));
}
