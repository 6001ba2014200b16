//! The world task driven by hand: one gateway link, no sockets, etcd or peers. Inputs go in
//! through the same entry points the streams use; what a connection receives comes out of
//! the round's `ShardBatch`es, decoded frame by frame.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_cluster::{ClusterView, PartitionMap, Region, ShardId};
use meridian_protocol::pb::{self as client_pb, server_message::Kind as Server, ErrorCode};
use meridian_protocol::{next_frame, TokenKey, TokenKeys};
use meridian_rpc::pb::{player_input::Kind as Input, Handoff, Join, Leave, PlayerInput};
use meridian_world::PlayerId;
use prost::Message;

use super::ShardCore;
use crate::types::PENDING_LIMIT;
use crate::types::{CoreConfig, Event, LinkId, SaveRecord, Transmit};
use crate::ShardMetrics;

const ME: ShardId = ShardId(1);
const OLD_OWNER: ShardId = ShardId(2);
const GATEWAY: u32 = 7;
const LINK: LinkId = LinkId(1);
const SESSION: u64 = 0x0000_0000_0100_0001;

struct Harness {
    actor: ShardCore,
    now: Instant,
}

impl Harness {
    /// A shard owning the whole map with one gateway link open.
    fn new() -> Harness {
        Harness::saving(None)
    }

    /// The same, saving its players every `save_interval` (a player store).
    fn saving(save_interval: Option<Duration>) -> Harness {
        // Tests jump the clock by seconds at a time (the real shell ticks every 100 ms).
        Harness::with(save_interval, Duration::from_secs(3600))
    }

    /// The same, with a lease of 3 s, for the tests about pauses.
    fn pausing() -> Harness {
        Harness::with(None, Duration::from_secs(3))
    }

    fn with(save_interval: Option<Duration>, lease_ttl: Duration) -> Harness {
        let config = CoreConfig {
            id: ME,
            incarnation: 1,
            world: Default::default(),
            seed: 1,
            resume_window: Duration::from_secs(30),
            resume_keys: TokenKey::new(vec![7; 32]).expect("invariant: a 32-byte key").into(),
            save_interval,
            lease_ttl,
            max_npcs: crate::types::DEFAULT_MAX_NPCS,
        };
        let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
        let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] };
        let view = ClusterView { partition: Some(partition), ..Default::default() };
        let metrics = Arc::new(ShardMetrics::new(&Default::default(), ME));
        let now = Instant::now();
        let mut actor = ShardCore::new(&config, metrics, now);
        actor.handle(now, Event::View(view));
        actor.handle(now, Event::LinkOpened { link: LINK, gateway: GATEWAY, lane: 0 });
        Harness { actor, now }
    }

    /// From the gateway link.
    fn direct(&mut self, player: u64, seq: u64, kind: Input) {
        let inputs = vec![input(player, seq, kind)];
        self.actor.handle(self.now, Event::Inputs { link: LINK, inputs });
    }

    /// Forwarded by another shard (no link).
    fn forwarded(&mut self, player: u64, seq: u64, kind: Input) {
        self.actor.on_input(None, input(player, seq, kind));
    }

    fn join(&mut self, player: u64, seq: u64) {
        let spawn = Some(client_pb::Position { x: 10, y: 10 });
        let join = Join {
            name: format!("p{player}"),
            spawn,
            restore: false,
            generation: 0,
            gateway_id: 0,
            epoch: 0,
            state: Vec::new(),
            login_stamp: 0,
            budgets: None,
        };
        self.direct(player, seq, Input::Join(join));
    }

    /// The old owner hands `player` over, next input `next_seq`.
    fn handoff(&mut self, player: u64, next_seq: u64) {
        let handoff = handoff_message(player, (50, 50), next_seq);
        self.actor.handoff_in(OLD_OWNER, PlayerId(player), 1, handoff);
    }

    /// Lets `wait` pass and runs the tick.
    fn wait(&mut self, wait: Duration) {
        self.now += wait;
        self.actor.handle(self.now, Event::Tick);
    }

    /// Lets the inputs held for a player not here wait past their limit.
    fn expire_early(&mut self) {
        self.wait(crate::inputs::EARLY_WAIT * 2);
    }

    /// Ends the round; what the test connection received in it, in order.
    fn received(&mut self) -> Vec<Server> {
        let mut out = Vec::new();
        self.actor.flush(&mut out);
        let mut messages = Vec::new();
        for transmit in out {
            let Transmit::Gateway { link: LINK, batch } = transmit else { continue };
            for delivery in batch.deliveries.into_iter().filter(|d| d.session == SESSION) {
                let mut frames = &delivery.frames[..];
                while let Some(header) = next_frame(frames, usize::MAX).expect("a whole frame") {
                    let message = client_pb::ServerMessage::decode(header.body(frames))
                        .expect("a server message");
                    messages.push(message.kind.expect("a message with a kind"));
                    frames = &frames[header.total_len()..];
                }
                assert!(frames.is_empty(), "deliveries hold whole frames only");
            }
        }
        messages
    }
}

