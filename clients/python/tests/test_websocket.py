"""The WebSocket transport against local `websockets` servers: one binary message per body,
and the resume on the next gateway's URL when the first shuts down."""

from __future__ import annotations

import asyncio

import pytest

from meridian_client import Connection, Direction, pb

from messages import error, login_ok, moved, view_reset

websockets = pytest.importorskip("websockets", reason="the websocket extra")


async def test_login_and_move_over_websocket() -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def gateway(socket: ServerConnection) -> None:
        async for body in socket:
            assert isinstance(body, bytes), "the client sends binary messages"
            message = pb.ClientMessage()
            message.ParseFromString(body)
            if message.HasField("login"):
                await socket.send(login_ok(1, 5, 5).SerializeToString())
            elif message.HasField("move"):
                await socket.send(moved(1, 6, 5, message.move.client_time).SerializeToString())

    async with serve(gateway, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with await Connection.connect_websocket(f"ws://127.0.0.1:{port}") as connection:
            info = await connection.login("web")
            assert info.player_id == 1
            assert await connection.move(Direction.RIGHT) == (6, 5)


async def test_shutting_down_resumes_on_the_next_websocket_gateway() -> None:
    from websockets.asyncio.server import ServerConnection, serve

    shut = asyncio.Event()
    resumed_with: list[bytes] = []

    async def stopping(socket: ServerConnection) -> None:
        body = await socket.recv()
        assert isinstance(body, bytes)
        message = pb.ClientMessage()
        message.ParseFromString(body)
        assert message.HasField("login")
        await socket.send(login_ok(1, 5, 5, token=b"tok").SerializeToString())
        await shut.wait()
        await socket.send(error(pb.SHUTTING_DOWN, "gateway is shutting down").SerializeToString())
        await socket.close()

    async def other(socket: ServerConnection) -> None:
        async for body in socket:
            assert isinstance(body, bytes)
            message = pb.ClientMessage()
            message.ParseFromString(body)
            if message.HasField("resume"):
                resumed_with.append(message.resume.token)
                await socket.send(view_reset(1, 5, 5, token=b"tok2").SerializeToString())
            elif message.HasField("move"):
                await socket.send(moved(1, 5, 4, message.move.client_time).SerializeToString())

    async with serve(stopping, "127.0.0.1", 0) as first, serve(other, "127.0.0.1", 0) as second:
        urls = [f"ws://127.0.0.1:{next(iter(s.sockets)).getsockname()[1]}" for s in (first, second)]
        async with await Connection.connect_websocket(urls[0], gateways=urls[1:]) as connection:
            await connection.login("web")
            assert connection.address == urls[0]
            shut.set()
            await connection.wait_until(lambda v: connection.resumes == 1, 5.0, "the resume")
            assert resumed_with == [b"tok"] and connection.address == urls[1]
            assert await asyncio.wait_for(connection.move(Direction.UP), 5.0) == (5, 4)
