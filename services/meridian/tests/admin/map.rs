//! The live map in headless Chromium. Players stand on one square of shard 1's region; the
//! gateway's `/map` is rendered by Chromium and checked from its pixels: inside every
//! region (as `/map.json` gives it) nearly all pixels are the owner's colour, and the
//! players' square is darker. The dumped DOM carries the epoch and the shard names the
//! script rendered. Then one page stays open (DevTools over a pipe) while shard 3 joins and
//! is drained again: the same page shows each new epoch and its regions without a reload.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use meridian_testkit::browser::{self, Browser};
use meridian_testkit::{
    deadline, drain_shard, http_get, wait_for_expected_partition, wait_ready, wait_until, Bot,
    Cluster, ExtraShard, DEFAULT_LEASE_TTL,
};
use serde_json::Value;

use crate::{admin_ports, two_shards, with_cluster, RESUME_KEY_HEX};

/// The viewport: the 800x800 map canvas and the side panel.
const WINDOW: (u32, u32) = (1250, 830);
/// Virtual time the one-shot runs give the page's script (it polls once a second).
const BUDGET: Duration = Duration::from_secs(4);
/// How long the open page may take to show a change the gateway already serves.
const PAGE_WITHIN: Duration = Duration::from_secs(10);
/// How long a scale step may take to show in the gateway's `/map.json`.
const STEP_WITHIN: Duration = Duration::from_secs(30);
/// Players standing on one density square of shard 1 (cells 50..60 x 50..60).
const CROWD: u32 = 8;
const CROWD_AT: (u32, u32) = (52, 52);

/// `/map.json` of the gateway.
fn map_json(admin: SocketAddr) -> anyhow::Result<Value> {
    let (code, body) = http_get(admin, "/map.json")?;
    ensure!(code == 200, "GET /map.json answered {code}: {body}");
    serde_json::from_str(&body).with_context(|| format!("/map.json is not JSON: {body}"))
}

/// The shards owning a region in a map snapshot.
fn owners(map: &Value) -> BTreeSet<u64> {
    map["regions"].as_array().into_iter().flatten().filter_map(|r| r["shard"].as_u64()).collect()
}

/// Waits until the gateway's `/map.json` satisfies `done`; returns that snapshot.
fn wait_map(
    admin: SocketAddr,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let mut last = Value::Null;
    wait_until(deadline(within), what, || match map_json(admin) {
        Ok(map) => {
            let ok = done(&map);
            last = map;
            ok
        }
        Err(_) => false,
    })
    .with_context(|| format!("last /map.json: {last}"))?;
    Ok(last)
}

/// An RGB image decoded from a PNG.
struct Image {
    width: u32,
    height: u32,
    pixels: Vec<[u8; 3]>,
}

impl Image {
    fn decode(bytes: &[u8]) -> anyhow::Result<Image> {
        let mut reader = png::Decoder::new(bytes).read_info().context("not a PNG")?;
        let mut buffer = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buffer).context("reading the PNG's frame")?;
        ensure!(info.bit_depth == png::BitDepth::Eight, "PNG bit depth {:?}", info.bit_depth);
        let step = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => bail!("PNG colour type {other:?}"),
        };
        let pixels =
            buffer[..info.buffer_size()].chunks_exact(step).map(|p| [p[0], p[1], p[2]]).collect();
        Ok(Image { width: info.width, height: info.height, pixels })
    }

    fn at(&self, x: u32, y: u32) -> [u8; 3] {
        self.pixels[(y * self.width + x) as usize]
    }
}

fn parse_colour(hex: &str) -> anyhow::Result<[u8; 3]> {
    let hex = hex.strip_prefix('#').context("colour without '#'")?;
    ensure!(hex.len() == 6, "colour {hex:?} is not #rrggbb");
    let channel = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16);
    Ok([channel(0)?, channel(2)?, channel(4)?])
}

fn same_colour(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 3)
}