fn input(player: u64, seq: u64, kind: Input) -> PlayerInput {
    PlayerInput { session: SESSION, player_id: player, seq, kind: Some(kind) }
}

fn a_move(client_time: u64) -> Input {
    let direction = client_pb::Direction::Right as i32;
    Input::Move(client_pb::Move { direction, client_time })
}

fn ping(client_time: u64) -> Input {
    Input::Ping(client_pb::Ping { client_time })
}

fn chat(text: &str) -> Input {
    Input::Chat(client_pb::Chat { text: text.into() })
}

/// Every answer, in order: Move acks and errors with their client_time, Pongs, and errors
/// without one (a Chat's).
fn answers(messages: &[Server]) -> Vec<(&'static str, u64)> {
    messages
        .iter()
        .filter_map(|message| match message {
            Server::Moved(moved) if moved.client_time != 0 => Some(("ack", moved.client_time)),
            Server::Error(error) if error.code == ErrorCode::Unavailable as i32 => {
                let what =
                    if error.client_time == 0 { "chat not delivered" } else { "unavailable" };
                Some((what, error.client_time))
            }
            Server::Pong(pong) => Some(("pong", pong.client_time)),
            _ => None,
        })
        .collect()
}

#[test]
fn past_the_out_of_order_limit_the_newest_input_is_answered_and_later_ones_still_flow() {
    let mut shard = Harness::new();
    shard.join(1, 1);
    shard.received();
    // Seq 2 is late; 3 ..= PENDING_LIMIT + 3 wait for it: one more than may be held.
    let last_held = 2 + PENDING_LIMIT as u64;
    for seq in 3..=last_held + 1 {
        shard.direct(1, seq, ping(seq));
    }
    assert_eq!(
        answers(&shard.received()),
        vec![("pong", last_held + 1)],
        "the input past the limit is answered at once"
    );
    shard.direct(1, 2, ping(2));
    let expected: Vec<_> = (2..=last_held).map(|seq| ("pong", seq)).collect();
    assert_eq!(answers(&shard.received()), expected, "the held inputs, in order, once seq 2 came");
    shard.direct(1, last_held + 2, ping(last_held + 2));
    assert_eq!(
        answers(&shard.received()),
        vec![("pong", last_held + 2)],
        "an input after the refused one is applied: the refused seq left no gap"
    );
}

#[test]
fn inputs_refused_while_the_player_was_not_here_leave_no_gap_when_it_arrives() {
    let mut shard = Harness::new();
    // The gateway switched to this shard; the handoff is slow. Seq 3 comes forwarded (no
    // link), 4 ..= 6 straight from the gateway.
    shard.forwarded(9, 3, a_move(3));
    shard.direct(9, 4, a_move(4));
    shard.direct(9, 5, chat("hello"));
    shard.direct(9, 6, ping(6));
    shard.expire_early();
    assert_eq!(
        answers(&shard.received()),
        vec![("unavailable", 3), ("unavailable", 4), ("chat not delivered", 0), ("pong", 6)],
        "every input answered in seq order, the forwarded move through the gateway link its \
         session uses"
    );
    // The handoff arrives after all, from before seq 2.
    shard.handoff(9, 2);
    shard.forwarded(9, 2, a_move(2));
    shard.direct(9, 7, a_move(7));
    assert_eq!(
        answers(&shard.received()),
        vec![("ack", 2), ("ack", 7)],
        "seq 2 is applied, 3 ..= 6 were answered already, and seq 7 does not wait for them"
    );
    // A late copy of a refused input (the gateway resends what is unconfirmed) is not
    // answered twice.
    shard.direct(9, 4, a_move(4));
    assert_eq!(answers(&shard.received()), vec![], "a refused seq is answered once");
}

