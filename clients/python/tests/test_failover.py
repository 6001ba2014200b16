"""Resuming on another gateway: the connection knows several gateways of one cluster
(`gateways=`), and each resume attempt goes to the next one, round-robin. Fake gateways on
127.0.0.1:0 play the cluster (the player's session lives behind all of them)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from meridian_client import Connection, ConnectionClosed, Direction, NotApplied, pb

from fake_gateway import WAIT, FakeGateway, logged_in
from messages import error, moved, view_reset


@pytest.fixture
async def gateways() -> AsyncIterator[list[FakeGateway]]:
    fakes = [FakeGateway() for _ in range(3)]
    for fake in fakes:
        await fake.start()
    yield fakes
    for fake in fakes:
        fake.stop()


async def test_shutting_down_resumes_on_the_next_gateway(gateways: list[FakeGateway]) -> None:
    first, second = gateways[0], gateways[1]
    connection, peer = await logged_in(first, first.port, gateways=[second.address])
    async with connection:
        assert connection.address == first.address
        heard: list[int] = []
        resuming: list[str] = []
        connection.on("error", lambda e: heard.append(e.code))
        connection.on("resuming", lambda e: resuming.append(e.reason))
        owed = asyncio.create_task(connection.move(Direction.UP))
        await peer.recv()
        # The gateway stops: it says so, then closes (the move is left unanswered).
        peer.send(error(pb.SHUTTING_DOWN, "gateway is shutting down"))
        peer.close()
        again = await second.accept()
        resume = await again.recv()
        assert resume.WhichOneof("kind") == "resume" and resume.resume.token == b"tok"
        assert connection.state == "resuming" and connection.address == second.address
        assert heard == [pb.SHUTTING_DOWN]
        assert len(resuming) == 1 and "127.0.0.1:%d is shutting down" % first.port in resuming[0]
        again.send(view_reset(1, 3, 4, token=b"tok2"))
        with pytest.raises(NotApplied):
            await asyncio.wait_for(owed, WAIT)
        later = asyncio.create_task(connection.move(Direction.RIGHT))
        sent = await again.recv()
        assert sent.WhichOneof("kind") == "move" and sent.move.direction == pb.RIGHT
        again.send(moved(1, 4, 4, sent.move.client_time))
        assert await asyncio.wait_for(later, WAIT) == (4, 4)
        assert connection.resumes == 1
        assert connection.info is not None and connection.info.resume_token == b"tok2"
        # Nothing went back to the gateway that is shutting down.
        assert first.peers.empty()


async def test_a_dropped_gateway_is_left_for_the_next_round_robin(gateways: list[FakeGateway]) -> None:
    first, down, third = gateways
    down.stop()
    connection, peer = await logged_in(first, first.port, gateways=[down.address, third.address])
    async with connection:
        peer.drop()
        # The next address refuses the connection; the one after it takes the resume.
        again = await third.accept()
        assert (await again.recv()).resume.token == b"tok"
        assert connection.address == third.address
        again.send(view_reset(1, 3, 4, token=b"tok2"))
        await connection.wait_until(lambda v: connection.resumes == 1, WAIT, "the resume on the third")
        # After the last address comes the first again.
        again.drop()
        back = await first.accept()
        assert (await back.recv()).resume.token == b"tok2"
        assert connection.address == first.address
        back.send(view_reset(1, 3, 4, token=b"tok3"))
        await connection.wait_until(lambda v: connection.resumes == 2, WAIT, "the resume on the first")
        move = asyncio.create_task(connection.move(Direction.DOWN))
        sent = await back.recv()
        back.send(moved(1, 3, 5, sent.move.client_time))
        assert await asyncio.wait_for(move, WAIT) == (3, 5)


async def test_a_gateway_shutting_down_during_a_resume_sends_it_on(gateways: list[FakeGateway]) -> None:
    first, second, _ = gateways
    connection, peer = await logged_in(first, first.port, gateways=[second.address])
    async with connection:
        peer.drop()
        # The second gateway takes the connection, then stops before it answers the resume.
        stopping = await second.accept()
        assert (await stopping.recv()).resume.token == b"tok"
        stopping.send(error(pb.SHUTTING_DOWN, "gateway is shutting down"))
        stopping.close()
        back = await first.accept()
        assert (await back.recv()).resume.token == b"tok"
        assert connection.state == "resuming" and connection.address == first.address
        back.send(view_reset(1, 3, 4))
        await connection.wait_until(
            lambda v: connection.resumes == 1 and connection.state == "playing", WAIT, "the resume"
        )


async def test_one_address_resumes_on_it_after_shutting_down(gateways: list[FakeGateway]) -> None:
    only = gateways[0]
    connection, peer = await logged_in(only, only.port)
    async with connection:
        peer.send(error(pb.SHUTTING_DOWN, "gateway is shutting down"))
        peer.close()
        # With nowhere else to go, the resume goes back to the same address, as before.
        again = await only.accept()
        assert (await again.recv()).resume.token == b"tok"
        assert connection.address == only.address
        again.send(view_reset(1, 3, 4))
        await connection.wait_until(lambda v: connection.resumes == 1, WAIT, "the resume")
        move = asyncio.create_task(connection.move(Direction.LEFT))
        sent = await again.recv()
        again.send(moved(1, 2, 4, sent.move.client_time))
        assert await asyncio.wait_for(move, WAIT) == (2, 4)


async def test_replaced_stays_final_with_other_gateways(gateways: list[FakeGateway]) -> None:
    first, second, _ = gateways
    connection, peer = await logged_in(first, first.port, gateways=[second.address])
    closed: list[str] = []
    connection.on("closed", lambda e: closed.append(e.reason))
    peer.send(error(pb.REPLACED, "logged in elsewhere"))
    peer.close()
    await connection.wait_until(lambda v: connection.state == "closed", WAIT, "the close")
    assert closed and "REPLACED" in closed[0]
    with pytest.raises(ConnectionClosed):
        await connection.move(Direction.UP)
    await asyncio.sleep(0.1)
    assert first.peers.empty() and second.peers.empty()
    await connection.close()


async def test_the_first_connection_tries_the_next_gateway(gateways: list[FakeGateway]) -> None:
    down, up, _ = gateways
    down.stop()
    connection = await Connection.connect(*down.address, gateways=[up.address])
    async with connection:
        assert connection.address == up.address
        await up.accept()
    with pytest.raises(OSError):
        await Connection.connect(*down.address, gateways=[down.address])
