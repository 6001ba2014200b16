//! A gateway told to stop (SIGTERM): each client is told `SHUTTING_DOWN` once its moves and
//! actions in flight are answered, so that nothing relayed goes unanswered (a shard that
//! does not answer within `SHUTDOWN_WAIT` gets them refused); a move the client sent before
//! it read the goodbye is answered `SHUTTING_DOWN` with its `client_time`; the connection
//! closes `GOODBYE_GRACE` after the goodbye.

use super::*;
use crate::{GOODBYE_GRACE, SHUTDOWN_WAIT};

/// The answer to move 1 from the shard, as a delivery for the connection's session.
fn answer_to_move_1(session: u64) -> Mail {
    let mut frames = Vec::new();
    encode_frame(&server::moved(1, 5, 5, 1), &mut frames);
    let delivery =
        Delivery { session, frames: frames.into(), move_answers: 1, ..Default::default() };
    Mail::Deliveries { from: ShardId(1), deliveries: vec![delivery] }
}

fn closing(core: &mut TestCore, slot: u32) -> Option<Closing> {
    core.get_mut(slot).map(|c| c.closing)
}

#[test]
fn a_client_with_nothing_in_flight_is_told_at_once_and_closed_after_the_grace() {
    let (mut core, links, _mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = login_at(&mut core, t0);
    relayed_inputs(&mut core, &links[0].1);
    core.shut_down(t0);
    assert_eq!(errors(&replies(&mut core, slot)), vec![(ErrorCode::ShuttingDown, 0)]);
    assert!(core.poll_timeout() <= t0 + GOODBYE_GRACE, "woken for the close");
    // A move the client sent before it read the goodbye: answered, not relayed.
    write_all_at(&mut core, slot, vec![step(7)], t0 + GOODBYE_GRACE / 2);
    assert_eq!(errors(&replies(&mut core, slot)), vec![(ErrorCode::ShuttingDown, 7)]);
    assert_eq!(relayed_inputs(&mut core, &links[0].1), vec![], "not relayed");
    assert_eq!(closing(&mut core, slot), Some(Closing::No), "still reading");
    tick(&mut core, t0 + GOODBYE_GRACE / 2);
    assert!(core.poll_timeout() <= t0 + GOODBYE_GRACE, "a tick before the close keeps its wake-up");
    tick(&mut core, t0 + GOODBYE_GRACE);
    assert_eq!(closing(&mut core, slot), Some(Closing::AfterFlush));
}

#[test]
fn a_client_is_told_once_its_moves_in_flight_are_answered() {
    let (mut core, links, mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = login_at(&mut core, t0);
    let session = core.relayed_session(slot);
    write_all_at(&mut core, slot, vec![step(1)], t0);
    assert!(!relayed_inputs(&mut core, &links[0].1).is_empty());
    core.shut_down(t0);
    assert_eq!(replies(&mut core, slot), vec![], "move 1 is owed its answer first");
    mail.send(answer_to_move_1(session)).unwrap();
    core.process_mail(t0 + Duration::from_millis(1));
    let answers = replies(&mut core, slot);
    assert_eq!(answers[0], server::moved(1, 5, 5, 1), "the ack goes out");
    assert_eq!(errors(&answers), vec![(ErrorCode::ShuttingDown, 0)], "then the goodbye");
}

#[test]
fn moves_a_shard_does_not_answer_in_time_are_refused_before_the_goodbye() {
    let (mut core, _links, _mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = login_at(&mut core, t0);
    write_all_at(&mut core, slot, vec![step(1), step(2)], t0);
    core.shut_down(t0);
    tick(&mut core, t0 + SHUTDOWN_WAIT / 2);
    assert_eq!(replies(&mut core, slot), vec![], "still waiting for the shard");
    tick(&mut core, t0 + SHUTDOWN_WAIT + TICK);
    let expected = vec![
        (ErrorCode::Unavailable, 1),
        (ErrorCode::Unavailable, 2),
        (ErrorCode::ShuttingDown, 0),
    ];
    assert_eq!(errors(&replies(&mut core, slot)), expected);
}

/// Moves the gateway refused itself at shutdown are not answered again when the shard's
/// late answer comes after all (found by the `gateway_core` fuzz target: the inputs were
/// still queued to the shard, which applied and answered them after the refusal).
#[test]
fn a_shards_late_answer_to_a_move_refused_at_shutdown_is_not_told_twice() {
    let (mut core, _links, mail) = core_limited(64, 1, Limits::default());
    let t0 = Instant::now();
    let slot = login_at(&mut core, t0);
    let session = core.relayed_session(slot);
    write_all_at(&mut core, slot, vec![step(1)], t0);
    core.shut_down(t0);
    tick(&mut core, t0 + SHUTDOWN_WAIT + TICK);
    let expected = vec![(ErrorCode::Unavailable, 1), (ErrorCode::ShuttingDown, 0)];
    assert_eq!(errors(&replies(&mut core, slot)), expected);
    mail.send(answer_to_move_1(session)).unwrap();
    core.process_mail(t0 + SHUTDOWN_WAIT + TICK * 2);
    assert_eq!(replies(&mut core, slot), vec![], "move 1 was answered already");
}
