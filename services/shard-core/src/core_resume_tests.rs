//! Resumes, logins and the gateway's lanes, driven through the core tests' harness
//! (`core_tests.rs`).

use super::*;

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
    let handoff = Handoff { session, ..handoff_message(player, (12, 12), 1) };
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

/// A viewer whose seat moves to a new stream of its own session (its gateway's stream broke
/// and it came back over another) is told what it sees on the new stream from then on, in
/// the same round too: where a viewer's output goes is remembered for the round
/// (`routes.rs`), and forgotten when its seat moves.
#[test]
fn a_viewer_restored_on_a_new_stream_is_told_there_within_the_round() {
    let mut h = Harness::new();
    let other = LinkId(2);
    h.actor.handle(h.now, Event::LinkOpened { link: other, gateway: GATEWAY, lane: 0 });
    h.join(11, 1);
    let mover = SESSION + 1;
    let spawn = Some(client_pb::Position { x: 12, y: 10 });
    let join = Join { name: "p12".into(), spawn, ..Default::default() };
    let inputs = vec![PlayerInput { session: mover, ..input(12, 1, Input::Join(join)) }];
    h.actor.handle(h.now, Event::Inputs { link: LINK, inputs });
    h.received();

    // One round: 12 moves (11 is told on its stream), 11 comes back over the other stream,
    // 12 moves again.
    move_on(&mut h, LINK, mover, 12, 2, 5);
    let restore = Join {
        name: "p11".into(),
        spawn: Some(client_pb::Position { x: 10, y: 10 }),
        restore: true,
        generation: 1,
        ..Default::default()
    };
    let inputs = vec![input(11, 2, Input::Join(restore))];
    h.actor.handle(h.now, Event::Inputs { link: other, inputs });
    move_on(&mut h, LINK, mover, 12, 3, 6);

    let told = |link: LinkId, all: &[(LinkId, u64, Server, bool)]| -> Vec<String> {
        let of_11 = all.iter().filter(|(l, session, _, _)| *l == link && *session == SESSION);
        of_11
            .map(|(_, _, message, _)| match message {
                Server::Moved(m) => format!("moved {} to {:?}", m.player_id, m.position),
                Server::ViewReset(_) => "view reset".into(),
                Server::Entered(e) => format!("entered {}", e.player_id),
                other => format!("{other:?}"),
            })
            .collect()
    };
    let all = received_all(&mut h);
    let at = |x| Some(client_pb::Position { x, y: 10 });
    assert_eq!(told(LINK, &all), vec![format!("moved 12 to {:?}", at(13))], "the old stream");
    let new = told(other, &all);
    assert_eq!(new.first().map(String::as_str), Some("view reset"), "the new stream: {new:?}");
    assert_eq!(
        new.last(),
        Some(&format!("moved 12 to {:?}", at(14))),
        "the move after it, on the new stream: {new:?}"
    );
}
