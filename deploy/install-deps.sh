#!/usr/bin/env bash
# Installs the system packages Meridian builds and tests with, if they are missing:
# etcd (the tests and `meridian up` start their own), protoc (etcd-client's build) and
# Chromium (the live map's test renders the gateway's /map in headless Chromium).
set -euo pipefail
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# A font too: --no-install-recommends would leave the map's labels without one.
[ -x /usr/bin/chromium ] || need+=(chromium fonts-dejavu-core)
if ((${#need[@]})); then
    echo "installing: ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: this machine kind ships a Rust toolchain; install one with rustup" >&2
    exit 1
fi
