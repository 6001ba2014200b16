"""The framing codec: round trips, incomplete input, garbage, truncation and oversize."""

import random

import pytest

from meridian_client.framing import (
    MAX_FRAME_BODY,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    encode_frame,
    encode_varint,
)


def test_varint_matches_protobuf_encoding() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(1) == b"\x01"
    assert encode_varint(127) == b"\x7f"
    assert encode_varint(128) == b"\x80\x01"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(4096) == b"\x80\x20"
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_round_trip_in_pieces_of_every_size() -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    bodies = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 127, 128, 300, 4096]))) for _ in range(40)]
    stream = b"".join(encode_frame(b) for b in bodies)
    decoder = FrameDecoder()
    got = []
    position = 0
    while position < len(stream):
        step = rng.randrange(1, 700)
        decoder.feed(stream[position : position + step])
        position += step
        got.extend(decoder.frames())
    assert got == bodies, f"seed {seed}"
    assert decoder.buffered() == 0


def test_incomplete_input_is_none_not_an_error() -> None:
    frame = encode_frame(b"x" * 300)
    decoder = FrameDecoder()
    for cut in range(len(frame)):
        decoder = FrameDecoder()
        decoder.feed(frame[:cut])
        assert decoder.next_frame() is None, f"cut at {cut}"
    decoder.feed(frame[len(frame) - 1 :])
    assert decoder.next_frame() == b"x" * 300


def test_oversize_is_refused_both_ways_before_buffering() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame(b"x" * (MAX_FRAME_BODY + 1))
    assert encode_frame(b"x" * MAX_FRAME_BODY)[:2] == b"\x80\x20"
    decoder = FrameDecoder()
    # Only the prefix of a 4097-byte body: refused at once, no body needed.
    decoder.feed(encode_varint(MAX_FRAME_BODY + 1))
    with pytest.raises(FrameTooLarge) as raised:
        decoder.next_frame()
    assert raised.value.length == MAX_FRAME_BODY + 1
    # A huge declared length is refused from its first bytes.
    decoder = FrameDecoder()
    decoder.feed(b"\xff\xff")
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_garbage_prefix_is_an_error() -> None:
    decoder = FrameDecoder(limit=1 << 70)
    decoder.feed(b"\x80" * 11)
    with pytest.raises(FrameError):
        decoder.next_frame()
