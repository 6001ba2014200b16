//! The wolves' rules as data: each file in `tests/rules/` is a scenario played on one real
//! shard core (`ShardCore` with the game, driven by hand like the shard's shell drives it),
//! with what every player is told after each step written out under it.
//!
//! Format (one command per line; `#` starts a comment; expectations are indented and name
//! the player that gets them, in the order it gets them):
//!
//! ```text
//! player ann 100,100            # logs in at that cell
//!   ann: login 100,100
//! action ann 2 payload=3,0      # Action kind 2; client_time counts from 1 per scenario
//!   ann: done t=1 wolf1
//! move ann right
//! wait 300ms                    # time passes in 100 ms steps, a tick and a game tick each
//! ```
//!
//! NPCs are named `wolf1`, `wolf2`, ... in the order they first appear (flags, kind 2,
//! `flag1`, `flag2`, ... if a client is first told of them by `Entered`). Messages read:
//! `login X,Y`, `entered WHO X,Y [kind=K] [state=S]`, `moved WHO X,Y [t=N]`, `left WHO`,
//! `state WHO S`, `event SOURCE KIND PAYLOAD`, `done t=N PAYLOAD`, `error CODE t=N DETAIL`.
//!
//! **A store.** A scenario that opens with `store` runs on a shard with a store
//! (`CoreConfig::save_interval` set), played by a model of it kept here: the game's
//! key-value space (entries with versions from one counter, compare-and-set as the real
//! store does) and the persistent entities' rows (fenced by generation and shard, removes
//! leaving tombstones). What the shard asks of it in one step (`Transmit::Kv`,
//! `SaveEntities`, `LoadEntities`, `ClaimEntities`, `Save`) is carried out, in order, at
//! the start of the next step, each 100 ms of a `wait` included, and the answers handed
//! back (`Event::KvAnswers`, `EntitiesFound`, `EntitiesClaimed`, `EntitiesSaved`,
//! `Saved`), but for writes of persistent entities: those are confirmed within their step
//! (an action that saved one, PLANT or UPROOT, is answered once the store has it). Without `store` the shard has none, as before. Commands about the store:
//!
//! ```text
//! store                         # an opening line: this scenario's shard has a store
//! kv flags/1 = 3                # the store's entry at flags/1 is the text 3
//! kv flags/2 absent             # the store has no entry at flags/2
//! kv-set flags/1 2              # the entry becomes 2 (as if another shard wrote it)
//! kv-fail 1                     # the next key-value request fails (KvAnswer::Failed)
//! entities 4                    # the store holds 4 persistent entities (not removed)
//! restart                       # the shard dies and a new life of it starts on the store:
//!                               # its players are gone (log them in again with `player`)
//! ```
//!
//! `kv` and `entities` check the store once what was asked before the command is carried
//! out; they tell no player anything.
//!
//! **The population.** The game keeps no wolves of its own unless the scenario opens with
//! `population N` (before or after `store`): then the shard keeps N wolves, spawned at
//! random cells, one a game tick. `npcs KIND N` checks the shard owns N NPCs of that kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_game::{KvAnswer, KvValue};
use meridian_protocol::pb::{self as client_pb, server_message::Kind as S, ErrorCode};
use meridian_protocol::{next_frame, TokenKey};
use meridian_rpc::pb::{player_input::Kind as Input, Join, PlayerInput};
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::kv::{KvOp, KvReply, KvRequest};
use meridian_shard_core::{
    CoreConfig, EntityRecord, EntitySave, Event, LinkId, SaveRecord, ShardMetrics, Transmit,
};
use meridian_wolves::Wolves;
use prost::Message;

const ME: ShardId = ShardId(1);
const LINK: LinkId = LinkId(1);
const FIRST_NPC_ID: u64 = 1_000_000;

struct Player {
    id: u64,
    session: u64,
    seq: u64,
}

/// The store of a scenario that has one (see the file's documentation).
#[derive(Default)]
struct StoreModel {
    /// The key-value space: key -> (value, version); versions come from one counter.
    kv: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
    version: u64,
    rows: BTreeMap<u64, Row>,
    /// Key-value requests still to fail (`kv-fail`).
    failing: usize,
    /// What the shard asked, to carry out at the next step.
    asked: Vec<Transmit>,
}

/// A persistent entity's row: its last write's fence, and the entity (`None`: removed).
struct Row {
    generation: u64,
    shard: u32,
    record: Option<EntityRecord>,
}

