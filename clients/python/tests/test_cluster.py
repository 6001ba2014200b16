"""The client against a real cluster (`meridian up --shards 2 --game wolves`, see conftest).

Every test plays around its own spot on the map, 60 cells from any other test's, so that
players and wolves of one test never enter another's view (view range 20).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from meridian_client import (
    ChatReceived,
    Connection,
    Direction,
    ErrorReceived,
    MeridianError,
    Moved,
    Reset,
    Resuming,
    pb,
)

from conftest import Cluster

WAIT = 10.0
WOLF = 1
ATTACK = 1
SUMMON = 2


async def connect(cluster: Cluster) -> Connection:
    return await Connection.connect(cluster.host, cluster.port)


async def test_login_and_see_another_player(cluster: Cluster) -> None:
    async with await connect(cluster) as alice, await connect(cluster) as bob:
        alice_info = await alice.login("alice", spawn=(40, 40))
        bob_info = await bob.login("bob", spawn=(43, 41))
        assert alice_info.player_id != bob_info.player_id
        assert alice_info.position == (40, 40) and bob_info.resume_token
        assert alice_info.view_range > 3 and alice_info.map_width > 43
        await alice.wait_until(lambda v: v.find("bob") is not None, WAIT, "alice to see bob")
        await bob.wait_until(lambda v: v.find("alice") is not None, WAIT, "bob to see alice")
        seen = alice.view.entities[bob_info.player_id]
        assert (seen.name, seen.position, seen.kind, seen.is_player) == ("bob", (43, 41), 0, True)
        assert alice.view.own_id == alice_info.player_id and alice.view.violations == []


async def test_moves_are_acknowledged_in_order(cluster: Cluster) -> None:
    async with await connect(cluster) as mover, await connect(cluster) as watcher:
        me = await mover.login("mover", spawn=(100, 40))
        await watcher.login("watcher", spawn=(102, 44))
        await watcher.wait_until(lambda v: me.player_id in v.entities, WAIT, "the watcher to see the mover")
        acks: list[Moved] = []
        mover.on("moved", lambda e: acks.append(e) if e.own else None)
        positions = await asyncio.wait_for(
            asyncio.gather(*(mover.move(Direction.RIGHT) for _ in range(5)), mover.move("down")), WAIT
        )
        assert positions == [(101, 40), (102, 40), (103, 40), (104, 40), (105, 40), (105, 41)]
        times = [a.client_time for a in acks]
        assert times == sorted(times) and len(set(times)) == 6 and 0 not in times, times
        assert mover.view.own_position == (105, 41)
        await watcher.wait_until(
            lambda v: v.entities[me.player_id].position == (105, 41), WAIT, "the watcher to see the last move"
        )


async def test_refused_moves_raise_their_own_errors(cluster: Cluster) -> None:
    async with await connect(cluster) as mover:
        await mover.login("hasty", spawn=(220, 1))
        # Past the move limit (20/s): every move is answered, the excess by RATE_LIMITED.
        answers = await asyncio.wait_for(
            asyncio.gather(*(mover.move(Direction.RIGHT) for _ in range(40)), return_exceptions=True), WAIT
        )
        moved = [a for a in answers if not isinstance(a, BaseException)]
        refused = [a for a in answers if isinstance(a, BaseException)]
        assert moved and refused, answers
        assert all(isinstance(r, MeridianError) and r.code == pb.RATE_LIMITED for r in refused), refused
        assert moved == [(221 + i, 1) for i in range(len(moved))], moved
        assert mover.view.own_position == moved[-1]

async def test_chat_reaches_the_other(cluster: Cluster) -> None:
    async with await connect(cluster) as alice, await connect(cluster) as bob:
        alice_info = await alice.login("chatty", spawn=(160, 40))
        await bob.login("listener", spawn=(161, 40))
        await bob.wait_until(lambda v: alice_info.player_id in v.entities, WAIT, "bob to see alice")
        heard: asyncio.Queue[ChatReceived] = asyncio.Queue()
        bob.on("chat", heard.put_nowait)
        await alice.chat("hello from python")
        said = await asyncio.wait_for(heard.get(), WAIT)
        assert (said.player_id, said.text, said.name) == (alice_info.player_id, "hello from python", "chatty")


async def test_wolves_summon_and_attack(cluster: Cluster) -> None:
    async with await connect(cluster) as hunter:
        await hunter.login("hunter", spawn=(40, 120))
        wolf_id = int(await hunter.action(SUMMON, payload=b"1,0"))
        await hunter.wait_until(lambda v: wolf_id in v.entities, WAIT, f"the summoned wolf {wolf_id} in view")
        wolf = hunter.view.entities[wolf_id]
        assert wolf.kind == WOLF and not wolf.is_player
        assert json.loads(wolf.state)["hp"] == 10
        # The wolf may step before the attack: attack it where it is, once adjacent.
        await hunter.wait_until(
            lambda v: wolf_id in v.entities and _adjacent(v.own_position, v.entities[wolf_id].position),
            WAIT, "the wolf next to the hunter",
        )
        answer = await hunter.action(ATTACK, target=wolf_id)
        assert json.loads(answer) == {"hp": 6}
        # The game's refusal is the action's own error.
        with pytest.raises(MeridianError) as refused:
            await hunter.action(ATTACK, target=999_999_999)
        assert refused.value.code == pb.REJECTED
        with pytest.raises(MeridianError) as refused:
            await hunter.action(77)
        assert refused.value.code == pb.REJECTED, refused.value


def _adjacent(a: tuple[int, int] | None, b: tuple[int, int]) -> bool:
    return a is not None and max(abs(a[0] - b[0]), abs(a[1] - b[1])) <= 1


async def test_a_dropped_connection_resumes_by_itself(cluster: Cluster) -> None:
    async with await connect(cluster) as alice, await connect(cluster) as bob:
        alice_info = await alice.login("dropped", spawn=(100, 120))
        bob_info = await bob.login("steady", spawn=(103, 120))
        await alice.wait_until(lambda v: bob_info.player_id in v.entities, WAIT, "alice to see bob")
        events = []
        alice.on("resuming", events.append)
        alice.on("reset", events.append)
        assert alice._transport is not None
        alice._transport.sever()
        await alice.wait_until(lambda v: alice.resumes == 1, WAIT, "the resume's ViewReset")
        assert [type(e) for e in events] == [Resuming, Reset], events
        assert events[1].position == (100, 120)
        assert alice.state == "playing" and alice.view.own_id == alice_info.player_id
        # Entered for everything in sight follows the ViewReset.
        await alice.wait_until(lambda v: bob_info.player_id in v.entities, WAIT, "bob in view again")
        assert await alice.move(Direction.LEFT) == (99, 120)
        await bob.wait_until(
            lambda v: alice_info.player_id in v.entities and v.entities[alice_info.player_id].position == (99, 120),
            WAIT, "bob to see alice back and moving",
        )
        # A token is good once: the second drop resumes with the one the first ViewReset
        # brought.
        first_token = alice_info.resume_token
        assert alice.info is not None and alice.info.resume_token != first_token
        alice._transport.sever()
        await alice.wait_until(lambda v: alice.resumes == 2, WAIT, "the second resume's ViewReset")
        assert await alice.move(Direction.LEFT) == (98, 120)
        assert alice.view.violations == [] and bob.view.violations == []


async def test_a_websocket_player_and_a_tcp_player_share_the_world(cluster: Cluster) -> None:
    pytest.importorskip("websockets", reason="the websocket extra")
    ws = cluster.ready["gateways"][0].get("ws")
    assert ws, f"meridian up runs a WebSocket front: {cluster.ready}"
    async with await connect(cluster) as tina, await Connection.connect_websocket(f"ws://{ws}/") as wendy:
        await tina.login("tina", spawn=(340, 40))
        wendy_info = await wendy.login("wendy", spawn=(342, 41))
        await tina.wait_until(lambda v: v.find("wendy") is not None, WAIT, "tina to see wendy")
        await wendy.wait_until(lambda v: v.find("tina") is not None, WAIT, "wendy to see tina")
        assert await wendy.move(Direction.RIGHT) == (343, 41)
        await tina.wait_until(
            lambda v: v.entities[wendy_info.player_id].position == (343, 41), WAIT, "tina to see wendy move"
        )


def _gateway(cluster: Cluster, index: int) -> tuple[str, int]:
    """The TCP game address of the cluster's gateway `index` (0: the one `connect` uses)."""
    host, port = cluster.ready["gateways"][index]["game"].rsplit(":", 1)
    return host, int(port)


