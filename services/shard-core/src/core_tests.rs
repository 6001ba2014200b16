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
        let handoff = Handoff {
            name: format!("p{player}"),
            position: Some(client_pb::Position { x: 50, y: 50 }),
            session: SESSION,
            gateway_id: GATEWAY,
            next_seq,
            view: Vec::new(),
            subject_seq: 0,
            ghosted_at: Vec::new(),
            ..Default::default()
        };
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

/// A peer that registered again (taken for dead after a pause: it dropped every copy it
/// held) gets its copies back, even when the view that says so is the first this shard
/// sees without it ever having been gone (`meridian-sim` seed 4348).
#[test]
fn a_peer_registered_again_is_mirrored_to_again() {
    use meridian_rpc::pb::peer_message::Kind as Peer;
    let mut h = Harness::new();
    let view = |incarnation: u64| {
        let mine = Region { shard: ME, x0: 0, y0: 0, x1: 200, y1: 400 };
        let theirs = Region { shard: OLD_OWNER, x0: 200, y0: 0, x1: 400, y1: 400 };
        let regions = vec![mine, theirs];
        let partition = PartitionMap { epoch: 2, width: 400, height: 400, regions };
        let shards = [(ME, registered(ME, 1)), (OLD_OWNER, registered(OLD_OWNER, incarnation))];
        ClusterView { partition: Some(partition), shards: shards.into(), ..Default::default() }
    };
    h.actor.handle(h.now, Event::View(view(3)));
    let spawn = Some(client_pb::Position { x: 195, y: 10 });
    let join = Join { name: "near".into(), spawn, ..Default::default() };
    h.direct(11, 1, Input::Join(join));
    let upserts_to_peer = |h: &mut Harness| {
        let mut out = Vec::new();
        h.actor.flush(&mut out);
        out.iter()
            .filter_map(|t| match t {
                Transmit::Peer { to, messages } if *to == OLD_OWNER => Some(messages),
                _ => None,
            })
            .flatten()
            .filter(|m| m.player_id == 11 && matches!(m.kind, Some(Peer::Upsert(_))))
            .count()
    };
    assert_eq!(upserts_to_peer(&mut h), 1, "mirrored near the border");
    h.actor.handle(h.now, Event::View(view(3)));
    assert_eq!(upserts_to_peer(&mut h), 0, "the same registration still has its copy");
    h.actor.handle(h.now, Event::View(view(7)));
    assert_eq!(upserts_to_peer(&mut h), 1, "a new registration gets the whole copy again");
}