/// Checks a screenshot of the map against the snapshot it shows: inside each region (its
/// outer 12% left out, for borders) at least 75% of the pixels are its shard's colour and
/// almost none another shard's; the crowd's square, if given, is darker than its shard's
/// colour. Returns the share of each region's pixels in its colour.
fn check_regions(
    png: &[u8],
    map: &Value,
    crowd: Option<(u32, u32)>,
) -> anyhow::Result<BTreeMap<u64, f64>> {
    let image = Image::decode(png)?;
    let colours: BTreeMap<u64, [u8; 3]> = map["shards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            Ok((
                s["id"].as_u64().context("shard id")?,
                parse_colour(s["color"].as_str().context("color")?)?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    // The canvas is where the shard colours are: their bounding box, which the region
    // borders (2 px strokes inside each region) make 2 px smaller on each side.
    let (mut x0, mut y0, mut x1, mut y1) = (u32::MAX, u32::MAX, 0, 0);
    for y in 0..image.height {
        for x in 0..image.width {
            if colours.values().any(|c| same_colour(image.at(x, y), *c)) {
                (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
            }
        }
    }
    ensure!(x0 < x1 && y0 < y1, "no pixel of any shard colour {colours:?} in the screenshot");
    let (width, height) =
        (map["width"].as_f64().unwrap_or(400.0), map["height"].as_f64().unwrap_or(400.0));
    let scale_x = f64::from(x1 - x0 + 5) / width;
    let scale_y = f64::from(y1 - y0 + 5) / height;
    let to_pixel =
        |cx: f64, cy: f64| (f64::from(x0) - 2.0 + cx * scale_x, f64::from(y0) - 2.0 + cy * scale_y);
    let mut shares = BTreeMap::new();
    for region in map["regions"].as_array().into_iter().flatten() {
        let shard = region["shard"].as_u64().context("region shard")?;
        let colour =
            *colours.get(&shard).with_context(|| format!("shard {shard} is not listed"))?;
        let edge = |a: &str, b: &str| {
            let (a, b) = (region[a].as_f64().unwrap_or(0.0), region[b].as_f64().unwrap_or(0.0));
            (a + 0.12 * (b - a), b - 0.12 * (b - a))
        };
        let ((rx0, rx1), (ry0, ry1)) = (edge("x0", "x1"), edge("y0", "y1"));
        let (px0, py0) = to_pixel(rx0, ry0);
        let (px1, py1) = to_pixel(rx1, ry1);
        let (mut own, mut other, mut all) = (0u64, 0u64, 0u64);
        for y in py0 as u32..(py1 as u32).min(image.height) {
            for x in px0 as u32..(px1 as u32).min(image.width) {
                let pixel = image.at(x, y);
                all += 1;
                if same_colour(pixel, colour) {
                    own += 1;
                } else if colours.values().any(|c| same_colour(pixel, *c)) {
                    other += 1;
                }
            }
        }
        let share = own as f64 / all.max(1) as f64;
        ensure!(all > 100, "shard {shard}'s region maps to only {all} pixels");
        ensure!(
            share >= 0.75,
            "only {:.0}% of shard {shard}'s region is its colour",
            share * 100.0
        );
        ensure!(
            other * 100 < all,
            "{other} of {all} pixels in shard {shard}'s region are another shard's colour"
        );
        *shares.entry(shard).or_insert(0.0) += share;
    }
    if let Some((cx, cy)) = crowd {
        let cell = map["density_cell"].as_f64().unwrap_or(10.0);
        let (sx, sy) = (
            (f64::from(cx) / cell).floor() * cell + cell / 2.0,
            (f64::from(cy) / cell).floor() * cell + cell / 2.0,
        );
        let (px, py) = to_pixel(sx, sy);
        let owner = map["regions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                let within = |lo: &str, hi: &str, v: f64| {
                    r[lo].as_f64() <= Some(v) && Some(v) < r[hi].as_f64()
                };
                within("x0", "x1", sx) && within("y0", "y1", sy)
            })
            .and_then(|r| r["shard"].as_u64())
            .context("nobody owns the crowd's square")?;
        ensure!((px as u32) < image.width && (py as u32) < image.height, "crowd off the image");
        let colour =
            *colours.get(&owner).with_context(|| format!("shard {owner} is not listed"))?;
        let pixel = image.at(px as u32, py as u32);
        ensure!(
            pixel.iter().zip(colour).all(|(p, c)| *p < c || c == 0) && !same_colour(pixel, colour),
            "the crowd's square at ({px:.0}, {py:.0}) is {pixel:?}, not darker than shard {owner}'s {colour:?}"
        );
    }
    Ok(shares)
}

/// Where this test keeps its screenshots, for a person to look at.
fn keep(png: &[u8], name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("admin-map-{name}.png"));
    if let Err(e) = std::fs::write(&path, png) {
        println!("could not keep the screenshot {}: {e}", path.display());
    }
    path
}

/// Waits until the open page has rendered `epoch` with exactly the shards `names`.
fn wait_page(page: &mut Browser, epoch: u64, names: &str) -> anyhow::Result<()> {
    let mut last = Value::Null;
    let expression = "JSON.stringify({epoch: document.body.dataset.epoch, shards: document.body.dataset.shards, stale: document.body.dataset.stale})";
    wait_until(
        deadline(PAGE_WITHIN),
        &format!("the open page to show epoch {epoch} with {names}"),
        || match page
            .evaluate(expression)
            .and_then(|v| Ok(serde_json::from_str::<Value>(v.as_str().unwrap_or("null"))?))
        {
            Ok(seen) => {
                let shown = seen["epoch"].as_str().and_then(|e| e.parse::<u64>().ok());
                let ok = shown == Some(epoch) && seen["shards"] == names;
                last = seen;
                ok
            }
            Err(e) => {
                last = Value::String(format!("{e:#}"));
                false
            }
        },
    )
    .with_context(|| format!("the page last showed {last}; chromium's log:\n{}", page.log_tail()))
}

