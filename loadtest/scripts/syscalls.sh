#!/usr/bin/env bash
# Counts the gateway's system calls per relayed message for one I/O backend.
#
#   loadtest/scripts/syscalls.sh uring|epoll BOTS SECONDS [MOVE_INTERVAL]
#
# Starts a local cluster (1 shard, 1 gateway) from the release build, attaches
# `strace -c -f` to the gateway process for the whole load test, and prints the syscall
# table plus: syscalls / (moves sent + messages delivered to clients). strace slows the
# traced process a lot; use the counts, not the delays, from a traced run.
set -euo pipefail
io=${1:?uring|epoll}; bots=${2:-1000}; seconds=${3:-20}; interval=${4:-1s}
cd "$(dirname "$0")/../.."
command -v strace >/dev/null || apt-get install -y -qq strace >/dev/null
work=$(mktemp -d)
target/release/meridian up --io "$io" --port 0 --etcd-port 0 --cluster "sc-$io" --ready-file "$work/ready.json" >"$work/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -f "$work/ready.json" ] && break; sleep 0.1; done
game=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['gateways'][0]['game'])" "$work/ready.json")
gw=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['gateways'][0]['pid'])" "$work/ready.json")
strace -c -f -p "$gw" -o "$work/strace.txt" &
tracer=$!
sleep 0.5
target/release/loadtest --addr "$game" --bots "$bots" --duration "${seconds}s" --move-interval "$interval" --json "$work/lt.json" >/dev/null
kill -INT $tracer; wait $tracer 2>/dev/null || true
cat "$work/strace.txt"
python3 - "$work/strace.txt" "$work/lt.json" "$io" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
total = next(int(l.split()[3]) for l in lines if l.strip().endswith("total"))
lt = json.load(open(sys.argv[2]))
messages = lt["moves_sent"] + lt["moves_acked"] + lt["notifications"]
print(f"{sys.argv[3]}: {total} syscalls / {messages} messages relayed "
      f"(moves in + acks and notifications out) = {total / max(messages, 1):.3f} per message; "
      f"p50 {lt['delay_ms']['p50']} ms p99 {lt['delay_ms']['p99']} ms (traced)")
PY