#[test]
fn a_forwarded_input_waits_for_its_player_longer_than_one_from_a_gateway() {
    let mut shard = Harness::new();
    // Only the forwarded copy: no link to answer it through, and the shard that forwarded it
    // handed the player here.
    shard.forwarded(21, 3, a_move(3));
    shard.expire_early();
    assert_eq!(answers(&shard.received()), vec![], "nothing to answer through");
    shard.handoff(21, 2);
    shard.forwarded(21, 2, a_move(2));
    shard.direct(21, 4, a_move(4));
    assert_eq!(answers(&shard.received()), vec![("ack", 2), ("ack", 3), ("ack", 4)]);
}

#[test]
fn a_forwarded_input_whose_player_never_came_in_time_leaves_no_gap() {
    let mut shard = Harness::new();
    shard.forwarded(23, 3, a_move(3));
    shard.wait(crate::inputs::FORWARD_FOR * 2);
    assert_eq!(answers(&shard.received()), vec![], "nothing to answer through");
    shard.handoff(23, 2);
    shard.forwarded(23, 2, a_move(2));
    shard.direct(23, 4, a_move(4));
    assert_eq!(
        answers(&shard.received()),
        vec![("ack", 2), ("ack", 4)],
        "seq 3 was given up on; seq 4 does not wait for it"
    );
}

#[test]
fn past_the_early_limit_inputs_are_answered_and_consumed() {
    let mut shard = Harness::new();
    let limit = crate::inputs::EARLY_LIMIT as u64;
    for seq in 3..=limit + 3 {
        shard.direct(13, seq, ping(seq));
    }
    assert_eq!(answers(&shard.received()), vec![("pong", limit + 3)], "the one over the limit");
    shard.handoff(13, 2);
    shard.forwarded(13, 2, ping(2));
    shard.direct(13, limit + 4, ping(limit + 4));
    let mut expected: Vec<_> = (2..=limit + 2).map(|seq| ("pong", seq)).collect();
    expected.push(("pong", limit + 4));
    assert_eq!(answers(&shard.received()), expected, "held ones in order, then past the refused");
}

#[test]
fn a_leave_for_a_player_not_here_yet_is_applied_when_it_arrives() {
    let mut shard = Harness::new();
    shard.direct(11, 3, Input::Leave(Leave { logout: false, budgets: None }));
    shard.expire_early();
    shard.received();
    shard.handoff(11, 2);
    shard.forwarded(11, 2, a_move(2));
    assert_eq!(answers(&shard.received()), vec![("ack", 2)]);
    assert!(
        !shard.actor.roster.is_seated(PlayerId(11)),
        "the player whose connection dropped left the world instead of staying on a dead session"
    );
}

/// meridian-sim seed 5899: the gateway sent a dropped connection's Leave to every shard; the
/// one the player was not on gave it up, and a copy forwarded later by the old owner (which
/// had handed the player here, where it had left the world since on its earlier session)
/// waited 30 s for a player that was never coming on that session.
#[test]
fn a_forwarded_copy_of_an_input_given_up_on_is_not_held_again() {
    let mut shard = Harness::new();
    shard.direct(15, 3, a_move(3));
    shard.direct(15, 4, Input::Leave(Leave { logout: false, budgets: None }));
    shard.expire_early();
    assert_eq!(answers(&shard.received()), vec![("unavailable", 3)]);
    shard.forwarded(15, 3, a_move(3));
    shard.forwarded(15, 4, Input::Leave(Leave { logout: false, budgets: None }));
    assert_eq!(shard.actor.sizes().early, 0, "copies of inputs given up on are not held");
    // The player arrives after all: the move was answered once, the Leave still applies.
    shard.handoff(15, 2);
    shard.forwarded(15, 2, a_move(2));
    assert_eq!(answers(&shard.received()), vec![("ack", 2)]);
    assert!(!shard.actor.roster.is_seated(PlayerId(15)), "the Leave given up on still applied");
}

