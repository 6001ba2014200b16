#!/usr/bin/env bash
# Meridian's benchmark suite, one command:
#
#   loadtest/bench/run.sh [--quick] [--update-docs] [--out DIR] [--no-proxies] [--no-micro]
#                         [--no-game | --only-game | --only-tls | --only-relay | --only-io
#                          | --only-ws [--ws-baseline BIN]]
#
# Builds the release binaries, installs what the comparisons need if it is missing
# (etcd, nginx with its stream module, HAProxy, strace), then runs loadtest/bench/suite.py:
# io_uring vs epoll, the gateway's relay hop vs nginx stream and HAProxy, 1 vs 4 shards,
# the capacity and density targets, the divan micro-benchmarks, and the game section
# (loadtest/bench/game.py: 4 shards running the wolves example with 0 and 1,000 NPCs, and
# actions aimed across a border; --only-game runs it alone, about 2.5 minutes with --quick),
# and the relay hop with two load clients (issue 17): bots -> gateway against bots -> nginx
# stream -> gateway, driven by `loadtest` and by `bare-client` (one thread, one epoll set,
# one read per readiness), 1,000 and 2,000 bots (300 and 600 with --quick), with perf
# counting system calls, wake-ups and context switches on the gateway (whole process and
# I/O threads), nginx and the client; --only-relay runs it alone (about 5 minutes, 2 with
# --quick; it is skipped with --no-proxies). --only-io runs io_uring against epoll alone
# (spread and dense workloads, system calls of the whole gateway process and of its I/O
# threads; about 3 minutes). Output in
# target/bench/ (report.html, bench.json, tables.md); --update-docs also rewrites the
# generated part of BENCHMARKS.md and docs/bench/. About 2 minutes with --quick, under 15
# without (plus the release build). Everything runs on loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v nginx >/dev/null || need+=(nginx)
[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
command -v haproxy >/dev/null || need+=(haproxy)
command -v strace >/dev/null || need+=(strace)
command -v perf >/dev/null || need+=(linux-perf)
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [ "${#need[@]}" -gt 0 ]; then
    echo "[bench] installing ${need[*]}"
    apt-get update -qq
    # The suite starts its own nginx and HAProxy with generated configs on free loopback
    # ports; whatever the packages do with their default services does not matter to it.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# perf counts the gateway's syscalls through a tracepoint, which needs tracefs; without it
# the suite reports strace's counts only.
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || true

echo "[bench] building release binaries (meridian, loadtest, loadtest-report, bare-client) and benches"
cargo build --release -q -p meridian -p loadtest
if [[ " $* " != *" --no-micro "* && " $* " != *" --only-"* ]]; then
    # Built exactly as suite.py runs them, so the suite's timing holds no compile.
    cargo bench -q --no-run -p meridian-protocol --bench codec
    cargo bench -q --no-run -p meridian-world --bench view_diff
fi
exec python3 loadtest/bench/suite.py "$@"
