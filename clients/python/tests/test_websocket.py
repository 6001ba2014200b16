"""The WebSocket transport against a local `websockets` server: one binary message per body."""

from __future__ import annotations

import pytest

from meridian_client import Connection, Direction, pb

from messages import login_ok, moved

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
