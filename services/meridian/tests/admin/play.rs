//! `/play` in real Chromium, with a Python bot beside it: two browser pages (the gateway's
//! WebSocket front) and the Python client (TCP) play in one world on 4 shards. Each page sees
//! the others, moves with the keyboard and chats; a shard killed under them is replaced
//! and both pages carry on.
//!
//! And the wolves game on the page (issue 32, item 5): with real key presses and mouse
//! clicks the page summons wolves, attacks the nearest one and a clicked one, and says in
//! words what the game answered and what it sent (bites, a kill, the player's death and
//! respawn).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context};
use meridian_testkit::browser::{self, Browser};
use meridian_testkit::{deadline, wait_until, Bot, ClusterOptions, Io};
use serde_json::Value;

use crate::with_cluster;

const WINDOW: (u32, u32) = (1000, 720);

/// The Python the client package is installed in (`deploy/test.sh` makes one).
fn python() -> String {
    std::env::var("MERIDIAN_PYTHON").unwrap_or_else(|_| {
        panic!(
            "MERIDIAN_PYTHON is not set: run deploy/test.sh, which installs clients/python into \
             a virtual environment and points this variable at its python"
        )
    })
}

/// A Python bot over TCP: logs in as `py` at `at` and steps right and left for `seconds`.
fn python_bot(game: std::net::SocketAddr, at: (u32, u32), seconds: u32) -> anyhow::Result<Child> {
    let script = format!(
        r#"
import asyncio, sys
from meridian_client import Connection, Direction
async def main():
    game = await Connection.connect("{host}", {port})
    await game.login("py", spawn=({x}, {y}))
    print("logged in", flush=True)
    for i in range({steps}):
        try:
            await game.move(Direction.RIGHT if i % 2 == 0 else Direction.LEFT)
        except Exception as refused:
            print("refused", refused, flush=True)
        await asyncio.sleep(0.5)
    await game.logout()
asyncio.run(main())
"#,
        host = game.ip(),
        port = game.port(),
        x = at.0,
        y = at.1,
        steps = seconds * 2,
    );
    Ok(Command::new(python())
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?)
}

fn eval(page: &mut Browser, js: &str) -> Value {
    page.evaluate(js).unwrap_or(Value::Null)
}

/// Whether the page shows an entity called `name` (at `at`, if given).
fn sees(page: &mut Browser, name: &str, at: Option<(u32, u32)>) -> bool {
    let seen = eval(page, "window.meridian ? window.meridian.seen() : []");
    seen.as_array().into_iter().flatten().any(|e| {
        e["name"] == name
            && at.is_none_or(|(x, y)| {
                e["x"].as_u64() == Some(x.into()) && e["y"].as_u64() == Some(y.into())
            })
    })
}

fn press(page: &mut Browser, key: &str) {
    eval(
        page,
        &format!("document.dispatchEvent(new KeyboardEvent('keydown', {{key: '{key}'}})), true"),
    );
}

fn status(page: &mut Browser) -> String {
    eval(page, "window.meridian ? window.meridian.status() : ''").as_str().unwrap_or("").to_string()
}

