#!/usr/bin/env python3
"""Battles and the spread world on one pinned core, two builds side by side (issue 29).

    python3 loadtest/bench/battle.py --before DIR --after DIR [--steps spread:5000,battle:2000]
                                     [--seconds 20] [--out target/bench-battle]

DIR holds a release `meridian` binary. For each step and each build (the order of the two
builds alternating from step to step), the whole cluster (`meridian up --shards 4
--gateways 1`, etcd included) runs pinned to core 1 (`taskset -c 1`) and the same
`loadtest` (target/release, or --loadtest) runs on core 0, a move a second per bot:

- `spread:N`: N bots over the whole map;
- `battle:N`: N bots spawned in the 20x20 box at the map's centre, where four shards meet,
  and kept in it (`loadtest --battle`): every bot in sight of every other;
- `border:N`: N bots kept in a 20x100 box standing on the x = 200 border, away from the
  y = 200 one (issue 30's calm borders: a crowd on a border moves it a few times at most);
- `disperse:N`: the battle of N, and halfway through the crowd disperses: three in four of
  its players leave (`loadtest --disperse-after`). Reported: how long after that the
  cluster is back to normal, i.e. the end of the last second with a refused move or a
  one-second p99 over 100 ms (`recovery_s`; 0 if the first second after is normal).

Each run lasts --seconds after a warm-up (the bots connecting, 2 ms apart, then 5 s for the
balancer's first adjustment and the backlog it leaves), and reports p50/p99 of a bot's own
move over the whole run and p99 after the warm-up (`loadtest --warmup`): the battle's
steady state. Also reported per step: moves sent / acked / refused / lost,
notifications delivered per second per cluster core, the cluster's CPU per notification,
bytes per second per player in and out (the gateway's counters), handoffs and the
partition epochs the balancer made and the ghost holds given up on for want of a
`Released` (`meridian_shard_ghost_release_timeouts_total`, 0 without a fault), and the
largest resident memory the cluster's processes (gateway, shards, etcd) reached together,
sampled every half second. Prints a Markdown table, writes battle.json and the
plot of p99 against players (battle.svg) into --out. Everything runs on loopback; every
process started is stopped by its PID.
"""

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import game  # noqa: E402
from suite import ROOT, cpu_seconds  # noqa: E402

BOX = "190,190,209,209"
BORDER_BOX = "190,60,209,159"
# disperse:N: when the crowd disperses (a share of the run) and which share of it leaves.
DISPERSE_AT = 0.5
DISPERSE_SHARE = 0.75
# "Back to normal" after a dispersal: no refused move and a one-second p99 at most this.
NORMAL_P99_MS = 100.0


def log(message):
    print(f"[battle {time.strftime('%H:%M:%S')}] {message}", flush=True)