/// A forwarded Leave for a player not here waits in no queue (meridian-sim seeds 5899,
/// 15979: a failed resume's Leave, which the gateway sends to every shard, forwarded by a
/// shard the player had been handed from, waited 30 s for a player never coming on that
/// session), and still ends the player's session should it come on it.
#[test]
fn a_forwarded_leave_for_a_player_not_here_is_kept_aside_not_queued() {
    let mut shard = Harness::new();
    let leave = || Input::Leave(Leave { logout: false, budgets: None });
    shard.forwarded(17, 3, leave());
    assert_eq!(shard.actor.sizes().early, 0, "not held as an input waiting for its player");
    shard.handoff(17, 2);
    shard.forwarded(17, 2, a_move(2));
    assert_eq!(answers(&shard.received()), vec![("ack", 2)]);
    assert!(!shard.actor.roster.is_seated(PlayerId(17)), "the Leave applied in its turn");
}

/// Ends the round; the saves it made.
fn saves(h: &mut Harness) -> Vec<SaveRecord> {
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    out.into_iter()
        .filter_map(|t| match t {
            Transmit::Save(saves) => Some(saves),
            _ => None,
        })
        .flatten()
        .collect()
}

/// With a player store: a player that moved is saved at the next save round (once, at its
/// generation, the one its Join gave), not again while it stands still, and once more
/// when it leaves. Without a store nothing is saved.
#[test]
fn players_are_saved_when_they_moved_and_when_they_leave() {
    let interval = Duration::from_secs(10);
    let mut h = Harness::saving(Some(interval));
    let join = Join {
        name: "p1".into(),
        spawn: Some(client_pb::Position { x: 10, y: 10 }),
        restore: false,
        generation: 5,
        gateway_id: 0,
        epoch: 0,
        state: Vec::new(),
        login_stamp: 0,
        budgets: None,
    };
    h.direct(1, 1, Input::Join(join));
    h.direct(1, 2, a_move(1));
    assert_eq!(saves(&mut h), vec![], "not before the save round");
    h.wait(interval + Duration::from_millis(100));
    let moved = SaveRecord { player: 1, generation: 5, at: (11, 10), state: Vec::new() };
    assert_eq!(saves(&mut h), vec![moved.clone()]);
    h.wait(interval + Duration::from_millis(100));
    assert_eq!(saves(&mut h), vec![], "standing still: nothing to save");
    h.direct(1, 3, Input::Leave(Leave { logout: true, budgets: None }));
    assert_eq!(saves(&mut h), vec![moved], "saved as it leaves");

    let mut h = Harness::new();
    h.join(1, 1);
    h.direct(1, 2, a_move(1));
    h.wait(interval * 2);
    h.direct(1, 3, Input::Leave(Leave { logout: true, budgets: None }));
    assert_eq!(saves(&mut h), vec![], "no store, no saves");
}

/// Whether this round closes the test connection's session.
fn closes(h: &mut Harness) -> bool {
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    out.into_iter().any(|t| match t {
        Transmit::Gateway { batch, .. } => {
            batch.deliveries.iter().any(|d| d.session == SESSION && d.close)
        }
        _ => false,
    })
}

/// With a player store, a logout's connection closes once its save is in the store (so a
/// login right after finds it), or after 5 s if the store does not answer.
#[test]
fn a_logout_closes_once_its_save_is_stored() {
    let mut h = Harness::saving(Some(Duration::from_secs(10)));
    h.join(1, 1);
    h.direct(1, 2, Input::Leave(Leave { logout: true, budgets: None }));
    assert!(!closes(&mut h), "not before the save is stored");
    h.actor.handle(h.now, Event::Saved { players: vec![2] });
    assert!(!closes(&mut h), "another player's save");
    h.actor.handle(h.now, Event::Saved { players: vec![1] });
    assert!(closes(&mut h));

    let mut h = Harness::saving(Some(Duration::from_secs(10)));
    h.join(1, 1);
    h.direct(1, 2, Input::Leave(Leave { logout: true, budgets: None }));
    assert!(!closes(&mut h));
    h.wait(Duration::from_secs(6));
    assert!(closes(&mut h), "the store never answered: closed anyway");

    let mut h = Harness::new();
    h.join(1, 1);
    h.direct(1, 2, Input::Leave(Leave { logout: true, budgets: None }));
    assert!(closes(&mut h), "without a store, at once");
}