/// A handoff for a player restored here meanwhile (its gateway's link to the old owner
/// broke, and the handoff was held up on its stream) is ignored, and the shards that held
/// copies for the old owner are told to drop them, not only the old owner: one that was
/// left out kept a ghost its owner never mirrored (meridian-sim seed 30971).
#[test]
fn a_handoff_for_a_player_owned_here_releases_every_old_holder() {
    use meridian_rpc::pb::peer_message::Kind as Peer;
    let mut h = Harness::new();
    h.join(11, 1);
    h.received();
    let third = ShardId(3);
    let handoff = Handoff {
        name: "p11".into(),
        position: Some(client_pb::Position { x: 10, y: 10 }),
        session: SESSION,
        gateway_id: GATEWAY,
        next_seq: 2,
        ghosted_at: vec![third.0, ME.0],
        ..Default::default()
    };
    h.actor.handoff_in(OLD_OWNER, PlayerId(11), 6, handoff);
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    let mut told: Vec<(ShardId, &'static str, u64)> = out
        .iter()
        .filter_map(|t| match t {
            Transmit::Peer { to, messages } => Some((*to, messages)),
            _ => None,
        })
        .flat_map(|(to, messages)| {
            messages.iter().filter(|m| m.player_id == 11).filter_map(move |m| match m.kind {
                Some(Peer::Remove(_)) => Some((to, "remove", m.generation)),
                Some(Peer::HandoffAck(_)) => Some((to, "ack", m.generation)),
                _ => None,
            })
        })
        .collect();
    told.sort();
    assert_eq!(
        told,
        vec![(OLD_OWNER, "ack", 6), (OLD_OWNER, "remove", 6), (third, "remove", 6)],
        "the old owner and the other holder drop their copies, at the handoff's generation"
    );
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

/// A shard split with `OLD_OWNER` at x = 200, both registered (incarnation 1) and linked.
fn split_with_old_owner(h: &mut Harness) {
    let mine = Region { shard: ME, x0: 0, y0: 0, x1: 200, y1: 400 };
    let theirs = Region { shard: OLD_OWNER, x0: 200, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 2, width: 400, height: 400, regions: vec![mine, theirs] };
    let shards = [(ME, registered(ME, 1)), (OLD_OWNER, registered(OLD_OWNER, 1))];
    let view =
        ClusterView { partition: Some(partition), shards: shards.into(), ..Default::default() };
    h.actor.handle(h.now, Event::View(view));
    h.actor.handle(h.now, Event::PeersUp(vec![OLD_OWNER]));
}

/// This shard handed a player over and got it back, but the returning handoff waits for
/// its gateway lane's link: inputs the other shard forwards with it are held here for the
/// player, not forwarded back to it by the older handoff's record. Forwarded back, each
/// went round between the two shards for good, at network speed (found by
/// `meridian-sim`, seed 67713: the sweep hung).
#[test]
fn inputs_forwarded_with_a_returning_handoff_that_waits_are_not_sent_back() {
    use meridian_rpc::pb::{peer_message::Kind as Peer, PeerMessage};
    let mut h = Harness::new();
    split_with_old_owner(&mut h);
    let spawn = Some(client_pb::Position { x: 199, y: 10 });
    h.direct(11, 1, Input::Join(Join { name: "edge".into(), spawn, ..Default::default() }));
    h.direct(11, 2, a_move(1));
    h.received();
    // Handed over at generation 0 -> 1; it comes back at generation 2 through another
    // gateway's lane, whose link is not open here yet, with seq 3 forwarded after it.
    let lane_link = LinkId(2);
    let other_gateway = GATEWAY + 1;
    let handoff = Handoff {
        name: "edge".into(),
        position: Some(client_pb::Position { x: 199, y: 10 }),
        session: SESSION,
        gateway_id: other_gateway,
        next_seq: 3,
        ..Default::default()
    };
    let message =
        |kind| PeerMessage { player_id: 11, generation: 2, subject_seq: 0, kind: Some(kind) };
    let forwarded = input(11, 3, a_move(3));
    let messages = vec![message(Peer::Handoff(handoff)), message(Peer::Forwarded(forwarded))];
    h.actor.handle(h.now, Event::Peer { from: OLD_OWNER, messages });
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    let sent_back = out.iter().any(|t| {
        matches!(t, Transmit::Peer { messages, .. }
            if messages.iter().any(|m| matches!(m.kind, Some(Peer::Forwarded(_)))))
    });
    assert!(!sent_back, "the input waits here for its player");
    h.actor.handle(h.now, Event::LinkOpened { link: lane_link, gateway: other_gateway, lane: 0 });
    let acks: Vec<_> = received_on(&mut h, lane_link)
        .into_iter()
        .filter_map(|(_, m, _)| match m {
            Server::Moved(moved) if moved.client_time != 0 => Some(moved.client_time),
            _ => None,
        })
        .collect();
    assert_eq!(acks, vec![3], "applied once the handoff is taken");
}

/// A neighbour the client was told of, seen at (x, 50) at subject_seq `seq`.
fn told_at(id: u64, x: u32, seq: u64) -> meridian_rpc::pb::ViewEntry {
    meridian_rpc::pb::ViewEntry {
        player_id: id,
        position: Some(client_pb::Position { x, y: 50 }),
        generation: 0,
        subject_seq: seq,
        seen: true,
        gone: false,
    }
}

/// Player 11 handed in at (50, 50) with `view` as what its client was told; the players
/// told `Left` in that round.
fn handed_in_told(h: &mut Harness, view: Vec<meridian_rpc::pb::ViewEntry>) -> Vec<u64> {
    let handoff = Handoff {
        name: "p11".into(),
        position: Some(client_pb::Position { x: 50, y: 50 }),
        session: SESSION,
        gateway_id: GATEWAY,
        next_seq: 2,
        view,
        ..Default::default()
    };
    h.actor.handoff_in(OLD_OWNER, PlayerId(11), 1, handoff);
    h.received()
        .into_iter()
        .filter_map(|m| match m {
            Server::Left(left) => Some(left.player_id),
            _ => None,
        })
        .collect()
}

/// A player handed in with a neighbour in its view that this shard knows nothing of, told
/// at a cell out of the player's sight here: its owner mirrors it nowhere near, so no copy
/// is on its way. It leaves the view at once; waiting for a copy that never comes kept it
/// shown for the 3 s the views wait at most (`meridian-sim` seed 103654, with no fault but
/// stalled peer streams: a stale neighbour after the cluster went quiet).
#[test]
fn a_neighbour_unknown_here_told_out_of_sight_leaves_the_view_at_once() {
    let mut h = Harness::new();
    // 99 was seen 25 cells away (the player moved since), 98 is in sight still.
    let left = handed_in_told(&mut h, vec![told_at(99, 25, 5), told_at(98, 45, 5)]);
    assert_eq!(left, vec![99], "the one out of sight goes; the one in sight waits for its copy");
}

/// The same for a neighbour whose copy this shard dropped for being out of reach: told at
/// a cell the player no longer sees, it is not coming back as a copy; it leaves at once.
#[test]
fn a_neighbour_dropped_out_of_reach_here_told_out_of_sight_leaves_the_view_at_once() {
    use meridian_rpc::pb::{peer_message::Kind as Peer, GhostRemove, GhostUpsert, PeerMessage};
    let mut h = Harness::new();
    let at = |x: u32| Some(client_pb::Position { x, y: 50 });
    let upsert = GhostUpsert { name: "p99".into(), position: at(25), ..Default::default() };
    let remove = GhostRemove { left_world: false, position: at(24) };
    let message = |seq, kind| PeerMessage {
        player_id: 99,
        generation: 0,
        subject_seq: seq,
        kind: Some(kind),
    };
    let messages = vec![message(4, Peer::Upsert(upsert)), message(5, Peer::Remove(remove))];
    h.actor.handle(h.now, Event::Peer { from: OLD_OWNER, messages });
    let left = handed_in_told(&mut h, vec![told_at(99, 25, 4)]);
    assert_eq!(left, vec![99], "told 25 cells away, dropped here: it leaves the view");
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

/// A login of the same account on another gateway takes the player over even when that
/// gateway's session id has the same number (session ids are unique per gateway only):
/// the old connection is told REPLACED and closed, the new one gets LoginOk where the
/// player stands, and inputs still coming from the old gateway's session are dropped.
#[test]
fn a_login_through_another_gateway_takes_the_player_over_whatever_its_session_number() {
    let mut h = Harness::new();
    let other = LinkId(2);
    h.actor.handle(h.now, Event::LinkOpened { link: other, gateway: GATEWAY + 1, lane: 0 });
    h.join(11, 1);
    h.direct(11, 2, a_move(1));
    h.received();
    let login = meridian_rpc::pb::ResumeRequest {
        login: true,
        name: "p11".into(),
        spawn: None,
        ..Default::default()
    };
    let inputs = vec![input(11, 1, Input::Resume(login))];
    h.actor.handle(h.now, Event::Inputs { link: other, inputs });
    let mut old = Vec::new();
    let mut new = Vec::new();
    for (link, _, kind, close) in received_all(&mut h) {
        if link == LINK {
            assert!(close, "the old connection is closed");
            old.push(kind)
        } else {
            new.push(kind)
        }
    }
    assert!(
        matches!(old.as_slice(), [Server::Error(e)] if e.code == ErrorCode::Replaced as i32),
        "the old connection is told REPLACED: {old:?}"
    );
    assert!(
        matches!(new.first(), Some(Server::LoginOk(ok)) if ok.player_id == 11 && ok.position == Some(client_pb::Position { x: 11, y: 10 })),
        "the new one gets LoginOk where the player stands: {new:?}"
    );
    // A move still in flight from the old gateway's session (same session number) is not
    // the new connection's.
    h.direct(11, 3, a_move(2));
    assert_eq!(received_on(&mut h, other), vec![], "nothing for the new connection");
    let moved = vec![input(11, 2, a_move(3))];
    h.actor.handle(h.now, Event::Inputs { link: other, inputs: moved });
    let answered = received_on(&mut h, other);
    assert!(
        matches!(answered.as_slice(), [(_, Server::Moved(m), false)] if m.client_time == 3 && m.position == Some(client_pb::Position { x: 12, y: 10 })),
        "the new connection's own move: {answered:?}"
    );
}

/// What a round sent each session of `link`: its messages, and whether a resume was
/// refused.
fn resume_answers(h: &mut Harness, link: LinkId, session: u64) -> (Vec<Server>, bool) {
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    let (mut messages, mut refused) = (Vec::new(), false);
    for transmit in out {
        let Transmit::Gateway { link: to, batch } = transmit else { continue };
        for delivery in batch.deliveries.into_iter().filter(|d| to == link && d.session == session)
        {
            refused |= delivery.resume_refused;
            let mut frames = &delivery.frames[..];
            while let Some(header) = next_frame(frames, usize::MAX).expect("a whole frame") {
                let message =
                    client_pb::ServerMessage::decode(header.body(frames)).expect("decodes");
                messages.push(message.kind.expect("a kind"));
                frames = &frames[header.total_len()..];
            }
        }
    }
    (messages, refused)
}

fn resume_with(h: &mut Harness, player: u64, session: u64, token: &[u8]) {
    let request = meridian_rpc::pb::ResumeRequest { token: token.to_vec(), ..Default::default() };
    let inputs = vec![PlayerInput {
        session,
        player_id: player,
        seq: 1,
        kind: Some(Input::Resume(request)),
    }];
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs });
}

/// A resume token is good once: the resume that uses it gets a fresh one in its
/// ViewReset, and the spent one (or a forged one, or one of a key no longer accepted) is
/// refused by the shard holding the player, which keeps the player for its real owner.
#[test]
fn a_resume_token_takes_the_player_back_once() {
    let mut h = Harness::new();
    h.join(11, 1);
    let first = match h.received().into_iter().next() {
        Some(Server::LoginOk(ok)) => ok.resume_token,
        other => panic!("LoginOk first: {other:?}"),
    };
    h.direct(11, 2, Input::Leave(Leave { logout: false, budgets: None }));
    h.received();

    // Forged, another key's, another player's: refused, the player stays parked.
    let mut forged = first.clone();
    forged[10] ^= 1;
    let other_key = TokenKey::new(vec![8; 32]).expect("a key");
    let other_player = h.actor.roster.mint_token(PlayerId(12), 1);
    for (session, token) in
        [(SESSION + 1, forged), (SESSION + 2, other_key.mint(11, 1)), (SESSION + 3, other_player)]
    {
        resume_with(&mut h, 11, session, &token);
        let (messages, refused) = resume_answers(&mut h, LINK, session);
        assert!(refused && messages.is_empty(), "refused: {messages:?}");
    }

    resume_with(&mut h, 11, SESSION + 4, &first);
    let (messages, refused) = resume_answers(&mut h, LINK, SESSION + 4);
    assert!(!refused);
    assert!(matches!(messages.first(), Some(Server::ViewReset(_))), "{messages:?}");

    // That connection dropped before its client said anything: the answer may have been
    // lost with it, so the token it came with still works.
    let leave = |session| PlayerInput {
        session,
        player_id: 11,
        seq: 2,
        kind: Some(Input::Leave(Leave { logout: false, budgets: None })),
    };
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs: vec![leave(SESSION + 4)] });
    h.received();
    resume_with(&mut h, 11, SESSION + 5, &first);
    let (messages, refused) = resume_answers(&mut h, LINK, SESSION + 5);
    assert!(!refused);
    let second = match messages.first() {
        Some(Server::ViewReset(reset)) => reset.resume_token.clone(),
        other => panic!("ViewReset first: {other:?}"),
    };
    assert_eq!(h.actor.roster.resume_keys().verify(&second).map(|t| t.player_id), Ok(11));
    assert_ne!(second, first, "a fresh token");

    // Once the client speaks on its new session it has the fresh token: the spent one
    // cannot take the player from that live session, nor once it is parked again.
    let ping = PlayerInput { session: SESSION + 5, player_id: 11, seq: 2, kind: Some(ping(5)) };
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs: vec![ping] });
    h.received();
    resume_with(&mut h, 11, SESSION + 6, &first);
    let (messages, refused) = resume_answers(&mut h, LINK, SESSION + 6);
    assert!(refused && messages.is_empty(), "a spent token is refused: {messages:?}");
    assert!(h.actor.roster.seat(PlayerId(11)).is_some_and(|s| s.session == SESSION + 5));
    assert_eq!(h.actor.metrics.resume_tokens_refused.get("spent"), 1);

    // The fresh one works, once more.
    resume_with(&mut h, 11, SESSION + 7, &second);
    let (messages, refused) = resume_answers(&mut h, LINK, SESSION + 7);
    assert!(!refused && matches!(messages.first(), Some(Server::ViewReset(_))), "{messages:?}");
}

