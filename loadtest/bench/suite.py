#!/usr/bin/env python3
"""Meridian's benchmark suite: one run, one machine, every comparison side by side.

Run it through `loadtest/bench/run.sh` (which builds the release binaries and installs
nginx, HAProxy and strace if missing). It starts its own clusters (`meridian up`) and
proxies on loopback ports, drives them with `loadtest`, reads the kernel's accounting of
the processes it started (/proc/<pid>/stat, strace), and writes into --out:

  bench.json      every measured number, the settings, the machine and the commit
  report.html     the self-contained report with plots (loadtest-report)
  svg/            every plot as an SVG file
  tables.md       the tables, ready for BENCHMARKS.md
  runs/           each loadtest run's JSON summary and progress log

With --update-docs it also rewrites the generated block of BENCHMARKS.md and copies the
SVGs to docs/bench/. Every load is bounded in bots and seconds (see SETTINGS); only
processes this script started are stopped, by their PIDs.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import game  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Where `cargo build --release` put the binaries: CARGO_TARGET_DIR when set (relative to the
# directory cargo ran in, which run.sh makes the repository's root), else target/.
RELEASE = (ROOT / os.environ.get("CARGO_TARGET_DIR", "target")) / "release"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Every load the suite puts on the machine, per mode: bots, seconds, move intervals.
SETTINGS = {
    "quick": {
        "io_bots": 300, "io_seconds": 5, "io_interval": "250ms",
        "strace_seconds": 4,
        "ramp_max": 1500, "ramp_step": 500, "ramp_step_seconds": 2,
        "capacity_bots": 5000, "capacity_window_seconds": 4,
        "dense_bots": 300, "dense_seconds": 5, "dense_interval": "250ms", "dense_side": 20,
        "ws_bots": 1000, "ws_seconds": 6, "ws_interval": "250ms",
        "relay_bots": [300, 600], "relay_seconds": 5, "relay_interval": "250ms",
        "bench_args": ["--sample-count", "100"],
    },
    "full": {
        "io_bots": 1000, "io_seconds": 15, "io_interval": "250ms",
        "strace_seconds": 8,
        "ramp_max": 6000, "ramp_step": 500, "ramp_step_seconds": 3,
        "capacity_bots": 5000, "capacity_window_seconds": 15,
        "dense_bots": 400, "dense_seconds": 12, "dense_interval": "250ms", "dense_side": 20,
        "ws_bots": 1000, "ws_seconds": 15, "ws_interval": "250ms",
        "relay_bots": [1000, 2000], "relay_seconds": 15, "relay_interval": "250ms",
        "bench_args": ["--sample-count", "500"],
    },
}
MAX_P99_MS = 50
CAPACITY_INTERVAL = "1s"
WS_SECTION = "Transport: TCP vs WebSocket (same gateway, same workload)"
# The TCP and WebSocket runs of that section, in the order they run: A B B A, so a drift of
# the busy machine over the four runs weighs on both transports alike.
WS_RUNS = (("ws_tcp_1", "tcp", "tcp spread 1"), ("ws_ws_1", "ws", "ws spread 1"),
           ("ws_ws_2", "ws", "ws spread 2"), ("ws_tcp_2", "tcp", "tcp spread 2"))
# With `--ws-baseline BIN`: WebSocket runs through another build's gateway (its own cluster,
# same workload), between the two halves of WS_RUNS: a before/after of the front.
WS_BASELINE_RUNS = (("ws_base_1", "base", "ws baseline 1"), ("ws_base_2", "base", "ws baseline 2"))
# The relay hop measured with two load clients (issue 17): `loadtest` (tokio, a task per
# bot) and `bare-client` (one thread, one epoll set, one read per readiness), each at every
# `relay_bots`, each time direct, through nginx `stream`, and direct again.
RELAY_CLIENTS = (("loadtest", "loadtest"), ("bare-client", "bare-client"))
RELAY_PATHS = (("direct", "direct"), ("nginx", "via nginx"), ("direct_again", "direct again"))
# What perf counts on the gateway's threads (per thread) and on nginx (all its processes):
# system calls, the wake-ups each one performs (`sched_waking` fires in the waker), and
# the times it is switched out (`sched_switch` fires in the task leaving the CPU).
SERVER_EVENTS = ("raw_syscalls:sys_enter", "sched:sched_waking", "sched:sched_switch")
# ... and on the load client (all its threads): the same, plus its reads and its waits.
CLIENT_EVENTS = SERVER_EVENTS + ("syscalls:sys_enter_recvfrom", "syscalls:sys_enter_read",
                                 "syscalls:sys_enter_epoll_wait",
                                 "syscalls:sys_enter_epoll_pwait")
TLS_SECTION = "Mutual TLS on the gRPC links: on vs off (same workload)"
# Its runs, A B B A as above, each on a cluster of its own (1 shard, 1 io_uring gateway):
# mutual TLS on every gRPC link (the default), or `meridian up --insecure-grpc`.
TLS_RUNS = (("tls_on_1", True, "mutual TLS 1"), ("tls_off_1", False, "gRPC in the clear 1"),
            ("tls_off_2", False, "gRPC in the clear 2"), ("tls_on_2", True, "mutual TLS 2"))


def log(message):
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[bench {stamp}] {message}", flush=True)


def sh(command):
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout.strip()


def cpu_seconds(pids):
    """User + system CPU seconds of processes (all their threads), from /proc/<pid>/stat."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields 14 and 15 (utime, stime) are the 12th and 13th after the ")".
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def cpu_by_thread_name(pid):
    """CPU seconds per thread name (gw-uring-0, tokio-rt-worker, ...) of one process."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Numbered threads of one kind (gw-uring-0, gw-uring-1) are summed as gw-uring.
        kind = re.sub(r"-\d+$", "", name)
        out[kind] = out.get(kind, 0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def children_of(pid):
    """PIDs of the direct children of `pid` (nginx workers under their master)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def thread_names(pid):
    names = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            pass
    return names


def stop(process, name, sig=signal.SIGTERM, timeout=10):
    """Stops one process this script started, by its PID, and reaps it."""
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"{name} (pid {process.pid}) did not stop in {timeout}s; killing it")
        process.kill()
        process.wait()


def wait_for_file(path, process, name, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} during start-up")
        time.sleep(0.1)
    raise RuntimeError(f"{name} was not ready within {seconds}s")


def wait_for_port(port, process, name, seconds=10):
    import socket
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} during start-up")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds}s")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`meridian up` with its own etcd, shards and one gateway; stopped by its PID."""

    def __init__(self, work, name, shards, io, binary=None, extra=(), env=None):
        self.name = name
        self.ready_file = work / f"{name}.ready.json"
        # A ready file left by an earlier suite in the same folder would name dead ports.
        self.ready_file.unlink(missing_ok=True)
        self.log_file = open(work / f"{name}.up.log", "w")
        command = [str(binary or RELEASE / "meridian"), "up", "--shards", str(shards), "--io", io,
                   "--port", "0", "--quic-port", "0", "--ws-port", "0", "--etcd-port", "0",
                   "--cluster", name,
                   "--ready-file", str(self.ready_file), *extra]
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        cwd=ROOT, env={**os.environ, **(env or {})})
        ready = wait_for_file(self.ready_file, self.process, f"cluster {name}")
        gateway = ready["gateways"][0]
        self.game = gateway["game"]
        self.game_port = int(self.game.rsplit(":", 1)[1])
        # The QUIC front's UDP address (the first gateway has one; `--quic-port 0` below).
        self.quic = gateway.get("quic")
        # The WebSocket front's TCP address (`--ws-port 0` below).
        self.ws = gateway.get("ws")
        self.gateway_pid = int(gateway["pid"])
        self.gateway_admin = gateway["admin"]
        self.shard_pids = [int(s["pid"]) for s in ready["shards"]]
        self.shard_admins = [s["admin"] for s in ready["shards"]]
        # Give the shards a moment to settle on the partition before measuring.
        time.sleep(1.0)

    def stop(self):
        stop(self.process, f"cluster {self.name}", signal.SIGINT, timeout=20)
        self.log_file.close()


class Proxy:
    """nginx `stream` or HAProxy in the foreground with a generated config on loopback."""

    def __init__(self, work, kind, upstream_port):
        self.kind = kind
        self.port = free_port()
        directory = work / kind
        directory.mkdir(exist_ok=True)
        if kind == "nginx":
            config = directory / "nginx.conf"
            config.write_text(f"""
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 2;
worker_rlimit_nofile 20000;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
daemon off;
events {{ worker_connections 20000; }}
stream {{
    server {{
        listen 127.0.0.1:{self.port};
        proxy_pass 127.0.0.1:{upstream_port};
        tcp_nodelay on;
        proxy_timeout 10m;
    }}
}}
""")
            command = ["nginx", "-c", str(config), "-p", str(directory)]
        else:
            config = directory / "haproxy.cfg"
            config.write_text(f"""
