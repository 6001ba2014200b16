#!/usr/bin/env bash
# Quick start, part 2: the whole test suite (unit, property, scenario and end-to-end tests
# against real etcd and real `meridian` processes, the client SDKs, and the offline Helm
# chart check).
#
# The Rust tests run under cargo-nextest (each test its own process, tests of different
# binaries side by side; groups and timeouts in .config/nextest.toml), the doctests under
# `cargo test --doc`. The steps that need no Rust build (the Python client's venv, the
# benchmark scripts' unit tests, the TypeScript SDK, the Helm chart check) run in the
# background while cargo builds; each one's output is printed when it ends, and any that
# failed fails the script. Arguments go to `cargo nextest run` (a filter, say).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh test
target="${CARGO_TARGET_DIR:-$PWD/target}"
logs=$(mktemp -d "${TMPDIR:-/tmp}/meridian-test.XXXXXX")
started=$(date +%s)

# ---------------------------------------------------------------- background steps
# step NAME COMMAND...: runs COMMAND in the background, its output to $logs/NAME.log.
# finish NAME: waits for it, prints its output and how long it took, and fails the script
# if it failed. An exit before every step is waited for ends the ones still running.
declare -A pids=()
step() {
    local name=$1
    shift
    (
        began=$(date +%s)
        status=0
        "$@" >"$logs/$name.log" 2>&1 || status=$?
        echo "$(( $(date +%s) - began ))" >"$logs/$name.seconds"
        exit "$status"
    ) &
    pids[$name]=$!
}
finish() {
    local name=$1 status=0
    wait "${pids[$name]}" || status=$?
    unset "pids[$name]"
    echo "--- $name ($(cat "$logs/$name.seconds" 2>/dev/null || echo '?') s, in the background)"
    cat "$logs/$name.log"
    if ((status != 0)); then
        echo "test.sh: $name failed (exit $status), output above" >&2
        exit 1
    fi
}
stop_background() {
    local pid
    for pid in "${pids[@]}"; do kill -- "$pid" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap stop_background EXIT
# phase WHAT: a heading with the seconds since the start, so a log shows where the time went.
phase() { echo "--- $1 (at $(( $(date +%s) - started )) s)"; }

# The Python client in a virtual environment of its own: its tests below, and the /play
# test's Python bot (MERIDIAN_PYTHON), use it.
venv="$target/clients-venv"
python_venv() {
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "./clients/python[test,websocket]"
}
# The benchmark scripts' parsing and verdicts (stdlib only, no load is run).
bench_unittests() {
    PYTHONDONTWRITEBYTECODE=1 python3 -m unittest loadtest/bench/test_suite.py loadtest/bench/test_saves.py loadtest/bench/test_game.py loadtest/bench/test_battle.py
    # The rooms check itself (.ci/rooms: no import circles, no oversize file) and its own
    # tests on synthetic crates.
    .ci/rooms
    PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s .ci -p 'test_*.py'
}
# The TypeScript SDK (vitest against an in-process fake gateway; tsc), and the /play page's
# committed bundle, which must be exactly what its sources make.
typescript_sdk() {
    (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run -s lint && npm test && npm run -s check:play) ||
        { echo "test.sh: the TypeScript SDK failed, or services/gateway/src/play.js is stale (npm run bundle:play in clients/typescript)" >&2; return 1; }
}
# The C# SDK's library, tests and example bot (mono's compiler); its tests run below.
csharp_build() { nice -n 5 clients/csharp/build.sh; }
step python-venv python_venv
step csharp-build csharp_build
step bench-unittests bench_unittests
step typescript-sdk typescript_sdk
# The Helm chart, offline: lint, render for several Kubernetes versions, strict schemas.
step chart-check .ci/chart-check

# ---------------------------------------------------------------- the Rust tests
phase "building the tests"
cargo nextest run --workspace --all-targets --no-run
export MERIDIAN_PYTHON="$venv/bin/python"
finish python-venv
phase "running the tests (cargo nextest)"
cargo nextest run --workspace --all-targets "$@"
phase "doctests"
cargo test --workspace --doc
# The Python client (pytest; against a real `meridian up` of the binary built above).
phase "the Python client (pytest)"
MERIDIAN_BIN="$target/debug/meridian" PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python
# The C# client: unit tests, then against a real `meridian up` of the binary built above
# (each test bounded by the runner; it prints its counts).
finish csharp-build
phase "the C# client (mono)"
MERIDIAN_BIN="$target/debug/meridian" timeout 900 mono clients/csharp/bin/Meridian.Client.Tests.exe all

finish bench-unittests
finish typescript-sdk
finish chart-check
# The chart's shard-death alert, rendered with the chart check's Helm, fired by a real
# Prometheus scraping a real `meridian up` of the binary built above when a shard is killed.
phase "the chart's alert against a real cluster (prometheus)"
MERIDIAN_BIN="$target/debug/meridian" .ci/alert-check

# Coverage-guided fuzzing of the codec, resume tokens and the gateway's core, a bounded time
# per target from the committed corpora (skipped, with a message, without a nightly toolchain).
phase "fuzzing"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz/run.sh
echo "--- deploy/test.sh passed in $(( $(date +%s) - started )) s"
