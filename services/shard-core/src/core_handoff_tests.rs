//! Handoffs, peers and the views of players handed in, driven through the core tests'
//! harness (`core_tests.rs`).

use super::*;

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
    let handoff = Handoff { ghosted_at: vec![third.0, ME.0], ..handoff_message(11, (10, 10), 2) };
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
    let handoff = Handoff { gateway_id: other_gateway, ..handoff_message(11, (199, 10), 3) };
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
    let handoff = Handoff { view, ..handoff_message(11, (50, 50), 2) };
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
