"""An asyncio client for Meridian's public client protocol (`proto/client.proto`).

`Connection.connect(host, port)` opens a TCP connection to a gateway; `login` places the
player; `move`, `action` resolve with their answers; `view` tracks what the player sees;
`on(name, callback)` or `events()` deliver what happens. A dropped connection, or one whose
gateway shuts down, resumes by itself within the resume window, on the next of the
`gateways` given if there are others. The protocol's messages are `meridian_client.pb`.
"""

from . import client_pb2 as pb
from .answers import Answers
from .connection import (
    EVENT_NAMES,
    Closed,
    Connection,
    Direction,
    ErrorReceived,
    LoginInfo,
    Resuming,
)
from .errors import ConnectionClosed, MeridianError, NotApplied
from .framing import MAX_FRAME_BODY, FrameDecoder, FrameError, FrameTooLarge, encode_frame
from .view import (
    ChatReceived,
    Entered,
    Entity,
    GameEventReceived,
    Left,
    Moved,
    Position,
    Reset,
    StateChanged,
    View,
)

__all__ = [
    "pb",
    "Answers",
    "EVENT_NAMES",
    "Closed",
    "Connection",
    "Direction",
    "ErrorReceived",
    "LoginInfo",
    "Resuming",
    "ConnectionClosed",
    "MeridianError",
    "NotApplied",
    "MAX_FRAME_BODY",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "encode_frame",
    "ChatReceived",
    "Entered",
    "Entity",
    "GameEventReceived",
    "Left",
    "Moved",
    "Position",
    "Reset",
    "StateChanged",
    "View",
]
