#!/usr/bin/env bash
# TCP vs QUIC through one gateway: own-move delay and gateway CPU per relayed message.
#
#   loadtest/scripts/transport.sh BOTS SECONDS [MOVE_INTERVAL] [IO]
#
# Starts a local cluster (1 shard, 1 gateway, --io IO, default uring) from the release build
# (PROFILE=debug to use the debug build), then runs the same load test over TCP and over
# QUIC (--insecure: the dev certificate) one after the other against the same gateway, and
# prints one row per transport: delay p50/p99, and the gateway's user+system CPU time over
# the run divided by the messages it relayed (moves in + acks and notifications out).
set -euo pipefail
bots=${1:-500}; seconds=${2:-20}; interval=${3:-1s}; io=${4:-uring}
profile=${PROFILE:-release}
cd "$(dirname "$0")/../.."
bin=target/$profile
work=$(mktemp -d)
"$bin/meridian" up --shards 1 --io "$io" --port 0 --quic-port 0 --etcd-port 0 --cluster "tq-$$" \
    --ready-file "$work/ready.json" >"$work/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 300); do [ -f "$work/ready.json" ] && break; sleep 0.1; done
field() { python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['gateways'][0][sys.argv[2]])" "$work/ready.json" "$1"; }
gateway=$(field pid)
ticks() { awk '{print $14 + $15}' "/proc/$gateway/stat"; }
hz=$(getconf CLK_TCK)
printf '%-5s %6s %9s %9s %9s %12s %14s\n' transport bots sent acked "p50 ms" "p99 ms" "CPU us/msg"
for transport in tcp quic; do
    if [ "$transport" = tcp ]; then
        target=(--addr "$(field game)")
    else
        target=(--addr "$(field quic)" --transport quic --insecure)
    fi
    before=$(ticks)
    "$bin/loadtest" "${target[@]}" --bots "$bots" --duration "${seconds}s" \
        --move-interval "$interval" --name-prefix "$transport" --json "$work/$transport.json" >/dev/null 2>&1
    after=$(ticks)
    python3 - "$work/$transport.json" "$transport" "$((after - before))" "$hz" <<'PY'
import json, sys
lt = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[3]), int(sys.argv[4])
messages = lt["moves_sent"] + lt["moves_acked"] + lt["notifications"]
cpu_us = ticks / hz * 1e6 / max(messages, 1)
print(f"{sys.argv[2]:<9} {lt['bots_connected']:>6} {lt['moves_sent']:>9} {lt['moves_acked']:>9} "
      f"{lt['delay_ms']['p50']:>9} {lt['delay_ms']['p99']:>12} {cpu_us:>14.2f}")
PY
done
