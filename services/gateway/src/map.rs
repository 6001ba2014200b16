//! The live map an operator opens on a gateway's admin port: `/map` (a self-contained
//! HTML page, canvas and script embedded in the binary) and `/map.json` (what it polls
//! about once a second).
//!
//! Regions, epoch, shard states and per-shard player counts come from the gateway's own
//! etcd view ([`ClusterView`]); the 2-D player density and each shard's readiness come
//! from the shards' admin ports (`/density`), fetched only while someone looks at the map
//! (see ARCHITECTURE.md, "The live map", for why the grid is not kept in etcd). A shard
//! that does not answer in time is drawn from the per-band load profile of its etcd record
//! instead, and marked unreachable.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meridian_cluster::{
    ClusterView, DensityReport, EpochCell, GatewayId, ShardId, ShardRecord, ShardState,
    DENSITY_CELL, LOAD_BAND,
};
use meridian_observe::{admin_get_as, Reply, ReplyFuture, Routes};
use serde::Serialize;

/// The page, embedded so the map needs nothing but the admin port.
const PAGE: &str = include_str!("map.html");
/// How long a shard may take to answer `/density` before it is drawn from its etcd record.
const DENSITY_WITHIN: Duration = Duration::from_millis(700);
/// Snapshots are shared by requests this close together, so many open pages cost the
/// shards no more than one.
const SNAPSHOT_REUSE: Duration = Duration::from_millis(400);

/// One colour per shard id, distinct from each other, from the page's background and from
/// the dark density overlay (the map test counts pixels of these exact colours), and far
/// from [`NPC_COLOR`]: the 7th used to be a light cyan (`#42d4f4`), which the eye took for
/// wolves; it is brown now.
pub const PALETTE: [&str; 12] = [
    "#e6194b", "#3cb44b", "#ffe119", "#4363d8", "#f58231", "#911eb4", "#9a6324", "#f032e6",
    "#bfef45", "#fabed4", "#469990", "#dcbeff",
];

/// The colour shard `id` is drawn in.
pub fn shard_color(id: ShardId) -> &'static str {
    PALETTE[(id.0 as usize).wrapping_sub(1) % PALETTE.len()]
}

/// The colour NPCs are drawn in: not a shard's, the background's or the overlay's, and far
/// from every shard's (see the test `npcs_are_far_from_every_shard_colour`).
pub const NPC_COLOR: &str = "#00ffff";

/// Whether this node has a live stream to a shard (`None`: it does not know, e.g. a
/// `meridian status --web` that routes no traffic).
pub type LinkProbe = Arc<dyn Fn(ShardId) -> Option<bool> + Send + Sync>;

