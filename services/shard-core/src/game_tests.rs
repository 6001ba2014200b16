//! The game in the core, driven by hand: actions here and at a target's owner, answers in
//! order, the owner's silence, requests from peers, and state changes once per tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_game::{
    Action, Context, EntityId, Game, Host, KvAnswer, KvTicket, KvValue, Position, Reply,
};
use meridian_protocol::pb::{self as client_pb, server_message::Kind as Server, ErrorCode};
use meridian_protocol::{next_frame, TokenKey};
use meridian_rpc::pb::{
    peer_message::Kind as Peer, player_input::Kind as Input, ActionAnswer, ActionRequest,
    GhostUpsert, Join, PeerMessage, PlayerInput,
};
use prost::Message;

use crate::core::ShardCore;
use crate::kv::{KvOp, KvReply, KvRequest};
use crate::types::{CoreConfig, EntityRecord, EntitySave, Event, LinkId, Transmit};
use crate::ShardMetrics;

const ME: ShardId = ShardId(1);
const NEIGHBOUR: ShardId = ShardId(2);
const LINK: LinkId = LinkId(1);
const SESSION: u64 = 0x100;
const PLAYER: u64 = 1;
const GHOST_WOLF: u64 = 5_000;

/// Answers every action with its own payload; `kind` 9 is refused, `kind` 13 panics;
/// `kind` 20 writes its payload at the key "k" of the key-value space if its version is
/// still 0 (answered with the ticket, or the refusal), and tells the actor the store's
/// answer as a game event of kind 77; `kind` 21 plants a persistent entity of kind 2 on the
/// actor's cell (answered with its id), `kind` 22 despawns its target.
struct Echo;

impl Game for Echo {
    fn action(&mut self, ctx: &mut Context<'_>, actor: EntityId, action: Action<'_>) -> Reply {
        match action.kind {
            9 => Reply::rejected("not that one"),
            13 => panic!("a bug in the game"),
            20 => match ctx.kv_set(b"k", Some(action.payload), Some(0)) {
                Ok(ticket) => Reply::Done(ticket.0.to_string().into_bytes()),
                Err(error) => Reply::rejected(error.to_string()),
            },
            21 => {
                let at = ctx.position(actor).expect("the actor");
                match ctx.spawn_persistent(2, "flag", at, action.payload.to_vec()) {
                    Ok(id) => Reply::Done(id.0.to_string().into_bytes()),
                    Err(error) => Reply::rejected(error.to_string()),
                }
            }
            22 => match ctx.despawn(action.target.expect("a target")) {
                Ok(()) => Reply::done(),
                Err(error) => Reply::rejected(error.to_string()),
            },
            _ => Reply::Done(action.payload.to_vec()),
        }
    }

    /// Tells the player of an arrival, with the arrival's private state (kind 78).
    fn arrived(&mut self, ctx: &mut Context<'_>, entity: EntityId) {
        let private = ctx.private_state(entity).unwrap_or_default().to_vec();
        ctx.event_to(EntityId(PLAYER), Some(entity), 78, &private);
    }

    fn kv_answer(&mut self, ctx: &mut Context<'_>, ticket: KvTicket, key: &[u8], answer: KvAnswer) {
        let told = format!("{} {} {answer:?}", ticket.0, String::from_utf8_lossy(key));
        ctx.event_to(EntityId(PLAYER), None, 77, told.as_bytes());
    }
}

struct Harness {
    core: ShardCore,
    now: Instant,
    seq: u64,
    /// The key-value requests flushed so far.
    kv: Vec<KvRequest>,
    /// What went to the store for persistent entities: writes, loads asked, claims.
    saved: Vec<EntitySave>,
    /// The numbers of the rounds of writes flushed so far.
    rounds: Vec<u64>,
    loads: usize,
    claims: Vec<EntityRecord>,
}

impl Harness {
    /// A shard owning the whole map, running `Echo`, with a player at (10, 10) and a ghost
    /// of a neighbour's wolf next to it.
    fn new() -> Harness {
        Harness::with_store(false)
    }

