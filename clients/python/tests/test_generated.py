"""The committed generated module matches proto/client.proto and keeps its field numbers."""

import subprocess
import sys
from pathlib import Path

import pytest

from meridian_client import Direction, pb

HERE = Path(__file__).resolve().parent.parent


def test_field_numbers_are_the_protocols() -> None:
    fields = {f.name: f.number for f in pb.ServerMessage.DESCRIPTOR.fields}
    assert fields == {
        "login_ok": 1, "entered": 2, "moved": 3, "left": 4, "chat": 5, "pong": 6,
        "error": 7, "view_reset": 8, "state_changed": 9, "event": 10, "action_done": 11,
    }
    fields = {f.name: f.number for f in pb.ClientMessage.DESCRIPTOR.fields}
    assert fields == {"login": 1, "move": 2, "chat": 3, "ping": 4, "logout": 5, "resume": 6, "action": 7}
    assert {f.name: f.number for f in pb.Action.DESCRIPTOR.fields} == {
        "kind": 1, "payload": 2, "target": 3, "client_time": 4,
    }
    assert [(d.name, int(d)) for d in Direction] == [(n, pb.Direction.Value(n)) for n in ("UP", "DOWN", "LEFT", "RIGHT")]
    assert pb.REJECTED == 11 and pb.REPLACED == 10


def test_committed_module_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="the dev extra (grpcio-tools) generates the module")
    proto = HERE.parent.parent / "proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", str(proto / "client.proto")],
        check=True,
    )
    for name in ("client_pb2.py", "client_pb2.pyi"):
        fresh = (tmp_path / name).read_text()
        committed = (HERE / "src" / "meridian_client" / name).read_text()
        assert fresh == committed, f"{name} is stale: run clients/python/generate.sh"