global
    # Two fds per relayed connection; the environment's hard limit is 20,000.
    maxconn 9000
    nbthread 2
defaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m
frontend bench
    bind 127.0.0.1:{self.port}
    default_backend gateway
backend gateway
    server gw1 127.0.0.1:{upstream_port}
""")
            command = ["haproxy", "-db", "-f", str(config)]
        self.log_file = open(directory / "stdout.log", "w")
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.process, kind)
        time.sleep(0.3)

    def pids(self):
        return [self.process.pid] + children_of(self.process.pid)

    def stop(self):
        # nginx: SIGTERM is a fast shutdown of master and workers; HAProxy stops on it too.
        stop(self.process, self.kind)
        self.log_file.close()


class Suite:
    def __init__(self, args):
        self.args = args
        self.mode = "quick" if args.quick else "full"
        self.s = dict(SETTINGS[self.mode])
        self.out = Path(args.out).resolve()
        self.runs_dir = self.out / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.results = {}
        self.manifest_sections = {}
        self.started = time.time()
        self.builds_seen = 0
        self.step_number = 0

    # ---- helpers -------------------------------------------------------------------

    def note_builds(self):
        running = sh("pgrep -c -x rustc || true")
        self.builds_seen = max(self.builds_seen, int(running or 0))

    def loadtest(self, label, addr, bots, seconds, interval, extra=(), section=None,
                 watch=(), strace_pid=None, client="loadtest", count_events=False):
        """One run of a load client (`loadtest`, or `bare-client` with the same flags);
        returns its summary plus the CPU seconds of `watch` PIDs.

        With `count_events`, perf also counts SERVER_EVENTS on the gateway and on a watched
        nginx, and CLIENT_EVENTS on the client (perf starts the client, so nothing of it is
        missed; the client's CPU from wait4 then includes perf's own, a few milliseconds)."""
        self.step_number += 1
        self.note_builds()
        log(f"run {self.step_number}: {label}: {bots} bots, {seconds}s, move every {interval}")
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        json_path = self.runs_dir / f"{slug}.json"
        command = [str(RELEASE / client), "--addr", addr, "--bots", str(bots),
                   "--duration", f"{seconds}s", "--move-interval", interval,
                   "--drain", "3s", "--json", str(json_path), "--label", label, *extra]
        have_perf = shutil.which("perf") is not None
        client_perf_path = self.runs_dir / f"{slug}.client-perf.csv"
        if count_events and have_perf:
            command = ["perf", "stat", "-x,", *event_flags(CLIENT_EVENTS),
                       "-o", str(client_perf_path), "--", *command]
        nginx_perf = None
        nginx_perf_path = self.runs_dir / f"{slug}.nginx-perf.csv"
        nginx_pids = dict(watch).get("nginx")
        if count_events and have_perf and nginx_pids:
            nginx_perf = subprocess.Popen(["perf", "stat", "-x,", *event_flags(SERVER_EVENTS),
                                           "-o", str(nginx_perf_path),
                                           "-p", ",".join(map(str, nginx_pids))],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tracer = None
        trace_path = self.runs_dir / f"{slug}.strace"
        names = {}
        if strace_pid is not None:
            tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", str(trace_path),
                                       "-p", str(strace_pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            names = thread_names(strace_pid)
        gateway_pid = dict(watch).get("gateway", [None])[0]
        perf = None
        perf_path = self.runs_dir / f"{slug}.perf.csv"
        if gateway_pid and have_perf:
            # Counting syscalls with a tracepoint costs the traced process almost nothing,
            # unlike strace, so this count comes from the very run that measures CPU.
            events = SERVER_EVENTS if count_events else SERVER_EVENTS[:1]
            perf = subprocess.Popen(["perf", "stat", "-x,", *event_flags(events),
                                     "--per-thread", "-o", str(perf_path),
                                     "-p", str(gateway_pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if perf or nginx_perf:
            time.sleep(0.3)
        cpu_before = {name: cpu_seconds(pids) for name, pids in watch}
        threads_before = cpu_by_thread_name(gateway_pid) if gateway_pid else {}
        wall_before = time.time()
        with open(self.runs_dir / f"{slug}.log", "w") as progress:
            bots_process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=progress)
            # wait4 gives the load generator's own CPU time (all its threads).
            _, status, usage = os.wait4(bots_process.pid, 0)
            bots_process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.time() - wall_before
        cpu = {name: cpu_seconds(pids) - cpu_before[name] for name, pids in watch}
        if watch:
            cpu["loadtest"] = usage.ru_utime + usage.ru_stime
        threads = {}
        if gateway_pid:
            after = cpu_by_thread_name(gateway_pid)
            threads = {kind: round(after[kind] - threads_before.get(kind, 0), 3)
                       for kind in after}
        if tracer is not None:
            stop(tracer, "strace", signal.SIGINT)
        perf_counts = None
        if perf is not None:
            stop(perf, "perf", signal.SIGINT)
            perf_counts = read_perf_counts(perf_path)
        if nginx_perf is not None:
            stop(nginx_perf, "perf", signal.SIGINT)
        if bots_process.returncode != 0:
            raise RuntimeError(f"{client} {label} failed; see {self.runs_dir / (slug + '.log')}")
        summary = json.loads(json_path.read_text())
        messages = summary["moves_sent"] + summary["moves_acked"] + summary["notifications"]
        result = {
            "label": label, "client": client,
            "summary_file": str(json_path.relative_to(self.out)),
            "bots": summary["bots_connected"], "moves_sent": summary["moves_sent"],
            "moves_acked": summary["moves_acked"], "moves_lost": summary["moves_lost"],
            "moves_errored": summary["moves_errored"], "disconnects": summary["disconnects"],
            "notifications": summary["notifications"],
            "notifications_per_s": summary["notifications_per_s"],
            "messages": messages, "wall_s": round(wall, 3),
            "p50_ms": summary["delay_ms"]["p50"], "p99_ms": summary["delay_ms"]["p99"],
            "p999_ms": summary["delay_ms"].get("p999"),
            "send_lag_max_ms": summary["send_lag_max_ms"],
            "cpu_s": {name: round(value, 3) for name, value in cpu.items()},
            "cpu_us_per_msg": {name: round(value * 1e6 / max(messages, 1), 3)
                               for name, value in cpu.items()},
            "gateway_cpu_s_by_thread": threads,
        }
        if summary.get("ramp"):
            result["ramp_largest_passing"] = summary["ramp"]["largest_passing"]
            result["ramp_stopped_because"] = summary["ramp"]["stopped_because"]
            result["ramp_steps"] = summary["ramp"]["steps"]
        if tracer is not None:
            result["syscalls"] = count_syscalls(trace_path, names, messages)
            trace_path.unlink(missing_ok=True)
        if perf_counts and perf_counts.get(SERVER_EVENTS[0]):
            result["syscalls_perf"] = per_message(perf_counts[SERVER_EVENTS[0]], messages)
        if count_events and perf_counts:
            result["gateway_events"] = {event: per_message(perf_counts.get(event, {}), messages)
                                        for event in SERVER_EVENTS}
        if nginx_perf is not None:
            result["nginx_events"] = totals_per_message(read_perf_counts(nginx_perf_path),
                                                        messages)
        if count_events and have_perf:
            result["client_events"] = totals_per_message(read_perf_counts(client_perf_path),
                                                         messages)
        # The client's sleeps (voluntary context switches, all its threads), from wait4.
        result["client_voluntary_switches_per_msg"] = round(usage.ru_nvcsw / max(messages, 1), 4)
        if summary.get("client_io"):
            result["client_io"] = summary["client_io"]
        if section:
            self.manifest_sections.setdefault(section, []).append(
                {"label": label, "summary": str(json_path.relative_to(self.out))})
        cpu_text = ", ".join(f"{n} {v} µs/msg" for n, v in result["cpu_us_per_msg"].items())
        log(f"  -> p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
            f"{messages / max(wall, 1e-3):.0f} msgs/s, lost {result['moves_lost']}"
            + (f", {cpu_text}" if cpu_text else "")
            + (f", ramp largest passing {result.get('ramp_largest_passing')}"
               if "ramp_largest_passing" in result else "")
            + (f", syscalls/msg {result['syscalls']['all_per_msg']} (all threads) "
               f"{result['syscalls']['workers_per_msg']} (I/O workers)"
               if "syscalls" in result else ""))
        return result

    def ramp(self, label, cluster, section, watch=()):
        s = self.s
        # The longest the ramp may run: every step's connects, settling and window, plus
        # slack; the ramp ends earlier at its first failing step.
        steps = -(-s["ramp_max"] // s["ramp_step"])
        bound = steps * (s["ramp_step_seconds"] + 2 + s["ramp_step"] // 1000) + 10
        return self.loadtest(
            label, cluster.game, s["ramp_max"], bound, CAPACITY_INTERVAL,
            extra=["--ramp", "--ramp-step", str(s["ramp_step"]),
                   "--ramp-step-duration", f"{s['ramp_step_seconds']}s",
                   "--max-p99", f"{MAX_P99_MS}ms"],
            section=section, watch=watch)

    # ---- the comparisons -----------------------------------------------------------

    def run(self):
        s = self.s
        work = self.out / "work"
        work.mkdir(exist_ok=True)
        r = self.results
        if self.args.only_game:
            r["game"] = self.game(work)
            return
        if self.args.only_tls:
            self.tls(work)
            return
        if self.args.only_relay:
            self.relay_clients(work)
            return
        if self.args.only_io:
            self.io_only(work)
            return
        if self.args.only_ws:
            log("cluster: 1 gateway (--io=uring) + 1 shard")
            cluster = Cluster(work, "bench-ws", 1, "uring")
            try:
                watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
                self.websocket(cluster, watch, work)
            finally:
                cluster.stop()
            return
        spread = dict(bots=s["io_bots"], seconds=s["io_seconds"], interval=s["io_interval"])
        io_section = "Gateway I/O: io_uring vs epoll (same workloads)"
        relay_section = "Relay hop: bots -> proxy -> gateway vs bots -> gateway"

        for io in ("uring", "epoll"):
            log(f"cluster: 1 gateway (--io={io}) + 1 shard")
            cluster = Cluster(work, f"bench-{io}-1", 1, io)
            try:
                watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
                r[f"{io}_direct"] = self.loadtest(f"{io} spread", cluster.game, **spread,
                                                  watch=watch, section=io_section)
                if io == "uring" and cluster.quic:
                    # The same workload over the QUIC front of the same gateway.
                    r["quic_direct"] = self.loadtest(
                        "quic spread", cluster.quic, **spread, watch=watch,
                        extra=["--transport", "quic", "--insecure"],
                        section="Transport: TCP vs QUIC (same gateway, same workload)")
                    self.manifest_sections["Transport: TCP vs QUIC (same gateway, same workload)"]\
                        .insert(0, {"label": "uring spread",
                                    "summary": r["uring_direct"]["summary_file"]})
                if io == "uring" and cluster.ws:
                    self.websocket(cluster, watch, work)
                self.io_syscall_runs(cluster, io, watch, io_section)
                if io == "uring" and not self.args.no_proxies:
                    self.manifest_sections[relay_section] = [
                        {"label": "uring spread", "summary": r["uring_direct"]["summary_file"]}]
                    for kind in ("nginx", "haproxy"):
                        proxy = Proxy(work, kind, cluster.game_port)
                        try:
                            r[f"{kind}_relay"] = self.loadtest(
                                f"via {kind}", f"127.0.0.1:{proxy.port}", **spread,
                                watch=watch + [(kind, proxy.pids())], section=relay_section)
                        finally:
                            proxy.stop()
                    # The direct run again, after the proxies: the two direct runs bracket
                    # them and their difference shows how much the machine drifted.
                    r["uring_direct_again"] = self.loadtest(
                        "uring spread, again", cluster.game, **spread, watch=watch,
                        section=relay_section)
                r[f"{io}_ramp"] = self.ramp(f"{io} ramp", cluster,
                                            "Capacity ramp: 1 move/s per bot")
            finally:
                cluster.stop()

        log("cluster: 1 gateway (--io=uring) + 4 shards")
        cluster = Cluster(work, "bench-uring-4", 4, "uring")
        shard_section = "Shards: 1 vs 4 (same workloads)"
        try:
            watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
            self.manifest_sections[shard_section] = [
                {"label": "uring spread", "summary": r["uring_direct"]["summary_file"]},
                {"label": "uring dense", "summary": r["uring_dense"]["summary_file"]}]
            r["uring4_direct"] = self.loadtest("4 shards spread", cluster.game, **spread,
                                               watch=watch, section=shard_section)
            r["uring4_dense"] = self.dense(cluster, "4 shards dense", watch, shard_section)
            bots = s["capacity_bots"]
            window = s["capacity_window_seconds"]
            # One ramp step of all the bots: connect them (1 per ms), let them settle, then
            # measure a window in steady state; the whole run's numbers are kept as well.
            r["capacity"] = self.loadtest(
                f"capacity {bots} bots, 4 shards", cluster.game, bots,
                bots // 1000 + window + 15, CAPACITY_INTERVAL, watch=watch,
                extra=["--ramp", "--ramp-start", str(bots), "--ramp-step", str(bots),
                       "--ramp-step-duration", f"{window}s", "--max-p99", f"{MAX_P99_MS}ms"],
                section="Capacity: 1 gateway + 4 shards, 1 move/s")
            r["uring4_ramp"] = self.ramp("4 shards ramp", cluster,
                                         "Capacity ramp: 1 move/s per bot")
        finally:
            cluster.stop()

        if not self.args.no_proxies:
            self.relay_clients(work)

        log("clusters: 1 gateway + 1 shard, mutual TLS on and off")
        self.tls(work)

        if not self.args.no_micro:
            r["micro"] = self.micro_benchmarks()
        if not self.args.no_game:
            r["game"] = self.game(work)

    def game(self, work):
        """The game section (issue 13): see game.py."""
        return game.GameBench(self, Cluster, work, cpu_seconds, log).run()

    def tls(self, work):
        """The cost of mutual TLS on the gRPC links (issue 15): the gateway's and the
        shard's CPU per relayed message and the delay, TLS on and off, A B B A."""
        s = self.s
        load = dict(bots=s["io_bots"], seconds=s["io_seconds"], interval=s["io_interval"])
        for key, secure, label in TLS_RUNS:
            extra = () if secure else ("--insecure-grpc",)
            cluster = Cluster(work, f"bench-{key.replace('_', '-')}", 1, "uring", extra=extra)
            try:
                watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
                self.results[key] = self.loadtest(label, cluster.game, **load, watch=watch,
                                                  section=TLS_SECTION)
            finally:
                cluster.stop()

    def websocket(self, cluster, watch, work):
        """TCP against the WebSocket front of the same gateway (issue 14): the same bots,
        spread over the map, run A B B A (see WS_RUNS); with a baseline build, its
        WebSocket runs in the middle."""
        s = self.s
        load = dict(bots=s["ws_bots"], seconds=s["ws_seconds"], interval=s["ws_interval"])
        for key, transport, label in WS_RUNS:
            if key == "ws_ws_2" and self.args.ws_baseline:
                log(f"cluster: the baseline build {self.args.ws_baseline}")
                base = Cluster(work, "bench-ws-base", 1, "uring", binary=self.args.ws_baseline)
                try:
                    base_watch = [("gateway", [base.gateway_pid]), ("shards", base.shard_pids)]
                    for base_key, _, base_label in WS_BASELINE_RUNS:
                        self.results[base_key] = self.loadtest(
                            base_label, base.ws, **load, watch=base_watch,
                            extra=["--transport", "ws"], section=WS_SECTION)
                finally:
                    base.stop()
            if transport == "tcp":
                self.results[key] = self.loadtest(label, cluster.game, **load, watch=watch,
                                                  section=WS_SECTION)
            else:
                self.results[key] = self.loadtest(label, cluster.ws, **load, watch=watch,
                                                  extra=["--transport", "ws"],
                                                  section=WS_SECTION)

    def io_syscall_runs(self, cluster, io, watch, section):
        """The runs after the spread one for backend `io`: spread under strace, dense (perf
        counting), dense under strace."""
        s, r = self.s, self.results
        r[f"{io}_strace"] = self.loadtest(
            f"{io} spread, strace", cluster.game, s["io_bots"], s["strace_seconds"],
            s["io_interval"], strace_pid=cluster.gateway_pid)
        r[f"{io}_dense"] = self.dense(cluster, f"{io} dense", watch, section)
        r[f"{io}_dense_strace"] = self.dense(cluster, f"{io} dense, strace", None, None,
                                             seconds=s["strace_seconds"],
                                             strace_pid=cluster.gateway_pid)

    def io_only(self, work):
        """io_uring against epoll alone: for each, one cluster (1 shard), the spread and the
        dense workloads, each with a perf run and a strace run of the whole gateway process
        (system calls per message of all its threads, and of its I/O workers alone)."""
        s, r = self.s, self.results
        spread = dict(bots=s["io_bots"], seconds=s["io_seconds"], interval=s["io_interval"])
        io_section = "Gateway I/O: io_uring vs epoll (same workloads)"
        for io in ("uring", "epoll"):
            log(f"cluster: 1 gateway (--io={io}) + 1 shard")
            cluster = Cluster(work, f"bench-{io}-1", 1, io)
            try:
                watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
                r[f"{io}_direct"] = self.loadtest(f"{io} spread", cluster.game, **spread,
                                                  watch=watch, section=io_section)
                self.io_syscall_runs(cluster, io, watch, io_section)
            finally:
                cluster.stop()

    def relay_clients(self, work):
        """The relay hop with two load clients (issue 17): one cluster (1 shard, 1 io_uring
        gateway); for every number of bots in `relay_bots` and each client of
        RELAY_CLIENTS, the spread workload direct, through nginx `stream` (a fresh nginx per
        run) and direct again, with perf counting system calls, wake-ups and context
        switches on the gateway, nginx and the client."""
        s = self.s
        log("cluster: 1 gateway (--io=uring) + 1 shard, the relay hop with two clients")
        cluster = Cluster(work, "bench-relay", 1, "uring")
        relay = self.results.setdefault("relay_clients", {})
        try:
            watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
            for i, bots in enumerate(s["relay_bots"]):
                # The clients take turns going first, so a drift of the shared machine
                # over the runs weighs on both.
                for name, binary in RELAY_CLIENTS[::1 if i % 2 == 0 else -1]:
                    runs = relay.setdefault(name, {}).setdefault(str(bots), {})
                    section = f"Relay hop, client {name}"
                    for key, path in RELAY_PATHS:
                        label = f"{name} {bots} {path}"
                        load = dict(bots=bots, seconds=s["relay_seconds"],
                                    interval=s["relay_interval"], section=section,
                                    client=binary, count_events=True)
                        if key != "nginx":
                            runs[key] = self.loadtest(label, cluster.game, watch=watch, **load)
                            continue
                        proxy = Proxy(work, "nginx", cluster.game_port)
                        try:
                            runs[key] = self.loadtest(label, f"127.0.0.1:{proxy.port}",
                                                      watch=watch + [("nginx", proxy.pids())],
                                                      **load)
                        finally:
                            proxy.stop()
        finally:
            cluster.stop()

    def dense(self, cluster, label, watch, section, seconds=None, strace_pid=None):
        """The densest workload: every bot in sight of every other, moving 4 times a second;
        it overloads this machine, which is what the syscall comparison asks for."""
        s = self.s
        side = s["dense_side"]
        # Around the map's centre: with 4 shards the area spans the four-way corner.
        x0 = 200 - side // 2
        area = f"{x0},{x0},{x0 + side - 1},{x0 + side - 1}"
        return self.loadtest(
            label, cluster.game, s["dense_bots"], seconds or s["dense_seconds"],
            s["dense_interval"], extra=["--spawn-area", area], watch=watch or (),
            section=section, strace_pid=strace_pid)

    def micro_benchmarks(self):
        log("micro-benchmarks (divan): codec and view diff")
        results = {}
        for package, bench in (("meridian-protocol", "codec"), ("meridian-world", "view_diff")):
            self.note_builds()
            output = subprocess.run(
                ["cargo", "bench", "-q", "-p", package, "--bench", bench, "--",
                 *self.s["bench_args"]],
                cwd=ROOT, capture_output=True, text=True, timeout=900)
            if output.returncode != 0:
                raise RuntimeError(f"cargo bench {package}: {output.stderr[-2000:]}")
            (self.runs_dir / f"micro-{bench}.txt").write_text(output.stdout)
            results[bench] = parse_divan(output.stdout)
            log(f"  -> {bench}: {len(results[bench])} benchmarks")
        return results

    # ---- output ----------------------------------------------------------------------

    def machine(self):
        model = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
        commit = sh(f"git -C {ROOT} rev-parse --short HEAD")
        dirty = sh(f"git -C {ROOT} status --porcelain --untracked-files=no")
        return {
            "nproc": os.cpu_count(), "kernel": os.uname().release, "cpu": model or "unknown",
            "memory": sh("free -h | awk '/Mem:/ {print $2}'"),
            "commit": commit + ("-dirty" if dirty else ""),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "load_average_at_start": self.load_at_start,
            "concurrent_rustc_seen": self.builds_seen,
            "nginx": sh("nginx -v 2>&1"), "haproxy": sh("haproxy -v | head -1"),
        }

    def rerender(self):
        data = json.loads((self.out / "bench.json").read_text())
        manifest = json.loads((self.out / "manifest.json").read_text())
        self.mode, self.s, self.results = data["mode"], data["settings"], data["results"]
        self.manifest_sections = {x["name"]: x["runs"] for x in manifest["sections"]}
        self.elapsed = data["elapsed_s"]
        self.saved_machine = data["machine"]
        self.write()
        return 0

    def write(self):
        machine = getattr(self, "saved_machine", None) or self.machine()
        tables = build_tables(self.results, self.s)
        elapsed = getattr(self, "elapsed", None) or round(time.time() - self.started, 1)
        data = {"mode": self.mode, "settings": self.s, "max_p99_ms": MAX_P99_MS,
                "machine": machine, "elapsed_s": elapsed, "results": self.results,
                "tables": tables}
        (self.out / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
        notes = [
            f"{machine['nproc']} cores ({machine['cpu']}), kernel {machine['kernel']}, "
            f"{machine['memory']} RAM; commit {machine['commit']}; {machine['date_utc']} UTC",
            f"mode {self.mode}; the suite took {elapsed} s; load average at start "
            f"{machine['load_average_at_start']}; up to {machine['concurrent_rustc_seen']} "
            "rustc processes of other builds were seen running during the suite",
            "bots, servers and proxies share the same cores: ratios hold better than "
            "absolute numbers",
        ]
        manifest = {
            "title": f"Meridian benchmarks ({self.mode}, {machine['commit']})",
            "notes": notes, "tables": tables,
            "sections": [{"name": name, "runs": runs}
                         for name, runs in self.manifest_sections.items()],
        }
        (self.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
        subprocess.run([str(RELEASE / "loadtest-report"), "--manifest",
                        str(self.out / "manifest.json"), "--out", str(self.out / "report.html"),
                        "--svg-dir", str(self.out / "svg")], check=True)
        markdown = render_markdown(tables, notes, self.s)
        (self.out / "tables.md").write_text(markdown)
        log(f"wrote {self.out}/report.html, bench.json, tables.md in {elapsed} s")
        if self.args.update_docs:
            update_docs(self.out, markdown)
        print(markdown)


def per_message(by_kind, messages):
    """Syscall counts by thread kind -> totals and per-message figures."""
    total = sum(by_kind.values())
    workers = sum(count for kind, count in by_kind.items() if kind.startswith("gw-"))
    return {
        "all_threads": total, "io_workers": workers, "by_thread": by_kind,
        "messages": messages,
        "all_per_msg": round(total / max(messages, 1), 4),
        "workers_per_msg": round(workers / max(messages, 1), 4),
    }


def event_flags(events):
    """perf's `-e EVENT` flags for `events`."""
    return [flag for event in events for flag in ("-e", event)]


def read_perf_counts(path):
    """`perf stat -x, [--per-thread] -e EVENT ...` output -> {event: {thread kind: n}}.

    With --per-thread every line starts with the thread ("gw-uring-0-1234": its name, then
    its id; numbered threads of one kind are summed); without it the count comes first and
    the whole is filed under the kind "all"."""
    counts = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        fields = line.split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        if fields[0].isdigit() or fields[0].startswith("<"):
            kind, value, event = "all", fields[0], fields[2]
        elif len(fields) >= 4:
            kind = re.sub(r"(-\d+)?-\d+$", "", fields[0])
            value, event = fields[1], fields[3]
        else:
            continue
        if not value.isdigit():
            continue  # "<not counted>" or "<not supported>"
        by_kind = counts.setdefault(event, {})
        by_kind[kind] = by_kind.get(kind, 0) + int(value)
    return counts


def read_perf_syscalls(path):
    """`perf stat -x, --per-thread -e raw_syscalls:sys_enter` output -> {thread kind: n}."""
    return read_perf_counts(path).get("raw_syscalls:sys_enter", {})


def totals_per_message(counts, messages):
    """{event: {kind: n}} -> {event: n per message}, every kind summed."""
    return {event: round(sum(by_kind.values()) / max(messages, 1), 4)
            for event, by_kind in counts.items()}


def count_syscalls(path, names, messages):
    """Counts system calls per thread from `strace -f` output (one line per call)."""
    per_thread = {}
    line_start = re.compile(r"^(\d+)\s+([a-z_0-9]+)\(")
    with open(path, errors="replace") as lines:
        for line in lines:
            match = line_start.match(line)
            if match:
                tid = int(match.group(1))
                per_thread[tid] = per_thread.get(tid, 0) + 1
            elif "<..." in line and "resumed>" in line:
                continue
    by_name = {}
    for tid, count in per_thread.items():
        name = names.get(tid, "other")
        by_name[name] = by_name.get(name, 0) + count
    return per_message(by_name, messages)


def parse_duration(text):
    """A duration as the `meridian` and `loadtest` flags write it (`250ms`, `30s`, `1m30s`,
    `2h`; a bare number is seconds), in seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return float(text)
    parts = re.findall(r"(\d+)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 250ms, 30s, 1m30s")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(n) * scale[u] for n, u in parts)


def parse_divan(text):
    """Rows of divan's table as {"group/name/arg": {"fastest", "median"}}.

    divan aligns its columns: the header line gives where "fastest" starts and where each
    "│" separator sits, and every row uses the same character positions (the tree drawing
    in front of the names uses "│" too, so rows cannot simply be split on it)."""
    rows = {}
    lines = text.splitlines()
    header = next((line for line in lines if "fastest" in line and "median" in line), None)
    if header is None:
        return rows
    fastest_at = header.index("fastest")
    separators = [i for i, c in enumerate(header) if c == "│"]
    if len(separators) < 2:
        return rows
    stack = []
    for line in lines:
        if line is header or len(line) <= separators[1]:
            continue
        name_area = line[:fastest_at]
        name = name_area.strip(" │├╰─")
        if not name:
            continue
        # "├─ name" is depth 0 (below the header's group), "│  ├─ arg" depth 1, ...
        depth = max((len(name_area) - len(name_area.lstrip(" │├╰─"))) // 3 - 1, 0)
        stack = stack[:depth] + [name]
        fastest = line[fastest_at:separators[0]].strip()
        median = line[separators[1] + 1:separators[2]].strip() if len(separators) > 2 else ""
        if fastest:
            rows["/".join(stack)] = {"fastest": fastest, "median": median}
    return rows


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def times_fewer(many, few):
    value = ratio(many, few)
    return f"{fmt(value)}x fewer" if value else "-"


def gateway_thread_split(run):
    """The gateway's CPU per message by thread group: the WebSocket front (`gw-ws`), the
    io_uring (or epoll) workers, and everything else (the tokio threads of the gRPC streams
    to the shards, the admin server, the main thread)."""
    threads = run.get("gateway_cpu_s_by_thread") or {}
    groups = {"gw-ws": 0.0, "I/O workers": 0.0, "other threads": 0.0}
    for kind, seconds in threads.items():
        if kind == "gw-ws":
            group = "gw-ws"
        elif kind in ("gw-uring", "gw-epoll"):
            group = "I/O workers"
        else:
            group = "other threads"
        groups[group] += seconds
    messages = max(run["messages"], 1)
    return {group: round(seconds * 1e6 / messages, 3) for group, seconds in groups.items()}


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def websocket_table(r, s):
    """TCP vs WebSocket through one gateway: the mean of each transport's runs, their
    ratio, and every run apart (their spread shows what the busy machine did)."""
    runs = {"tcp": [], "ws": [], "base": []}
    for key, transport, _ in WS_RUNS + WS_BASELINE_RUNS:
        if r.get(key):
            runs[transport].append(r[key])
    if not (runs["tcp"] and runs["ws"]):
        return None
    kinds = ["tcp", "ws"] + (["base"] if runs["base"] else [])
    measures = [
        ("delay p50 (ms)", lambda x: x["p50_ms"], 3),
        ("delay p99 (ms)", lambda x: x["p99_ms"], 3),
        ("delay p999 (ms)", lambda x: x.get("p999_ms"), 3),
        ("messages relayed / s", lambda x: x["messages"] / x["wall_s"], 0),
        ("moves lost", lambda x: x["moves_lost"], 0),
        ("gateway CPU µs / message", lambda x: x["cpu_us_per_msg"]["gateway"], 2),
    ]
    for group in ("gw-ws", "I/O workers", "other threads"):
        measures.append((f"of it in {group} (µs / message)",
                         lambda x, g=group: gateway_thread_split(x)[g], 2))
    measures.append(("loadtest CPU µs / message", lambda x: x["cpu_us_per_msg"].get("loadtest"),
                     2))
    rows = []
    for label, value, digits in measures:
        values = {kind: [value(x) for x in runs[kind]] for kind in kinds}
        means = {kind: mean(values[kind]) for kind in kinds}
        row = [label]
        for kind in kinds:
            row.append(fmt(round_to(means[kind], digits), digits))
            if kind != "tcp":
                versus = ratio(means[kind], means["tcp"])
                row.append(f"{fmt(versus)}x" if versus else "-")
        row += [" / ".join(fmt(round_to(v, digits), digits) for v in values[kind])
                for kind in kinds]
        rows.append(row)
    header = ["measure", "TCP (io_uring)", "WebSocket", "WS vs TCP"]
    if "base" in kinds:
        header += ["WS, baseline build", "baseline vs TCP"]
    header += ["TCP runs", "WS runs"] + (["baseline runs"] if "base" in kinds else [])
    return {"title": f"Transport: TCP vs WebSocket through one io_uring gateway: "
                     f"{s['ws_bots']} bots spread over the map, a move per {s['ws_interval']}, "
                     f"{s['ws_seconds']} s per run, 1 shard",
            "header": header, "rows": rows}


def relay_figures(x):
    """The figures of one relay run that the two-client tables show (None when missing)."""
    if not x:
        return {}
    cpu = x.get("cpu_us_per_msg", {})
    perf = x.get("syscalls_perf") or {}
    gateway = x.get("gateway_events") or {}
    client = x.get("client_events") or {}
    nginx = x.get("nginx_events") or {}

    def total(counts, *events):
        values = [counts[e] for e in events if e in counts]
        return round(sum(values), 4) if values else None

    return {
        "gateway_cpu": cpu.get("gateway"), "nginx_cpu": cpu.get("nginx"),
        "client_cpu": cpu.get("loadtest"),
        "p50": x.get("p50_ms"), "p99": x.get("p99_ms"), "lost": x.get("moves_lost"),
        "messages_per_s": x["messages"] / x["wall_s"] if x.get("wall_s") else None,
        "gateway_syscalls": perf.get("all_per_msg"),
        "gateway_syscalls_io": perf.get("workers_per_msg"),
        "gateway_wakeups": gateway.get("sched:sched_waking", {}).get("all_per_msg"),
        "gateway_wakeups_io": gateway.get("sched:sched_waking", {}).get("workers_per_msg"),
        "gateway_switches": gateway.get("sched:sched_switch", {}).get("all_per_msg"),
        "gateway_switches_io": gateway.get("sched:sched_switch", {}).get("workers_per_msg"),
        "nginx_wakeups": nginx.get("sched:sched_waking"),
        "nginx_syscalls": nginx.get("raw_syscalls:sys_enter"),
        "client_syscalls": client.get("raw_syscalls:sys_enter"),
        "client_reads": total(client, "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_read"),
        "client_waits": total(client, "syscalls:sys_enter_epoll_wait",
                              "syscalls:sys_enter_epoll_pwait"),
        "client_sleeps": x.get("client_voluntary_switches_per_msg"),
    }


def relay_direct_mean(runs, key):
    """The mean of a figure over a client's direct runs (before and after nginx)."""
    return mean([relay_figures(runs.get(k)).get(key) for k in ("direct", "direct_again")])


def relay_client_tables(r, s):
    """The relay hop with two clients: a table per client (every run), one that sets the
    clients side by side on what they change (the direct runs' means), and the ratio of
    the gateway's CPU per message to nginx's. loadtest/scripts/wakeups.py breaks the
    wake-ups down by who wakes whom."""
    relay = r.get("relay_clients")
    if not relay:
        return []
    load = (f"1 shard, 1 io_uring gateway, nginx stream with 2 workers; bots spread over the "
            f"map, a move per {s['relay_interval']}, {s['relay_seconds']} s per run")
    tables = []
    for name, _ in RELAY_CLIENTS:
        by_bots = relay.get(name)
        if not by_bots:
            continue
        rows = []
        for bots, runs in sorted(by_bots.items(), key=lambda item: int(item[0])):
            direct_gateway = relay_direct_mean(runs, "gateway_cpu")
            for key, path in RELAY_PATHS:
                f = relay_figures(runs.get(key))
                if not f:
                    continue
                versus = ratio(direct_gateway, f["nginx_cpu"]) if key == "nginx" else None
                rows.append([fmt(int(bots)), path, fmt(f["gateway_cpu"]), fmt(f["nginx_cpu"]),
                             f"{fmt(versus)}x" if versus else "-",
                             fmt(f["p50"], 3), fmt(f["p99"], 3),
                             fmt(f["gateway_syscalls"], 3), fmt(f["gateway_syscalls_io"], 3),
                             fmt(f["gateway_wakeups"], 3), fmt(f["client_reads"], 3),
                             fmt(f["client_sleeps"], 3), fmt(f["client_cpu"]), fmt(f["lost"])])
        tables.append({
            "title": f"Relay hop, client {name}: bots -> gateway vs bots -> nginx -> gateway; "
                     f"{load}",
            "header": ["bots", "path", "gateway CPU µs/msg", "nginx CPU µs/msg",
                       "gateway (direct, mean) / nginx", "p50 ms", "p99 ms",
                       "gateway syscalls/msg, whole process", "gateway syscalls/msg, I/O threads",
                       "gateway wake-ups/msg", "client reads/msg", "client sleeps/msg",
                       "client CPU µs/msg", "lost"],
            "rows": rows})
    names = [name for name, _ in RELAY_CLIENTS]
    sizes = sorted({int(b) for name in names for b in relay.get(name, {})})
    if all(relay.get(name) for name in names) and sizes:
        a, b = names
        measures = [
            ("gateway CPU µs / message", "gateway_cpu", 2),
            ("gateway syscalls / message, whole process", "gateway_syscalls", 3),
            ("gateway syscalls / message, I/O threads", "gateway_syscalls_io", 3),
            ("gateway wake-ups of other threads / message (sched_waking in the gateway)",
             "gateway_wakeups", 3),
            ("... of them by the I/O threads", "gateway_wakeups_io", 3),
            ("gateway context switches / message (its own sleeps)", "gateway_switches", 3),
            ("... of them by the I/O threads", "gateway_switches_io", 3),
            ("client CPU µs / message", "client_cpu", 2),
            ("client syscalls / message", "client_syscalls", 3),
            ("client reads / message", "client_reads", 3),
            ("client epoll waits / message", "client_waits", 3),
            ("client sleeps / message (voluntary context switches)", "client_sleeps", 3),
            ("messages relayed / s", "messages_per_s", 0),
            ("delay p50 (ms)", "p50", 3),
            ("delay p99 (ms)", "p99", 3),
        ]
        nginx_measures = [
            ("through nginx: nginx CPU µs / message", "nginx_cpu", 2),
            ("through nginx: nginx wake-ups of other threads / message", "nginx_wakeups", 3),
            ("through nginx: gateway CPU µs / message behind it", "gateway_cpu", 2),
        ]
        rows = []
        for label, key, digits in measures:
            row = [f"direct: {label}"]
            for bots in sizes:
                va, vb = (relay_direct_mean(relay[n].get(str(bots), {}), key) for n in names)
                row += [fmt(round_to(va, digits), digits), fmt(round_to(vb, digits), digits),
                        f"{fmt(ratio(vb, va))}x" if ratio(vb, va) else "-"]
            rows.append(row)
        for label, key, digits in nginx_measures:
            row = [label]
            for bots in sizes:
                va, vb = (relay_figures(relay[n].get(str(bots), {}).get("nginx")).get(key)
                          for n in names)
                row += [fmt(round_to(va, digits), digits), fmt(round_to(vb, digits), digits),
                        f"{fmt(ratio(vb, va))}x" if ratio(vb, va) else "-"]
            rows.append(row)
        row = ["gateway (direct, mean) / nginx, CPU per message"]
        for bots in sizes:
            values = [relay_gateway_vs_nginx(relay[n].get(str(bots), {})) for n in names]
            row += [f"{fmt(v)}x" if v else "-" for v in values] + [""]
        rows.append(row)
        header = ["measure"]
        for bots in sizes:
            header += [f"{a}, {bots:,} bots", f"{b}, {bots:,} bots", f"{b} / {a}"]
        tables.append({"title": f"Relay hop: what the client changes ({a} vs {b}); {load}",
                       "header": header, "rows": rows})
    return tables


def relay_gateway_vs_nginx(runs):
    """The gateway's CPU per message direct (mean of the runs before and after) over
    nginx's own in front of it, for one client and number of bots."""
    nginx = relay_figures(runs.get("nginx")).get("nginx_cpu")
    return ratio(relay_direct_mean(runs, "gateway_cpu"), nginx)


def tls_table(r, s):
    """Mutual TLS on the gRPC links against gRPC in the clear: the mean of each's runs,
    their ratio, and every run apart."""
    runs = {True: [], False: []}
    for key, secure, _ in TLS_RUNS:
        if r.get(key):
            runs[secure].append(r[key])
    if not (runs[True] and runs[False]):
        return None
    measures = [
        ("delay p50 (ms)", lambda x: x["p50_ms"], 3),
        ("delay p99 (ms)", lambda x: x["p99_ms"], 3),
        ("messages relayed / s", lambda x: x["messages"] / x["wall_s"], 0),
        ("moves lost", lambda x: x["moves_lost"], 0),
        ("gateway CPU µs / message", lambda x: x["cpu_us_per_msg"]["gateway"], 2),
        ("shard CPU µs / message", lambda x: x["cpu_us_per_msg"]["shards"], 2),
    ]
    rows = []
    for label, value, digits in measures:
        on = [value(x) for x in runs[True]]
        off = [value(x) for x in runs[False]]
        on_mean, off_mean = mean(on), mean(off)
        rows.append([label, fmt(round_to(on_mean, digits), digits),
                     fmt(round_to(off_mean, digits), digits),
                     f"{fmt(ratio(on_mean, off_mean))}x" if ratio(on_mean, off_mean) else "-",
                     " / ".join(fmt(round_to(v, digits), digits) for v in on),
                     " / ".join(fmt(round_to(v, digits), digits) for v in off)])
    return {"title": f"Mutual TLS on the gRPC links vs gRPC in the clear: {s['io_bots']} bots "
                     f"spread over the map, a move per {s['io_interval']}, {s['io_seconds']} s "
                     f"per run, 1 shard, 1 io_uring gateway, a cluster per run",
            "header": ["measure", "mutual TLS", "in the clear", "TLS vs clear", "TLS runs",
                       "clear runs"],
            "rows": rows}


def round_to(value, digits):
    """`value` rounded for `fmt`: whole numbers become ints (thousands separators)."""
    if value is None:
        return None
    return int(round(value)) if digits == 0 else float(value)


def io_rows(r, prefix_a, prefix_b):
    """Rows comparing two gateway runs (and their strace runs) on one workload."""
    a, b = r.get(prefix_a), r.get(prefix_b)
    if not (a and b):
        return []
    rows = []
    sources = [("perf, this run", a.get("syscalls_perf"), b.get("syscalls_perf"))]
    ta, tb = r.get(prefix_a + "_strace"), r.get(prefix_b + "_strace")
    if ta and tb:
        sources.append(("strace run", ta["syscalls"], tb["syscalls"]))
    for source, sa, sb in sources:
        if not (sa and sb):
            continue
        for key, what in (("all_per_msg", "syscalls / message, all gateway threads"),
                          ("workers_per_msg", "syscalls / message, I/O worker threads only")):
            rows.append([f"{what} ({source})", fmt(sa[key], 4), fmt(sb[key], 4),
                         times_fewer(sb[key], sa[key])])
    ga, gb = a["cpu_us_per_msg"]["gateway"], b["cpu_us_per_msg"]["gateway"]
    rows.append(["gateway CPU µs / message", fmt(ga), fmt(gb), f"{fmt(ratio(ga, gb))}x"])
    for what, key in (("delay p50 (ms)", "p50_ms"), ("delay p99 (ms)", "p99_ms")):
        rows.append([what, fmt(a[key], 3), fmt(b[key], 3), f"{fmt(ratio(a[key], b[key]))}x"])
    rows.append(["messages relayed / s", fmt(a["messages"] / a["wall_s"], 0),
                 fmt(b["messages"] / b["wall_s"], 0), ""])
    rows.append(["moves lost", fmt(a["moves_lost"]), fmt(b["moves_lost"]), ""])
    return rows


def build_tables(r, s):
    tables = []
    dense_load = (f"{s['dense_bots']} bots in a {s['dense_side']}x{s['dense_side']} area "
                  f"(all in sight of each other), a move per {s['dense_interval']}")
    spread_load = (f"{s['io_bots']} bots spread over the map, a move per {s['io_interval']}")
    header = ["measure", "io_uring", "epoll", "uring vs epoll"]
    rows = io_rows(r, "uring_dense", "epoll_dense")
    if rows:
        tables.append({"title": f"Gateway I/O under overload: {dense_load}, 1 shard",
                       "header": header, "rows": rows})
    rows = io_rows(r, "uring_direct", "epoll_direct")
    if rows:
        tables.append({"title": f"Gateway I/O, light load: {spread_load}, 1 shard",
                       "header": header, "rows": rows})
    ur, er = r.get("uring_ramp"), r.get("epoll_ramp")
    u4r = r.get("uring4_ramp")
    if ur or er or u4r:
        rows = []
        for label, run in (("io_uring, 1 shard", ur), ("epoll, 1 shard", er),
                           ("io_uring, 4 shards", u4r)):
            if run:
                rows.append([label, fmt(run.get("ramp_largest_passing")),
                             run.get("ramp_stopped_because", "")])
        tables.append({"title": f"Capacity (ramp mode): bots added {s['ramp_step']} at a time, "
                                f"{s['ramp_step_seconds']} s windows, 1 move/s, up to "
                                f"{s['ramp_max']}",
                       "header": ["gateway, shards", f"largest N with p99 <= {MAX_P99_MS} ms",
                                  "why the ramp stopped"],
                       "rows": rows})
    u, u2 = r.get("uring_direct"), r.get("uring_direct_again")
    if u and (r.get("nginx_relay") or r.get("haproxy_relay")):
        base = [x for x in (u, u2) if x]
        base_p50, base_p99 = direct_baseline(r)
        rows = []
        for x in base:
            rows.append([f"bots -> gateway ({x['label']})", "-",
                         fmt(x["cpu_us_per_msg"]["gateway"]), fmt(x["p50_ms"], 3),
                         fmt(x["p99_ms"], 3), "-", "-", fmt(x["moves_lost"])])
        for kind in ("nginx", "haproxy"):
            p = r.get(f"{kind}_relay")
            if not p:
                continue
            rows.append([f"bots -> {kind} -> gateway", fmt(p["cpu_us_per_msg"][kind]),
                         fmt(p["cpu_us_per_msg"]["gateway"]), fmt(p["p50_ms"], 3),
                         fmt(p["p99_ms"], 3), fmt(round(p["p50_ms"] - base_p50, 3), 3),
                         fmt(round(p["p99_ms"] - base_p99, 3), 3), fmt(p["moves_lost"])])
        tables.append({"title": f"Relay hop: {spread_load}; added delay against the mean of "
                                "the direct runs before and after",
                       "header": ["path", "proxy CPU µs/msg", "gateway CPU µs/msg",
                                  "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "lost"],
                       "rows": rows})
    tables.extend(relay_client_tables(r, s))
    tcp, quic = r.get("uring_direct"), r.get("quic_direct")
    if tcp and quic:
        rows = []
        for label, key, digits in (("delay p50 (ms)", "p50_ms", 3), ("delay p99 (ms)", "p99_ms", 3),
                                   ("messages relayed", "messages", 0),
                                   ("moves lost", "moves_lost", 0)):
            rows.append([label, fmt(tcp[key], digits), fmt(quic[key], digits),
                         f"{fmt(ratio(quic[key], tcp[key]))}x" if tcp[key] else "-"])
        g_tcp, g_quic = tcp["cpu_us_per_msg"]["gateway"], quic["cpu_us_per_msg"]["gateway"]
        rows.append(["gateway CPU µs / message", fmt(g_tcp), fmt(g_quic),
                     f"{fmt(ratio(g_quic, g_tcp))}x"])
        tables.append({"title": f"Transport: TCP vs QUIC through one io_uring gateway: "
                                f"{spread_load}, 1 shard",
                       "header": ["measure", "TCP (io_uring)", "QUIC", "QUIC vs TCP"],
                       "rows": rows})
    table = websocket_table(r, s)
    if table:
        tables.append(table)
    table = tls_table(r, s)
    if table:
        tables.append(table)
    rows = []
    for what, one, four in (("spread", r.get("uring_direct"), r.get("uring4_direct")),
                            ("dense", r.get("uring_dense"), r.get("uring4_dense"))):
        if not (one and four):
            continue
        for label, key, digits in (("delay p50 (ms)", "p50_ms", 3), ("delay p99 (ms)", "p99_ms", 3),
                                   ("notifications / s", "notifications_per_s", 0),
                                   ("moves lost", "moves_lost", 0)):
            rows.append([f"{what}: {label}", fmt(one[key], digits), fmt(four[key], digits),
                         f"{fmt(ratio(four[key], one[key]))}x" if one[key] else "-"])
        cpu1, cpu4 = one["cpu_us_per_msg"]["shards"], four["cpu_us_per_msg"]["shards"]
        rows.append([f"{what}: shard CPU µs / message (all shards)", fmt(cpu1), fmt(cpu4),
                     f"{fmt(ratio(cpu4, cpu1))}x"])
    if rows:
        tables.append({"title": "Shards: 1 vs 4 behind one io_uring gateway, same workloads",
                       "header": ["measure", "1 shard", "4 shards", "4 vs 1"], "rows": rows})
    cpu_rows = []
    for key, run in r.items():
        if isinstance(run, dict) and run.get("cpu_us_per_msg"):
            c = run["cpu_us_per_msg"]
            threads = run.get("gateway_cpu_s_by_thread", {})
            total = sum(threads.values())
            workers = sum(v for k, v in threads.items() if k.startswith("gw-"))
            share = f"{100 * workers / total:.0f}%" if total else "-"
            cpu_rows.append([run["label"], fmt(run["messages"]), fmt(c.get("gateway")), share,
                             fmt(c.get("shards")), fmt(c.get("nginx", c.get("haproxy"))),
                             fmt(c.get("loadtest"))])
    if cpu_rows:
        tables.append({"title": "Where the CPU goes: µs per relayed message, by process",
                       "header": ["run", "messages", "gateway", "of it in I/O workers",
                                  "shards", "proxy", "loadtest"],
                       "rows": cpu_rows})
    if r.get("game"):
        tables.extend(game.game_tables(r["game"], fmt, ratio))
    if any(key != "game" for key in r):
        tables.append({"title": "Targets of issues 5 and 17",
                       "header": ["target", "measured", "met"], "rows": target_rows(r, s)})
    micro = r.get("micro")
    if micro:
        rows = []
        for bench, entries in micro.items():
            for name, values in entries.items():
                rows.append([f"{bench}::{name}", values["fastest"], values["median"]])
        tables.append({"title": "Micro-benchmarks (divan, per iteration)",
                       "header": ["benchmark", "fastest", "median"], "rows": rows})
    return tables


def every_scope(counts):
    """(source, scope) for every syscall ratio the io_uring verdict weighs."""
    return [(source, scope) for source, _, _ in counts
            for scope in ("I/O workers", "all threads")]


def every_ratio(counts):
    """epoll / io_uring syscalls per message, in `every_scope` order."""
    return [ratio(se[key], su[key]) for _, su, se in counts
            for key in ("workers_per_msg", "all_per_msg")]


def direct_baseline(r):
    """Mean p50 and p99 of the direct runs made around the proxied ones."""
    base = [x for x in (r.get("uring_direct"), r.get("uring_direct_again")) if x]
    return (sum(x["p50_ms"] for x in base) / len(base),
            sum(x["p99_ms"] for x in base) / len(base))


def target_rows(r, s):
    rows = []

    def verdict(ok):
        return "n/a" if ok is None else ("yes" if ok else "**no**")

    ud, ed = r.get("uring_dense_strace"), r.get("epoll_dense_strace")
    u, e = r.get("uring_dense"), r.get("epoll_dense")
    if ud and ed and u and e:
        counts = [("strace", ud["syscalls"], ed["syscalls"])]
        if u.get("syscalls_perf") and e.get("syscalls_perf"):
            counts.insert(0, ("perf", u["syscalls_perf"], e["syscalls_perf"]))
        texts = []
        for source, su, se in counts:
            workers = ratio(se["workers_per_msg"], su["workers_per_msg"])
            every = ratio(se["all_per_msg"], su["all_per_msg"])
            texts.append(f"{source}: {fmt(workers)}x fewer on the I/O worker threads, "
                         f"{fmt(every)}x on all gateway threads")
        gu, ge = u["cpu_us_per_msg"]["gateway"], e["cpu_us_per_msg"]["gateway"]
        met = [x is not None and x >= 47 for x in every_ratio(counts)]
        if gu >= ge or not any(met):
            outcome = verdict(False)
        elif all(met):
            outcome = verdict(True)
        else:
            outcome = "partly: " + ", ".join(
                f"{source} {scope} {'yes' if ok else 'no'}"
                for (source, scope), ok in zip(every_scope(counts), met))
        rows.append(["io_uring: >= 47x fewer syscalls per relayed message than epoll under "
                     "overload, and lower CPU per message",
                     "; ".join(texts) + f" (dense workload); CPU {fmt(gu)} vs {fmt(ge)} µs/msg",
                     outcome])
    d = r.get("uring_direct")
    n, h = r.get("nginx_relay"), r.get("haproxy_relay")
    relay = r.get("relay_clients")
    if relay:
        texts, ratios = [], []
        for name, _ in RELAY_CLIENTS:
            for bots, runs in sorted(relay.get(name, {}).items(), key=lambda i: int(i[0])):
                versus = relay_gateway_vs_nginx(runs)
                ratios.append(versus)
                texts.append(f"{name}, {int(bots):,} bots: gateway "
                             f"{fmt(relay_direct_mean(runs, 'gateway_cpu'))} vs nginx "
                             f"{fmt(relay_figures(runs.get('nginx')).get('nginx_cpu'))} µs/msg "
                             f"({fmt(versus)}x)")
        met = [v is not None and v <= 0.5 for v in ratios]
        rows.append(["relay hop: gateway CPU per relayed message <= half of nginx stream's, "
                     "with both clients, at every number of bots",
                     "; ".join(texts),
                     verdict(bool(met) and all(met)) if all(v is not None for v in ratios)
                     else verdict(None)])
    elif d and n:
        gw = d["cpu_us_per_msg"]["gateway"]
        ng = n["cpu_us_per_msg"]["nginx"]
        rows.append(["relay hop: gateway CPU per relayed message <= half of nginx stream's",
                     f"gateway {fmt(gw)} µs/msg vs nginx {fmt(ng)} µs/msg "
                     f"({fmt(ratio(gw, ng))}x of nginx's)", verdict(gw <= ng / 2)])
    if d and n and h:
        _, base_p99 = direct_baseline(r)
        rows.append(["relay hop: lower added p99 than nginx and HAProxy",
                     f"nginx adds {fmt(round(n['p99_ms'] - base_p99, 3), 3)} ms p99, HAProxy "
                     f"{fmt(round(h['p99_ms'] - base_p99, 3), 3)} ms, against the direct runs; "
                     "the gateway's own hop cannot be removed from the path to be measured the "
                     "same way (see BENCHMARKS.md)", verdict(None)])
    c = r.get("capacity")
    if c:
        step = (c.get("ramp_steps") or [{}])[-1]
        steady = step.get("p99_ms")
        ok = (step.get("passed", False) and c["bots"] >= 5000 and c["moves_lost"] == 0
              and c["disconnects"] == 0)
        rows.append([">= 5,000 bots through 1 gateway + 4 shards at 1 move/s with p99 < 50 ms "
                     "and zero lost moves",
                     f"{fmt(c['bots'])} bots online; steady-state p99 {fmt(steady, 3)} ms "
                     f"({s['capacity_window_seconds']} s window once all were connected), whole "
                     f"run p99 {fmt(c['p99_ms'], 3)} ms (logins included); "
                     f"{fmt(c['moves_lost'])} lost, {fmt(c['disconnects'])} disconnects; the "
                     f"bots' own send schedule lagged up to {fmt(c['send_lag_max_ms'], 1)} ms",
                     verdict(ok)])
    dense = [r[k] for k in ("uring_dense", "uring4_dense") if r.get(k)]
    if dense:
        best = max(dense, key=lambda d: d["notifications_per_s"])
        rows.append([">= 300,000 notifications / s in the densest configuration",
                     f"{fmt(best['notifications_per_s'], 0)} / s ({best['label']}: "
                     f"{best['bots']} bots in a {s['dense_side']}x{s['dense_side']} area, p99 "
                     f"{fmt(best['p99_ms'], 3)} ms, {fmt(best['moves_lost'])} lost)",
                     verdict(best["notifications_per_s"] >= 300_000)])
    return rows


def render_markdown(tables, notes, settings):
    lines = []
    for note in notes:
        lines.append(f"- {note}")
    lines.append("")
    for table in tables:
        lines.append(f"### {table['title']}")
        lines.append("")
        lines.append(markdown_table(table["header"], table["rows"]))
        lines.append("")
    return "\n".join(lines)


def markdown_table(header, rows):
    """A Markdown table of `header` and `rows` (a "|" in a cell is escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


def script_arguments(parser, seconds, out):
    """Adds the flags the scripts in loadtest/scripts share (--bots, --seconds, --out),
    parses them, keeps a run within what the shared machine allows, and makes the folder
    `--out` names; the arguments and that folder."""
    parser.add_argument("--bots", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=seconds)
    parser.add_argument("--out", default=out)
    args = parser.parse_args()
    if args.bots > 2000 or args.seconds > 20:
        parser.error("keep it to 2,000 bots and 20 s a run: the machine is shared")
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    return args, folder


DOC_PLOTS = {
    "gateway-i-o-io-uring-vs-epoll-same-workloads-cdf.svg",
    "gateway-i-o-io-uring-vs-epoll-same-workloads-box.svg",
    "relay-hop-bots-proxy-gateway-vs-bots-gateway-cdf.svg",
    "shards-1-vs-4-same-workloads-box.svg",
    "capacity-ramp-1-move-s-per-bot-ramp.svg",
    "capacity-1-gateway-4-shards-1-move-s-delay.svg",
}
BEGIN = "<!-- bench:begin (generated by loadtest/bench/run.sh --update-docs) -->"
END = "<!-- bench:end -->"


def update_docs(out, markdown):
    docs = ROOT / "docs" / "bench"
    docs.mkdir(parents=True, exist_ok=True)
    # Only the plots BENCHMARKS.md embeds are copied as files; report.html has them all.
    for old in docs.glob("*.svg"):
        old.unlink()
    for svg in sorted((out / "svg").glob("*.svg")):
        if svg.name in DOC_PLOTS:
            shutil.copy(svg, docs / svg.name)
    shutil.copy(out / "report.html", docs / "report.html")
    shutil.copy(out / "bench.json", docs / "bench.json")
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown}\n{END}{tail}")
    log(f"updated {path} and {docs}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about 2 minutes, smaller loads")
    parser.add_argument("--out", default=str(ROOT / "target" / "bench"),
                        help="output folder (default target/bench)")
    parser.add_argument("--update-docs", action="store_true",
                        help="rewrite BENCHMARKS.md's generated block and docs/bench/")
    parser.add_argument("--no-proxies", action="store_true", help="skip nginx and HAProxy")
    parser.add_argument("--no-micro", action="store_true", help="skip the divan benchmarks")
    parser.add_argument("--no-game", action="store_true",
                        help="skip the game section (NPCs and actions, issue 13)")
    parser.add_argument("--only-game", action="store_true",
                        help="run the game section alone (with --quick about 2 minutes)")
    parser.add_argument("--only-tls", action="store_true",
                        help="run the TLS on/off comparison alone (with --quick about 1 minute)")
    parser.add_argument("--only-ws", action="store_true",
                        help="run the TCP vs WebSocket comparison alone (with --quick about "
                             "1 minute)")
    parser.add_argument("--only-relay", action="store_true",
                        help="run the relay hop with two clients alone (gateway direct vs "
                             "nginx stream in front, loadtest and bare-client; about 5 "
                             "minutes, with --quick about 2)")
    parser.add_argument("--only-io", action="store_true",
                        help="only io_uring against epoll: spread and dense workloads, "
                             "system calls of the whole gateway and of its I/O threads")
    parser.add_argument("--ws-baseline", metavar="BIN",
                        help="also run the WebSocket runs through this other build of "
                             "`meridian` (a before/after of the WebSocket front)")
    parser.add_argument("--rerender", action="store_true",
                        help="run nothing: redraw the report, tables (and docs) from the "
                             "bench.json and manifest.json already in --out")
    args = parser.parse_args()
    only = [flag for flag, on in (("--only-game", args.only_game), ("--only-tls", args.only_tls),
                                  ("--only-ws", args.only_ws), ("--only-relay", args.only_relay),
                                  ("--only-io", args.only_io))
            if on]
    if len(only) > 1:
        parser.error(f"{' and '.join(only)}: pick one")
    if only and args.update_docs:
        parser.error("--update-docs rewrites the whole generated block of BENCHMARKS.md: "
                     f"run it with the whole suite, not {only[0]}")
    suite = Suite(args)
    if args.rerender:
        return suite.rerender()
    suite.load_at_start = sh("cut -d' ' -f1-3 /proc/loadavg")
    log(f"mode {suite.mode}: settings {json.dumps(suite.s)}; output in {suite.out}")
    try:
        suite.run()
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        log(f"FAILED: {error}")
        if suite.results:
            suite.write()
        return 1
    suite.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
