from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Direction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTION_UNSPECIFIED: _ClassVar[Direction]
    UP: _ClassVar[Direction]
    DOWN: _ClassVar[Direction]
    LEFT: _ClassVar[Direction]
    RIGHT: _ClassVar[Direction]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_UNSPECIFIED: _ClassVar[ErrorCode]
    MALFORMED: _ClassVar[ErrorCode]
    FRAME_TOO_LARGE: _ClassVar[ErrorCode]
    NOT_LOGGED_IN: _ClassVar[ErrorCode]
    ALREADY_LOGGED_IN: _ClassVar[ErrorCode]
    RATE_LIMITED: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
    INVALID_TOKEN: _ClassVar[ErrorCode]
    SHUTTING_DOWN: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    REPLACED: _ClassVar[ErrorCode]
    REJECTED: _ClassVar[ErrorCode]
DIRECTION_UNSPECIFIED: Direction
UP: Direction
DOWN: Direction
LEFT: Direction
RIGHT: Direction
ERROR_UNSPECIFIED: ErrorCode
MALFORMED: ErrorCode
FRAME_TOO_LARGE: ErrorCode
NOT_LOGGED_IN: ErrorCode
ALREADY_LOGGED_IN: ErrorCode
RATE_LIMITED: ErrorCode
UNAVAILABLE: ErrorCode
INVALID_TOKEN: ErrorCode
SHUTTING_DOWN: ErrorCode
INVALID_ARGUMENT: ErrorCode
REPLACED: ErrorCode
REJECTED: ErrorCode

class ClientMessage(_message.Message):
    __slots__ = ("login", "move", "chat", "ping", "logout", "resume", "action")
    LOGIN_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    LOGOUT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    login: Login
    move: Move
    chat: Chat
    ping: Ping
    logout: Logout
    resume: Resume
    action: Action
    def __init__(self, login: _Optional[_Union[Login, _Mapping]] = ..., move: _Optional[_Union[Move, _Mapping]] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., logout: _Optional[_Union[Logout, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., action: _Optional[_Union[Action, _Mapping]] = ...) -> None: ...

class Login(_message.Message):
    __slots__ = ("name", "spawn", "token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPAWN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    spawn: Position
    token: str
    def __init__(self, name: _Optional[str] = ..., spawn: _Optional[_Union[Position, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class Move(_message.Message):
    __slots__ = ("direction", "client_time")
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    direction: Direction
    client_time: int
    def __init__(self, direction: _Optional[_Union[Direction, str]] = ..., client_time: _Optional[int] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("client_time",)
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    client_time: int
    def __init__(self, client_time: _Optional[int] = ...) -> None: ...

class Logout(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Resume(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    def __init__(self, token: _Optional[bytes] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("kind", "payload", "target", "client_time")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    kind: int
    payload: bytes
    target: int
    client_time: int
    def __init__(self, kind: _Optional[int] = ..., payload: _Optional[bytes] = ..., target: _Optional[int] = ..., client_time: _Optional[int] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("x", "y")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("login_ok", "entered", "moved", "left", "chat", "pong", "error", "view_reset", "state_changed", "event", "action_done")
    LOGIN_OK_FIELD_NUMBER: _ClassVar[int]
    ENTERED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VIEW_RESET_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_DONE_FIELD_NUMBER: _ClassVar[int]
    login_ok: LoginOk
    entered: Entered
    moved: Moved
    left: Left
    chat: ChatMessage
    pong: Pong
    error: Error
    view_reset: ViewReset
    state_changed: StateChanged
    event: GameEvent
    action_done: ActionDone
    def __init__(self, login_ok: _Optional[_Union[LoginOk, _Mapping]] = ..., entered: _Optional[_Union[Entered, _Mapping]] = ..., moved: _Optional[_Union[Moved, _Mapping]] = ..., left: _Optional[_Union[Left, _Mapping]] = ..., chat: _Optional[_Union[ChatMessage, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., view_reset: _Optional[_Union[ViewReset, _Mapping]] = ..., state_changed: _Optional[_Union[StateChanged, _Mapping]] = ..., event: _Optional[_Union[GameEvent, _Mapping]] = ..., action_done: _Optional[_Union[ActionDone, _Mapping]] = ...) -> None: ...

class LoginOk(_message.Message):
    __slots__ = ("player_id", "position", "resume_token", "map_width", "map_height", "view_range")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAP_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAP_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    VIEW_RANGE_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    position: Position
    resume_token: bytes
    map_width: int
    map_height: int
    view_range: int
    def __init__(self, player_id: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., resume_token: _Optional[bytes] = ..., map_width: _Optional[int] = ..., map_height: _Optional[int] = ..., view_range: _Optional[int] = ...) -> None: ...

class Entered(_message.Message):
    __slots__ = ("player_id", "position", "name", "kind", "state")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    position: Position
    name: str
    kind: int
    state: bytes
    def __init__(self, player_id: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., name: _Optional[str] = ..., kind: _Optional[int] = ..., state: _Optional[bytes] = ...) -> None: ...

class Moved(_message.Message):
    __slots__ = ("player_id", "position", "client_time")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    position: Position
    client_time: int
    def __init__(self, player_id: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., client_time: _Optional[int] = ...) -> None: ...

class Left(_message.Message):
    __slots__ = ("player_id",)
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    def __init__(self, player_id: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("player_id", "text")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    text: str
    def __init__(self, player_id: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("client_time",)
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    client_time: int
    def __init__(self, client_time: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "detail", "client_time")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    detail: str
    client_time: int
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., detail: _Optional[str] = ..., client_time: _Optional[int] = ...) -> None: ...

class StateChanged(_message.Message):
    __slots__ = ("entity_id", "state")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    entity_id: int
    state: bytes
    def __init__(self, entity_id: _Optional[int] = ..., state: _Optional[bytes] = ...) -> None: ...

class GameEvent(_message.Message):
    __slots__ = ("source", "kind", "payload")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    source: int
    kind: int
    payload: bytes
    def __init__(self, source: _Optional[int] = ..., kind: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ActionDone(_message.Message):
    __slots__ = ("client_time", "payload")
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    client_time: int
    payload: bytes
    def __init__(self, client_time: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ViewReset(_message.Message):
    __slots__ = ("player_id", "position", "resume_token")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    player_id: int
    position: Position
    resume_token: bytes
    def __init__(self, player_id: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., resume_token: _Optional[bytes] = ...) -> None: ...
