#!/usr/bin/env bash
# Quick start, part 1: build and run a whole local cluster (etcd, shards, gateways).
# Installs only what building and running needs (`install-deps.sh run`: no Chromium).
# Extra arguments go to `meridian up`, e.g. `deploy/up.sh --shards 1 --gateways 2 --io epoll`.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh run
cargo build --release -p meridian -p loadtest
exec target/release/meridian up "$@"