/// What `/map.json` answers.
#[derive(Debug, Clone, Serialize)]
pub struct MapSnapshot {
    pub cluster: String,
    /// The node serving the map (a gateway id; absent for `meridian status --web`).
    pub gateway: Option<u32>,
    pub width: u32,
    pub height: u32,
    /// The partition epoch this node is using; absent before the first partition.
    pub epoch: Option<u64>,
    pub regions: Vec<MapRegion>,
    pub shards: Vec<MapShard>,
    /// Side of a density square, in cells.
    pub density_cell: u32,
    /// `[column, row, players]` per square with players, over all shards (estimated from
    /// the load bands for shards that did not answer: then the counts may be fractional).
    pub density: Vec<[f64; 3]>,
    /// `[column, row, npcs]` per square with a game's NPCs (from the shards that answered).
    pub npcs: Vec<[f64; 3]>,
    /// The colour NPCs are drawn in.
    pub npc_color: &'static str,
    /// Players of all shards, as their etcd records count them.
    pub players: u64,
    pub gateways: Vec<u32>,
    /// Milliseconds since the Unix epoch when this snapshot was taken.
    pub taken_at_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapRegion {
    pub shard: u32,
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapShard {
    pub id: u32,
    pub name: String,
    pub color: &'static str,
    /// `serving`, `draining`, or `gone` (owns a region but its etcd record has expired).
    pub state: &'static str,
    /// `healthy`, `not ready`, `no link`, `unreachable` or `gone`.
    pub health: &'static str,
    pub ready: Option<bool>,
    /// This gateway's stream to the shard is up.
    pub link: Option<bool>,
    pub players: u64,
    /// Players over the mean of the serving shards (1.0 = even).
    pub load: f64,
    /// Cells of the map it owns.
    pub area: u64,
    /// The partition epoch the shard itself reports using.
    pub epoch: Option<u64>,
    /// Where its density comes from: `shard` (its `/density`) or `bands` (its etcd record).
    pub density: &'static str,
    pub drain_requested: bool,
}

/// The live map of one node: its etcd view, its links, and the shards' admin ports.
pub struct LiveMap {
    cluster: String,
    gateway: Option<GatewayId>,
    view: Arc<EpochCell<ClusterView>>,
    link: LinkProbe,
    token: Option<String>,
    last: Mutex<Option<(Instant, String)>>,
}

impl LiveMap {
    /// `token`: the cluster's admin token, presented to the shards' `/density`.
    pub fn new(
        cluster: String,
        gateway: Option<GatewayId>,
        view: Arc<EpochCell<ClusterView>>,
        link: LinkProbe,
        token: Option<String>,
    ) -> Arc<Self> {
        Arc::new(LiveMap { cluster, gateway, view, link, token, last: Mutex::new(None) })
    }

    /// `/map` and `/map.json`, for the admin port.
    pub fn routes(self: &Arc<Self>) -> Routes {
        let map = Arc::clone(self);
        Arc::new(move |path: &str| {
            let reply: ReplyFuture = match path {
                "/map" | "/map.html" => Box::pin(async { Reply::html(PAGE.to_string()) }),
                "/map.json" => {
                    let map = Arc::clone(&map);
                    Box::pin(async move { Reply::json(map.json().await) })
                }
                _ => return None,
            };
            Some(reply)
        })
    }

    /// The current snapshot as JSON (shared with requests less than [`SNAPSHOT_REUSE`]
    /// apart).
    pub async fn json(&self) -> String {
        if let Some((at, json)) = self.last.lock().ok().and_then(|last| last.clone()) {
            if at.elapsed() < SNAPSHOT_REUSE {
                return json;
            }
        }
        let json = serde_json::to_string(&self.snapshot().await).unwrap_or_default();
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), json.clone()));
        }
        json
    }

    /// Reads the view, asks every known shard for its density, and puts it together.
    pub async fn snapshot(&self) -> MapSnapshot {
        let view = self.view.read(ClusterView::clone);
        let asks = view.shards.values().map(|record| {
            let admin = record.admin.clone();
            let id = record.id;
            let token = self.token.clone();
            async move {
                let token = token.as_deref();
                let answer = admin_get_as(&admin, "/density", DENSITY_WITHIN, token).await;
                let report = answer
                    .filter(|(code, _)| *code == 200)
                    .and_then(|(_, body)| serde_json::from_str::<DensityReport>(&body).ok());
                (id, report)
            }
        });
        let reports: BTreeMap<ShardId, DensityReport> =
            join_all(asks).await.into_iter().filter_map(|(id, r)| Some((id, r?))).collect();
        let links: BTreeMap<ShardId, Option<bool>> =
            shard_ids(&view).into_iter().map(|id| (id, (self.link)(id))).collect();
        assemble(&self.cluster, self.gateway, &view, &reports, &links)
    }
}

/// Every shard worth drawing: registered ones and region owners whose records are gone.
fn shard_ids(view: &ClusterView) -> BTreeSet<ShardId> {
    let mut ids: BTreeSet<ShardId> = view.shards.keys().copied().collect();
    if let Some(map) = &view.partition {
        ids.extend(map.owners());
    }
    ids
}

/// Runs the futures concurrently and returns their outputs in order.
async fn join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        if let Ok(output) = handle.await {
            outputs.push(output);
        }
    }
    outputs
}

