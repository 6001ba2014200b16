"""The connection: login, keep-alive, resume after a drop, answers and the view.

One `Connection` is one player session, which may outlive several network connections:
when the link drops while playing, or the gateway says it is shutting down
(`SHUTTING_DOWN`) and closes, it reconnects within the resume window with `Resume{token}`,
and the server answers with `ViewReset` (the view starts over, `Entered` for everything in
sight follows). Moves and actions sent meanwhile wait for the resume; those left unanswered
by the drop fail with `NotApplied`.

A connection may know several gateways of the same cluster (`gateways=`): each attempt to
resume goes to the next one in the list, round-robin, starting after the one that failed, so
a player whose gateway stops or dies goes on through another. After `SHUTTING_DOWN` the first
attempt goes out at once; attempts after a failed one wait a backoff (50 ms, doubling up to
2 s). With a single address, every attempt goes back to it.

Everything runs on the caller's event loop: one task reads, one sends `Ping` when the
connection has been quiet for `keepalive` seconds (the server closes after 120 s idle).
"""

from __future__ import annotations

import asyncio
import logging
import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, AsyncIterator, Callable, Literal, Sequence

from google.protobuf.message import DecodeError

from . import client_pb2 as pb
from .answers import Answers, Kind
from .errors import ConnectionClosed, MeridianError
from .framing import MAX_FRAME_BODY, FrameError
from .transport import Address, Connector, Transport, tcp_connector, websocket_connector
from .view import (
    ChatReceived,
    Entered,
    Event,
    GameEventReceived,
    Left,
    Moved,
    Position,
    Reset,
    StateChanged,
    View,
)

log = logging.getLogger("meridian_client")


class Direction(IntEnum):
    """The wire values of `meridian.client.v1.Direction`."""

    UP = 1
    DOWN = 2
    LEFT = 3
    RIGHT = 4


@dataclass(frozen=True)
class LoginInfo:
    player_id: int
    position: Position
    resume_token: bytes
    map_width: int
    map_height: int
    view_range: int


@dataclass(frozen=True)
class ErrorReceived:
    """An `Error` that answers no move or action (a chat refused, a notice before a close)."""

    code: int
    detail: str


@dataclass(frozen=True)
class Resuming:
    """The link dropped, or the gateway is shutting down; the client is reconnecting with its
    resume token (to the next gateway, if it knows several)."""

    reason: str


@dataclass(frozen=True)
class Closed:
    """The session is over for good."""

    reason: str


AnyEvent = Event | ErrorReceived | Resuming | Closed

# The names `on()` takes, by event type.
EVENT_NAMES: dict[type, str] = {
    Entered: "entered",
    Moved: "moved",
    Left: "left",
    StateChanged: "state",
    GameEventReceived: "event",
    ChatReceived: "chat",
    Reset: "reset",
    ErrorReceived: "error",
    Resuming: "resuming",
    Closed: "closed",
}

State = Literal["connected", "playing", "resuming", "closed"]

# Errors after which the server closes and a resume must not be tried.
_FINAL_CODES = {pb.REPLACED}

# The backoff between resume attempts: the first wait, and the longest.
_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 2.0


