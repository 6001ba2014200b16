//! Persistent entities in the core (issue 34): what goes to the store when, what a load
//! brings back, and what a refused save drops. Driven by the game harness of `game_tests`.

use super::*;
use meridian_world::PlayerId;

/// The neighbour's life in the views these tests give.
const NEIGHBOUR_LIFE: u64 = 1;

/// A view in which the neighbour runs (in its life [`NEIGHBOUR_LIFE`]) and this shard owns
/// the whole map, at partition `epoch`.
fn view_with_neighbour(epoch: u64) -> ClusterView {
    let record = meridian_cluster::ShardRecord {
        id: NEIGHBOUR,
        grpc: "127.0.0.1:1".into(),
        admin: "127.0.0.1:2".into(),
        state: meridian_cluster::ShardState::Serving,
        players: 0,
        load: Default::default(),
        incarnation: NEIGHBOUR_LIFE,
        transport: None,
    };
    let whole = Region { shard: ME, x0: 0, y0: 0, x1: 400, y1: 400 };
    let partition = PartitionMap { epoch, width: 400, height: 400, regions: vec![whole] };
    let mut view = ClusterView { partition: Some(partition), ..Default::default() };
    view.shards.insert(NEIGHBOUR, record);
    view
}

/// A record as the store would hand it in: entity `id` at (x, 50), last saved by `shard`
/// in its life `incarnation` at generation 3.
fn record(id: u64, x: u32, shard: ShardId, incarnation: u64) -> EntityRecord {
    EntityRecord {
        id,
        kind: 2,
        name: "flag".into(),
        at: (x, 50),
        state: b"ours".to_vec(),
        private: format!("loot {id}").into_bytes(),
        generation: 3,
        shard: shard.0,
        incarnation,
    }
}

#[test]
fn a_persistent_entity_is_saved_when_planted_and_its_removal_when_despawned() {
    let mut h = Harness::with_store(true);
    h.flush();
    h.saved.clear();
    h.action(21, 0, 1);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), Vec::<String>::new(), "not answered before the store has it");
    let [EntitySave::Upsert(planted)] = &h.saved[..] else { panic!("one save: {:?}", h.saved) };
    let id = planted.id;
    let expected = EntityRecord {
        id,
        kind: 2,
        name: "flag".into(),
        at: (10, 10),
        state: b"p1".to_vec(),
        private: Vec::new(),
        generation: 0,
        shard: ME.0,
        incarnation: 1,
    };
    assert_eq!(planted, &expected, "saved in the round it was planted");
    let round = *h.rounds.last().expect("a round");
    h.core.handle(h.now, Event::EntitiesSaved { through: round, refused: Vec::new() });
    let (told, _) = h.flush();
    assert_eq!(answers(&told), [format!("done 1 {id}")], "answered once it is in the store");
    h.saved.clear();
    h.wait(Duration::from_secs(2));
    h.flush();
    assert_eq!(h.saved, [], "unchanged: not saved again");
    h.action(22, id, 2);
    let (told, _) = h.flush();
    assert!(answers(&told).is_empty(), "an uproot waits for its removal to be stored too");
    let removed = EntitySave::Remove { id, generation: 0, shard: ME.0, incarnation: 1 };
    assert_eq!(h.saved, [removed]);
    let round = *h.rounds.last().expect("a round");
    h.core.handle(h.now, Event::EntitiesSaved { through: round, refused: Vec::new() });
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["done 2 "]);
}

/// Nothing acknowledged is lost: an action that planted a persistent entity is answered
/// only once the store has it; the player's later inputs wait behind it, in order, and a
/// store that does not confirm in time gets the action answered UNAVAILABLE.
#[test]
fn an_action_that_saved_is_answered_after_the_store_has_it_and_later_inputs_wait() {
    let mut h = Harness::with_store(true);
    h.flush();
    h.action(21, 0, 1);
    h.action(3, 0, 2);
    let (told, _) = h.flush();
    assert!(answers(&told).is_empty(), "the plant waits, the echo behind it: {told:?}");
    let first = *h.rounds.last().expect("a round");
    h.core.handle(h.now, Event::EntitiesSaved { through: first - 1, refused: Vec::new() });
    let (told, _) = h.flush();
    assert!(answers(&told).is_empty(), "an earlier round is not this one");
    h.core.handle(h.now, Event::EntitiesSaved { through: first, refused: Vec::new() });
    let (told, _) = h.flush();
    let told = answers(&told);
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(told[0].starts_with("done 1 ") && told[1] == "done 2 p2", "in order: {told:?}");
    // The store never confirms: UNAVAILABLE after 2 s, and the player goes on.
    h.action(21, 0, 3);
    h.flush();
    h.wait(Duration::from_millis(2_100));
    h.action(3, 0, 4);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["UNAVAILABLE 3", "done 4 p4"]);
    let round = *h.rounds.last().expect("a round");
    h.core.handle(h.now, Event::EntitiesSaved { through: round, refused: Vec::new() });
    let (told, _) = h.flush();
    assert!(answers(&told).is_empty(), "a late confirmation answers nothing twice");
}