impl StoreModel {
    /// Whether a write of (`generation`, `shard`) is applied over the row of `id`.
    fn fence(&self, id: u64, generation: u64, shard: u32, upsert: bool) -> bool {
        match self.rows.get(&id) {
            None => true,
            Some(row) if row.record.is_none() && upsert => generation > row.generation,
            Some(row) => {
                row.generation < generation || (row.generation == generation && row.shard == shard)
            }
        }
    }

    fn upsert(&mut self, record: EntityRecord) -> bool {
        if !self.fence(record.id, record.generation, record.shard, true) {
            return false;
        }
        let (id, generation, shard) = (record.id, record.generation, record.shard);
        self.rows.insert(id, Row { generation, shard, record: Some(record) });
        true
    }

    fn kv_request(&mut self, request: KvRequest) -> KvReply {
        if self.failing > 0 {
            self.failing -= 1;
            let answer = KvAnswer::Failed("the model store fails, as told".into());
            return KvReply { ticket: request.ticket, key: request.key, answer };
        }
        let current = self
            .kv
            .get(&request.key)
            .map(|(value, version)| KvValue { value: value.clone(), version: *version });
        let answer = match request.op {
            KvOp::Get => KvAnswer::Found(current),
            KvOp::Set { value, expected } => {
                let version = current.as_ref().map_or(0, |c| c.version);
                if expected.is_some_and(|expected| expected != version) {
                    KvAnswer::Conflict(current)
                } else if let Some(value) = value {
                    self.version += 1;
                    self.kv.insert(request.key.clone(), (value, self.version));
                    KvAnswer::Written { version: self.version }
                } else {
                    self.kv.remove(&request.key);
                    KvAnswer::Written { version: 0 }
                }
            }
        };
        KvReply { ticket: request.ticket, key: request.key, answer }
    }

    /// Carries out what was asked, in order: the answers for the shard.
    fn carry_out(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        for asked in std::mem::take(&mut self.asked) {
            match asked {
                Transmit::Kv(requests) => {
                    let replies = requests.into_iter().map(|r| self.kv_request(r)).collect();
                    events.push(Event::KvAnswers(replies));
                }
                Transmit::SaveEntities { round, saves } => {
                    let mut refused = Vec::new();
                    for save in saves {
                        let id = save.id();
                        let applied = match save {
                            EntitySave::Upsert(record) => self.upsert(record),
                            EntitySave::Remove { id, generation, shard, .. } => {
                                let applied = self.fence(id, generation, shard, false);
                                if applied {
                                    let row = Row { generation, shard, record: None };
                                    self.rows.insert(id, row);
                                }
                                applied
                            }
                        };
                        if !applied {
                            refused.push(id);
                        }
                    }
                    events.push(Event::EntitiesSaved { through: round, refused });
                }
                Transmit::LoadEntities { .. } => {
                    let records = self.rows.values().filter_map(|row| row.record.clone());
                    events.push(Event::EntitiesFound(records.collect()));
                }
                Transmit::ClaimEntities(claims) => {
                    let taken = claims.into_iter().filter(|c| self.upsert(c.clone())).collect();
                    events.push(Event::EntitiesClaimed(taken));
                }
                Transmit::Save(players) => {
                    let players = players.iter().map(|p: &SaveRecord| p.player).collect();
                    events.push(Event::Saved { players });
                }
                _ => {}
            }
        }
        events
    }

    /// Persistent entities the store holds (not removed).
    fn n_entities(&self) -> usize {
        self.rows.values().filter(|row| row.record.is_some()).count()
    }
}

struct Scenario {
    core: ShardCore,
    now: Instant,
    players: BTreeMap<String, Player>,
    npcs: BTreeMap<u64, String>,
    client_time: u64,
    logins: u64,
    /// This life of the shard (`restart` starts the next).
    incarnation: u64,
    setup: Setup,
    store: Option<StoreModel>,
    /// Output flushed before the end of a step (with a store), for [`Scenario::received`].
    flushed: Vec<Transmit>,
}

/// How a scenario's shard is made (its opening lines).
#[derive(Clone, Copy, Default)]
struct Setup {
    with_store: bool,
    /// The wolves the game keeps on the shard.
    population: usize,
}

