#!/usr/bin/env bash
# Quick start, part 2: the whole test suite (unit, property, scenario and end-to-end tests
# against real etcd and real `meridian` processes, and the offline Helm chart check).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh test
cargo test --workspace --all-targets "$@"
# The benchmark scripts' parsing and verdicts (stdlib only, no load is run).
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest loadtest/bench/test_suite.py loadtest/bench/test_saves.py
# The Helm chart, offline: lint, render for several Kubernetes versions, strict schemas.
.ci/chart-check
# Coverage-guided fuzzing of the codec, resume tokens and the gateway's core, a bounded time
# per target from the committed corpora (skipped, with a message, without a nightly toolchain).
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" fuzz/run.sh