    /// As [`Harness::new`], with a store if `store` (saves every second).
    fn with_store(store: bool) -> Harness {
        let config = CoreConfig {
            id: ME,
            incarnation: 1,
            world: Default::default(),
            seed: 1,
            resume_window: Duration::from_secs(30),
            resume_keys: TokenKey::new(vec![7; 32]).expect("a 32-byte key").into(),
            save_interval: store.then_some(Duration::from_secs(1)),
            lease_ttl: Duration::from_secs(3600),
            max_npcs: 10,
        };
        let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
        let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] };
        let view = ClusterView { partition: Some(partition), ..Default::default() };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
        let now = Instant::now();
        let mut core = ShardCore::with_game(&config, metrics, now, Box::new(Echo));
        core.handle(now, Event::View(view));
        core.handle(now, Event::LinkOpened { link: LINK, gateway: 1, lane: 0 });
        core.handle(now, Event::Ids(9_000..9_100));
        let mut h = Harness {
            core,
            now,
            seq: 0,
            kv: Vec::new(),
            saved: Vec::new(),
            rounds: Vec::new(),
            loads: 0,
            claims: Vec::new(),
        };
        let join = Join {
            name: "ann".into(),
            spawn: Some(client_pb::Position { x: 10, y: 10 }),
            ..Default::default()
        };
        h.input(Input::Join(join));
        let upsert = GhostUpsert {
            name: "wolf".into(),
            position: Some(client_pb::Position { x: 11, y: 10 }),
            kind: 1,
            state: b"hp=10".to_vec(),
            ..Default::default()
        };
        h.peer(GHOST_WOLF, Peer::Upsert(upsert));
        h.flush();
        h
    }

    fn input(&mut self, kind: Input) {
        self.seq += 1;
        let input =
            PlayerInput { session: SESSION, player_id: PLAYER, seq: self.seq, kind: Some(kind) };
        self.core.handle(self.now, Event::Inputs { link: LINK, inputs: vec![input] });
    }

    fn action(&mut self, kind: u32, target: u64, client_time: u64) {
        let payload = format!("p{client_time}").into_bytes();
        self.input(Input::Action(client_pb::Action { kind, payload, target, client_time }));
    }

    fn peer(&mut self, about: u64, kind: Peer) {
        let message =
            PeerMessage { player_id: about, generation: 0, subject_seq: 0, kind: Some(kind) };
        self.core.handle(self.now, Event::Peer { from: NEIGHBOUR, messages: vec![message] });
    }

    /// Ends the round: what the player was told, and what went to the neighbour.
    fn flush(&mut self) -> (Vec<Server>, Vec<PeerMessage>) {
        let mut out = Vec::new();
        self.core.flush(&mut out);
        let (mut told, mut sent) = (Vec::new(), Vec::new());
        for transmit in out {
            match transmit {
                Transmit::Gateway { batch, .. } => {
                    for delivery in batch.deliveries {
                        let mut frames = &delivery.frames[..];
                        while let Some(header) = next_frame(frames, usize::MAX).expect("frames") {
                            let message = client_pb::ServerMessage::decode(header.body(frames))
                                .expect("a server message");
                            told.push(message.kind.expect("a kind"));
                            frames = &frames[header.total_len()..];
                        }
                    }
                }
                Transmit::Peer { to: NEIGHBOUR, messages } => sent.extend(messages),
                Transmit::Kv(requests) => self.kv.extend(requests),
                Transmit::SaveEntities { round, saves } => {
                    self.rounds.push(round);
                    self.saved.extend(saves)
                }
                Transmit::LoadEntities { .. } => self.loads += 1,
                Transmit::ClaimEntities(claims) => self.claims.extend(claims),
                _ => {}
            }
        }
        (told, sent)
    }

    fn wait(&mut self, wait: Duration) {
        self.now += wait;
        self.core.handle(self.now, Event::Tick);
    }
}

