//! The chat and action budgets belong to the player, not the connection (issue 31 item 3):
//! kept by this gateway, parked by the shard and given back with a resume's answer, and
//! empty for a connection that took its player over from one still open.

use super::*;

/// Issue 31 item 3: the chat and action budgets are the player's, not the connection's.
/// A client that spends its chats, drops and resumes on a new connection finds them spent
/// (before, every resume refilled them: 149 chats/s from one player).
#[test]
fn a_resume_gets_back_the_budgets_its_last_connection_spent() {
    let (mut core, links, mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let token = TokenKey::new(vec![7; 32]).expect("a valid key").mint(42, u64::MAX / 2);
    // The shard says the player's budgets are full (parked so, long ago): only what this
    // gateway kept of the connection it left can lower them.
    let full =
        Budgets { chat_credit: 5 * 1_000_000_000, action_credit: 20 * 1_000_000_000, age_ms: 0 };
    let resume_at = |core: &mut TestCore, at: Instant| {
        let slot = core.connect(at).expect("admitted");
        let resume = C::Resume(meridian_protocol::pb::Resume { token: token.clone() });
        write_all_at(core, slot, vec![resume], at);
        let session = core.relayed_session(slot);
        let mut frames = Vec::new();
        encode_frame(&server::view_reset(42, 1, 1), &mut frames);
        let answer =
            Delivery { session, frames: frames.into(), budgets: Some(full), ..Default::default() };
        mail.send(Mail::Deliveries { from: ShardId(1), deliveries: vec![answer] }).unwrap();
        core.process_mail(at);
        replies(core, slot);
        slot
    };
    let chats = |n: usize| (0..n).map(|i| C::Chat(Chat { text: format!("hi {i}") })).collect();
    let first = resume_at(&mut core, t0);
    write_all_at(&mut core, first, chats(6), t0);
    let relayed = relayed_inputs(&mut core, &links[0].1);
    let n_chats = |inputs: &[PlayerInput]| {
        inputs.iter().filter(|i| matches!(i.kind, Some(Input::Chat(_)))).count()
    };
    assert_eq!(n_chats(&relayed), 5, "the burst of 5");
    assert_eq!(errors(&replies(&mut core, first)), vec![(ErrorCode::RateLimited, 0)]);
    core.on_peer_closed(first);
    // Back 10 ms later on a new connection: the burst is still spent.
    let later = t0 + Duration::from_millis(10);
    let second = resume_at(&mut core, later);
    write_all_at(&mut core, second, chats(1), later);
    assert_eq!(n_chats(&relayed_inputs(&mut core, &links[0].1)), 0);
    assert_eq!(errors(&replies(&mut core, second)), vec![(ErrorCode::RateLimited, 0)]);
    // Half a second on, the bucket has refilled by its rate (2/s): one more.
    let refilled = t0 + Duration::from_millis(510);
    write_all_at(&mut core, second, chats(2), refilled);
    assert_eq!(n_chats(&relayed_inputs(&mut core, &links[0].1)), 1);
}

/// The budgets travel with the player: a dropped connection's Leave carries them to the
/// shard, which parks them with the player and gives them back with its answer to a resume
/// on any gateway, so hopping from gateway to gateway buys nothing either.
#[test]
fn a_resume_on_another_gateway_gets_the_budgets_its_shard_parked() {
    let token = TokenKey::new(vec![7; 32]).expect("a valid key").mint(42, u64::MAX / 2);
    let chats = |n: usize| (0..n).map(|i| C::Chat(Chat { text: format!("hi {i}") })).collect();
    let n_chats = |inputs: &[PlayerInput]| {
        inputs.iter().filter(|i| matches!(i.kind, Some(Input::Chat(_)))).count()
    };
    let t0 = Instant::now();
    let resume = |core: &mut TestCore, mail: &SyncSender<Mail>, at: Instant, budgets| {
        let slot = core.connect(at).expect("admitted");
        let resume = C::Resume(meridian_protocol::pb::Resume { token: token.clone() });
        write_all_at(core, slot, vec![resume], at);
        let session = core.relayed_session(slot);
        let mut frames = Vec::new();
        encode_frame(&server::view_reset(42, 1, 1), &mut frames);
        let answer = Delivery { session, frames: frames.into(), budgets, ..Default::default() };
        mail.send(Mail::Deliveries { from: ShardId(1), deliveries: vec![answer] }).unwrap();
        core.process_mail(at);
        replies(core, slot);
        slot
    };
    // Gateway A: the burst of 5 chats spent, then the connection drops.
    let (mut a, a_links, a_mail) = core_limited(64, 1, Limits::default());
    let full =
        Budgets { chat_credit: 5 * 1_000_000_000, action_credit: 20 * 1_000_000_000, age_ms: 0 };
    let first = resume(&mut a, &a_mail, t0, Some(full));
    write_all_at(&mut a, first, chats(5), t0);
    assert_eq!(n_chats(&relayed_inputs(&mut a, &a_links[0].1)), 5);
    a.on_peer_closed(first);
    a.flush_inputs();
    let leave = relayed_inputs(&mut a, &a_links[0].1).pop().expect("a Leave");
    let Some(Input::Leave(Leave { logout: false, budgets: Some(parked) })) = leave.kind else {
        panic!("a dropped connection's Leave carries its budgets: {leave:?}");
    };
    assert!(parked.chat_credit < 1_000_000_000, "less than one chat left: {parked:?}");
    assert_eq!(parked.action_credit, 20 * 1_000_000_000, "no action spent: {parked:?}");
    // Gateway B, which never saw the player: its shard's answer brings them, 10 ms old.
    let (mut b, b_links, b_mail) = core_limited(64, 1, Limits::default());
    let later = t0 + Duration::from_millis(10);
    let aged = Budgets { age_ms: 10, ..parked };
    let second = resume(&mut b, &b_mail, later, Some(aged));
    write_all_at(&mut b, second, chats(1), later);
    assert_eq!(n_chats(&relayed_inputs(&mut b, &b_links[0].1)), 0, "still spent");
    assert_eq!(errors(&replies(&mut b, second)), vec![(ErrorCode::RateLimited, 0)]);
    // Refilled at the gateway's own rate (2/s) from when they were given: one more.
    let refilled = t0 + Duration::from_millis(510);
    write_all_at(&mut b, second, chats(2), refilled);
    assert_eq!(n_chats(&relayed_inputs(&mut b, &b_links[0].1)), 1);
}

/// A resume that takes the player over from a connection still open (on another gateway)
/// is answered without budgets: the old connection's gateway holds them, and they come
/// later, through the shard, with that connection's Leave. Until then the new connection
/// has none to spend, so the race cannot buy a fresh burst (abuse scenario 11 heard 10
/// chats of a budget of 6 when the old budgets came after the new burst). They refill at
/// the usual rate.
#[test]
fn a_takeover_answered_without_budgets_starts_with_none() {
    let (mut core, links, mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let token = TokenKey::new(vec![7; 32]).expect("a valid key").mint(42, u64::MAX / 2);
    let slot = core.connect(t0).expect("admitted");
    let resume = C::Resume(meridian_protocol::pb::Resume { token });
    write_all_at(&mut core, slot, vec![resume], t0);
    let session = core.relayed_session(slot);
    let mut frames = Vec::new();
    encode_frame(&server::view_reset(42, 1, 1), &mut frames);
    let answer = Delivery { session, frames: frames.into(), budgets: None, ..Default::default() };
    mail.send(Mail::Deliveries { from: ShardId(1), deliveries: vec![answer] }).unwrap();
    core.process_mail(t0);
    replies(&mut core, slot);
    let chats = |n: usize| (0..n).map(|i| C::Chat(Chat { text: format!("hi {i}") })).collect();
    let n_chats = |inputs: &[PlayerInput]| {
        inputs.iter().filter(|i| matches!(i.kind, Some(Input::Chat(_)))).count()
    };
    write_all_at(&mut core, slot, chats(5), t0);
    assert_eq!(n_chats(&relayed_inputs(&mut core, &links[0].1)), 0, "no fresh burst");
    let refused = errors(&replies(&mut core, slot));
    assert_eq!(refused, vec![(ErrorCode::RateLimited, 0); 5], "each chat refused");
    // Half a second on, refilled by the rate (2/s): one chat.
    let refilled = t0 + Duration::from_millis(510);
    write_all_at(&mut core, slot, chats(2), refilled);
    assert_eq!(n_chats(&relayed_inputs(&mut core, &links[0].1)), 1);
}