/// During a key rotation a shard takes tokens signed with the previous key; after it, no
/// longer.
#[test]
fn a_token_of_the_previous_key_works_during_a_rotation_only() {
    let old = TokenKey::new(vec![7; 32]).expect("a key");
    let new = TokenKey::new(vec![9; 32]).expect("a key");
    for (previous, works) in [(vec![old.clone()], true), (Vec::new(), false)] {
        let mut h = Harness::new();
        h.join(11, 1);
        h.received();
        h.direct(11, 2, Input::Leave(Leave { logout: false, budgets: None }));
        h.received();
        let nonce = h.actor.roster.parked(PlayerId(11)).expect("parked").resume_nonce;
        h.actor.roster.set_resume_keys(TokenKeys::new(new.clone(), previous));
        resume_with(&mut h, 11, SESSION + 1, &old.mint(11, nonce));
        let (messages, refused) = resume_answers(&mut h, LINK, SESSION + 1);
        assert_eq!(!refused, works, "{messages:?}");
        if let Some(Server::ViewReset(reset)) = messages.first() {
            let fresh = TokenKeys::from(new.clone()).verify(&reset.resume_token);
            assert!(fresh.is_ok(), "the fresh token is signed with the new key");
        }
    }
}

/// A session of `GATEWAY`'s lane 1 (the top 16 bits of its id).
const LANE_1_SESSION: u64 = 1 << 48 | 0x0100_0002;