#[test]
fn without_a_store_nothing_persistent_is_planted() {
    let mut h = Harness::new();
    h.action(21, 0, 1);
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["REJECTED 1"]);
    assert!(h.saved.is_empty() && h.loads == 0);
    assert_eq!(h.core.world.n_npcs(), 0, "nothing spawned");
}

#[test]
fn entities_whose_owner_is_gone_are_claimed_from_the_store_and_come_back_with_their_state() {
    let mut h = Harness::with_store(true);
    h.flush();
    assert_eq!(h.loads, 1, "the first partition reads the store");
    h.core.handle(h.now, Event::View(view_with_neighbour(2)));
    h.flush();
    assert_eq!(h.loads, 1, "one load out at a time");
    h.core.handle(h.now, Event::EntitiesFound(Vec::new()));
    h.flush();
    assert_eq!(h.loads, 2, "then the one the new partition wanted");
    let dead = record(100, 50, ShardId(7), 5);
    let my_last_life = record(101, 60, ME, 9);
    let running = record(102, 70, NEIGHBOUR, NEIGHBOUR_LIFE);
    let found = vec![dead.clone(), my_last_life.clone(), running];
    h.core.handle(h.now, Event::EntitiesFound(found.clone()));
    h.flush();
    let claim =
        |r: &EntityRecord| EntityRecord { generation: 4, shard: ME.0, incarnation: 1, ..r.clone() };
    assert_eq!(h.claims, [claim(&dead), claim(&my_last_life)], "the running owner keeps its own");
    h.core.handle(h.now, Event::EntitiesFound(found));
    h.flush();
    assert_eq!(h.claims.len(), 2, "a claim out is not made twice");
    h.saved.clear();
    h.core.handle(h.now, Event::EntitiesClaimed(vec![claim(&dead)]));
    let (told, _) = h.flush();
    assert_eq!(answers(&told), ["arrived 100 loot 100"], "the game is told, private state and all");
    assert_eq!(h.core.world.position(PlayerId(100)), Some(Position::new(50, 50)));
    assert_eq!(h.saved, [EntitySave::Upsert(claim(&dead))], "saved under the claim at once");
    assert!(h.core.world.position(PlayerId(101)).is_none(), "a claim the store refused");
    h.core.handle(h.now, Event::EntitiesSaved { through: 0, refused: vec![100] });
    h.flush();
    assert!(h.core.world.position(PlayerId(100)).is_none(), "a newer owner saved it: dropped");
    assert_eq!(h.core.metrics.entities_fenced_out.get(), 1);
}

#[test]
fn a_persistent_entity_handed_in_is_saved_at_once_under_its_new_generation() {
    let mut h = Harness::with_store(true);
    h.flush();
    h.saved.clear();
    let handoff = meridian_rpc::pb::Handoff {
        name: "flag".into(),
        position: Some(client_pb::Position { x: 30, y: 30 }),
        kind: 2,
        state: b"ours".to_vec(),
        private_state: b"loot".to_vec(),
        persistent: true,
        ..Default::default()
    };
    let message = PeerMessage {
        player_id: 200,
        generation: 6,
        subject_seq: 0,
        kind: Some(Peer::Handoff(handoff)),
    };
    h.core.handle(h.now, Event::Peer { from: NEIGHBOUR, messages: vec![message] });
    h.flush();
    let EntitySave::Upsert(saved) = &h.saved[..].first().expect("saved").clone() else {
        panic!("an upsert: {:?}", h.saved)
    };
    assert_eq!((saved.id, saved.generation, saved.shard), (200, 6, ME.0));
    assert_eq!(saved.private, b"loot");
}

/// A shard that drains away, or dies, need not change the partition (its cells may have
/// gone to others already); what it saved as it went must still be brought back (found
/// in a real cluster: a drained shard's last save waited for the next partition).
#[test]
fn a_peer_leaving_reads_the_store_even_with_the_partition_unchanged() {
    let mut h = Harness::with_store(true);
    h.core.handle(h.now, Event::View(view_with_neighbour(1)));
    h.core.handle(h.now, Event::EntitiesFound(Vec::new()));
    h.flush();
    let loads = h.loads;
    h.core.handle(h.now, Event::View(view_with_neighbour(1)));
    h.flush();
    assert_eq!(h.loads, loads, "the same view asks nothing");
    let mut gone = view_with_neighbour(1);
    gone.shards.clear();
    h.core.handle(h.now, Event::View(gone));
    h.flush();
    assert_eq!(h.loads, loads + 1, "the neighbour left: the store is read");
}