/// A shard that did not run for longer than its lease (a stopped process) acts on nothing
/// until etcd says whether the lease is alive: a move that waited meanwhile is answered
/// only after the keep-alive sent after the pause is confirmed (not by one sent before it).
#[test]
fn a_shard_that_did_not_run_past_its_lease_waits_for_etcd_before_it_acts() {
    let mut h = Harness::pausing();
    h.join(11, 1);
    h.received();
    let before_the_pause = h.now;
    h.now += Duration::from_secs(5);
    h.direct(11, 2, a_move(1));
    assert_eq!(h.received(), vec![], "nothing acted on while the lease is in doubt");
    let stale = Event::LeaseConfirmed { asked: before_the_pause };
    h.actor.handle(h.now, stale);
    assert_eq!(h.received(), vec![], "a keep-alive from before the pause proves nothing");
    h.actor.handle(h.now, Event::LeaseConfirmed { asked: h.now });
    let answered = h.received();
    assert!(
        matches!(answered.as_slice(), [Server::Moved(m)] if m.client_time == 1),
        "the move that waited is applied once the lease is confirmed: {answered:?}"
    );
}

/// A shard woken after its lease expired, whose region the newest partition gave away, was
/// taken for dead: its players were restored elsewhere. What its gateways sent the old
/// incarnation (here a restore and a move) is void, not applied: applying it brought back a
/// player that lives on another shard now (`meridian-sim` seed 303). Its gateway streams
/// end, so a gateway that missed the death still answers and restores (seed 1643).
#[test]
fn a_shard_taken_for_dead_drops_the_inputs_sent_to_its_old_incarnation() {
    let mut h = Harness::pausing();
    h.join(11, 1);
    h.received();
    h.now += Duration::from_secs(5);
    let restore = Join {
        name: "p12".into(),
        spawn: Some(client_pb::Position { x: 20, y: 20 }),
        restore: true,
        generation: 1,
        ..Default::default()
    };
    h.direct(12, 1, Input::Join(restore));
    h.direct(11, 2, a_move(1));
    let elsewhere = Region { shard: OLD_OWNER, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 2, width: 400, height: 400, regions: vec![elsewhere] };
    let view = ClusterView { partition: Some(partition), ..Default::default() };
    h.actor.handle(h.now, Event::View(view));
    assert_eq!(h.received(), vec![], "nothing acted on while the lease is in doubt");
    h.actor.handle(h.now, Event::LeaseExpired { partition: None });
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    assert!(
        matches!(out.as_slice(), [Transmit::CloseLink { link: LINK }]),
        "neither the restore nor the move is applied, and the gateway's stream ends (its \
         gateway may not have seen the death): {out:?}"
    );
    assert_eq!(h.actor.local_players().count(), 0, "no player here: they live elsewhere");
    assert_eq!(h.actor.epoch(), 2, "the view that waited is taken");
}

/// The same when the watch has not brought the reassignment yet: the partition read from
/// etcd with the expiry decides, not the lagging views that waited (`meridian-sim` seed 1643).
#[test]
fn a_shard_taken_for_dead_judges_by_the_partition_read_with_the_expiry() {
    let mut h = Harness::pausing();
    h.join(11, 1);
    h.received();
    h.now += Duration::from_secs(5);
    h.direct(11, 2, a_move(1));
    assert_eq!(h.received(), vec![], "nothing acted on while the lease is in doubt");
    let elsewhere = Region { shard: OLD_OWNER, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 2, width: 400, height: 400, regions: vec![elsewhere] };
    h.actor.handle(h.now, Event::LeaseExpired { partition: Some(partition) });
    assert_eq!(h.received(), vec![], "the move is not applied");
    assert_eq!(h.actor.local_players().count(), 0, "player 11 lives elsewhere now");
}