/// A shard core, life `incarnation`, with the game, a store or not, and its first ids.
fn new_core(incarnation: u64, Setup { with_store, population }: Setup, now: Instant) -> ShardCore {
    let config = CoreConfig {
        incarnation,
        id: ME,
        world: Default::default(),
        seed: 7,
        resume_window: Duration::from_secs(30),
        resume_keys: TokenKey::new(vec![7; 32]).expect("a 32-byte key").into(),
        save_interval: with_store.then_some(Duration::from_secs(60)),
        lease_ttl: Duration::from_secs(3600),
        max_npcs: 100,
    };
    let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] };
    let view = ClusterView { partition: Some(partition), ..Default::default() };
    let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
    // Unless told otherwise, no population of its own: the scenarios summon every wolf.
    let game = Box::new(Wolves::new(population));
    let mut core = ShardCore::with_game(&config, metrics, now, game);
    core.handle(now, Event::View(view));
    core.handle(now, Event::LinkOpened { link: LINK, gateway: 1, lane: 0 });
    // Each life its own ids (a real shard claims blocks in etcd).
    let first = FIRST_NPC_ID + (incarnation - 1) * 1000;
    core.handle(now, Event::Ids(first..first + 1000));
    core
}

impl Scenario {
    fn new(setup: Setup) -> Scenario {
        let now = Instant::now();
        Scenario {
            core: new_core(1, setup, now),
            setup,
            now,
            players: BTreeMap::new(),
            npcs: BTreeMap::new(),
            client_time: 0,
            logins: 0,
            incarnation: 1,
            store: setup.with_store.then(StoreModel::default),
            flushed: Vec::new(),
        }
    }

    /// With a store: what the shard asked it so far is carried out and answered, and what
    /// the shard asks next is taken (its output for clients kept for the step's end).
    fn store_round(&mut self) {
        let Some(store) = &mut self.store else { return };
        for event in store.carry_out() {
            self.core.handle(self.now, event);
        }
        let mut out = Vec::new();
        self.core.flush(&mut out);
        self.take_output(out);
    }

    /// Output for clients kept for [`Scenario::received`]; the rest is the store's to do.
    /// Writes of persistent entities are confirmed within their step (the shard answers an
    /// action that saved one only once the store has it, so the action's `done` comes in
    /// the step it was made); everything else waits for the next step.
    fn take_output(&mut self, out: Vec<Transmit>) {
        let mut confirm = Vec::new();
        for transmit in out {
            match (&mut self.store, transmit) {
                (_, gateway @ Transmit::Gateway { .. }) => self.flushed.push(gateway),
                (Some(_), saves @ Transmit::SaveEntities { .. }) => confirm.push(saves),
                (Some(store), other) => store.asked.push(other),
                (None, _) => {}
            }
        }
        let Some(store) = self.store.as_mut().filter(|_| !confirm.is_empty()) else { return };
        let later = std::mem::replace(&mut store.asked, confirm);
        let events = store.carry_out();
        store.asked = later;
        for event in events {
            self.core.handle(self.now, event);
        }
        let mut out = Vec::new();
        self.core.flush(&mut out);
        self.take_output(out);
    }

    fn input(&mut self, name: &str, kind: Input) {
        let player = self.players.get_mut(name).unwrap_or_else(|| panic!("no player {name}"));
        player.seq += 1;
        let input = PlayerInput {
            session: player.session,
            player_id: player.id,
            seq: player.seq,
            kind: Some(kind),
        };
        self.core.handle(self.now, Event::Inputs { link: LINK, inputs: vec![input] });
    }

    fn label(&mut self, id: u64) -> String {
        self.label_as(id, meridian_wolves::WOLF)
    }

    /// The label of `id`, named after `kind` if it has none yet.
    fn label_as(&mut self, id: u64, kind: u32) -> String {
        if let Some((name, _)) = self.players.iter().find(|(_, p)| p.id == id) {
            return name.clone();
        }
        if id == 0 {
            return "world".into();
        }
        if let Some(label) = self.npcs.get(&id) {
            return label.clone();
        }
        let prefix = if kind == meridian_wolves::FLAG { "flag" } else { "wolf" };
        let n = self.npcs.values().filter(|label| label.starts_with(prefix)).count() + 1;
        self.npcs.entry(id).or_insert_with(|| format!("{prefix}{n}")).clone()
    }