def scrape(admin):
    """name -> summed value of every sample of the admin port's /metrics."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as answer:
        return game.parse_metrics(answer.read().decode())


def parse_steps(text):
    steps = []
    for item in text.split(","):
        kind, _, bots = item.partition(":")
        if kind not in ("spread", "battle", "border", "disperse") or not bots.isdigit():
            raise SystemExit(
                f"bad step {item!r}: want spread:N, battle:N, border:N or disperse:N")
        steps.append((kind, int(bots)))
    return steps


def run_step(meridian, loadtest, kind, bots, seconds, work, label):
    work.mkdir(parents=True, exist_ok=True)
    ready = work / "ready.json"
    # A ready file left by an earlier run in the same --out would name its dead cluster.
    ready.unlink(missing_ok=True)
    up_log = open(work / "up.log", "w")
    up = subprocess.Popen(
        ["taskset", "-c", "1", str(meridian), "up", "--shards", "4", "--gateways", "1",
         "--port", "0", "--quic-port", "0", "--ws-port", "0", "--etcd-port", "0",
         "--store", "none", "--cluster", f"battle-{os.getpid()}", "--ready-file", str(ready)],
        stdout=up_log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not (ready.exists() and ready.stat().st_size > 0):
            if up.poll() is not None or time.time() > deadline:
                raise SystemExit(f"meridian up did not get ready (see {work / 'up.log'})")
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        gateway = info["gateways"][0]
        pids = [info["etcd_pid"], gateway["pid"]] + [s["pid"] for s in info["shards"]]
        summary_path = work / "summary.json"
        warmup = warmup_seconds(bots)
        args = [str(loadtest), "--addr", gateway["game"], "--bots", str(bots),
                "--duration", f"{seconds + warmup}s", "--warmup", f"{warmup}s",
                "--move-interval", "1s", "--connect-interval", "2ms",
                "--json", str(summary_path), "--label", label]
        if kind in ("battle", "disperse"):
            args += ["--spawn-area", BOX, "--battle"]
        if kind == "disperse":
            args += ["--disperse-after", f"{int(dispersed_at(seconds, bots) * 1000)}ms",
                     "--disperse-share", str(DISPERSE_SHARE)]
        elif kind == "border":
            args += ["--spawn-area", BORDER_BOX, "--battle"]
        before = {s["id"]: scrape(s["admin"]) for s in info["shards"]}
        gw_before = scrape(gateway["admin"])
        epochs_before = up_log_epochs(work / "up.log")
        cpu_before, t0 = cpu_seconds(pids), time.time()
        memory = MemoryPeak(pids)
        with open(work / "loadtest.log", "w") as out:
            subprocess.run(["taskset", "-c", "0"] + args, stdout=out, stderr=subprocess.STDOUT,
                           check=False, timeout=seconds + warmup + 120)
        cpu, wall = cpu_seconds(pids) - cpu_before, time.time() - t0
        peak_rss = memory.stop()
        after = {s["id"]: scrape(s["admin"]) for s in info["shards"]}
        gw_after = scrape(gateway["admin"])
        epochs = up_log_epochs(work / "up.log") - epochs_before
        summary = json.loads(summary_path.read_text())
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        up_log.close()

    def delta(name):
        return sum(after[i].get(name, 0) - before[i].get(name, 0) for i in after)

    notifications = summary["notifications"]
    errors = summary["errors_by_code"]
    return {
        "kind": kind, "bots": bots, "label": label,
        "p50_ms": summary["delay_ms"].get("p50"), "p99_ms": summary["delay_ms"].get("p99"),
        "max_ms": summary["delay_ms"].get("max"),
        "steady_p50_ms": (summary.get("delay_steady_ms") or {}).get("p50"),
        "steady_p99_after_warmup_ms": (summary.get("delay_steady_ms") or {}).get("p99"),
        # The worst one-second p99 once the first 5 s (bots connecting, the balancer's
        # first adjustment) are over.
        "steady_p99_ms": max((p["p99_ms"] for p in summary["per_second"]
                              if p["t"] > 5 and p["p99_ms"] is not None), default=None),
        "sent": summary["moves_sent"], "acked": summary["moves_acked"],
        "refused": sum(errors.values()), "errors": errors, "lost": summary["moves_lost"],
        "disconnects": summary["disconnects"],
        "notifications_per_s": notifications / max(wall, 1e-3),
        "cpu_s": cpu, "wall_s": wall,
        "cpu_us_per_notification": 1e6 * cpu / max(notifications, 1),
        "bytes_in_per_player_s": (gw_after.get("meridian_gateway_bytes_in_total", 0)
                                  - gw_before.get("meridian_gateway_bytes_in_total", 0))
        / max(wall, 1e-3) / bots,
        "bytes_out_per_player_s": (gw_after.get("meridian_gateway_bytes_out_total", 0)
                                   - gw_before.get("meridian_gateway_bytes_out_total", 0))
        / max(wall, 1e-3) / bots,
        "handoffs": delta("meridian_shard_handoffs_out_total"),
        "moves_shed": delta("meridian_shard_moves_shed_total"),
        "epochs": epochs,
        "release_timeouts": delta("meridian_shard_ghost_release_timeouts_total"),
        "peak_rss_mb": peak_rss / 2**20,
        "recovery_s": (recovery_seconds(summary["per_second"], dispersed_at(seconds, bots))
                       if kind == "disperse" else None),
    }


def warmup_seconds(bots):
    """The bots connect 2 ms apart; then 5 s for the balancer's first adjustment."""
    return math.ceil(bots * 0.002) + 5


def dispersed_at(seconds, bots):
    """disperse:N: the crowd disperses halfway through the run after its warm-up."""
    return warmup_seconds(bots) + seconds * DISPERSE_AT


def recovery_seconds(per_second, dispersed_at):
    """Seconds from the dispersal to the end of the last one-second interval after it with a
    refused move or a p99 over NORMAL_P99_MS (0: the first second after was normal)."""
    last_bad = dispersed_at
    for second in per_second:
        if second["t"] <= dispersed_at:
            continue
        p99 = second.get("p99_ms")
        if second.get("errors", 0) > 0 or (p99 is not None and p99 > NORMAL_P99_MS):
            last_bad = second["t"]
    return round(last_bad - dispersed_at, 3)


class MemoryPeak:
    """Samples the summed resident memory of `pids` every half second until stopped."""

    def __init__(self, pids):
        self.pids, self.peak, self.done = pids, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, sum(rss_bytes(pid) for pid in self.pids))
            self.done.wait(0.5)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def up_log_epochs(path):
    try:
        return len(re.findall("published partition map", path.read_text(errors="replace")))
    except OSError:
        return 0


