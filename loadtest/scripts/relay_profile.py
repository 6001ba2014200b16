#!/usr/bin/env python3
"""Where the gateway's and nginx `stream`'s CPU goes per relayed message (issue 17).

    python3 loadtest/scripts/relay_profile.py [--client loadtest] [--bots 1000]
            [--seconds 15] [--out DIR]

Starts one cluster (1 shard, 1 io_uring gateway; `meridian up`, as the benchmark suite
does, from the same RELEASE directory) and runs the spread workload (a move per 250 ms)
twice: direct to the gateway, then through nginx `stream` (2 workers, the suite's config).
In the middle of each run, once every bot is connected and moving, it samples the server
in front of the clients (the gateway's threads, or nginx's workers) with `perf record -g`
and reads its CPU from /proc/<pid>/stat over the same window. It prints one table: CPU
µs per message in the window, split by the kernel paths that take it, where each path
counts everything under it (so sending includes the loopback receive processing the
sender's CPU runs for the receiver, and its wake-up):

- sending: `tcp_sendmsg` (io_uring's `io_send` and nginx's `writev` alike);
- receiving: `tcp_recvmsg`;
- waiting: `io_cqring_wait` or `do_epoll_wait` (polling, sleeping, task work run there);
- user space: samples outside the kernel (Meridian, rustls, libc; nginx).

Only processes this script starts are stopped, by their PIDs; it runs on loopback.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import suite  # noqa: E402

# (row, kernel symbols whose inclusive share makes it; the first one found counts).
PATHS = [
    ("sending (tcp_sendmsg, with the receiver's loopback path)", ["tcp_sendmsg"]),
    ("receiving (tcp_recvmsg)", ["tcp_recvmsg"]),
    ("waiting (io_cqring_wait / do_epoll_wait)", ["io_cqring_wait", "do_epoll_wait"]),
]
ROW = re.compile(r"^\s*(?P<children>[\d.]+)%\s+(?P<self>[\d.]+)%\s+\[(?P<where>[k.])\]\s+(?P<sym>\S+)")


def shares(perf_data):
    """{kernel symbol: inclusive share}, and the share of samples in user space."""
    text = subprocess.run(["perf", "report", "-i", str(perf_data), "--children", "--sort",
                           "sym", "--stdio", "-g", "none"], capture_output=True,
                          text=True).stdout
    inclusive, user = {}, 0.0
    for line in text.splitlines():
        match = ROW.match(line)
        if not match:
            continue
        if match["where"] == "k":
            inclusive.setdefault(match["sym"], float(match["children"]) / 100)
        else:
            user += float(match["self"]) / 100
    return inclusive, user


def run(label, addr, pids_of, args, out):
    """One run of the client against `addr`; perf and CPU on `pids_of()` mid-run."""
    summary_path = out / f"{label}.json"
    command = [str(suite.RELEASE / args.client), "--addr", addr, "--bots", str(args.bots),
               "--duration", f"{args.seconds}s", "--move-interval", "250ms", "--drain", "3s",
               "--json", str(summary_path)]
    client = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    window_at = args.bots / 1000 + 3  # every bot connected and moving
    window = max(args.seconds - window_at - 2, 1)
    time.sleep(window_at)
    pids = pids_of()
    perf_data = out / f"{label}.perf.data"
    cpu_before = suite.cpu_seconds(pids)
    subprocess.run(["perf", "record", "-q", "-g", "-F", "999", "-o", str(perf_data), "-p",
                    ",".join(map(str, pids)), "--", "sleep", str(window)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    cpu = suite.cpu_seconds(pids) - cpu_before
    if client.wait() != 0:
        raise RuntimeError(f"{args.client} failed against {label}")
    summary = json.loads(summary_path.read_text())
    seconds = [s for s in summary["per_second"] if window_at < s["t"] <= window_at + window]
    messages = sum(s["sent"] + s["acked"] + s["notifications"] for s in seconds)
    messages *= window / max(len(seconds), 1)
    inclusive, user = shares(perf_data)
    perf_data.unlink()
    us = cpu * 1e6 / max(messages, 1)
    split = {}
    for row, symbols in PATHS:
        split[row] = us * next((inclusive[s] for s in symbols if s in inclusive), 0.0)
    split["user space"] = us * user
    return {"label": label, "cpu_us_per_msg": us, "messages_per_s": messages / window,
            "split": split, "lost": summary["moves_lost"]}


def table(results):
    header = ["µs per message"] + [r["label"] for r in results]
    rows = [["CPU in the window"] + [f"{r['cpu_us_per_msg']:.2f}" for r in results]]
    for row in results[0]["split"]:
        rows.append([row] + [f"{r['split'][row]:.2f}" for r in results])
    rows.append(["everything else"] + [
        f"{r['cpu_us_per_msg'] - sum(r['split'].values()):.2f}" for r in results])
    rows.append(["messages relayed / s"] + [f"{r['messages_per_s']:,.0f}" for r in results])
    rows.append(["moves lost"] + [str(r["lost"]) for r in results])
    return suite.markdown_table(header, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", default="loadtest", help="loadtest or bare-client")
    args, out = suite.script_arguments(parser, seconds=15, out="/tmp/meridian-relay-profile")
    cluster = suite.Cluster(out, "relay-profile", 1, "uring")
    try:
        results = [run("gateway, direct", cluster.game, lambda: [cluster.gateway_pid],
                       args, out)]
        proxy = suite.Proxy(out, "nginx", cluster.game_port)
        try:
            # The workers carry the traffic; the master only watches them.
            results.append(run("nginx, in front", f"127.0.0.1:{proxy.port}",
                               lambda: suite.children_of(proxy.process.pid), args, out))
        finally:
            proxy.stop()
    finally:
        cluster.stop()
    (out / "relay-profile.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
