//! The parts of the public API that scenarios do not show: construction, the queries, and
//! that names and chat texts are shared rather than copied when fanned out.

use std::sync::Arc;
use std::time::Duration;

use meridian_world::{
    ConfigProblem, Direction, EntityKind, Envelope, Notification, PlayerId, Position, World,
    WorldConfig, WorldError,
};

const NOW: Duration = Duration::ZERO;

#[test]
fn try_new_reports_every_problem_and_new_accepts_the_default() {
    let bad = WorldConfig { width: 0, height: 10, view_range: 3, move_rate: 0 };
    let error = World::try_new(bad).err().expect("a zero width and rate are refused");
    assert_eq!(error.problems, vec![ConfigProblem::ZeroWidth, ConfigProblem::ZeroMoveRate]);
    let world = World::new(WorldConfig::default());
    assert_eq!(*world.config(), WorldConfig::default());
    assert_eq!((world.n_local(), world.n_ghosts()), (0, 0));
}

#[test]
#[should_panic(expected = "valid config")]
fn new_panics_on_an_invalid_config() {
    let _ = World::new(WorldConfig { height: 0, ..WorldConfig::default() });
}

#[test]
fn names_and_texts_are_shared_not_copied() {
    let mut world = World::new(WorldConfig::default());
    let mut out = Vec::new();
    let (a, b, c) = (PlayerId(1), PlayerId(2), PlayerId(3));
    let name_a: Arc<str> = Arc::from("alice");
    world.login(a, Arc::clone(&name_a), Position::new(5, 5), NOW, &mut out).expect("login a");
    world.login(b, Arc::from("bob"), Position::new(6, 5), NOW, &mut out).expect("login b");
    world.login(c, Arc::from("carol"), Position::new(7, 5), NOW, &mut out).expect("login c");
    let entered_a: Vec<&Arc<str>> = out
        .iter()
        .filter_map(|envelope| match &envelope.note {
            Notification::Entered { subject, name, .. } if *subject == a => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(entered_a.len(), 2, "b and c were told about a");
    assert!(entered_a.iter().all(|name| Arc::ptr_eq(name, &name_a)));
    assert!(Arc::ptr_eq(world.name(a).expect("a is present"), &name_a));

    out.clear();
    let text: Arc<str> = Arc::from("hello");
    world.chat(b, Arc::clone(&text), &mut out).expect("chat");
    assert_eq!(out.len(), 3);
    assert!(out
        .iter()
        .all(|e| matches!(&e.note, Notification::Chat { text: t, .. } if Arc::ptr_eq(t, &text))));
}

#[test]
fn queries_report_kinds_positions_and_players() {
    let mut world = World::new(WorldConfig::default());
    let mut out = Vec::new();
    let (a, g) = (PlayerId(1), PlayerId(2));
    world.login(a, Arc::from("a"), Position::new(3, 4), NOW, &mut out).expect("login");
    world.upsert_ghost(g, Arc::from("g"), Position::new(30, 4), &mut out).expect("ghost");
    assert_eq!(world.is_local(a), Some(true));
    assert_eq!(world.is_local(g), Some(false));
    assert_eq!(world.kind(g), Some(EntityKind::Ghost));
    assert_eq!(world.is_local(PlayerId(9)), None);
    assert_eq!(world.position(g), Some(Position::new(30, 4)));
    assert_eq!(world.local_players().collect::<Vec<_>>(), vec![(a, Position::new(3, 4))]);
    assert_eq!(world.ghosts().collect::<Vec<_>>(), vec![(g, Position::new(30, 4))]);
    let mut seen = vec![PlayerId(77)];
    world.visible_to(PlayerId(9), &mut seen);
    assert_eq!(seen, vec![PlayerId(77)], "an absent player sees nothing, and out is appended to");
    assert!(out.is_empty(), "a and g are 27 cells apart");
}

#[test]
fn a_move_returns_the_new_position_and_acks_first() {
    let mut world = World::new(WorldConfig::default());
    let mut out = Vec::new();
    let (a, b) = (PlayerId(1), PlayerId(2));
    world.login(a, Arc::from("a"), Position::new(10, 10), NOW, &mut out).expect("login a");
    world.login(b, Arc::from("b"), Position::new(31, 10), NOW, &mut out).expect("login b");
    out.clear();
    let position = world.move_player(a, Direction::Right, 42, NOW, &mut out).expect("move");
    assert_eq!(position, Position::new(11, 10));
    let ack = Notification::Moved { subject: a, position, client_time: 42 };
    assert_eq!(out[0], Envelope { to: a, note: ack });
    assert_eq!(out.len(), 3, "the ack, then Entered both ways");
    assert_eq!(
        world.move_player(PlayerId(5), Direction::Up, 1, NOW, &mut out),
        Err(WorldError::UnknownPlayer(PlayerId(5)))
    );
    assert_eq!(PlayerId(5).to_string(), "5");
    assert_eq!(Position::new(1, 2).to_string(), "(1, 2)");
}

/// NPCs: seen with their kind and state, told nothing themselves, moved like players; a
/// ghost moved by its owner keeps its kind and state (found end to end: a moved ghost of a
/// wolf lost its health).
#[test]
fn npcs_are_seen_with_their_kind_and_state_and_ghosts_keep_theirs() {
    let mut world = World::new(WorldConfig::default());
    let mut out = Vec::new();
    let (ann, wolf, ghost) = (PlayerId(1), PlayerId(1_000), PlayerId(2_000));
    world.login(ann, Arc::from("ann"), Position::new(5, 5), NOW, &mut out).expect("login");
    out.clear();
    let look =
        meridian_world::Look { name: Arc::from("wolf"), kind: 7, state: Arc::from(&b"hp=3"[..]) };
    world.spawn_npc(wolf, look.clone(), Position::new(6, 5), NOW, &mut out).expect("spawn");
    let entered = |out: &[Envelope], subject: PlayerId| {
        out.iter().any(|e| {
            e.to == ann
                && matches!(&e.note, Notification::Entered { subject: s, kind: 7, state, .. }
                    if *s == subject && &state[..] == b"hp=3")
        })
    };
    assert!(entered(&out, wolf), "ann sees the wolf with its kind and state: {out:?}");
    assert!(out.iter().all(|e| e.to == ann), "the wolf is told nothing: {out:?}");
    assert_eq!((world.n_local(), world.n_npcs()), (1, 1));
    assert_eq!(world.kind(wolf), Some(EntityKind::Npc));
    out.clear();
    world.move_player(wolf, Direction::Right, 0, NOW, &mut out).expect("a wolf moves");
    assert!(out.iter().all(|e| e.to == ann), "no ack for an NPC: {out:?}");

    world.upsert_ghost_as(ghost, look, Position::new(8, 5), &mut out).expect("a ghost");
    assert!(entered(&out, ghost));
    out.clear();
    world.upsert_ghost(ghost, Arc::from("wolf"), Position::new(9, 5), &mut out).expect("moved");
    assert_eq!(world.state(ghost).map(|s| s.to_vec()), Some(b"hp=3".to_vec()));
    assert!(
        out.iter().all(|e| !matches!(e.note, Notification::StateChanged { .. })),
        "a move changes no state: {out:?}"
    );
    world.assert_consistent();
}