/// A handoff of `player` on `session` of `GATEWAY`, next input 1, at (12, 12).
fn handoff_of(h: &mut Harness, player: u64, session: u64) {
    let handoff = Handoff {
        name: format!("p{player}"),
        position: Some(client_pb::Position { x: 12, y: 12 }),
        session,
        gateway_id: GATEWAY,
        next_seq: 1,
        ..Default::default()
    };
    h.actor.handoff_in(OLD_OWNER, PlayerId(player), 1, handoff);
}

/// A move of `player` on `session` through `link`.
fn move_on(h: &mut Harness, link: LinkId, session: u64, player: u64, seq: u64, time: u64) {
    let inputs = vec![PlayerInput { session, ..input(player, seq, a_move(time)) }];
    h.actor.handle(h.now, Event::Inputs { link, inputs });
}

/// A gateway opens one link per lane: a player handed in is answered on its session's lane's
/// link, and a lane's link closing takes only that lane's players with it.
#[test]
fn each_lane_of_a_gateway_carries_its_own_sessions() {
    let mut h = Harness::new();
    let lane_1 = LinkId(2);
    h.actor.handle(h.now, Event::LinkOpened { link: lane_1, gateway: GATEWAY, lane: 1 });
    h.join(11, 1);
    let spawn = Some(client_pb::Position { x: 11, y: 11 });
    let join = Join { name: "p12".into(), spawn, ..Default::default() };
    let inputs = vec![PlayerInput { session: LANE_1_SESSION, ..input(12, 1, Input::Join(join)) }];
    h.actor.handle(h.now, Event::Inputs { link: lane_1, inputs });
    h.received();

    // Handed in: one player of each lane (lane 1's link opened last).
    let (on_1, on_0) = (LANE_1_SESSION + 1, SESSION + 1);
    handoff_of(&mut h, 13, on_1);
    handoff_of(&mut h, 15, on_0);
    move_on(&mut h, lane_1, on_1, 13, 1, 77);
    move_on(&mut h, LINK, on_0, 15, 1, 78);
    let mut acks = Vec::new();
    for (link, session, message, _) in received_all(&mut h) {
        // The movers' own acks (others' moves carry no client time).
        if let Server::Moved(moved) = message {
            if moved.client_time != 0 {
                acks.push((link, session, moved.client_time));
            }
        }
    }
    acks.sort_unstable();
    assert_eq!(acks, vec![(LINK, on_0, 78), (lane_1, on_1, 77)], "each on its lane's link");

    h.actor.handle(h.now, Event::LinkClosed { link: LINK });
    let here = |h: &Harness, player: u64| h.actor.roster.is_seated(PlayerId(player));
    assert!(!here(&h, 11) && !here(&h, 15), "lane 0's players left with its link");
    assert!(here(&h, 12) && here(&h, 13), "lane 1's players stay");
    move_on(&mut h, lane_1, LANE_1_SESSION, 12, 2, 79);
    let answered = received_on(&mut h, lane_1);
    let acked = answered.iter().any(|(session, message, _)| {
        *session == LANE_1_SESSION && matches!(message, Server::Moved(m) if m.client_time == 79)
    });
    assert!(acked, "lane 1 still plays: {answered:?}");
    // Lane 0 has no link now: a handoff of its session waits for one, not for lane 1's.
    handoff_of(&mut h, 16, SESSION + 2);
    assert!(!here(&h, 16), "waits for lane 0's link");
}

