"""A real Meridian cluster for the tests that need one: `meridian up`, started once per session.

It has two shards and three gateways: the tests play through the first gateway, and the last
tests of `test_cluster.py` stop the other two to see their players resume on the first.

The binary is `$MERIDIAN_BIN`, or `<repo>/target/debug/meridian`. The cluster runs the
example game with no wolves of its own (`MERIDIAN_WOLVES_PER_SHARD=0`): the tests summon the
wolves they need, and nothing else wanders into their views. Each test plays in its own part
of the map, far enough from the others' (view range 20) that their players never meet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
START_DEADLINE = 60.0
STOP_DEADLINE = 15.0

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Cluster:
    host: str
    port: int
    ready: dict[str, Any]
    log: Path


def meridian_bin() -> Path:
    return Path(os.environ.get("MERIDIAN_BIN", REPO / "target" / "debug" / "meridian"))


def _start(run_dir: Path, attempt: int) -> tuple[subprocess.Popen[bytes], Path, Path]:
    ready_file = run_dir / f"ready-{attempt}.json"
    log = run_dir / f"up-{attempt}.log"
    command = [
        str(meridian_bin()), "up", "--shards", "2", "--gateways", "3",
        "--port", "0", "--quic-port", "0", "--ws-port", "0",
        "--etcd-port", "0",
        "--game", "wolves", "--ready-file", str(ready_file),
        "--cluster", f"py-test-{os.getpid()}-{attempt}",
    ]
    env = dict(os.environ, MERIDIAN_WOLVES_PER_SHARD="0")
    with open(log, "wb") as out:
        # A session of its own: if `up` itself must be killed, its children go by its group id.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return process, ready_file, log


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait_ready(process: subprocess.Popen[bytes], ready_file: Path, log: Path) -> dict[str, Any] | None:
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return None
        try:
            ready: dict[str, Any] = json.loads(ready_file.read_text())
            return ready
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    _stop(process)
    pytest.fail(f"meridian up was not ready within {START_DEADLINE} s; log {log}:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("meridian")
    problems = []
    # The shared binary may be rebuilt (replaced) under us: a start that fails for that is tried again.
    for attempt in range(3):
        if not meridian_bin().exists():
            problems.append(f"attempt {attempt}: {meridian_bin()} does not exist")
            time.sleep(5)
            continue
        try:
            process, ready_file, log = _start(run_dir, attempt)
        except OSError as error:
            problems.append(f"attempt {attempt}: {error}")
            time.sleep(5)
            continue
        ready = _wait_ready(process, ready_file, log)
        if ready is None:
            problems.append(f"attempt {attempt}: meridian up exited {process.returncode}: {log.read_text()[-2000:]}")
            continue
        gateway = ready["gateways"][0]
        # The gateway's client (TCP) address: `game` in today's ready file.
        host, port = (gateway.get("addr") or gateway["game"]).rsplit(":", 1)
        try:
            yield Cluster(host, int(port), ready, log)
        finally:
            _stop(process)
        return
    pytest.fail("could not start a cluster (set MERIDIAN_BIN to a built meridian binary):\n" + "\n".join(problems))
