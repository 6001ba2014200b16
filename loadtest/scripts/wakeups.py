#!/usr/bin/env python3
"""Who wakes whom, per relayed message, with one load client or another (issue 17).

    python3 loadtest/scripts/wakeups.py [--bots 1000] [--seconds 12] [--out DIR]
            VARIANT [VARIANT ...]

A VARIANT is a client binary of the release build with its extra flags after colons:
`loadtest`, `bare-client`, `bare-client:--send-tick:1ms`. Starts one cluster (1 shard, 1
io_uring gateway; `meridian up`, as the benchmark suite does, from the same RELEASE
directory), then runs each variant in turn, direct to the gateway, the spread workload (a
move per 250 ms). For each run it measures the gateway's CPU per message over the whole
run (/proc/<pid>/stat), and records `sched:sched_waking` on every CPU for a window in the
middle (`perf record -a`): the tracepoint fires in the waker's context and names the
task woken, so each event is one edge "waker -> wakee". Tasks are told apart by thread:
the gateway's I/O workers (`gw-uring-N`) and its tokio threads (the relay tasks and the
gRPC streams to the shard), the shard, the client; anything else is "other" (etcd,
kernel threads, other users of the machine). It prints one table: the edges per 1,000
messages, and the moves per wake-up of the gateway's I/O workers by the client.

Only processes this script starts are stopped, by their PIDs; it runs on loopback.
"""

import argparse
import collections
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import suite  # noqa: E402

# Edges worth a row, in this order; the rest are summed as "everything else".
EDGES = [
    ("client", "gateway I/O"), ("gateway I/O", "client"),
    ("gateway I/O", "gateway tokio"), ("gateway tokio", "gateway I/O"),
    ("gateway tokio", "gateway tokio"),
    ("gateway tokio", "shard"), ("shard", "gateway tokio"), ("shard", "shard"),
    ("client", "client"),
]
LINE = re.compile(r"^\s*(?P<comm>\S.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+comm=.*? pid=(?P<target>\d+)")


def threads(pid):
    """{tid: thread name} of a live process."""
    out = {}
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out[int(task.name)] = (task / "comm").read_text().strip()
            except OSError:
                pass
    except OSError:
        pass
    return out


def roles(cluster, client_pid):
    """{tid: role} of every thread that matters here."""
    who = {}
    for tid, name in threads(cluster.gateway_pid).items():
        who[tid] = ("gateway I/O" if name.startswith(("gw-uring", "gw-epoll"))
                    else "gateway tokio" if name.startswith("tokio") else "gateway other")
    for pid in cluster.shard_pids:
        for tid in threads(pid):
            who[tid] = "shard"
    for tid in threads(client_pid):
        who[tid] = "client"
    return who


def count_edges(perf_data, who):
    text = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid,tid,comm,trace"],
                          capture_output=True, text=True).stdout
    edges = collections.Counter()
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        waker = who.get(int(match["tid"]), "other")
        wakee = who.get(int(match["target"]), "other")
        edges[(waker, wakee)] += 1
    return edges


def run_variant(cluster, variant, args, out):
    binary, *extra = variant.split(":")
    slug = re.sub(r"[^a-z0-9]+", "-", variant.lower()).strip("-")
    summary_path = out / f"{slug}.json"
    command = [str(suite.RELEASE / binary), "--addr", cluster.game, "--bots", str(args.bots),
               "--duration", f"{args.seconds}s", "--move-interval", "250ms", "--drain", "3s",
               "--json", str(summary_path), *extra]
    cpu_before = suite.cpu_seconds([cluster.gateway_pid])
    client = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    window_at = args.bots / 1000 + 2  # every bot connected and moving
    window = max(args.seconds - window_at - 2, 1)
    time.sleep(window_at)
    who = roles(cluster, client.pid)
    perf_data = out / f"{slug}.perf.data"
    subprocess.run(["perf", "record", "-q", "-a", "-e", "sched:sched_waking", "-o",
                    str(perf_data), "--", "sleep", str(window)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    if client.wait() != 0:
        raise RuntimeError(f"{variant} failed")
    gateway_cpu = suite.cpu_seconds([cluster.gateway_pid]) - cpu_before
    summary = json.loads(summary_path.read_text())
    messages = summary["moves_sent"] + summary["moves_acked"] + summary["notifications"]
    # Messages and moves inside the window, from the per-second entries it covers.
    seconds = [s for s in summary["per_second"] if window_at < s["t"] <= window_at + window]
    window_messages = sum(s["sent"] + s["acked"] + s["notifications"] for s in seconds)
    window_moves = sum(s["sent"] for s in seconds)
    scale = window / max(len(seconds), 1)
    edges = count_edges(perf_data, who)
    perf_data.unlink()
    return {
        "variant": variant, "gateway_cpu_us_per_msg": gateway_cpu * 1e6 / max(messages, 1),
        "p50_ms": summary["delay_ms"]["p50"], "p99_ms": summary["delay_ms"]["p99"],
        "window_messages": window_messages * scale, "window_moves": window_moves * scale,
        "edges": {f"{a} -> {b}": n for (a, b), n in edges.items()},
    }


def table(results):
    header = ["per 1,000 messages"] + [r["variant"] for r in results]
    rows = [["gateway CPU µs / message (whole run)"]
            + [f"{r['gateway_cpu_us_per_msg']:.2f}" for r in results],
            ["delay p50 / p99 ms"] + [f"{r['p50_ms']} / {r['p99_ms']}" for r in results]]
    for a, b in EDGES:
        rows.append([f"{a} -> {b}"] + [
            f"{1000 * r['edges'].get(f'{a} -> {b}', 0) / r['window_messages']:.1f}"
            for r in results])
    named = {f"{a} -> {b}" for a, b in EDGES}
    rows.append(["everything else"] + [
        f"{1000 * sum(n for e, n in r['edges'].items() if e not in named) / r['window_messages']:.1f}"
        for r in results])
    rows.append(["wake-ups performed by the gateway (all its threads)"] + [
        f"{1000 * sum(n for e, n in r['edges'].items() if e.startswith('gateway')) / r['window_messages']:.1f}"
        for r in results])
    rows.append(["moves per wake-up of the gateway's I/O workers by the client"] + [
        f"{r['window_moves'] / max(r['edges'].get('client -> gateway I/O', 0), 1):.2f}"
        for r in results])
    return suite.markdown_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+")
    args, out = suite.script_arguments(parser, seconds=12, out="/tmp/meridian-wakeups")
    cluster = suite.Cluster(out, "wakeups", 1, "uring")
    try:
        results = [run_variant(cluster, variant, args, out) for variant in args.variants]
    finally:
        cluster.stop()
    (out / "wakeups.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