/// The answers among what the player was told, in order.
fn answers(told: &[Server]) -> Vec<String> {
    told.iter()
        .filter_map(|m| match m {
            Server::ActionDone(d) => {
                Some(format!("done {} {}", d.client_time, String::from_utf8_lossy(&d.payload)))
            }
            Server::Moved(m) if m.client_time != 0 => Some(format!("ack {}", m.client_time)),
            Server::Error(e) => {
                let code = ErrorCode::try_from(e.code).map_or("?", |c| c.as_str_name());
                Some(format!("{code} {}", e.client_time))
            }
            Server::Pong(p) => Some(format!("pong {}", p.client_time)),
            Server::Event(e) if e.kind == 77 => {
                Some(format!("kv {}", String::from_utf8_lossy(&e.payload)))
            }
            Server::Event(e) if e.kind == 78 => {
                Some(format!("arrived {} {}", e.source, String::from_utf8_lossy(&e.payload)))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_action_here_is_answered_at_once_in_order_with_moves() {
    let mut h = Harness::new();
    h.action(3, 0, 1);
    h.input(Input::Move(client_pb::Move {
        direction: client_pb::Direction::Up as i32,
        client_time: 2,
    }));
    h.action(9, 0, 3);
    let (told, sent) = h.flush();
    assert_eq!(answers(&told), ["done 1 p1", "ack 2", "REJECTED 3"]);
    assert!(sent.is_empty(), "nothing for the neighbour: {sent:?}");
}

#[test]
fn an_action_on_a_ghost_is_answered_by_its_owner_and_later_inputs_wait_for_it() {
    let mut h = Harness::new();
    h.action(3, GHOST_WOLF, 1);
    h.input(Input::Move(client_pb::Move {
        direction: client_pb::Direction::Up as i32,
        client_time: 2,
    }));
    h.input(Input::Ping(client_pb::Ping { client_time: 3 }));
    let (told, sent) = h.flush();
    assert_eq!(answers(&told), Vec::<String>::new(), "everything waits for the owner's answer");
    let request = sent.iter().find_map(|m| match &m.kind {
        Some(Peer::Action(request)) if m.player_id == GHOST_WOLF => Some(request.clone()),
        _ => None,
    });
    let request = request.expect("the action went to the wolf's owner");
    assert_eq!((request.actor, request.origin), (PLAYER, ME.0));
    let answer = ActionAnswer {
        client_time: 1,
        done: true,
        payload: b"bitten".to_vec(),
        rejected: String::new(),
    };
    h.peer(PLAYER, Peer::Answer(answer));
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["done 1 bitten", "ack 2", "pong 3"], "in the order they were sent");
}

#[test]
fn an_action_whose_owner_never_answers_is_answered_unavailable_and_the_player_goes_on() {
    let mut h = Harness::new();
    h.action(3, GHOST_WOLF, 1);
    h.input(Input::Move(client_pb::Move {
        direction: client_pb::Direction::Up as i32,
        client_time: 2,
    }));
    h.flush();
    h.wait(crate::game::ACTION_ANSWER_WITHIN + Duration::from_millis(200));
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["UNAVAILABLE 1", "ack 2"]);
    // The answer, late: dropped (the action was answered already).
    let answer =
        ActionAnswer { client_time: 1, done: true, payload: Vec::new(), rejected: String::new() };
    h.peer(PLAYER, Peer::Answer(answer));
    assert_eq!(answers(&h.flush().0), Vec::<String>::new(), "one answer per action");
}

#[test]
fn an_action_from_a_neighbours_player_runs_here_and_is_answered_to_its_shard() {
    let mut h = Harness::new();
    let wolf =
        Host::spawn(&mut h.core, 1, "wolf", Position::new(20, 20), Vec::new()).expect("spawn");
    h.flush();
    let action =
        client_pb::Action { kind: 3, payload: b"x".to_vec(), target: wolf.0, client_time: 8 };
    h.peer(
        wolf.0,
        Peer::Action(ActionRequest { actor: 77, action: Some(action), origin: NEIGHBOUR.0 }),
    );
    let (_, sent) = h.flush();
    let answer = sent.iter().find_map(|m| match &m.kind {
        Some(Peer::Answer(answer)) if m.player_id == 77 => Some(answer.clone()),
        _ => None,
    });
    let answer = answer.expect("answered to the actor's shard");
    assert_eq!((answer.client_time, answer.done, answer.payload.as_slice()), (8, true, &b"x"[..]));
    // On an entity gone from here: refused, still answered.
    Host::despawn(&mut h.core, wolf).expect("despawn");
    let action =
        client_pb::Action { kind: 3, target: wolf.0, client_time: 9, ..Default::default() };
    h.peer(
        wolf.0,
        Peer::Action(ActionRequest { actor: 77, action: Some(action), origin: NEIGHBOUR.0 }),
    );
    let (_, sent) = h.flush();
    assert!(
        sent.iter()
            .any(|m| matches!(&m.kind, Some(Peer::Answer(a)) if a.client_time == 9 && !a.done)),
        "{sent:?}"
    );
}

#[test]
fn public_state_is_sent_at_most_once_per_tick() {
    let mut h = Harness::new();
    let wolf = Host::spawn(&mut h.core, 1, "wolf", Position::new(12, 10), b"hp=10".to_vec())
        .expect("spawn");
    h.flush();
    Host::set_state(&mut h.core, wolf, b"hp=9".to_vec()).expect("state");
    Host::set_state(&mut h.core, wolf, b"hp=8".to_vec()).expect("state");
    assert!(h.flush().0.is_empty(), "nothing before the tick");
    h.core.handle(h.now, Event::GameTick);
    let (told, _) = h.flush();
    let changes: Vec<_> = told
        .iter()
        .filter_map(|m| match m {
            Server::StateChanged(c) if c.entity_id == wolf.0 => Some(c.state.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(changes, [b"hp=8".to_vec()], "one change, the last");
    assert!(Host::set_state(&mut h.core, wolf, vec![0; 1025]).is_err(), "1 KiB at most");
    assert!(Host::set_state(&mut h.core, EntityId(GHOST_WOLF), vec![1]).is_err(), "not a ghost's");
}

#[test]
fn two_actions_on_ghosts_in_a_row_are_sent_one_after_the_other() {
    let mut h = Harness::new();
    h.action(3, GHOST_WOLF, 1);
    h.action(3, GHOST_WOLF, 2);
    h.input(Input::Move(client_pb::Move {
        direction: client_pb::Direction::Up as i32,
        client_time: 3,
    }));
    let requests = |sent: &[PeerMessage]| -> Vec<u64> {
        sent.iter()
            .filter_map(|m| match &m.kind {
                Some(Peer::Action(r)) => r.action.as_ref().map(|a| a.client_time),
                _ => None,
            })
            .collect()
    };
    let (told, sent) = h.flush();
    assert_eq!((answers(&told), requests(&sent)), (vec![], vec![1]), "the second waits");
    let done = |t| ActionAnswer {
        client_time: t,
        done: true,
        payload: Vec::new(),
        rejected: String::new(),
    };
    h.peer(PLAYER, Peer::Answer(done(1)));
    let (told, sent) = h.flush();
    assert_eq!((answers(&told), requests(&sent)), (vec!["done 1 ".to_string()], vec![2]));
    h.peer(PLAYER, Peer::Answer(done(2)));
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["done 2 ", "ack 3"]);
}

#[test]
fn a_game_that_panics_does_not_take_the_shard_down() {
    let mut h = Harness::new();
    h.action(13, 0, 1);
    h.action(3, 0, 2);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["REJECTED 1", "done 2 p2"], "answered, and the game goes on");
    assert_eq!(h.core.metrics.game_panics.get(), 1);
}

/// A drain waits for NPCs to be handed off while another shard lives to take them; the
/// last shard of a stopping cluster does not wait for them (found in CI: `meridian up`
/// stopping its shards one by one handed a wolf along to the last one, which then waited
/// for its drain deadline).
#[test]
fn a_drain_waits_for_npcs_only_while_another_shard_can_take_them() {
    let mut h = Harness::new();
    Host::spawn(&mut h.core, 1, "wolf", Position::new(30, 30), Vec::new()).expect("spawn");
    let (waiting, ..) = h.core.drain_status(h.now);
    assert_eq!(waiting, 1, "alone in the cluster: only the player counts");
    let mut view = ClusterView { partition: None, ..Default::default() };
    let record = meridian_cluster::ShardRecord {
        id: NEIGHBOUR,
        grpc: "127.0.0.1:1".into(),
        admin: "127.0.0.1:2".into(),
        state: meridian_cluster::ShardState::Serving,
        players: 0,
        load: Default::default(),
        incarnation: 1,
        transport: None,
    };
    view.shards.insert(NEIGHBOUR, record);
    let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    view.partition = Some(PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] });
    h.core.handle(h.now, Event::View(view));
    let (waiting, ..) = h.core.drain_status(h.now);
    assert_eq!(waiting, 2, "another shard lives: the wolf is to be handed off too");
}

#[test]
fn a_key_value_request_goes_to_the_shell_and_its_answer_to_the_game_in_a_later_round() {
    let mut h = Harness::with_store(true);
    h.action(20, 0, 1);
    h.action(20, 0, 2);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["done 1 1", "done 2 2"], "answered at once with the tickets");
    let set = |ticket, value: &[u8]| KvRequest {
        ticket: KvTicket(ticket),
        key: b"k".to_vec(),
        op: KvOp::Set { value: Some(value.to_vec()), expected: Some(0) },
    };
    assert_eq!(h.kv, [set(1, b"p1"), set(2, b"p2")], "in the order made");
    let reply = |ticket, answer| KvReply { ticket: KvTicket(ticket), key: b"k".to_vec(), answer };
    let won = KvValue { value: b"p1".to_vec(), version: 4 };
    let replies =
        vec![reply(1, KvAnswer::Written { version: 4 }), reply(2, KvAnswer::Conflict(Some(won)))];
    h.core.handle(h.now, Event::KvAnswers(replies));
    let (told, _) = h.flush();
    assert_eq!(
        answers(&told),
        [
            "kv 1 k Written { version: 4 }",
            "kv 2 k Conflict(Some(KvValue { value: [112, 49], version: 4 }))"
        ]
    );
}

#[test]
fn without_a_store_a_key_value_request_is_refused_at_once() {
    let mut h = Harness::new();
    h.action(20, 0, 1);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["REJECTED 1"]);
    assert!(h.kv.is_empty());
}

#[path = "persistent_tests.rs"]
mod persistent;