    fn id_of(&self, label: &str) -> u64 {
        if let Some(player) = self.players.get(label) {
            return player.id;
        }
        let found = self.npcs.iter().find(|(_, l)| l.as_str() == label);
        found.map(|(id, _)| *id).unwrap_or_else(|| panic!("nobody called {label}"))
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    fn render(&mut self, message: S) -> String {
        let xy = |p: Option<client_pb::Position>| p.map_or((0, 0), |p| (p.x, p.y));
        match message {
            S::LoginOk(ok) => {
                let (x, y) = xy(ok.position);
                format!("login {x},{y}")
            }
            S::Entered(e) => {
                let (x, y) = xy(e.position);
                let mut line = format!("entered {} {x},{y}", self.label_as(e.player_id, e.kind));
                if e.kind != 0 {
                    line += &format!(" kind={}", e.kind);
                }
                if !e.state.is_empty() {
                    line += &format!(" state={}", Self::text(&e.state));
                }
                line
            }
            S::Moved(m) => {
                let (x, y) = xy(m.position);
                let mut line = format!("moved {} {x},{y}", self.label(m.player_id));
                if m.client_time != 0 {
                    line += &format!(" t={}", m.client_time);
                }
                line
            }
            S::Left(left) => format!("left {}", self.label(left.player_id)),
            S::StateChanged(c) => {
                format!("state {} {}", self.label(c.entity_id), Self::text(&c.state))
            }
            S::Event(e) => {
                format!("event {} {} {}", self.label(e.source), e.kind, Self::text(&e.payload))
                    .trim_end()
                    .to_string()
            }
            S::ActionDone(done) => {
                let payload = Self::text(&done.payload);
                let payload = match payload.parse::<u64>() {
                    Ok(id) if id >= FIRST_NPC_ID => self.label(id),
                    _ => payload,
                };
                format!("done t={} {payload}", done.client_time).trim_end().to_string()
            }
            S::Error(error) => {
                let code = ErrorCode::try_from(error.code).map_or("?", |c| c.as_str_name());
                format!("error {code} t={} {}", error.client_time, error.detail)
            }
            S::Chat(chat) => format!("chat {} {}", self.label(chat.player_id), chat.text),
            S::Pong(pong) => format!("pong {}", pong.client_time),
            S::ViewReset(reset) => {
                let (x, y) = xy(reset.position);
                format!("view-reset {x},{y}")
            }
        }
    }

    /// Ends the round: what each player received, rendered.
    fn received(&mut self) -> BTreeMap<String, Vec<String>> {
        let mut out = Vec::new();
        self.core.flush(&mut out);
        self.take_output(out);
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for transmit in std::mem::take(&mut self.flushed) {
            let Transmit::Gateway { batch, .. } = transmit else { continue };
            for delivery in batch.deliveries {
                let Some(name) = self
                    .players
                    .iter()
                    .find(|(_, p)| p.session == delivery.session)
                    .map(|(n, _)| n.clone())
                else {
                    continue;
                };
                let mut frames = &delivery.frames[..];
                while let Some(header) = next_frame(frames, usize::MAX).expect("whole frames") {
                    let message = client_pb::ServerMessage::decode(header.body(frames))
                        .expect("a server message");
                    let line = self.render(message.kind.expect("a kind"));
                    got.entry(name.clone()).or_default().push(line);
                    frames = &frames[header.total_len()..];
                }
            }
        }
        got
    }

    /// Runs one command; what a check found wrong, if anything.
    fn run_command(&mut self, line: &str) -> Option<String> {
        self.store_round();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["player", name, at] => {
                let (x, y) = cell(at);
                // A player logging in again (after a `restart`) keeps its id.
                let id = match self.players.get(*name) {
                    Some(player) => player.id,
                    None => self.players.len() as u64 + 1,
                };
                self.logins += 1;
                let player = Player { id, session: 0x100 + self.logins, seq: 0 };
                self.players.insert(name.to_string(), player);
                let join = Join {
                    name: name.to_string(),
                    spawn: Some(client_pb::Position { x, y }),
                    ..Default::default()
                };
                self.input(name, Input::Join(join));
            }
            ["move", name, direction] => {
                let direction = match *direction {
                    "up" => client_pb::Direction::Up,
                    "down" => client_pb::Direction::Down,
                    "left" => client_pb::Direction::Left,
                    "right" => client_pb::Direction::Right,
                    other => panic!("no direction {other}"),
                };
                self.client_time += 1;
                let m =
                    client_pb::Move { direction: direction as i32, client_time: self.client_time };
                self.input(name, Input::Move(m));
            }
            ["action", name, kind, rest @ ..] => {
                let mut action = client_pb::Action {
                    kind: kind.parse().expect("an action kind"),
                    ..Default::default()
                };
                for option in rest {
                    match option.split_once('=') {
                        Some(("target", who)) => action.target = self.id_of(who),
                        Some(("payload", text)) => action.payload = text.as_bytes().to_vec(),
                        _ => panic!("unknown option {option}"),
                    }
                }
                self.client_time += 1;
                action.client_time = self.client_time;
                self.input(name, Input::Action(action));
            }
            ["wait", duration] => {
                let total = parse_duration(duration);
                let step = Duration::from_millis(100);
                let mut waited = Duration::ZERO;
                while waited < total {
                    self.now += step;
                    waited += step;
                    self.core.handle(self.now, Event::Tick);
                    self.core.handle(self.now, Event::GameTick);
                    self.store_round();
                }
            }
            ["kv", key, rest @ ..] => {
                let store = self.store.as_ref().expect("`kv` needs a scenario with `store`");
                let found = store.kv.get(key.as_bytes()).map(|(v, _)| Self::text(v));
                let expected = match rest {
                    ["=", value] => Some(value.to_string()),
                    ["absent"] => None,
                    _ => panic!("cannot read {line:?}: kv KEY = VALUE, or kv KEY absent"),
                };
                if found != expected {
                    return Some(format!("the store has {found:?} at {key}"));
                }
            }
            ["kv-set", key, value] => {
                let store = self.store.as_mut().expect("`kv-set` needs a scenario with `store`");
                store.version += 1;
                store
                    .kv
                    .insert(key.as_bytes().to_vec(), (value.as_bytes().to_vec(), store.version));
            }
            ["kv-fail", n] => {
                let store = self.store.as_mut().expect("`kv-fail` needs a scenario with `store`");
                store.failing = n.parse().expect("a number of requests");
            }
            ["npcs", kind, n] => {
                let needle = format!("\"kind\":{kind},");
                let owned = self.core.report(self.now).matches(&needle).count();
                if owned.to_string() != *n {
                    return Some(format!("the shard owns {owned} NPCs of kind {kind}"));
                }
            }
            ["entities", n] => {
                let store = self.store.as_ref().expect("`entities` needs a scenario with `store`");
                let n: usize = n.parse().expect("a number of entities");
                if store.n_entities() != n {
                    return Some(format!("the store holds {} entities", store.n_entities()));
                }
            }
            ["restart"] => {
                assert!(self.store.is_some(), "`restart` needs a scenario with `store`");
                // What the dead life flushed for clients is lost with its connections.
                self.flushed.clear();
                self.incarnation += 1;
                self.core = new_core(self.incarnation, self.setup, self.now);
            }
            _ => panic!("cannot read {line:?}"),
        }
        None
    }
}