/// The epochs listed in the page's history of partition changes, newest first.
fn page_history(page: &mut Browser) -> anyhow::Result<Vec<u64>> {
    let value = page.evaluate(
        "[...document.querySelectorAll('#history li')].map(li => Number(li.dataset.epoch))",
    )?;
    Ok(value.as_array().into_iter().flatten().filter_map(Value::as_u64).collect())
}

/// `meridian status --web 127.0.0.1:0` on the cluster serves the same map as the gateway:
/// the page, and `/map.json` with the same epoch and regions.
fn status_web_serves_the_map(cluster: &Cluster, gateway: SocketAddr) -> anyhow::Result<()> {
    let mut child = std::process::Command::new(cluster.bin())
        .args(["status", "--web", "127.0.0.1:0"])
        .args(["--etcd", cluster.etcd_url(), "--cluster", cluster.cluster_name()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting `meridian status --web`")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = sender.send(line);
    });
    let checked = (|| {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .context("`meridian status --web` printed no URL within 10 s")?;
        let addr: SocketAddr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no address in {line:?}"))?;
        let (code, page) = http_get(addr, "/map")?;
        ensure!(code == 200 && page.contains("<canvas"), "GET /map answered {code}");
        // Both follow etcd on their own: wait until they agree.
        let mut last = (Value::Null, Value::Null);
        wait_until(
            deadline(Duration::from_secs(10)),
            "status --web and the gateway to agree",
            || match (map_json(addr), map_json(gateway)) {
                (Ok(ours), Ok(theirs)) => {
                    let same =
                        ours["epoch"] == theirs["epoch"] && ours["regions"] == theirs["regions"];
                    last = (ours, theirs);
                    same
                }
                _ => false,
            },
        )
        .with_context(|| format!("status --web served {}, the gateway {}", last.0, last.1))?;
        let map = last.0;
        ensure!(map["gateway"].is_null(), "status --web claims to be a gateway: {map}");
        anyhow::Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    checked.context("meridian status --web")
}

pub fn live_map_in_headless_chromium() {
    if !browser::chromium_installed() {
        panic!(
            "{} is missing: run deploy/install-deps.sh (apt-get install chromium)",
            browser::CHROMIUM
        );
    }
    with_cluster("live map in headless chromium", two_shards(), |cluster| {
        let admin = cluster.gateway(0).admin;
        let url = format!("http://{admin}/map");
        let partition = wait_for_expected_partition(cluster, Duration::from_secs(15))?;
        // Logins need the gateway's streams to the shards: wait until it says it can route.
        wait_ready(&admin_ports(cluster), Duration::from_secs(15))?;
        let mut crowd = Vec::new();
        for i in 0..CROWD {
            let mut bot = Bot::connect(cluster.game_addr(0))?;
            bot.login(&format!("crowd{i}"), Some((CROWD_AT.0 + i % 4, CROWD_AT.1 + i / 4)))?;
            crowd.push(bot);
        }
        let map = wait_map(
            admin,
            STEP_WITHIN,
            "/map.json to show the crowd on two healthy shards",
            |m| {
                m["epoch"].as_u64() == Some(partition.epoch)
                    && m["density"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|c| c[2].as_f64() == Some(f64::from(CROWD))))
                    && m["shards"]
                        .as_array()
                        .is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["health"] == "healthy"))
            },
        )?;

        // One shot: screenshot and DOM.
        let started = std::time::Instant::now();
        let png = browser::screenshot_once(&url, WINDOW, BUDGET)?;
        let shot = keep(&png, "two-shards");
        let shares = check_regions(&png, &map, Some(CROWD_AT))
            .with_context(|| format!("screenshot {}", shot.display()))?;
        let dom = browser::dump_dom_once(&url, BUDGET)?;
        let epoch_attr = format!("data-epoch=\"{}\"", partition.epoch);
        ensure!(dom.contains(&epoch_attr), "the DOM has no {epoch_attr}: {dom}");
        ensure!(
            dom.contains(&format!("<b id=\"epoch\">{}</b>", partition.epoch)),
            "the DOM shows no epoch: {dom}"
        );
        for name in ["shard-1", "shard-2"] {
            ensure!(
                dom.contains(&format!("<td>{name}</td>")),
                "the DOM's table has no {name}: {dom}"
            );
        }
        ensure!(!dom.contains("data-rendered=\"0\""), "the script never rendered: {dom}");
        println!(
            "one-shot screenshot and DOM in {:.1} s; region colour shares {shares:?}; kept {}",
            started.elapsed().as_secs_f64(),
            shot.display()
        );

        status_web_serves_the_map(cluster, admin)?;

        // Live: one open page follows a scale-out and a drain.
        let mut page = Browser::open(&url, WINDOW)?;
        wait_page(&mut page, partition.epoch, "shard-1,shard-2")?;
        let mut joined = ExtraShard::start(cluster, 3, RESUME_KEY_HEX, DEFAULT_LEASE_TTL)?;
        let three = wait_map(admin, STEP_WITHIN, "/map.json to give shard 3 a region", |m| {
            owners(m) == BTreeSet::from([1, 2, 3])
        })?;
        let epoch3 = three["epoch"].as_u64().context("epoch")?;
        wait_page(&mut page, epoch3, "shard-1,shard-2,shard-3")?;
        let png = page.screenshot()?;
        let shot3 = keep(&png, "three-shards-live");
        // The page may have polled a newer snapshot than ours (borders follow the load).
        let now = map_json(admin)?;
        let check = if now["epoch"] == three["epoch"] { &three } else { &now };
        check_regions(&png, check, None)
            .with_context(|| format!("screenshot {}", shot3.display()))?;
        ensure!(
            page_history(&mut page)?.starts_with(&[epoch3]),
            "the page's history does not list epoch {epoch3} first"
        );

        drain_shard(cluster, 3, Duration::from_secs(30))?;
        let status = joined.wait_exit(Duration::from_secs(30))?;
        ensure!(status.success(), "shard 3 exited with {status} after its drain");
        let two = wait_map(admin, STEP_WITHIN, "/map.json to show shards 1 and 2 only", |m| {
            owners(m) == BTreeSet::from([1, 2])
                && m["shards"].as_array().is_some_and(|s| s.len() == 2)
        })?;
        let epoch2 = two["epoch"].as_u64().context("epoch")?;
        wait_page(&mut page, epoch2, "shard-1,shard-2")?;
        let png = page.screenshot()?;
        let shot2 = keep(&png, "after-drain-live");
        check_regions(&png, &two, None)
            .with_context(|| format!("screenshot {}", shot2.display()))?;
        let history = page_history(&mut page)?;
        ensure!(
            history.len() >= 3
                && history[0] == epoch2
                && history.contains(&epoch3)
                && history.contains(&partition.epoch),
            "the open page's history {history:?} does not show epochs {} -> {epoch3} -> {epoch2}",
            partition.epoch
        );
        println!(
            "the open page followed epochs {} -> {epoch3} (shard 3 joined) -> {epoch2} (drained); \
             screenshots {} and {}",
            partition.epoch,
            shot3.display(),
            shot2.display()
        );
        drop(page);
        drop(crowd);
        Ok(())
    });
}