/// A shard that did not run past its lease and finds it expired was taken for dead, whatever
/// the map says when it reads it: the gateways saw its record go and restore its players
/// where the coordinator puts them, and the coordinator may not have drawn the new map yet.
/// So it starts a new life: its players are dropped (their gateways restore them, here or
/// elsewhere), the move that waited is void, and its incarnation says so. Keeping them was
/// issue 33's SIGSTOP run: moves lost, players on two shards.
#[test]
fn a_paused_shard_whose_lease_expired_starts_a_new_life_even_if_the_map_still_names_it() {
    let mut h = Harness::pausing();
    h.join(11, 1);
    h.received();
    h.now += Duration::from_secs(5);
    h.direct(11, 2, a_move(1));
    let ours = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![ours] };
    h.actor.handle(h.now, Event::LeaseExpired { partition: Some(partition) });
    assert_eq!(h.received(), vec![], "the move is not applied");
    assert_eq!(h.actor.local_players().count(), 0, "player 11 is restored by its gateway");
    assert_eq!(h.actor.incarnation(), 2, "a new life");
}

/// A shard that kept running while its lease expired (etcd stalled: every lease expires at
/// once when it resumes, and nobody is taken for dead) keeps its players if the map still
/// gives it its region.
#[test]
fn a_running_shard_whose_lease_expired_keeps_its_players_if_the_region_is_still_its() {
    let mut h = Harness::pausing();
    h.join(11, 1);
    h.received();
    let ours = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![ours] };
    h.actor.handle(h.now, Event::LeaseExpired { partition: Some(partition) });
    h.direct(11, 2, a_move(1));
    let answered = h.received();
    assert!(
        matches!(answered.as_slice(), [Server::Moved(m)] if m.client_time == 1),
        "the player plays on: {answered:?}"
    );
    assert_eq!(h.actor.incarnation(), 1, "the same life");
}

/// What every link's sessions received in a round: (link, session, message, close flag) in
/// order.
fn received_all(h: &mut Harness) -> Vec<(LinkId, u64, Server, bool)> {
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    let mut messages = Vec::new();
    for transmit in out {
        let Transmit::Gateway { link, batch } = transmit else { continue };
        for delivery in batch.deliveries {
            let mut frames = &delivery.frames[..];
            while let Some(header) = next_frame(frames, usize::MAX).expect("a whole frame") {
                let message =
                    client_pb::ServerMessage::decode(header.body(frames)).expect("decodes");
                let kind = message.kind.expect("a kind");
                messages.push((link, delivery.session, kind, delivery.close));
                frames = &frames[header.total_len()..];
            }
        }
    }
    messages
}

/// What one link's sessions received in a round: (session, message, close flag) in order.
fn received_on(h: &mut Harness, link: LinkId) -> Vec<(u64, Server, bool)> {
    let all = received_all(h).into_iter();
    all.filter(|m| m.0 == link)
        .map(|(_, session, message, close)| (session, message, close))
        .collect()
}

/// A serving shard's etcd record.
fn registered(id: ShardId, incarnation: u64) -> meridian_cluster::ShardRecord {
    meridian_cluster::ShardRecord {
        id,
        grpc: String::new(),
        admin: String::new(),
        state: meridian_cluster::ShardState::Serving,
        players: 0,
        load: Default::default(),
        incarnation,
        transport: None,
    }
}

/// A handoff from the old owner of `player`, on the test gateway's session, at `at`, next
/// input `next_seq`.
fn handoff_message(player: u64, at: (u32, u32), next_seq: u64) -> Handoff {
    Handoff {
        name: format!("p{player}"),
        position: Some(client_pb::Position { x: at.0, y: at.1 }),
        session: SESSION,
        gateway_id: GATEWAY,
        next_seq,
        ..Default::default()
    }
}

// Handoffs, peers and the views of players handed in.
#[path = "core_handoff_tests.rs"]
mod handoffs;
// Resumes, logins and the gateway's lanes.
#[path = "core_resume_tests.rs"]
mod resumes;
