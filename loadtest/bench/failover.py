#!/usr/bin/env python3
"""How long a shard's failure freezes its players, two builds side by side (issue 33).

    python3 loadtest/bench/failover.py --before DIR --after DIR [--faults kill,stop,gateway,roll]
                                       [--rounds 1] [--out target/bench-failover]

DIR holds a release `meridian` binary. For each fault and round, each build in turn (the
order alternating) runs `meridian up --shards 3 --gateways 2` (etcd included), and two
`loadtest`s (target/release, or --loadtest), 150 bots on each gateway, a move every 100 ms
for 25 s. At 10 s one shard (the second) meets the fault:

- `kill`: SIGKILL, the process is gone (a crash, an OOM kill);
- `stop`: SIGSTOP at 8 s and SIGCONT at 16 s (a long pause: a GC, a VM migration);
- `gateway`: SIGTERM to the first gateway at 10 s (a gateway's rolling restart, or a
  scale-in): its bots are told `SHUTTING_DOWN` and resume on the other gateway with their
  tokens (`loadtest --resume-addr`, as the SDKs do); the ack gap includes the move;
- `roll`: a rolling restart, 45 s of load: every shard in turn gets SIGTERM (it drains:
  its players are handed to the others, then it exits) at 5 + 12k s and is started again
  with the same id 6 s later (`meridian shard --join <up's data dir> --id K`); after the
  load, `meridian status --check` must say the cluster is healthy.

Reported per run: p50 / p99 / max over the bots of each bot's longest gap between two of
its acks (`ack_gap_ms`, loadtest's summary; the worse of the two loadtests' percentiles),
moves sent / acked / refused / lost, disconnects. Prints a Markdown table and writes
failover.json into --out. Everything runs on loopback; every process started is stopped
by its PID.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import ROOT  # noqa: E402

SECONDS = 25
ROLL_SECONDS = 45
BOTS_PER_GATEWAY = 150


def log(message):
    print(f"[failover {time.strftime('%H:%M:%S')}] {message}", flush=True)


def stop(process, how):
    """Sends `how` to a process this run started, if it still runs, and waits for it (30 s,
    then SIGKILL)."""
    if process.poll() is not None:
        return
    process.send_signal(how)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_once(meridian, loadtest, fault, work, label):
    work.mkdir(parents=True, exist_ok=True)
    seconds = ROLL_SECONDS if fault == "roll" else SECONDS
    cluster = f"failover-{os.getpid()}"
    replacements = []
    healthy = None
    ready = work / "ready.json"
    # A ready file left by an earlier run in the same --out would name its dead cluster.
    ready.unlink(missing_ok=True)
    up_log = open(work / "up.log", "w")
    up = subprocess.Popen(
        [str(meridian), "up", "--shards", "3", "--gateways", "2", "--port", "0",
         "--quic-port", "0", "--ws-port", "0", "--etcd-port", "0", "--store", "none",
         "--cluster", cluster, "--ready-file", str(ready)],
        stdout=up_log, stderr=subprocess.STDOUT)
    loads = []
    try:
        deadline = time.time() + 60
        while not (ready.exists() and ready.stat().st_size > 0):
            if up.poll() is not None or time.time() > deadline:
                raise SystemExit(f"meridian up did not get ready (see {work / 'up.log'})")
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        victim = info["shards"][1]["pid"]
        gateways = info["gateways"][:2]
        for n, gateway in enumerate(gateways):
            summary = work / f"summary-{n}.json"
            other = gateways[1 - n]["game"]
            args = [str(loadtest), "--addr", gateway["game"], "--resume-addr", other,
                    "--bots", str(BOTS_PER_GATEWAY),
                    "--duration", f"{seconds}s", "--move-interval", "100ms",
                    "--connect-interval", "5ms", "--name-prefix", f"g{n}-", "--json",
                    str(summary), "--label", label]
            out = open(work / f"loadtest-{n}.log", "w")
            loads.append((subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT), out,
                          summary))
        started = time.time()
        if fault == "kill":
            time.sleep(max(0.0, started + 10 - time.time()))
            log(f"  SIGKILL to shard pid {victim}")
            os.kill(victim, signal.SIGKILL)
        elif fault == "gateway":
            time.sleep(max(0.0, started + 10 - time.time()))
            log(f"  SIGTERM to gateway pid {gateways[0]['pid']}")
            os.kill(gateways[0]["pid"], signal.SIGTERM)
        elif fault == "roll":
            for k, shard in enumerate(info["shards"]):
                at = started + 5 + 12 * k
                time.sleep(max(0.0, at - time.time()))
                log(f"  SIGTERM to shard {shard['id']} (pid {shard['pid']})")
                os.kill(shard["pid"], signal.SIGTERM)
                time.sleep(max(0.0, at + 6 - time.time()))
                log(f"  shard {shard['id']} started again")
                out = open(work / f"shard-{shard['id']}-again.log", "w")
                replacements.append((subprocess.Popen(
                    [str(meridian), "shard", "--join", info["data_dir"], "--id",
                     str(shard["id"])], stdout=out, stderr=subprocess.STDOUT), out))
        else:
            time.sleep(max(0.0, started + 8 - time.time()))
            log(f"  SIGSTOP to shard pid {victim}")
            os.kill(victim, signal.SIGSTOP)
            time.sleep(max(0.0, started + 16 - time.time()))
            log(f"  SIGCONT to shard pid {victim}")
            os.kill(victim, signal.SIGCONT)
        summaries = []
        for process, out, summary in loads:
            process.wait(timeout=seconds + 120)
            out.close()
            summaries.append(json.loads(summary.read_text()))
        if fault == "roll":
            status = subprocess.run(
                [str(meridian), "status", "--cluster", cluster, "--etcd", info["etcd"], "--check"],
                capture_output=True, text=True)
            (work / "status.txt").write_text(status.stdout + status.stderr)
            healthy = status.returncode == 0
            log(f"  meridian status --check: {'healthy' if healthy else 'NOT healthy'}")
    finally:
        for process, out in replacements:
            stop(process, signal.SIGTERM)
            out.close()
        for process, out, _ in loads:
            stop(process, signal.SIGKILL)
        stop(up, signal.SIGINT)
        up_log.close()

    def worst(key):
        values = [s["ack_gap_ms"].get(key) for s in summaries]
        return max((v for v in values if v is not None), default=None)

    def total(key):
        return sum(s[key] for s in summaries)

    refused = total("moves_errored")
    return {
        "fault": fault, "label": label,
        "gap_p50_ms": worst("p50"), "gap_p99_ms": worst("p99"), "gap_max_ms": worst("max"),
        "sent": total("moves_sent"), "acked": total("moves_acked"), "refused": refused,
        "errors": [s["errors_by_code"] for s in summaries], "lost": total("moves_lost"),
        "disconnects": total("disconnects"), "healthy_after": healthy,
        "resumes": total("resumes"),
    }


def healthy_words(healthy):
    return "-" if healthy is None else ("healthy" if healthy else "NOT healthy")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="folder with the 'before' meridian")
    parser.add_argument("--after", required=True, help="folder with the 'after' meridian")
    parser.add_argument("--loadtest", default=str(ROOT / "target" / "release" / "loadtest"))
    parser.add_argument("--faults", default="kill,stop,gateway,roll")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "target" / "bench-failover"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    builds = {"before": Path(args.before) / "meridian", "after": Path(args.after) / "meridian"}
    results = []
    n = 0
    for fault in args.faults.split(","):
        if fault not in ("kill", "stop", "gateway", "roll"):
            raise SystemExit(f"unknown fault {fault!r}: want kill, stop, gateway or roll")
        for round_ in range(args.rounds):
            order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
            n += 1
            for label in order:
                log(f"{fault}, round {round_ + 1}: {label} ({builds[label]})")
                result = run_once(builds[label], args.loadtest, fault,
                                  out / f"{fault}-{round_}-{label}", label)
                log(f"  longest ack gap p50 {result['gap_p50_ms']} p99 {result['gap_p99_ms']} "
                    f"max {result['gap_max_ms']} ms; refused {result['refused']}, lost "
                    f"{result['lost']}, disconnects {result['disconnects']}, resumes "
                    f"{result['resumes']}")
                results.append(result)
    (out / "failover.json").write_text(json.dumps(results, indent=2))
    print("| fault | build | longest ack gap per player p50 / p99 / max, ms | moves sent / "
          "acked / refused / lost | disconnects | resumes | status --check after |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['fault']} | {r['label']} | {r['gap_p50_ms']} / {r['gap_p99_ms']} / "
              f"{r['gap_max_ms']} | {r['sent']} / {r['acked']} / {r['refused']} / {r['lost']} "
              f"| {r['disconnects']} | {r['resumes']} | {healthy_words(r['healthy_after'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
