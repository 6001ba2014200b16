"""A scripted fake gateway on 127.0.0.1:0 for the tests that run without a cluster.

The test plays the server: it accepts the client's connections one by one (`accept`),
reads what the client sends and writes the server's messages, then closes or drops.
"""

from __future__ import annotations

import asyncio
from typing import Any

from meridian_client import Connection, FrameDecoder, encode_frame, pb

from messages import login_ok

WAIT = 5.0


class Peer:
    """One accepted connection, seen from the fake gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()

    async def recv(self) -> pb.ClientMessage:
        while (body := self.decoder.next_frame()) is None:
            data = await asyncio.wait_for(self.reader.read(4096), WAIT)
            assert data, "the client closed"
            self.decoder.feed(data)
        message = pb.ClientMessage()
        message.ParseFromString(body)
        return message

    def send(self, *messages: pb.ServerMessage) -> None:
        for message in messages:
            self.writer.write(encode_frame(message.SerializeToString()))

    def close(self) -> None:
        """Closes after what was written, as a gateway does after a closing error."""
        self.writer.close()

    def drop(self) -> None:
        """Cuts the connection at once, as a gateway that dies does."""
        self.writer.transport.abort()


class FakeGateway:
    def __init__(self) -> None:
        self.peers: asyncio.Queue[Peer] = asyncio.Queue()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.peers.put(Peer(reader, writer))

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def accept(self) -> Peer:
        return await asyncio.wait_for(self.peers.get(), WAIT)

    def stop(self) -> None:
        """Stops listening: a connection to its port is refused from now on."""
        assert self.server is not None
        self.server.close()


async def logged_in(gateway: FakeGateway, port: int, **options: Any) -> tuple[Connection, Peer]:
    """Connects to `port` (with `options` for `Connection.connect`) and logs "ann" in there."""
    connection = await Connection.connect("127.0.0.1", port, **options)
    peer = await gateway.accept()
    login = asyncio.create_task(connection.login("ann", spawn=(3, 4)))
    sent = await peer.recv()
    assert sent.WhichOneof("kind") == "login" and sent.login.name == "ann"
    assert (sent.login.spawn.x, sent.login.spawn.y) == (3, 4)
    peer.send(login_ok(1, 3, 4, token=b"tok"))
    info = await login
    assert info.player_id == 1 and info.resume_token == b"tok"
    return connection, peer
