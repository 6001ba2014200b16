"""Builders of server messages for the tests that run without a cluster."""

from meridian_client import pb


def login_ok(player_id: int, x: int, y: int, token: bytes = b"token") -> pb.ServerMessage:
    return pb.ServerMessage(
        login_ok=pb.LoginOk(player_id=player_id, position=pb.Position(x=x, y=y), resume_token=token,
                            map_width=400, map_height=400, view_range=20)
    )


def entered(entity_id: int, x: int, y: int, name: str, kind: int = 0, state: bytes = b"") -> pb.ServerMessage:
    return pb.ServerMessage(
        entered=pb.Entered(player_id=entity_id, position=pb.Position(x=x, y=y), name=name, kind=kind, state=state)
    )


def moved(entity_id: int, x: int, y: int, client_time: int = 0) -> pb.ServerMessage:
    return pb.ServerMessage(moved=pb.Moved(player_id=entity_id, position=pb.Position(x=x, y=y), client_time=client_time))


def left(entity_id: int) -> pb.ServerMessage:
    return pb.ServerMessage(left=pb.Left(player_id=entity_id))


def view_reset(player_id: int, x: int, y: int, token: bytes = b"") -> pb.ServerMessage:
    reset = pb.ViewReset(player_id=player_id, position=pb.Position(x=x, y=y), resume_token=token)
    return pb.ServerMessage(view_reset=reset)


def error(code: int, detail: str, client_time: int = 0) -> pb.ServerMessage:
    return pb.ServerMessage(error=pb.Error(code=code, detail=detail, client_time=client_time))  # type: ignore[arg-type]


def action_done(client_time: int, payload: bytes) -> pb.ServerMessage:
    return pb.ServerMessage(action_done=pb.ActionDone(client_time=client_time, payload=payload))


def state_changed(entity_id: int, state: bytes) -> pb.ServerMessage:
    return pb.ServerMessage(state_changed=pb.StateChanged(entity_id=entity_id, state=state))
