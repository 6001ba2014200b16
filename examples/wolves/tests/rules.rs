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
//! NPCs are named `wolf1`, `wolf2`, ... in the order they first appear. Messages read:
//! `login X,Y`, `entered WHO X,Y [kind=K] [state=S]`, `moved WHO X,Y [t=N]`, `left WHO`,
//! `state WHO S`, `event SOURCE KIND PAYLOAD`, `done t=N PAYLOAD`, `error CODE t=N DETAIL`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_protocol::pb::{self as client_pb, server_message::Kind as S, ErrorCode};
use meridian_protocol::{next_frame, TokenKey};
use meridian_rpc::pb::{player_input::Kind as Input, Join, PlayerInput};
use meridian_shard_core::core::ShardCore;
use meridian_shard_core::{CoreConfig, Event, LinkId, ShardMetrics, Transmit};
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

struct Scenario {
    core: ShardCore,
    now: Instant,
    players: BTreeMap<String, Player>,
    npcs: BTreeMap<u64, String>,
    client_time: u64,
}

impl Scenario {
    fn new() -> Scenario {
        let config = CoreConfig {
            incarnation: 1,
            id: ME,
            world: Default::default(),
            seed: 7,
            resume_window: Duration::from_secs(30),
            resume_keys: TokenKey::new(vec![7; 32]).expect("a 32-byte key").into(),
            save_interval: None,
            lease_ttl: Duration::from_secs(3600),
            max_npcs: 100,
        };
        let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
        let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] };
        let view = ClusterView { partition: Some(partition), ..Default::default() };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
        let now = Instant::now();
        // No population of its own: the scenarios summon every wolf.
        let game = Box::new(Wolves::new(0));
        let mut core = ShardCore::with_game(&config, metrics, now, game);
        core.handle(now, Event::View(view));
        core.handle(now, Event::LinkOpened { link: LINK, gateway: 1, lane: 0 });
        core.handle(now, Event::Ids(FIRST_NPC_ID..FIRST_NPC_ID + 1000));
        Scenario { core, now, players: BTreeMap::new(), npcs: BTreeMap::new(), client_time: 0 }
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
        if let Some((name, _)) = self.players.iter().find(|(_, p)| p.id == id) {
            return name.clone();
        }
        if id == 0 {
            return "world".into();
        }
        let n = self.npcs.len() + 1;
        self.npcs.entry(id).or_insert_with(|| format!("wolf{n}")).clone()
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
                let mut line = format!("entered {} {x},{y}", self.label(e.player_id));
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
        let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for transmit in out {
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

    fn run_command(&mut self, line: &str) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["player", name, at] => {
                let (x, y) = cell(at);
                let n = self.players.len() as u64 + 1;
                let player = Player { id: n, session: 0x100 + n, seq: 0 };
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
                }
            }
            _ => panic!("cannot read {line:?}"),
        }
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
    let mut scenario = Scenario::new();
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
    for (line_number, command, expected) in steps {
        scenario.run_command(&command);
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
