"""What the player sees, rebuilt from the server's notifications, sans I/O.

`View.apply(message)` takes one `ServerMessage` and returns the events it means
(`Entered`, `Moved`, `Left`, `StateChanged`, `GameEventReceived`, `ChatReceived`, `Reset`).
The rules it follows (normative in the protocol): `Entered` for an entity not in view,
`Moved` for one in view (or our own ack), `Left` for one in view, `ViewReset` clears
everything and `Entered` for all in sight follows. A message that breaks a rule is not
applied; it is counted in `violations`, since a client has no use for crashing on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Union

from . import client_pb2 as pb


class Position(NamedTuple):
    x: int
    y: int


def _position(message: pb.Position) -> Position:
    return Position(message.x, message.y)


@dataclass
class Entity:
    """Another player or an NPC in sight."""

    id: int
    position: Position
    name: str
    # 0 for a player; the game's (non-zero) kind for an NPC.
    kind: int
    # The entity's public state (game-defined bytes), as last told.
    state: bytes

    @property
    def is_player(self) -> bool:
        return self.kind == 0


@dataclass(frozen=True)
class Entered:
    entity: Entity


@dataclass(frozen=True)
class Moved:
    """An entity in view moved, or (`own`) our own move was acknowledged."""

    entity_id: int
    position: Position
    own: bool
    client_time: int = 0


@dataclass(frozen=True)
class Left:
    entity: Entity


@dataclass(frozen=True)
class StateChanged:
    """Public state changed: of an entity in view, or (`own`) our own."""

    entity_id: int
    state: bytes
    own: bool


@dataclass(frozen=True)
class GameEventReceived:
    """Something the game told the player; `source` 0 is the world."""

    source: int
    kind: int
    payload: bytes


@dataclass(frozen=True)
class ChatReceived:
    player_id: int
    text: str
    # The speaker's name when it is in view (or ourselves), else "".
    name: str


@dataclass(frozen=True)
class Reset:
    """The view was cleared (a resume or a restore); `Entered` for all in sight follows."""

    position: Position


Event = Union[Entered, Moved, Left, StateChanged, GameEventReceived, ChatReceived, Reset]


@dataclass
class View:
    own_id: int | None = None
    own_name: str = ""
    own_position: Position | None = None
    own_state: bytes = b""
    entities: dict[int, Entity] = field(default_factory=dict)
    # Messages that broke the protocol's view rules and were ignored (with why).
    violations: list[str] = field(default_factory=list)

    def players(self) -> list[Entity]:
        return [e for e in self.entities.values() if e.is_player]

    def npcs(self, kind: int | None = None) -> list[Entity]:
        return [
            e for e in self.entities.values() if not e.is_player and (kind is None or e.kind == kind)
        ]

    def find(self, name: str) -> Entity | None:
        """The entity in view with this name (the lowest id if several)."""
        matches = [e for e in self.entities.values() if e.name == name]
        return min(matches, key=lambda e: e.id) if matches else None

    def apply(self, message: pb.ServerMessage) -> list[Event]:
        kind = message.WhichOneof("kind")
        if kind == "login_ok":
            ok = message.login_ok
            self.own_id = ok.player_id
            self.own_position = _position(ok.position)
            self.entities.clear()
            return []
        if kind == "view_reset":
            reset = message.view_reset
            if self.own_id is not None and reset.player_id != self.own_id:
                return self._violation(f"ViewReset for player {reset.player_id}, not us")
            self.own_id = reset.player_id
            self.own_position = _position(reset.position)
            self.entities.clear()
            return [Reset(self.own_position)]
        if kind == "entered":
            entered = message.entered
            if entered.player_id == self.own_id:
                return self._violation(f"Entered for ourselves ({entered.player_id})")
            if entered.player_id in self.entities:
                return self._violation(f"Entered for {entered.player_id}, already in view")
            entity = Entity(
                entered.player_id,
                _position(entered.position),
                entered.name,
                entered.kind,
                bytes(entered.state),
            )
            self.entities[entity.id] = entity
            return [Entered(entity)]
        if kind == "moved":
            moved = message.moved
            position = _position(moved.position)
            if moved.player_id == self.own_id:
                self.own_position = position
                return [Moved(moved.player_id, position, True, moved.client_time)]
            seen = self.entities.get(moved.player_id)
            if seen is None:
                return self._violation(f"Moved for {moved.player_id}, not in view")
            seen.position = position
            return [Moved(moved.player_id, position, False)]
        if kind == "left":
            gone = self.entities.pop(message.left.player_id, None)
            if gone is None:
                return self._violation(f"Left for {message.left.player_id}, not in view")
            return [Left(gone)]
        if kind == "state_changed":
            changed = message.state_changed
            state = bytes(changed.state)
            if changed.entity_id == self.own_id:
                self.own_state = state
                return [StateChanged(changed.entity_id, state, True)]
            seen = self.entities.get(changed.entity_id)
            if seen is None:
                return self._violation(f"StateChanged for {changed.entity_id}, not in view")
            seen.state = state
            return [StateChanged(changed.entity_id, state, False)]
        if kind == "event":
            event = message.event
            return [GameEventReceived(event.source, event.kind, bytes(event.payload))]
        if kind == "chat":
            chat = message.chat
            speaker = self.entities.get(chat.player_id)
            name = speaker.name if speaker else (self.own_name if chat.player_id == self.own_id else "")
            return [ChatReceived(chat.player_id, chat.text, name)]
        # Pong, Error and ActionDone are answers, not part of the view.
        return []

    def _violation(self, why: str) -> list[Event]:
        self.violations.append(why)
        return []
