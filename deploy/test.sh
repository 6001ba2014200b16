#!/usr/bin/env bash
# Quick start, part 2: the whole test suite (unit, property, scenario and end-to-end tests
# against real etcd and real `meridian` processes, the client SDKs, and the offline Helm
# chart check).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh test
target="${CARGO_TARGET_DIR:-$PWD/target}"
# The Python client in a virtual environment of its own: its tests below, and the /play
# test's Python bot (MERIDIAN_PYTHON), use it.
venv="$target/clients-venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "./clients/python[test,websocket]"
export MERIDIAN_PYTHON="$venv/bin/python"
cargo test --workspace --all-targets "$@"
# The benchmark scripts' parsing and verdicts (stdlib only, no load is run).
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest loadtest/bench/test_suite.py loadtest/bench/test_saves.py loadtest/bench/test_game.py
# The rooms check's own tests (.ci/rooms: import circles and file sizes, on synthetic crates).
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s .ci -p 'test_*.py'
# The TypeScript SDK (vitest against an in-process fake gateway; tsc), and the /play page's
# committed bundle, which must be exactly what its sources make.
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run -s lint && npm test && npm run -s check:play) ||
    { echo "test.sh: the TypeScript SDK failed, or services/gateway/src/play.js is stale (npm run bundle:play in clients/typescript)" >&2; exit 1; }
# The Python client (pytest; against a real `meridian up` of the binary built above).
MERIDIAN_BIN="$target/debug/meridian" PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python
# The Helm chart, offline: lint, render for several Kubernetes versions, strict schemas.
.ci/chart-check
# Coverage-guided fuzzing of the codec, resume tokens and the gateway's core, a bounded time
# per target from the committed corpora (skipped, with a message, without a nightly toolchain).
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz/run.sh