/// `meridian up --game wolves`: the map counts each shard's wolves by square and draws them
/// in the NPC colour, which no shard has.
pub fn the_live_map_draws_a_games_npcs_in_their_own_colour() {
    if !browser::chromium_installed() {
        panic!("{} is missing: run deploy/install-deps.sh", browser::CHROMIUM);
    }
    const WOLVES: f64 = 12.0;
    let opts = two_shards().arg("--game").arg("wolves").env("MERIDIAN_WOLVES_PER_SHARD", "6");
    with_cluster("NPCs on the live map", opts, |cluster| {
        let admin = cluster.gateway(0).admin;
        let map = wait_map(admin, Duration::from_secs(20), "/map.json to count 12 wolves", |m| {
            let total: f64 = m["npcs"]
                .as_array()
                .map(|squares| squares.iter().filter_map(|c| c[2].as_f64()).sum())
                .unwrap_or(0.0);
            total >= WOLVES
        })?;
        let npc = parse_colour(map["npc_color"].as_str().context("npc_color")?)?;
        for shard in map["shards"].as_array().into_iter().flatten() {
            let colour = parse_colour(shard["color"].as_str().context("color")?)?;
            ensure!(!same_colour(colour, npc), "shard {shard} is drawn in the NPC colour");
        }
        let png = browser::screenshot_once(&format!("http://{admin}/map"), WINDOW, BUDGET)?;
        let shot = keep(&png, "npcs");
        let image = Image::decode(&png)?;
        let mut drawn = 0;
        for y in 0..image.height {
            for x in 0..image.width {
                drawn += usize::from(image.at(x, y) == npc);
            }
        }
        // Each square with wolves gets a mark of at least 2 x 2 pixels.
        let squares = map["npcs"].as_array().map_or(0, Vec::len);
        ensure!(
            drawn >= squares * 4,
            "{drawn} pixels in the NPC colour for {squares} squares with wolves; see {}",
            shot.display()
        );
        Ok(())
    })
}