/// A handoff whose lane has no link here yet waits for that lane's link: another lane of
/// the same gateway opening does not take it.
#[test]
fn a_handoff_waits_for_the_link_of_its_own_lane() {
    let mut h = Harness::new();
    handoff_of(&mut h, 13, LANE_1_SESSION);
    assert!(!h.actor.roster.is_seated(PlayerId(13)), "lane 1 has no link here yet");
    h.actor.handle(h.now, Event::LinkOpened { link: LinkId(3), gateway: GATEWAY, lane: 2 });
    assert!(!h.actor.roster.is_seated(PlayerId(13)), "lane 2's link is not lane 1's");
    h.actor.handle(h.now, Event::LinkOpened { link: LinkId(2), gateway: GATEWAY, lane: 1 });
    let seat = h.actor.roster.seat(PlayerId(13)).expect("taken when lane 1's link opened");
    assert_eq!(seat.link, LinkId(2));
    assert_eq!(h.actor.sizes().awaiting_gateway, 0);
}

/// Issue 31 item 4: two logins of one account raced to two shards, and each was seated.
/// The shard seating a login tells every other (a `Claim`); the one holding the older login
/// ends it with REPLACED and closes its connection, whichever claim arrives first; a newer
/// login stands; and an older login arriving after the claim is refused on arrival.
#[test]
fn of_two_logins_racing_to_two_shards_the_later_wins() {
    use meridian_rpc::pb::{peer_message::Kind as Peer, Claim, PeerMessage};

    let claim_from_peer = |h: &mut Harness, player: u64, login_stamp: u64| {
        let claim = Claim { login_stamp, session: 99 };
        let message =
            PeerMessage { player_id: player, kind: Some(Peer::Claim(claim)), ..Default::default() };
        h.actor.handle(h.now, Event::Peer { from: OLD_OWNER, messages: vec![message] });
    };
    let join_at = |h: &mut Harness, player: u64, login_stamp: u64| {
        let spawn = Some(client_pb::Position { x: 10, y: 10 });
        let join = Join { name: format!("p{player}"), spawn, login_stamp, ..Default::default() };
        h.direct(player, 1, Input::Join(join));
    };
    let mut h = Harness::new();
    // Shard 2 is registered too: logins seated here are claimed to it.
    let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch: 1, width: 400, height: 400, regions: vec![whole] };
    let mut view = ClusterView { partition: Some(partition), ..Default::default() };
    for id in [ME, OLD_OWNER] {
        view.shards.insert(id, registered(id, 1));
    }
    view.revision = 2;
    h.actor.handle(h.now, Event::View(view));

    // A login here is claimed to the other shard.
    join_at(&mut h, 21, 1_000);
    let mut out = Vec::new();
    h.actor.flush(&mut out);
    let claimed = out.iter().any(|t| {
        matches!(t, Transmit::Peer { to, messages } if *to == OLD_OWNER
            && messages.iter().any(|m| m.player_id == 21
                && matches!(&m.kind, Some(Peer::Claim(c)) if c.login_stamp == 1_000 && c.session == SESSION)))
    });
    assert!(claimed, "the login is claimed to shard 2: {out:?}");

    // The other shard seated an older login of the same account: this one stands.
    claim_from_peer(&mut h, 21, 900);
    assert!(h.actor.roster.is_seated(PlayerId(21)), "an older claim ends nothing here");
    assert!(received_all(&mut h).iter().all(|(_, _, m, close)| !close
        && !matches!(m, Server::Error(e) if e.code == ErrorCode::Replaced as i32)));

    // ... and a newer one: this login ends.
    claim_from_peer(&mut h, 21, 1_100);
    assert!(!h.actor.roster.is_seated(PlayerId(21)), "the older login leaves the world");
    let ended = received_all(&mut h);
    assert!(
        ended.iter().any(|(_, session, m, close)| *session == SESSION
            && *close
            && matches!(m, Server::Error(e) if e.code == ErrorCode::Replaced as i32)),
        "its connection is told REPLACED and closed: {ended:?}"
    );

    // A login older than a claim seen lately is refused on arrival.
    claim_from_peer(&mut h, 22, 2_000);
    join_at(&mut h, 22, 1_999);
    assert!(!h.actor.roster.is_seated(PlayerId(22)));
    let refused = received_all(&mut h);
    assert!(
        matches!(refused.as_slice(), [(_, _, Server::Error(e), true)] if e.code == ErrorCode::Replaced as i32),
        "told REPLACED, not LoginOk: {refused:?}"
    );
}

