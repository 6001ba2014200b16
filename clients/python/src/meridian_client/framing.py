"""Varint length-delimited framing, sans I/O: bytes in, message bodies out.

On a byte stream every message body is preceded by its length as a protobuf varint. The
body limit (4096 bytes by default, the prefix not counted) holds in both directions; a
declared length over it is refused before anything is buffered for it.
"""

from __future__ import annotations

MAX_FRAME_BODY = 4096
"""The protocol's default limit on one message body, in bytes, both ways."""

# A varint of a length this client accepts never needs more than this many bytes; the
# protobuf maximum (10) covers a 64-bit value, which no limit here comes near.
_MAX_VARINT_BYTES = 10


class FrameError(Exception):
    """The peer's byte stream is not valid framing: the connection cannot go on."""


class FrameTooLarge(FrameError):
    """A frame body longer than the limit (sent or received)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame body of {length} bytes is over the limit of {limit}")
        self.length = length
        self.limit = limit


def encode_varint(value: int) -> bytes:
    """The protobuf varint encoding of a non-negative integer."""
    if value < 0:
        raise ValueError(f"a varint is never negative: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_frame(body: bytes, limit: int = MAX_FRAME_BODY) -> bytes:
    """`body` with its length prefix; a body over `limit` is refused (the server would close)."""
    if len(body) > limit:
        raise FrameTooLarge(len(body), limit)
    return encode_varint(len(body)) + body


class FrameDecoder:
    """Collects stream bytes and cuts them into frame bodies.

    `feed` adds bytes; `next_frame` returns the next complete body, or None while it is
    still incomplete (not an error). A prefix declaring more than `limit` bytes raises
    `FrameTooLarge` as soon as the prefix is read, so a hostile peer cannot make it buffer.
    """

    def __init__(self, limit: int = MAX_FRAME_BODY) -> None:
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def next_frame(self) -> bytes | None:
        length = 0
        shift = 0
        for index, byte in enumerate(self._buffer):
            if index >= _MAX_VARINT_BYTES:
                raise FrameError("frame length prefix is longer than 10 bytes")
            length |= (byte & 0x7F) << shift
            shift += 7
            if length > self.limit:
                raise FrameTooLarge(length, self.limit)
            if byte & 0x80:
                continue
            start = index + 1
            end = start + length
            if len(self._buffer) < end:
                return None
            body = bytes(self._buffer[start:end])
            del self._buffer[:end]
            return body
        return None

    def frames(self) -> list[bytes]:
        """Every complete body buffered now, in order."""
        out = []
        while (body := self.next_frame()) is not None:
            out.append(body)
        return out