fn cell(text: &str) -> (u32, u32) {
    let (x, y) = text.split_once(',').expect("X,Y");
    (x.parse().expect("x"), y.parse().expect("y"))
}

fn parse_duration(text: &str) -> Duration {
    if let Some(ms) = text.strip_suffix("ms") {
        return Duration::from_millis(ms.parse().expect("milliseconds"));
    }
    let secs = text.strip_suffix('s').expect("a duration in ms or s");
    Duration::from_secs(secs.parse().expect("seconds"))
}

/// Plays one scenario; every difference between what was expected and what came.
fn play(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("a scenario file");
    let mut problems = Vec::new();
    let mut steps: Vec<(usize, String, BTreeMap<String, Vec<String>>)> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(' ') {
            let (who, what) = line.trim().split_once(": ").expect("  who: message");
            let step = steps.last_mut().expect("an expectation follows a command");
            step.2.entry(who.to_string()).or_default().push(what.to_string());
        } else {
            steps.push((n + 1, line.to_string(), BTreeMap::new()));
        }
    }
    let mut setup = Setup::default();
    while let Some((_, opening, _)) = steps.first() {
        match opening.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["store"] => setup.with_store = true,
            ["population", n] => setup.population = n.parse().expect("a number of wolves"),
            _ => break,
        }
        steps.remove(0);
    }
    let mut scenario = Scenario::new(setup);
    for (line_number, command, expected) in steps {
        if let Some(wrong) = scenario.run_command(&command) {
            problems.push(format!("{}:{line_number} `{command}`: {wrong}", path.display()));
        }
        let got = scenario.received();
        if std::env::var_os("RULES_PRINT").is_some() {
            // What happened, written as a scenario (to review, then keep as expected).
            println!("{command}");
            for (who, lines) in &got {
                for line in lines {
                    println!("  {who}: {line}");
                }
            }
        }
        if got != expected {
            problems.push(format!(
                "{}:{line_number} `{command}`\n  expected: {expected:#?}\n  got: {got:#?}",
                path.display()
            ));
            if std::env::var_os("RULES_PRINT").is_none() {
                break;
            }
        }
    }
    problems
}

#[test]
fn every_rules_scenario_plays_as_written() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rules");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/rules")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rules"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the scenarios are there");
    let problems: Vec<String> = files.iter().flat_map(|f| play(f)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