/// A dropped connection's budgets (from its gateway's Leave) are parked with the player
/// and come back, aged, with the answer to its resume: whichever gateway it resumes on
/// refills them from there, so a reconnect buys no burst. A connection that drops while
/// still resuming gives none, and the budgets parked before stay.
#[test]
fn a_resume_gets_back_the_budgets_its_dropped_connection_parked() {
    let mut h = Harness::new();
    h.join(11, 1);
    let token = match h.received().into_iter().next() {
        Some(Server::LoginOk(ok)) => ok.resume_token,
        other => panic!("LoginOk first: {other:?}"),
    };
    let spent = meridian_rpc::pb::Budgets { chat_credit: 300, action_credit: 7, age_ms: 0 };
    let leave = |session, budgets| PlayerInput {
        session,
        player_id: 11,
        seq: 2,
        kind: Some(Input::Leave(Leave { logout: false, budgets })),
    };
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs: vec![leave(SESSION, Some(spent))] });
    h.received();
    let answered_budgets = |h: &mut Harness, session| {
        let mut out = Vec::new();
        h.actor.flush(&mut out);
        let mut budgets = Vec::new();
        for transmit in out {
            let Transmit::Gateway { batch, .. } = transmit else { continue };
            for delivery in batch.deliveries.into_iter().filter(|d| d.session == session) {
                assert!(!delivery.resume_refused, "taken back");
                budgets.extend(delivery.budgets);
            }
        }
        budgets
    };
    h.now += Duration::from_millis(250);
    resume_with(&mut h, 11, SESSION + 1, &token);
    assert_eq!(
        answered_budgets(&mut h, SESSION + 1),
        vec![meridian_rpc::pb::Budgets { age_ms: 250, ..spent }]
    );
    // Dropped before the answer reached the client: no budgets of its own to give.
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs: vec![leave(SESSION + 1, None)] });
    h.received();
    h.now += Duration::from_millis(100);
    resume_with(&mut h, 11, SESSION + 2, &token);
    assert_eq!(
        answered_budgets(&mut h, SESSION + 2),
        vec![meridian_rpc::pb::Budgets { age_ms: 350, ..spent }]
    );
}