def svg_plot(results, path):
    """p99 against players, one line per build and workload (log-scale y)."""
    width, height, pad = 640, 400, 50
    series = {}
    for r in results:
        if r["p99_ms"]:
            series.setdefault((r["label"], r["kind"]), []).append((r["bots"], r["p99_ms"]))
    if not series:
        return
    xs = [b for pts in series.values() for b, _ in pts]
    ys = [max(p, 0.1) for pts in series.values() for _, p in pts]
    x_max = max(xs) * 1.05
    y_lo, y_hi = math.log10(min(ys) / 2), math.log10(max(ys) * 2)

    def px(b):
        return pad + (width - 2 * pad) * b / x_max

    def py(ms):
        return height - pad - (height - 2 * pad) * (math.log10(max(ms, 0.1)) - y_lo) / (y_hi - y_lo)

    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">players</text>',
             f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" '
             f'text-anchor="middle">p99 own-move delay, ms (log)</text>']
    for ms in (1, 10, 100, 1000, 10000):
        if y_lo <= math.log10(ms) <= y_hi:
            parts.append(f'<text x="{pad - 5}" y="{py(ms) + 4}" text-anchor="end">{ms}</text>')
            parts.append(f'<line x1="{pad}" y1="{py(ms)}" x2="{width - pad}" y2="{py(ms)}" stroke="#ddd"/>')
    for i, ((label, kind), pts) in enumerate(sorted(series.items())):
        pts.sort()
        colour = colours[i % len(colours)]
        line = " ".join(f"{px(b):.1f},{py(p):.1f}" for b, p in pts)
        dash = ' stroke-dasharray="6,4"' if kind == "spread" else ""
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for b, p in pts:
            parts.append(f'<circle cx="{px(b):.1f}" cy="{py(p):.1f}" r="3" fill="{colour}"/>')
        parts.append(f'<text x="{pad + 10}" y="{pad + 15 * (i + 1)}" fill="{colour}">{label} {kind}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="folder with the 'before' meridian")
    parser.add_argument("--after", required=True, help="folder with the 'after' meridian")
    parser.add_argument("--loadtest", default=str(ROOT / "target" / "release" / "loadtest"))
    parser.add_argument("--steps", default="spread:3000,spread:5000,battle:500,battle:1000,"
                                           "battle:2000,battle:4000")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "target" / "bench-battle"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_table(run_all(args, out))
    return 0


def run_all(args, out):
    builds = {"before": Path(args.before) / "meridian", "after": Path(args.after) / "meridian"}
    results = []
    for n, (kind, bots) in enumerate(parse_steps(args.steps)):
        order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
        for label in order:
            log(f"{kind} {bots}: {label} ({builds[label]})")
            result = run_step(builds[label], args.loadtest, kind, bots, args.seconds,
                              out / f"{kind}-{bots}-{label}", label)
            log(f"  p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, refused "
                f"{result['refused']}, lost {result['lost']}, epochs {result['epochs']}")
            results.append(result)
    (out / "battle.json").write_text(json.dumps(results, indent=2))
    svg_plot(results, out / "battle.svg")
    return results


def print_table(results):
    header = ["workload", "players", "build", "p50 ms", "p99 ms",
              "p99 after the warm-up, ms", "moves sent / acked / refused / lost",
              "disconnects", "notifications/s (one core)", "CPU µs per notification",
              "bytes/s per player in / out", "handoffs", "balancer epochs",
              "ghost release timeouts", "peak memory, MB", "back to normal after dispersal, s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    kinds = {"spread": 0, "battle": 1, "border": 2, "disperse": 3}
    for r in sorted(results, key=lambda r: (kinds[r["kind"]], r["bots"], r["label"] != "before")):
        print("| " + " | ".join([
            r["kind"], f"{r['bots']:,}", r["label"], f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
            f"{r['steady_p99_after_warmup_ms']:.1f}"
            if r.get("steady_p99_after_warmup_ms") is not None else "",
            f"{r['sent']:,} / {r['acked']:,} / {r['refused']:,} / {r['lost']:,}",
            str(r["disconnects"]), f"{r['notifications_per_s']:,.0f}",
            f"{r['cpu_us_per_notification']:.3f}",
            f"{r['bytes_in_per_player_s']:.0f} / {r['bytes_out_per_player_s']:,.0f}",
            f"{r['handoffs']:.0f}", str(r["epochs"]), f"{r.get('release_timeouts', 0):.0f}",
            f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "",
            f"{r['recovery_s']:.1f}" if r.get("recovery_s") is not None else "",
        ]) + " |")


if __name__ == "__main__":
    sys.exit(main())
