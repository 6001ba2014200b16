#!/usr/bin/env python3
"""Two `meridian` builds side by side on the suite's spread and dense workloads.

    python3 loadtest/bench/ab.py --before DIR --after DIR [--rounds 2] [--full]

DIR holds a release `meridian` binary (e.g. a worktree's target/release). Each round runs
both builds, alternating which goes first, on one io_uring gateway and one shard: the
spread workload (bots over the whole map) and the dense one (every bot in sight of every
other), with the same `loadtest` binary (target/release). Gateway CPU per message comes from
/proc, as in the suite. Prints a Markdown table (median over rounds) and writes ab.json in
--out. Everything runs on loopback; every process started is stopped by its PID.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402


def measure(bench, work, label, binary):
    cluster = suite.Cluster(work, f"ab-{label}", 1, "uring", binary=binary)
    try:
        watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
        s = bench.s
        spread = bench.loadtest(f"{label} spread", cluster.game, s["io_bots"], s["io_seconds"],
                                s["io_interval"], watch=watch)
        dense = bench.dense(cluster, f"{label} dense", watch, None)
        return {"spread": spread, "dense": dense}
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="folder with the 'before' meridian")
    parser.add_argument("--after", required=True, help="folder with the 'after' meridian")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="the suite's full loads")
    parser.add_argument("--out", default=str(suite.ROOT / "target" / "bench-ab"))
    args = parser.parse_args()
    bench = suite.Suite(argparse.Namespace(quick=not args.full, out=args.out))
    work = bench.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    builds = {"before": Path(args.before) / "meridian", "after": Path(args.after) / "meridian"}
    runs = {"before": [], "after": []}
    for round_number in range(args.rounds):
        order = ["before", "after"] if round_number % 2 == 0 else ["after", "before"]
        for label in order:
            suite.log(f"round {round_number + 1}: {label} ({builds[label]})")
            runs[label].append(measure(bench, work, label, builds[label]))
    (bench.out / "ab.json").write_text(json.dumps(runs, indent=2))
    rows = []
    for workload in ("spread", "dense"):
        for label in ("before", "after"):
            results = [r[workload] for r in runs[label]]
            med = lambda f: statistics.median(f(r) for r in results)  # noqa: E731
            rows.append([
                workload, label,
                f"{med(lambda r: r['cpu_us_per_msg']['gateway']):.2f}",
                f"{med(lambda r: r['messages'] / max(r['wall_s'], 1e-3)):.0f}",
                f"{med(lambda r: r['p50_ms']):.2f}", f"{med(lambda r: r['p99_ms']):.2f}",
                str(sum(r["moves_lost"] for r in results)),
                " / ".join(f"{r['cpu_us_per_msg']['gateway']:.2f}" for r in results),
            ])
    header = ["workload", "build", "gateway CPU µs/msg (median)", "msgs/s", "p50 ms", "p99 ms",
              "moves lost (all rounds)", "gateway µs/msg per round"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
