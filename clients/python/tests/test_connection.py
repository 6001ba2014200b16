"""The connection against a scripted fake gateway on 127.0.0.1:0 (no cluster): login,
answers through the socket, keep-alive, and the resume after a drop (to more than one
gateway: `test_failover.py`)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from meridian_client import (
    Connection,
    ConnectionClosed,
    Direction,
    MeridianError,
    NotApplied,
    Position,
    pb,
)

from fake_gateway import WAIT, FakeGateway, logged_in
from messages import action_done, entered, error, moved, view_reset


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[FakeGateway, int]]:
    fake = FakeGateway()
    port = await fake.start()
    yield fake, port
    fake.stop()


async def test_login_refused_raises_and_the_connection_stays(gateway: tuple[FakeGateway, int]) -> None:
    fake, port = gateway
    async with await Connection.connect("127.0.0.1", port) as connection:
        peer = await fake.accept()
        login = asyncio.create_task(connection.login("bad\u202ename"))
        await peer.recv()
        peer.send(error(pb.INVALID_ARGUMENT, "name has a bidirectional character"))
        with pytest.raises(MeridianError) as refused:
            await login
        assert refused.value.code == pb.INVALID_ARGUMENT
        assert connection.state == "connected"


async def test_answers_arrive_through_the_socket(gateway: tuple[FakeGateway, int]) -> None:
    fake, port = gateway
    connection, peer = await logged_in(*gateway)
    async with connection:
        move = asyncio.create_task(connection.move(Direction.RIGHT))
        action = asyncio.create_task(connection.action(2, target=9, payload=b"1,0"))
        refused = asyncio.create_task(connection.move("left"))
        sent = [await peer.recv() for _ in range(3)]
        times = [m.move.client_time if m.HasField("move") else m.action.client_time for m in sent]
        assert len(set(times)) == 3 and 0 not in times
        assert sent[1].action.kind == 2 and sent[1].action.target == 9 and sent[1].action.payload == b"1,0"
        # Someone else's move with no client_time, then the answers, out of order.
        peer.send(entered(5, 6, 4, "bo"), moved(5, 7, 4))
        peer.send(error(pb.RATE_LIMITED, "move rate limit", times[2]))
        peer.send(action_done(times[1], b"77"), moved(1, 4, 4, times[0]))
        assert await asyncio.wait_for(move, WAIT) == Position(4, 4)
        assert await asyncio.wait_for(action, WAIT) == b"77"
        with pytest.raises(MeridianError):
            await asyncio.wait_for(refused, WAIT)
        assert connection.view.entities[5].position == (7, 4)
        assert connection.view.own_position == (4, 4)


async def test_keepalive_pings_a_quiet_connection(gateway: tuple[FakeGateway, int]) -> None:
    connection, peer = await logged_in(*gateway, keepalive=0.2)
    async with connection:
        first = await peer.recv()
        second = await peer.recv()
        assert first.WhichOneof("kind") == "ping" and second.WhichOneof("kind") == "ping"
        assert 0 < first.ping.client_time < second.ping.client_time


async def test_a_drop_resumes_and_what_it_owed_was_not_applied(gateway: tuple[FakeGateway, int]) -> None:
    fake, port = gateway
    connection, peer = await logged_in(fake, port)
    async with connection:
        owed = asyncio.create_task(connection.move(Direction.UP))
        await peer.recv()
        peer.drop()
        # The new connection resumes with the token; a move sent meanwhile waits for it.
        again = await fake.accept()
        resume = await again.recv()
        assert resume.WhichOneof("kind") == "resume" and resume.resume.token == b"tok"
        later = asyncio.create_task(connection.move(Direction.DOWN))
        await asyncio.sleep(0.05)
        assert not later.done() and connection.state == "resuming"
        again.send(view_reset(1, 3, 4), entered(5, 6, 4, "bo"))
        with pytest.raises(NotApplied):
            await asyncio.wait_for(owed, WAIT)
        sent = await again.recv()
        assert sent.WhichOneof("kind") == "move" and sent.move.direction == pb.DOWN
        again.send(moved(1, 3, 5, sent.move.client_time))
        assert await asyncio.wait_for(later, WAIT) == (3, 5)
        assert connection.resumes == 1 and list(connection.view.entities) == [5]


async def test_the_next_resume_uses_the_token_the_last_view_reset_brought(gateway: tuple[FakeGateway, int]) -> None:
    # A token is good once: each resume's ViewReset carries the one for the next.
    fake, port = gateway
    connection, peer = await logged_in(fake, port)
    async with connection:
        peer.drop()
        again = await fake.accept()
        assert (await again.recv()).resume.token == b"tok"
        again.send(view_reset(1, 3, 4, token=b"tok2"))
        await connection.wait_until(lambda v: connection.resumes == 1, WAIT, "the first resume")
        assert connection.info is not None and connection.info.resume_token == b"tok2"
        again.drop()
        third = await fake.accept()
        assert (await third.recv()).resume.token == b"tok2"


async def test_a_refused_resume_closes_for_good(gateway: tuple[FakeGateway, int]) -> None:
    fake, port = gateway
    connection, peer = await logged_in(fake, port)
    owed = asyncio.create_task(connection.action(1, target=5))
    await peer.recv()
    peer.drop()
    again = await fake.accept()
    await again.recv()
    again.send(error(pb.INVALID_TOKEN, "nothing to resume: the resume window has passed"))
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(owed, WAIT)
    assert connection.state == "closed"
    with pytest.raises(ConnectionClosed):
        await connection.move(Direction.UP)
    await connection.close()
