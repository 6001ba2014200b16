//! The roster's unit tests (apart, as `core_tests.rs`: they read the clock for their `now`).

use super::*;
use meridian_protocol::TokenKey;

fn roster() -> Roster {
    let keys: TokenKeys = TokenKey::new(vec![7; 32]).expect("invariant: a 32-byte key").into();
    Roster::new(keys, Duration::from_secs(30))
}

fn parked(nonce: u64, since: Instant) -> Parked {
    Parked {
        name: "p".into(),
        at: meridian_world::Position { x: 1, y: 1 },
        generation: 1,
        since,
        move_budget: None,
        private: Vec::new(),
        state: std::sync::Arc::from(&[][..]),
        resume_nonce: nonce,
        resume_previous: None,
        login: (0, 0),
        budgets: None,
    }
}

#[test]
fn a_token_takes_back_only_the_player_held_here_with_its_latest_nonce() {
    let mut roster = roster();
    let player = PlayerId(11);
    let token = roster.mint_token(player, 5);
    assert_eq!(roster.check_token(player, &token), TokenCheck::NotHeld);
    let mut seat = Seat::new(LinkId(1), 9, 1, 1, 1);
    seat.resume_nonce = 5;
    roster.insert_seat(player, seat);
    assert_eq!(
        roster.check_token(player, &roster.mint_token(player, 4)),
        TokenCheck::Refused("spent")
    );
    assert_eq!(roster.take_resumed_with(), None);
    assert_eq!(roster.check_token(player, &token), TokenCheck::TakesBack);
    assert_eq!(roster.take_resumed_with(), Some(5));
    assert_eq!(roster.take_resumed_with(), None, "taken once");
    let other = roster.mint_token(PlayerId(12), 5);
    assert_eq!(roster.check_token(player, &other), TokenCheck::Refused("other player"));
    assert_eq!(roster.check_token(player, b"garbage"), TokenCheck::Refused("forged"));
}

#[test]
fn an_npc_seat_is_not_resumed_but_a_parked_player_is() {
    let mut roster = roster();
    let npc = PlayerId(20);
    roster.insert_seat(npc, Seat::npc(0, 0, Vec::new()));
    let token = roster.mint_token(npc, 0);
    assert_eq!(roster.check_token(npc, &token), TokenCheck::NotHeld);
    let player = PlayerId(11);
    roster.park(player, parked(3, Instant::now()));
    let token = roster.mint_token(player, 3);
    assert_eq!(roster.check_token(player, &token), TokenCheck::TakesBack);
}

#[test]
fn parked_players_go_after_the_resume_window() {
    let mut roster = roster();
    let start = Instant::now();
    roster.park(PlayerId(11), parked(3, start));
    roster.expire_parked(start + Duration::from_secs(30));
    assert_eq!(roster.n_parked(), 1, "kept for the whole window");
    assert!(roster.within_resume_window(start, start + Duration::from_secs(30)));
    roster.expire_parked(start + Duration::from_secs(31));
    assert_eq!(roster.n_parked(), 0);
    assert!(roster.take_parked(PlayerId(11)).is_none());
}

#[test]
fn a_peer_that_dropped_its_ghosts_is_forgotten_as_a_holder() {
    let mut roster = roster();
    let peer = meridian_cluster::ShardId(2);
    let mut seat = Seat::new(LinkId(1), 9, 1, 1, 1);
    seat.ghosted_at = vec![peer, meridian_cluster::ShardId(3)];
    roster.insert_seat(PlayerId(11), seat);
    roster.insert_seat(PlayerId(12), Seat::new(LinkId(1), 10, 1, 1, 1));
    assert_eq!(roster.forget_holder(peer), vec![PlayerId(11)]);
    let left = &roster.seat(PlayerId(11)).expect("seated").ghosted_at;
    assert_eq!(left, &vec![meridian_cluster::ShardId(3)]);
    assert_eq!(roster.seated_on(LinkId(1)).len(), 2);
}