# These two stop gateways of the shared cluster: they come last (the other tests use only
# the first gateway, which they leave alone).


async def test_a_gateway_shutting_down_sends_its_player_to_another(cluster: Cluster) -> None:
    first, last = _gateway(cluster, 0), _gateway(cluster, 2)
    async with await Connection.connect(*last, gateways=[first]) as traveller, await connect(cluster) as watcher:
        me = await traveller.login("traveller", spawn=(40, 300))
        await watcher.login("watcher", spawn=(42, 300))
        await traveller.wait_until(lambda v: v.find("watcher") is not None, WAIT, "the traveller to see the watcher")
        assert traveller.address == last
        heard: list[ErrorReceived] = []
        traveller.on("error", heard.append)
        # SIGTERM: the gateway tells its clients SHUTTING_DOWN and closes.
        os.kill(cluster.ready["gateways"][2]["pid"], signal.SIGTERM)
        await traveller.wait_until(lambda v: traveller.resumes == 1, WAIT, "the resume on the first gateway")
        assert [e.code for e in heard] == [pb.SHUTTING_DOWN], heard
        assert traveller.address == first and traveller.view.own_id == me.player_id
        assert await traveller.move(Direction.RIGHT) == (41, 300)
        await watcher.wait_until(
            lambda v: me.player_id in v.entities and v.entities[me.player_id].position == (41, 300),
            WAIT, "the watcher to see the traveller back and moving",
        )


async def test_a_killed_gateway_and_the_websocket_client_resumes_on_another(cluster: Cluster) -> None:
    pytest.importorskip("websockets", reason="the websocket extra")
    first, second = (cluster.ready["gateways"][i]["ws"] for i in (0, 1))
    async with await Connection.connect_websocket(f"ws://{second}/", gateways=[f"ws://{first}/"]) as survivor:
        await survivor.login("survivor", spawn=(100, 300))
        # SIGKILL: no SHUTTING_DOWN, the connection just breaks.
        os.kill(cluster.ready["gateways"][1]["pid"], signal.SIGKILL)
        await survivor.wait_until(lambda v: survivor.resumes == 1, WAIT, "the resume on the first gateway")
        assert survivor.address == f"ws://{first}/"
        assert await survivor.move(Direction.RIGHT) == (101, 300)