class Connection:
    def __init__(
        self,
        connector: Connector | Sequence[Connector],
        *,
        keepalive: float = 30.0,
        resume_window: float = 30.0,
        auto_resume: bool = True,
    ) -> None:
        self.view = View()
        self.info: LoginInfo | None = None
        self.state: State = "connected"
        # How many times the session resumed after a drop.
        self.resumes = 0
        self.keepalive = keepalive
        self.resume_window = resume_window
        self.auto_resume = auto_resume
        self._connectors: list[Connector] = (
            [connector] if callable(connector) else list(connector)
        )
        if not self._connectors:
            raise ValueError("a connection needs at least one connector")
        # Which of `_connectors` the transport is on (while resuming: the one last tried).
        self._gateway = 0
        # The gateway said SHUTTING_DOWN: the next resume attempt moves on without a wait.
        self._gateway_shutting_down = False
        self._backoff = 0.0
        self._transport: Transport | None = None
        self._generation = 0
        self._answers = Answers()
        self._login: asyncio.Future[LoginInfo] | None = None
        self._logging_out = False
        self._final_error: MeridianError | None = None
        self._close_reason = ""
        # Set while a transport is up and usable for the current state.
        self._online = asyncio.Event()
        self._changed: asyncio.Future[None] | None = None
        self._callbacks: dict[str, list[Callable[[Any], Any]]] = {}
        self._queues: list[asyncio.Queue[AnyEvent]] = []
        self._last_sent = 0.0
        self._resume_deadline = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    # ---- opening and closing ----

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        gateways: Sequence[tuple[str, int]] = (),
        max_frame: int = MAX_FRAME_BODY,
        **options: Any,
    ) -> Connection:
        """Opens a TCP connection to a gateway's game port.

        `gateways` are the `(host, port)` game addresses of more gateways of the same
        cluster, tried after `host:port`: when it cannot be reached at first, and in turn
        for each attempt to resume.
        """
        addresses = [(host, port), *gateways]
        return await cls.open([tcp_connector(h, p, max_frame) for h, p in addresses], **options)

    @classmethod
    async def connect_websocket(
        cls,
        url: str,
        *,
        gateways: Sequence[str] = (),
        max_frame: int = MAX_FRAME_BODY,
        **options: Any,
    ) -> Connection:
        """Opens a WebSocket connection (`ws://` or `wss://`); needs the `websocket` extra.

        `gateways` are the URLs of more gateways of the same cluster, used as in `connect`.
        """
        urls = [url, *gateways]
        return await cls.open([websocket_connector(u, max_frame) for u in urls], **options)

    @classmethod
    async def open(cls, connector: Connector | Sequence[Connector], **options: Any) -> Connection:
        """Opens a connection through a connector, or the first of several that connects.

        Several connectors are gateways of the same cluster, in the order to try them; if
        none connects, the last one's error is raised.
        """
        connection = cls(connector, **options)
        transport = await connection._open_first()
        connection._attach(transport)
        loop = asyncio.get_running_loop()
        connection._tasks = [
            loop.create_task(connection._run(transport)),
            loop.create_task(connection._keep_alive()),
        ]
        return connection

    @property
    def address(self) -> Address | None:
        """The gateway this connection is on: `(host, port)` for TCP, the URL for a WebSocket.

        While resuming, it is the gateway being tried. It is None for a connector of your own
        that has no `address` attribute.
        """
        address: Address | None = getattr(self._connectors[self._gateway], "address", None)
        return address

    async def close(self) -> None:
        """Closes at once, without logging out: the player stays for the resume window."""
        self._finish("closed by the client")
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the session ----

    async def login(
        self,
        name: str,
        spawn: tuple[int, int] | None = None,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> LoginInfo:
        """Logs in; raises `MeridianError` if the server refuses (the connection stays open)."""
        if self.state != "connected" or self._login is not None:
            raise RuntimeError(f"login on a connection that is {self.state}")
        login = pb.Login(name=name, token=token or "")
        if spawn is not None:
            login.spawn.x, login.spawn.y = spawn
        self._login = asyncio.get_running_loop().create_future()
        self.view.own_name = name
        try:
            await self._send(pb.ClientMessage(login=login))
            return await asyncio.wait_for(asyncio.shield(self._login), timeout)
        finally:
            self._login = None

    async def move(self, direction: Direction | str, timeout: float | None = None) -> Position:
        """Moves one cell; returns the acknowledged position."""
        if isinstance(direction, str):
            direction = Direction[direction.upper()]
        client_time, answer = await self._command("move")
        message = pb.ClientMessage(move=pb.Move(direction=int(direction), client_time=client_time))  # type: ignore[arg-type]
        result: Position = await self._await_answer(message, client_time, answer, timeout)
        return result

    async def action(
        self, kind: int, target: int = 0, payload: bytes = b"", timeout: float | None = None
    ) -> bytes:
        """A game action; returns `ActionDone.payload` (`MeridianError` REJECTED if refused)."""
        client_time, answer = await self._command("action")
        message = pb.ClientMessage(
            action=pb.Action(kind=kind, target=target, payload=payload, client_time=client_time)
        )
        result: bytes = await self._await_answer(message, client_time, answer, timeout)
        return result

    async def chat(self, text: str) -> None:
        """Says something to everyone in sight (a refusal comes as an `error` event)."""
        await self._wait_playing()
        await self._send(pb.ClientMessage(chat=pb.Chat(text=text)))

    async def ping(self) -> None:
        await self._send(pb.ClientMessage(ping=pb.Ping(client_time=self._answers.next_client_time())))

    async def logout(self, timeout: float = 5.0) -> None:
        """Logs out (the player leaves the world now) and waits for the server's close."""
        await self._wait_playing()
        self._logging_out = True
        await self._send(pb.ClientMessage(logout=pb.Logout()))
        reader = self._tasks[0]
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout)
        except asyncio.TimeoutError:
            pass
        await self.close()

    # ---- events ----

    def on(self, name: str, callback: Callable[[Any], Any]) -> None:
        """Calls `callback(event)` for each event named `name` (see `EVENT_NAMES`).

        A callback that returns a coroutine has it run as a task.
        """
        if name not in EVENT_NAMES.values():
            raise ValueError(f"no event {name!r}; known: {sorted(EVENT_NAMES.values())}")
        self._callbacks.setdefault(name, []).append(callback)

    async def events(self) -> AsyncIterator[AnyEvent]:
        """Every event from now on, in order, until the session closes."""
        queue: asyncio.Queue[AnyEvent] = asyncio.Queue()
        self._queues.append(queue)
        try:
            while True:
                event = await queue.get()
                yield event
                if isinstance(event, Closed):
                    return
        finally:
            self._queues.remove(queue)

    async def wait_until(
        self, predicate: Callable[[View], bool], timeout: float = 10.0, what: str = "a condition"
    ) -> None:
        """Waits until `predicate(view)` holds, checked after every message."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self.view):
            if self.state == "closed":
                raise ConnectionClosed(f"closed ({self._close_reason}) while waiting for {what}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"waited {timeout} s for {what}")
            if self._changed is None or self._changed.done():
                self._changed = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._changed), remaining)
            except asyncio.TimeoutError:
                pass

    # ---- internals ----

    async def _open_first(self) -> Transport:
        """Connects to each gateway in turn until one answers; raises the last one's error."""
        for index, connector in enumerate(self._connectors):
            self._gateway = index
            try:
                return await connector()
            except Exception as error:
                if index == len(self._connectors) - 1:
                    raise
                log.debug("could not connect to %s: %s", self._where(), error)
        raise AssertionError("unreachable: there is at least one connector")

    def _where(self) -> str:
        """The current gateway's address as text, for reasons and logs."""
        address = self.address
        if address is None:
            return f"#{self._gateway + 1}"
        if isinstance(address, tuple):
            host, port = address
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return address

    def _attach(self, transport: Transport) -> None:
        self._transport = transport
        self._generation += 1
        self._last_sent = asyncio.get_running_loop().time()
        if self.state == "connected":
            self._online.set()

    async def _command(self, kind: Kind) -> tuple[int, asyncio.Future[Any]]:
        await self._wait_playing()
        client_time = self._answers.next_client_time()
        # Registered before the send: the answer may arrive while the send awaits.
        return client_time, self._answers.expect(kind, client_time, self._generation)

    async def _await_answer(
        self,
        message: pb.ClientMessage,
        client_time: int,
        answer: asyncio.Future[Any],
        timeout: float | None,
    ) -> Any:
        try:
            await self._send(message)
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        finally:
            self._answers.forget(client_time)

    async def _wait_playing(self) -> None:
        while True:
            if self.state == "closed":
                raise ConnectionClosed(self._close_reason)
            if self.state == "playing" and self._online.is_set():
                return
            if self.state == "connected":
                raise RuntimeError("not logged in")
            await self._online.wait()

    async def _send(self, message: pb.ClientMessage) -> None:
        if self.state == "closed" or self._transport is None:
            raise ConnectionClosed(self._close_reason)
        body = message.SerializeToString()
        self._last_sent = asyncio.get_running_loop().time()
        try:
            await self._transport.send(body)
        except (OSError, ConnectionError) as error:
            # The reader sees the drop too and resumes; an answer owed is then NotApplied.
            log.debug("send failed: %s", error)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        while self.state != "closed":
            wait = self._last_sent + self.keepalive - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if self._online.is_set():
                await self.ping()
            else:
                await asyncio.sleep(min(self.keepalive, 1.0))

    async def _run(self, transport: Transport) -> None:
        reason = "closed"
        try:
            while True:
                reason = await self._read(transport)
                if self._gateway_shutting_down:
                    reason = f"the gateway {self._where()} is shutting down ({reason})"
                self._online.clear()
                transport.close()
                if not self._should_resume():
                    break
                resumed = await self._resume(reason)
                if resumed is None:
                    reason = f"{reason}; no resume within {self.resume_window} s"
                    break
                transport = resumed
        finally:
            self._finish(reason)

    async def _read(self, transport: Transport) -> str:
        """Reads and handles messages until the link drops; returns why it ended."""
        try:
            while True:
                body = await transport.recv()
                if body is None:
                    return "the server closed the connection"
                message = pb.ServerMessage()
                message.ParseFromString(body)
                self._handle(message)
                if self._final_error is not None:
                    return f"final error {self._final_error}"
        except (OSError, ConnectionError) as error:
            return f"connection lost: {error}"
        except (FrameError, DecodeError, ValueError) as error:
            return f"undecodable data from the server: {error}"

    def _should_resume(self) -> bool:
        return (
            self.auto_resume
            and self.state in ("playing", "resuming")
            and not self._logging_out
            and self._final_error is None
            and self.info is not None
        )

    async def _resume(self, reason: str) -> Transport | None:
        assert self.info is not None, "invariant: only a logged-in session resumes"
        loop = asyncio.get_running_loop()
        if self.state != "resuming":
            self.state = "resuming"
            self._resume_deadline = loop.time() + self.resume_window
            self._backoff = 0.0
            self._emit(Resuming(reason))
        # A connection that opened but closed before its ViewReset (a gateway that could
        # not resume, or that is going away too) counts as a failed attempt as well.
        while loop.time() < self._resume_deadline:
            if self._gateway_shutting_down:
                # The gateway is going away on purpose: on to the next one at once.
                self._gateway_shutting_down = False
            elif self._backoff > 0:
                await asyncio.sleep(min(self._backoff, self._resume_deadline - loop.time()))
                if loop.time() >= self._resume_deadline:
                    break
            self._backoff = min(max(self._backoff * 2, _FIRST_BACKOFF), _MAX_BACKOFF)
            # Round-robin, starting after the gateway that failed (the same one if alone).
            self._gateway = (self._gateway + 1) % len(self._connectors)
            transport: Transport | None = None
            try:
                connector = self._connectors[self._gateway]
                transport = await asyncio.wait_for(
                    connector(), max(0.1, self._resume_deadline - loop.time())
                )
                self._attach(transport)
                resume = pb.ClientMessage(resume=pb.Resume(token=self.info.resume_token))
                await transport.send(resume.SerializeToString())
                return transport
            except Exception as error:
                # Any failure to connect (a connector may raise its library's own errors,
                # such as a refused WebSocket handshake) is one failed attempt.
                log.debug("resume attempt on %s failed: %s", self._where(), error)
                if transport is not None:
                    transport.close()
        return None

    def _handle(self, message: pb.ServerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "view_reset" and message.view_reset.resume_token and self.info is not None:
            # A resume (or a restore after a shard failure) spends the token held: the
            # fresh one comes with the ViewReset, and only it works next time.
            token = bytes(message.view_reset.resume_token)
            self.info = dataclasses.replace(self.info, resume_token=token)
        if kind == "login_ok" and self._login is not None:
            ok = message.login_ok
            self.info = LoginInfo(
                ok.player_id,
                Position(ok.position.x, ok.position.y),
                bytes(ok.resume_token),
                ok.map_width,
                ok.map_height,
                ok.view_range,
            )
            self.state = "playing"
            if not self._login.done():
                self._login.set_result(self.info)
        elif kind == "view_reset" and self.state == "resuming":
            self.state = "playing"
            self.resumes += 1
            self._answers.interrupt_before(self._generation)
            self._online.set()
        elif kind == "error" and message.error.client_time == 0:
            error = message.error
            if self._login is not None and not self._login.done():
                self._login.set_exception(MeridianError(error.code, error.detail))
            elif self.state == "resuming" and error.code == pb.INVALID_TOKEN:
                self._final_error = MeridianError(error.code, error.detail)
            if error.code in _FINAL_CODES:
                self._final_error = MeridianError(error.code, error.detail)
            elif error.code == pb.SHUTTING_DOWN and self.state in ("playing", "resuming"):
                # The close follows; the session resumes, on another gateway if there is one.
                self._gateway_shutting_down = True
            self._emit(ErrorReceived(error.code, error.detail))
        self._answers.resolve(message, self.view.own_id)
        for event in self.view.apply(message):
            self._emit(event)
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _emit(self, event: AnyEvent) -> None:
        for queue in self._queues:
            queue.put_nowait(event)
        for callback in self._callbacks.get(EVENT_NAMES[type(event)], []):
            try:
                result = callback(event)
                if asyncio.iscoroutine(result):
                    asyncio.get_running_loop().create_task(result)
            except Exception:
                log.exception("event callback for %s failed", type(event).__name__)

    def _finish(self, reason: str) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        self._close_reason = reason
        if self._transport is not None:
            self._transport.close()
        closed = ConnectionClosed(reason)
        self._answers.fail_all(closed)
        if self._login is not None and not self._login.done():
            self._login.set_exception(closed)
        # Wakes whoever waits to send, so that they see the close.
        self._online.set()
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._emit(Closed(reason))
