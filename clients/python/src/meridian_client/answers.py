"""Matching the server's answers to the moves and actions that asked for them.

Every `Move` and `Action` carries a `client_time` (non-zero, unique per connection object
here, across resumes too) and gets exactly one answer on the connection it was sent on:
the mover's own `Moved` with that client_time, `ActionDone`, or an `Error` carrying it.
Answers come in the order the commands were sent, but matching is by client_time, so an
answer for an unknown client_time (say, one abandoned by its caller) is simply dropped.

A command's answer is lost with its connection. After a drop, the `ViewReset` that answers
the resume tells the client that whatever was still unanswered was not applied: those
commands fail with `NotApplied`. Commands sent on the current connection keep waiting at a
`ViewReset`: the server still owes them their one answer there (a restore after a shard
failure answers the moves it lost before the `ViewReset`, and moves sent during the
restore are answered after it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from . import client_pb2 as pb
from .errors import MeridianError, NotApplied
from .view import Position

Kind = Literal["move", "action"]


@dataclass
class Pending:
    kind: Kind
    client_time: int
    # Which connection (counting from 1, one more per resume) it was sent on.
    generation: int
    future: asyncio.Future[Any]


class Answers:
    def __init__(self) -> None:
        self._last_client_time = 0
        self._pending: dict[int, Pending] = {}

    def next_client_time(self) -> int:
        """A fresh client_time: non-zero (proto3 does not send 0) and never reused."""
        self._last_client_time += 1
        return self._last_client_time

    def expect(self, kind: Kind, client_time: int, generation: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # A caller that gave up never reads its error: that is no reason for asyncio to warn.
        future.add_done_callback(_retrieve)
        self._pending[client_time] = Pending(kind, client_time, generation, future)
        return future

    def forget(self, client_time: int) -> None:
        """The caller gave up (a timeout or a cancel); a late answer is dropped."""
        self._pending.pop(client_time, None)

    def __len__(self) -> int:
        return len(self._pending)

    def resolve(self, message: pb.ServerMessage, own_id: int | None) -> bool:
        """Resolves the command this message answers; False if it answers none."""
        kind = message.WhichOneof("kind")
        if kind == "moved":
            moved = message.moved
            if moved.player_id != own_id or moved.client_time == 0:
                return False
            pending = self._take(moved.client_time, "move")
            if pending is None:
                return False
            _settle(pending, result=Position(moved.position.x, moved.position.y))
            return True
        if kind == "action_done":
            pending = self._take(message.action_done.client_time, "action")
            if pending is None:
                return False
            _settle(pending, result=bytes(message.action_done.payload))
            return True
        if kind == "error" and message.error.client_time != 0:
            error = message.error
            pending = self._pending.pop(error.client_time, None)
            if pending is None:
                return False
            _settle(pending, error=MeridianError(error.code, error.detail))
            return True
        return False

    def interrupt_before(self, generation: int) -> int:
        """Fails every command sent on a connection older than `generation` with `NotApplied`."""
        stale = [p for p in self._pending.values() if p.generation < generation]
        for pending in stale:
            del self._pending[pending.client_time]
            what = f"{pending.kind} {pending.client_time}"
            _settle(pending, error=NotApplied(f"{what}: the connection dropped before its answer"))
        return len(stale)

    def fail_all(self, error: Exception) -> None:
        pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            _settle(p, error=error)

    def _take(self, client_time: int, kind: Kind) -> Pending | None:
        pending = self._pending.get(client_time)
        if pending is None or pending.kind != kind:
            return None
        return self._pending.pop(client_time)


def _settle(pending: Pending, result: Any = None, error: Exception | None = None) -> None:
    if pending.future.done():
        return
    if error is not None:
        pending.future.set_exception(error)
    else:
        pending.future.set_result(result)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