pub fn two_pages_and_a_python_bot_play_in_one_world() {
    if !browser::chromium_installed() {
        panic!("{} is missing: run deploy/install-deps.sh", browser::CHROMIUM);
    }
    let opts = ClusterOptions::new(Io::Uring).shards(4).arg("--lease-ttl").arg("2s");
    with_cluster("play in Chromium", opts, |cluster| {
        let admin = cluster.gateway(0).admin;
        let ws = cluster.ws_addr(0);
        let url = |name: &str, x: u32| {
            format!("http://{admin}/play?name={name}&x={x}&y=100&auto=1&ws=ws://{ws}/")
        };
        let mut ann = Browser::open(&url("ann", 100), WINDOW)?;
        let mut bob = Browser::open(&url("bob", 104), WINDOW)?;
        let mut py = python_bot(cluster.game_addr(0), (102, 103), 30)?;
        let met =
            wait_until(deadline(Duration::from_secs(20)), "the pages and the bot to meet", || {
                sees(&mut ann, "bob", Some((104, 100)))
                    && sees(&mut bob, "ann", Some((100, 100)))
                    && sees(&mut ann, "py", None)
                    && sees(&mut bob, "py", None)
            });
        let result = (|| -> anyhow::Result<()> {
            met.with_context(|| format!("ann: {}; bob: {}", status(&mut ann), status(&mut bob)))?;
            ensure!(status(&mut ann) == "playing", "ann's status line: {}", status(&mut ann));

            // Ann walks with the keyboard; Bob sees her go.
            press(&mut ann, "ArrowRight");
            press(&mut ann, "d");
            wait_until(deadline(Duration::from_secs(5)), "bob to see ann at (102, 100)", || {
                sees(&mut bob, "ann", Some((102, 100)))
            })?;
            // Bob says hello through the chat box; Ann reads it.
            eval(
                &mut bob,
                "(() => { document.getElementById('chat-text').value = 'hello ann'; \
                 document.getElementById('chat').requestSubmit(); return true; })()",
            );
            wait_until(deadline(Duration::from_secs(5)), "ann to read bob's chat", || {
                eval(&mut ann, "window.meridian.log")
                    .as_array()
                    .is_some_and(|c| c.iter().any(|line| line == "bob: hello ann"))
            })?;

            // Their shard dies; both pages play on.
            let owner = cluster.status_json()?["partition"]["regions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| {
                    let get = |k: &str| r[k].as_u64().unwrap_or(0);
                    (get("x0")..get("x1")).contains(&102) && (get("y0")..get("y1")).contains(&100)
                })
                .and_then(|r| r["shard"].as_u64())
                .context("the shard owning (102, 100)")?;
            let index = cluster
                .shards()
                .iter()
                .position(|s| u64::from(s.id) == owner)
                .context("that shard's process")?;
            let positions = |ann: &mut Browser, bob: &mut Browser| {
                (eval(ann, "window.meridian.me()"), eval(bob, "window.meridian.me()"))
            };
            let before_kill = positions(&mut ann, &mut bob);
            cluster.kill_shard(index)?;
            // The gateways see the shard's port refuse and restore its players at once
            // (issue 33): a page may say "resuming" for a moment or never. Either way both
            // play on: each one's moves are applied on the shard that took them.
            wait_until(deadline(Duration::from_secs(25)), "both pages to move again", || {
                press(&mut ann, "ArrowDown");
                press(&mut bob, "ArrowDown");
                // Paces the presses (each is a move, under the move limit) and gives the
                // pages a round trip before their status is read: waits for nothing.
                std::thread::sleep(Duration::from_millis(200));
                let now = positions(&mut ann, &mut bob);
                now.0 != before_kill.0
                    && now.1 != before_kill.1
                    && status(&mut ann).starts_with("playing")
                    && status(&mut bob).starts_with("playing")
            })
            .with_context(|| format!("ann: {}; bob: {}", status(&mut ann), status(&mut bob)))?;
            ensure!(
                !cluster.status_json()?["partition"]["regions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["shard"].as_u64() == Some(owner)),
                "the killed shard still owns a region"
            );
            // Both carry on: a move is applied, and each still sees the other.
            let before = eval(&mut ann, "window.meridian.me()");
            press(&mut ann, "ArrowUp");
            wait_until(deadline(Duration::from_secs(5)), "ann to move after the restore", || {
                eval(&mut ann, "window.meridian.me()") != before
            })?;
            wait_until(deadline(Duration::from_secs(5)), "ann and bob still in sight", || {
                sees(&mut ann, "bob", None) && sees(&mut bob, "ann", None)
            })?;
            // For a person to look at.
            let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("admin-play.png");
            let _ = std::fs::write(&shot, ann.screenshot()?);
            Ok(())
        })();
        let _ = py.kill();
        let _ = py.wait();
        result.with_context(|| format!("chromium log: {}", ann.log_tail()))
    })
}

/// The page's log, oldest line first.
fn log(page: &mut Browser) -> Vec<String> {
    let lines = eval(page, "window.meridian ? window.meridian.log : []");
    lines.as_array().into_iter().flatten().filter_map(|l| l.as_str().map(str::to_string)).collect()
}

/// Waits for the page's log to have a line `line`; returns its index.
fn wait_for_line(page: &mut Browser, line: &str) -> anyhow::Result<usize> {
    let mut found = None;
    wait_until(deadline(Duration::from_secs(20)), &format!("the log to say {line:?}"), || {
        found = log(page).iter().position(|l| l == line);
        found.is_some()
    })
    .with_context(|| format!("the log: {:?}", log(page)))?;
    Ok(found.expect("invariant: set when the wait succeeded"))
}

/// Clicks the middle of the cell `(x, y)` on the page's canvas.
fn click_cell(page: &mut Browser, (x, y): (u32, u32)) -> anyhow::Result<()> {
    let at = page.evaluate(&format!("window.meridian.onScreen({x}, {y})"))?;
    let (Some(px), Some(py)) = (at["x"].as_f64(), at["y"].as_f64()) else {
        anyhow::bail!("the page has no screen point for ({x}, {y}): {at}");
    };
    page.click(px, py)
}

