"""Answer matching: each move or action resolved by its own answer, by client_time."""

import pytest

from meridian_client import Answers, MeridianError, NotApplied, Position, pb

from messages import action_done, error, moved


async def test_answers_match_by_client_time() -> None:
    answers = Answers()
    times = [answers.next_client_time() for _ in range(3)]
    assert times == sorted(set(times)) and 0 not in times
    move = answers.expect("move", times[0], generation=1)
    action = answers.expect("action", times[1], generation=1)
    refused = answers.expect("move", times[2], generation=1)
    # Another player's Moved, and our own with a client_time no one waits for, answer nothing.
    assert not answers.resolve(moved(2, 5, 5, client_time=times[0]), own_id=1)
    assert not answers.resolve(moved(1, 5, 5, client_time=999), own_id=1)
    # An ActionDone cannot answer a move, nor an ack an action.
    assert not answers.resolve(action_done(times[0], b"x"), own_id=1)
    assert not answers.resolve(moved(1, 5, 5, client_time=times[1]), own_id=1)
    assert answers.resolve(moved(1, 11, 10, client_time=times[0]), own_id=1)
    assert answers.resolve(action_done(times[1], b'{"hp":6}'), own_id=1)
    assert answers.resolve(error(pb.RATE_LIMITED, "move rate limit", client_time=times[2]), own_id=1)
    assert await move == Position(11, 10)
    assert await action == b'{"hp":6}'
    with pytest.raises(MeridianError) as raised:
        await refused
    assert raised.value.code == pb.RATE_LIMITED and raised.value.code_name == "RATE_LIMITED"
    assert len(answers) == 0
    # An error without a client_time answers nothing.
    assert not answers.resolve(error(pb.INVALID_ARGUMENT, "chat"), own_id=1)


async def test_a_resume_interrupts_only_what_the_old_connection_owed() -> None:
    answers = Answers()
    old = answers.expect("move", answers.next_client_time(), generation=1)
    new = answers.expect("action", answers.next_client_time(), generation=2)
    assert answers.interrupt_before(2) == 1
    with pytest.raises(NotApplied):
        await old
    assert not new.done() and len(answers) == 1
