"""Byte transports: one message body per `send`/`recv`, whatever the wire does.

TCP carries each body behind its varint length (see `framing`); a WebSocket carries one
body per binary message, with no prefix. Both keep the 4096-byte body limit both ways.

A `Connector` opens a fresh transport to one gateway each time it is called: the connection
calls it again to resume. The two here (`tcp_connector`, `websocket_connector`) also say
which gateway they reach, as their `address`.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from .framing import MAX_FRAME_BODY, FrameDecoder, FrameTooLarge, encode_frame


class Transport(Protocol):
    async def send(self, body: bytes) -> None: ...

    async def recv(self) -> bytes | None:
        """The next body, or None once the peer has closed."""
        ...

    def close(self) -> None: ...

    def sever(self) -> None:
        """Cuts the link at once, as a network failure would (for tests and tools)."""
        ...


Connector = Callable[[], Awaitable[Transport]]

# Where a connector goes: `(host, port)` for TCP, the URL for a WebSocket.
Address = tuple[str, int] | str


class TcpTransport:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limit: int = MAX_FRAME_BODY,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._limit = limit
        self._decoder = FrameDecoder(limit)

    @classmethod
    async def open(cls, host: str, port: int, limit: int = MAX_FRAME_BODY) -> TcpTransport:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Moves are small and latency matters more than packing them.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, limit)

    async def send(self, body: bytes) -> None:
        self._writer.write(encode_frame(body, self._limit))
        await self._writer.drain()

    async def recv(self) -> bytes | None:
        while True:
            body = self._decoder.next_frame()
            if body is not None:
                return body
            data = await self._reader.read(65536)
            if not data:
                return None
            self._decoder.feed(data)

    def close(self) -> None:
        self._writer.close()

    def sever(self) -> None:
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._writer.transport.abort()


@dataclass(frozen=True)
class TcpConnector:
    """Opens a `TcpTransport` to one gateway's game port each time it is called."""

    host: str
    port: int
    limit: int = MAX_FRAME_BODY

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    async def __call__(self) -> Transport:
        return await TcpTransport.open(self.host, self.port, self.limit)


def tcp_connector(host: str, port: int, limit: int = MAX_FRAME_BODY) -> TcpConnector:
    return TcpConnector(host, port, limit)


class WebSocketTransport:
    """Needs the `websockets` package (the `websocket` extra)."""

    def __init__(self, socket_: Any, limit: int = MAX_FRAME_BODY) -> None:
        self._socket = socket_
        self._limit = limit

    @classmethod
    async def open(cls, url: str, limit: int = MAX_FRAME_BODY) -> WebSocketTransport:
        from websockets.asyncio.client import connect

        # max_size makes the library refuse (and close on) an oversize message itself.
        return cls(await connect(url, max_size=limit, compression=None), limit)

    async def send(self, body: bytes) -> None:
        if len(body) > self._limit:
            raise FrameTooLarge(len(body), self._limit)
        await self._socket.send(body)

    async def recv(self) -> bytes | None:
        from websockets.exceptions import ConnectionClosed

        try:
            message = await self._socket.recv()
        except ConnectionClosed:
            return None
        if isinstance(message, str):
            # The protocol is binary only; a text message is a broken peer.
            raise ValueError("a text WebSocket message where a binary body was expected")
        return bytes(message)

    def close(self) -> None:
        asyncio.get_running_loop().create_task(self._socket.close())

    def sever(self) -> None:
        self._socket.transport.abort()


@dataclass(frozen=True)
class WebSocketConnector:
    """Opens a `WebSocketTransport` to one gateway's URL each time it is called."""

    url: str
    limit: int = MAX_FRAME_BODY

    @property
    def address(self) -> str:
        return self.url

    async def __call__(self) -> Transport:
        return await WebSocketTransport.open(self.url, self.limit)


def websocket_connector(url: str, limit: int = MAX_FRAME_BODY) -> WebSocketConnector:
    return WebSocketConnector(url, limit)