/// Clicks the middle of the element with id `id`.
fn click_element(page: &mut Browser, id: &str) -> anyhow::Result<()> {
    let js = format!(
        "(() => {{ const b = document.getElementById('{id}').getBoundingClientRect(); \
         return {{ x: b.left + b.width / 2, y: b.top + b.height / 2 }}; }})()"
    );
    let at = page.evaluate(&js)?;
    let (Some(px), Some(py)) = (at["x"].as_f64(), at["y"].as_f64()) else {
        anyhow::bail!("no element {id:?} on the page: {at}");
    };
    page.click(px, py)
}

/// Wolves at `at` in the page's view.
fn wolves_at(page: &mut Browser, (x, y): (u32, u32)) -> usize {
    let seen = eval(page, "window.meridian ? window.meridian.seen() : []");
    seen.as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["kind"] == 1 && e["x"].as_u64() == Some(x.into()) && e["y"].as_u64() == Some(y.into())
        })
        .count()
}

pub fn the_page_fights_wolves_and_says_what_happened() {
    if !browser::chromium_installed() {
        panic!("{} is missing: run deploy/install-deps.sh", browser::CHROMIUM);
    }
    // No wolves but the page's own: what it sees is what it summoned.
    let opts = ClusterOptions::new(Io::Uring)
        .arg("--game")
        .arg("wolves")
        .env("MERIDIAN_WOLVES_PER_SHARD", "0");
    with_cluster("wolves on /play", opts, |cluster| {
        let admin = cluster.gateway(0).admin;
        let ws = cluster.ws_addr(0);
        // A player beside Ann, two cells down: not a wolf, so not to be attacked.
        let mut bob = Bot::connect(cluster.client_addr(0))?;
        bob.login("bob", Some((100, 102)))?;
        let mut ann = Browser::open(
            &format!("http://{admin}/play?name=ann&x=100&y=100&auto=1&ws=ws://{ws}/"),
            WINDOW,
        )?;
        let result = (|| -> anyhow::Result<()> {
            wait_until(deadline(Duration::from_secs(20)), "ann to play and see bob", || {
                status(&mut ann) == "playing" && sees(&mut ann, "bob", Some((100, 102)))
            })
            .with_context(|| format!("ann: {}", status(&mut ann)))?;
            // The controls are listed while playing.
            let controls = eval(
                &mut ann,
                "(() => { const c = document.getElementById('controls'); \
                 return c && c.offsetParent !== null ? c.innerText : ''; })()",
            );
            let controls = controls.as_str().unwrap_or("");
            for words in
                ["Attack (F)", "Summon a wolf (E)", "attack the nearest wolf", "click a wolf"]
            {
                ensure!(
                    controls.contains(words),
                    "the controls shown lack {words:?}: {controls:?}"
                );
            }

            // Nothing to attack yet; and the game refuses an attack on a player.
            ann.key("f")?;
            wait_for_line(&mut ann, "no wolf in sight to attack")?;
            click_cell(&mut ann, (100, 102))?;
            wait_for_line(&mut ann, "attack refused: only wolves can be attacked")?;

            // Three wolves (the summon budget's burst) on the side Ann faces: the right.
            for _ in 0..3 {
                ann.key("e")?;
            }
            wait_until(
                deadline(Duration::from_secs(20)),
                "three wolves summoned at (101, 100)",
                || {
                    let summoned = log(&mut ann)
                        .iter()
                        .filter(|l| l.starts_with("you summoned a wolf (#"))
                        .count();
                    summoned == 3 && wolves_at(&mut ann, (101, 100)) == 3
                },
            )
            .with_context(|| format!("the log: {:?}", log(&mut ann)))?;
            wait_for_line(&mut ann, "wolf bites you for 2")?;

            // A clicked wolf, then the nearest (the same one: the lowest id of the three)
            // with Space and with the Attack button: three hits kill it.
            click_cell(&mut ann, (101, 100))?;
            wait_for_line(&mut ann, "you hit the wolf: 6/10 health left")?;
            ann.key(" ")?;
            wait_for_line(&mut ann, "you hit the wolf: 2/10 health left")?;
            click_element(&mut ann, "attack")?;
            wait_for_line(&mut ann, "you killed the wolf")?;
            wait_for_line(&mut ann, "wolf died")?;
            wait_until(deadline(Duration::from_secs(5)), "two wolves left", || {
                wolves_at(&mut ann, (101, 100)) == 2
            })?;

            // Three wolves bit 6 a second, two bite on: Ann's 20 health runs out.
            let died = wait_for_line(&mut ann, "you died")?;
            let respawned = wait_for_line(&mut ann, "you respawned with full health")?;
            ensure!(died < respawned, "died, then respawned: {:?}", log(&mut ann));

            let shot =
                std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("admin-play-wolves.png");
            let _ = std::fs::write(&shot, ann.screenshot()?);
            Ok(())
        })();
        result.with_context(|| format!("chromium log: {}", ann.log_tail()))
    })
}