/// Puts a snapshot together from what was read; pure, so it is tested without a cluster.
pub fn assemble(
    cluster: &str,
    gateway: Option<GatewayId>,
    view: &ClusterView,
    reports: &BTreeMap<ShardId, DensityReport>,
    links: &BTreeMap<ShardId, Option<bool>>,
) -> MapSnapshot {
    let (width, height) = view.partition.as_ref().map_or((400, 400), |p| (p.width, p.height));
    let regions: Vec<MapRegion> = view
        .partition
        .iter()
        .flat_map(|p| &p.regions)
        .map(|r| MapRegion { shard: r.shard.0, x0: r.x0, y0: r.y0, x1: r.x1, y1: r.y1 })
        .collect();
    let serving: Vec<&ShardRecord> = view.serving_shards().collect();
    let players: u64 = view.shards.values().map(|s| s.players).sum();
    let mean = if serving.is_empty() {
        0.0
    } else {
        serving.iter().map(|s| s.players).sum::<u64>() as f64 / serving.len() as f64
    };
    let mut density: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut npcs: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut shards = Vec::new();
    for id in shard_ids(view) {
        let record = view.shards.get(&id);
        let report = reports.get(&id);
        let link = links.get(&id).copied().flatten();
        let source = match (report, record) {
            (Some(report), _) => {
                add_reported(&mut density, report.cell, &report.counts);
                add_reported(&mut npcs, report.cell, &report.npcs);
                "shard"
            }
            (None, Some(record)) => {
                add_estimated(&mut density, record);
                "bands"
            }
            (None, None) => "none",
        };
        let state = match record.map(|r| r.state) {
            Some(ShardState::Serving) => "serving",
            Some(ShardState::Draining) => "draining",
            None => "gone",
        };
        let ready = report.map(|r| r.ready);
        let health = match (record, ready, link) {
            (None, _, _) => "gone",
            (Some(_), None, _) => "unreachable",
            (Some(_), _, Some(false)) => "no link",
            (Some(_), Some(false), _) => "not ready",
            (Some(_), Some(true), _) => "healthy",
        };
        let shard_players = record.map_or(0, |r| r.players);
        let area = view.partition.iter().flat_map(|p| p.regions_of(id)).map(|r| r.area()).sum();
        shards.push(MapShard {
            id: id.0,
            name: id.to_string(),
            color: shard_color(id),
            state,
            health,
            ready,
            link,
            players: shard_players,
            load: if mean > 0.0 { shard_players as f64 / mean } else { 0.0 },
            area,
            epoch: report.map(|r| r.epoch),
            density: source,
            drain_requested: view.drains.contains(&id),
        });
    }
    MapSnapshot {
        cluster: cluster.to_string(),
        gateway: gateway.map(|g| g.0),
        width,
        height,
        epoch: view.partition.as_ref().map(|p| p.epoch),
        regions,
        shards,
        density_cell: DENSITY_CELL,
        density: density.into_iter().map(|((c, r), n)| [f64::from(c), f64::from(r), n]).collect(),
        npcs: npcs.into_iter().map(|((c, r), n)| [f64::from(c), f64::from(r), n]).collect(),
        npc_color: NPC_COLOR,
        players,
        gateways: view.gateways.keys().map(|g| g.0).collect(),
        taken_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

fn add_reported(density: &mut BTreeMap<(u32, u32), f64>, cell: u32, counts: &[[u32; 3]]) {
    // A shard on another grid size (a different build) is rescaled to ours.
    let cell = cell.max(1);
    for &[column, row, n] in counts {
        let key = (column * cell / DENSITY_CELL, row * cell / DENSITY_CELL);
        *density.entry(key).or_default() += f64::from(n);
    }
}

/// The 2-D density a shard's per-band counts imply if x and y were independent: the best
/// the map can draw of a shard that does not answer.
fn add_estimated(density: &mut BTreeMap<(u32, u32), f64>, record: &ShardRecord) {
    let total: u32 = record.load.x.iter().sum();
    if total == 0 {
        return;
    }
    // Bands of LOAD_BAND cells summed into squares of DENSITY_CELL cells.
    let squares = |bands: &[u32]| {
        let mut by_square: BTreeMap<u32, u32> = BTreeMap::new();
        for (band, &n) in bands.iter().enumerate().filter(|(_, n)| **n > 0) {
            *by_square.entry(band as u32 * LOAD_BAND / DENSITY_CELL).or_default() += n;
        }
        by_square
    };
    let (columns, rows) = (squares(&record.load.x), squares(&record.load.y));
    for (&column, &nx) in &columns {
        for (&row, &ny) in &rows {
            let share = f64::from(nx) * f64::from(ny) / f64::from(total);
            *density.entry((column, row)).or_default() += share;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_cluster::{LoadProfile, PartitionMap, Region};

    fn record(id: u32, state: ShardState, players: u64, load: LoadProfile) -> ShardRecord {
        ShardRecord {
            id: ShardId(id),
            grpc: String::new(),
            admin: String::new(),
            state,
            players,
            load,
            incarnation: 1,
            transport: None,
        }
    }

    fn view() -> ClusterView {
        let mut view = ClusterView::default();
        // Shard 2's four players stand in the square at cells (300.., 50..).
        let bands = (400 / LOAD_BAND) as usize;
        let (mut x, mut y) = (vec![0; bands], vec![0; bands]);
        x[(305 / LOAD_BAND) as usize] = 4;
        y[(55 / LOAD_BAND) as usize] = 4;
        view.shards.insert(ShardId(1), record(1, ShardState::Serving, 6, LoadProfile::default()));
        view.shards.insert(
            ShardId(2),
            record(2, ShardState::Serving, 4, LoadProfile { x, y, ..Default::default() }),
        );
        view.shards.insert(ShardId(5), record(5, ShardState::Draining, 0, LoadProfile::default()));
        view.partition = Some(PartitionMap {
            epoch: 7,
            width: 400,
            height: 400,
            regions: vec![
                Region { shard: ShardId(1), x0: 0, y0: 0, x1: 200, y1: 400 },
                Region { shard: ShardId(2), x0: 200, y0: 0, x1: 400, y1: 200 },
                Region { shard: ShardId(3), x0: 200, y0: 200, x1: 400, y1: 400 },
            ],
        });
        view.drains.insert(ShardId(5));
        view
    }

    #[test]
    fn a_snapshot_has_every_shard_with_its_state_health_and_load() {
        let reports = BTreeMap::from([(
            ShardId(1),
            DensityReport {
                shard: 1,
                epoch: 7,
                ready: true,
                cell: 10,
                counts: vec![[3, 4, 6]],
                npcs: vec![[3, 5, 2]],
            },
        )]);
        let links = BTreeMap::from([(ShardId(1), Some(true)), (ShardId(2), Some(true))]);
        let snapshot = assemble("c", Some(GatewayId(1)), &view(), &reports, &links);
        assert_eq!(snapshot.epoch, Some(7));
        assert_eq!(snapshot.regions.len(), 3);
        let by_id: BTreeMap<u32, &MapShard> = snapshot.shards.iter().map(|s| (s.id, s)).collect();
        assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 5]);
        assert_eq!(
            (by_id[&1].state, by_id[&1].health, by_id[&1].density),
            ("serving", "healthy", "shard")
        );
        assert_eq!((by_id[&2].health, by_id[&2].density), ("unreachable", "bands"));
        assert_eq!((by_id[&3].state, by_id[&3].health), ("gone", "gone"));
        assert_eq!(by_id[&5].state, "draining");
        assert!(by_id[&5].drain_requested);
        assert_eq!(by_id[&1].area, 200 * 400);
        assert!((by_id[&1].load - 1.2).abs() < 1e-9, "6 players over a mean of 5");
        assert_eq!(snapshot.players, 10);
        // Shard 1's reported square, and shard 2's four players estimated in one square.
        assert_eq!(snapshot.density, vec![[3.0, 4.0, 6.0], [30.0, 5.0, 4.0]]);
        assert_eq!(snapshot.npcs, vec![[3.0, 5.0, 2.0]], "the NPCs a shard reported");
        assert!(!PALETTE.contains(&snapshot.npc_color), "NPCs in a colour of their own");
    }

    #[test]
    fn a_shard_without_a_link_or_not_ready_says_so() {
        let reports = BTreeMap::from([(
            ShardId(1),
            DensityReport {
                shard: 1,
                epoch: 7,
                ready: false,
                cell: 10,
                counts: vec![],
                npcs: vec![],
            },
        )]);
        let snapshot =
            assemble("c", None, &view(), &reports, &BTreeMap::from([(ShardId(1), Some(true))]));
        assert_eq!(snapshot.shards[0].health, "not ready");
        let snapshot =
            assemble("c", None, &view(), &reports, &BTreeMap::from([(ShardId(1), Some(false))]));
        assert_eq!(snapshot.shards[0].health, "no link");
    }

    #[test]
    fn an_empty_cluster_is_an_empty_map() {
        let snapshot =
            assemble("c", None, &ClusterView::default(), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(snapshot.epoch, None);
        assert!(snapshot.shards.is_empty() && snapshot.density.is_empty());
        assert_eq!((snapshot.width, snapshot.height), (400, 400));
    }

    #[test]
    fn colours_are_distinct_and_wrap_around() {
        let distinct: BTreeSet<&str> = PALETTE.iter().copied().collect();
        assert_eq!(distinct.len(), PALETTE.len());
        assert_eq!(shard_color(ShardId(1)), PALETTE[0]);
        assert_eq!(shard_color(ShardId(13)), PALETTE[0]);
        assert_eq!(shard_color(ShardId(0)), PALETTE[(usize::MAX) % PALETTE.len()]);
    }

    /// `#rrggbb` as channels.
    fn channels(hex: &str) -> [i32; 3] {
        let hex = hex.strip_prefix('#').expect("a palette colour is #rrggbb");
        let channel = |i: usize| i32::from_str_radix(&hex[i..i + 2], 16).expect("hex digits");
        [channel(0), channel(2), channel(4)]
    }

    #[test]
    fn npcs_are_far_from_every_shard_colour() {
        // Euclidean distance in RGB: not the eye's, but enough to keep a shard's region
        // from reading as a crowd of NPCs. The old cyan shard was 80 from NPC_COLOR; the
        // nearest now (teal) is 166. A third of the cube's diagonal is about 147.
        const FAR: f64 = 140.0;
        let npc = channels(NPC_COLOR);
        for colour in PALETTE {
            let rgb = channels(colour);
            let distance =
                npc.iter().zip(rgb).map(|(a, b)| f64::from((a - b).pow(2))).sum::<f64>().sqrt();
            assert!(distance >= FAR, "shard colour {colour} is {distance:.0} from {NPC_COLOR}");
        }
    }

    #[test]
    fn the_page_polls_the_json_it_is_served_with() {
        assert!(PAGE.contains("map.json"));
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"), "no external assets");
    }
}
