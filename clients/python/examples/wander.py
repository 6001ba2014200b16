"""A bot that logs in, wanders, prints what it sees and attacks wolves next to it.

    python examples/wander.py --port 7777 --name wanderer --seed 7

Against `meridian up --game wolves` it attacks any adjacent wolf (Action ATTACK, kind 1,
target = the wolf's id; wolves are NPCs of kind 1) instead of stepping. It keeps going
through drops (the connection resumes by itself) until interrupted or `--steps` is spent.
"""

from __future__ import annotations

import argparse
import asyncio
import random

from meridian_client import (
    ChatReceived,
    Connection,
    Direction,
    Entered,
    ErrorReceived,
    GameEventReceived,
    Left,
    MeridianError,
    NotApplied,
    Reset,
    Resuming,
    StateChanged,
)

WOLF = 1
ATTACK = 1


def describe(event: object) -> str | None:
    if isinstance(event, Entered):
        e = event.entity
        what = "player" if e.is_player else f"npc kind {e.kind}"
        return f"sees {e.name!r} ({what}, id {e.id}) at {tuple(e.position)} {e.state.decode(errors='replace')}"
    if isinstance(event, Left):
        return f"lost sight of {event.entity.name!r} (id {event.entity.id})"
    if isinstance(event, StateChanged):
        return f"state of {'itself' if event.own else event.entity_id}: {event.state.decode(errors='replace')}"
    if isinstance(event, GameEventReceived):
        return f"game event {event.kind} from {event.source}: {event.payload!r}"
    if isinstance(event, ChatReceived):
        return f"{event.name or event.player_id} says {event.text!r}"
    if isinstance(event, Reset):
        return f"view reset at {tuple(event.position)}"
    if isinstance(event, Resuming):
        return f"connection lost ({event.reason}); resuming"
    if isinstance(event, ErrorReceived):
        return f"server error {event.code}: {event.detail}"
    return None  # Moves are too many to print.


async def wander(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    print(f"wander: seed {args.seed}")
    async with await Connection.connect(args.host, args.port) as connection:
        for name in ("entered", "left", "state", "event", "chat", "reset", "resuming", "error"):
            connection.on(name, lambda event: (line := describe(event)) and print(f"  {line}"))
        spawn = (args.x, args.y) if args.x is not None and args.y is not None else None
        info = await connection.login(args.name, spawn=spawn)
        print(f"logged in as {args.name} (id {info.player_id}) at {tuple(info.position)}, "
              f"map {info.map_width}x{info.map_height}, view range {info.view_range}")
        await connection.chat("hello, I am a Python bot")
        direction = rng.choice(list(Direction))
        for step in range(args.steps):
            view = connection.view
            me = view.own_position
            prey = [w for w in view.npcs(WOLF)
                    if me and max(abs(w.position.x - me.x), abs(w.position.y - me.y)) <= 1]
            try:
                if prey:
                    answer = await connection.action(ATTACK, target=prey[0].id)
                    print(f"  attacked wolf {prey[0].id}: {answer.decode(errors='replace')}")
                else:
                    if rng.random() < 0.2:
                        direction = rng.choice(list(Direction))
                    position = await connection.move(direction)
                    if step % 10 == 0:
                        print(f"step {step}: at {tuple(position)}, "
                              f"{len(view.players())} players and {len(view.npcs())} npcs in sight")
            except MeridianError as error:
                print(f"  refused: {error}")
            except NotApplied:
                print("  a command was lost with the connection; going on")
            await asyncio.sleep(args.every)
        await connection.logout()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7777)
    parser.add_argument("--name", default="wanderer")
    parser.add_argument("--x", type=int, help="spawn cell (honoured in dev mode)")
    parser.add_argument("--y", type=int)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between steps")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 32))
    try:
        asyncio.run(wander(parser.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
