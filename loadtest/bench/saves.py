#!/usr/bin/env python3
"""What saving players costs a shard (issue 12): shard CPU per saved player.

    python3 loadtest/bench/saves.py [--bots 5000] [--window 60] [--rounds 1]
                                    [--save-interval 10] [--postgres-url URL] [--out DIR]

Starts a local cluster (`meridian up --shards 1`, one gateway) three times in one run: with
no player store, with an SQLite store (a new file) and with a PostgreSQL store (a server of
this script's own from Debian's `postgresql` package: initdb in a temporary directory, the
server's defaults, fsync on, listening on loopback only; a new database per cluster; or the
server at --postgres-url). Each time `loadtest` connects BOTS bots that move one cell a
second in a random direction (so nearly every bot stands on another cell at every save
round); once every bot is on the shard and one save interval has passed, the script
measures a WINDOW of seconds: the shard process's user + system CPU from /proc/<pid>/stat,
and from the shard's /metrics the saves written (`meridian_shard_saves_total`), the moves
applied and the batches' write times. The shard saves every --save-interval seconds
(MERIDIAN_SAVE_INTERVAL; `meridian up` passes the environment on to its nodes).

Bots connect one per --connect-interval (2 ms: a login with a store is a store lookup, one
after another at the gateway), and the gateway's login deadline is raised to 120 s
(MERIDIAN_LOGIN_TIMEOUT): on a busy disk a login can wait longer than the default 10 s
behind the lookups before it, and would be cut. Neither touches what is measured, which
starts once every bot is in.

Prints progress lines and Markdown tables, and writes saves.json into --out. With --rounds 2
the three clusters run twice, the second time in the opposite order, so drift between runs
shows. The binaries are the release build (run `cargo build --release -p meridian -p
loadtest` first; CARGO_TARGET_DIR is honoured). Every process is on loopback and bounded
(--bots at most 9,000, --window at most 600 s); the script stops only what it started, by
PID (the PostgreSQL server with `pg_ctl stop`, which signals the PID in its pid file).
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402
from suite import log  # noqa: E402

MAX_BOTS = 9_000  # one load-test process; the open-file limit here is 20,000 (ENVIRONMENT.md)
MAX_WINDOW = 600
STORES = ("none", "sqlite", "postgres")
LABELS = {"none": "no store", "sqlite": "SQLite", "postgres": "PostgreSQL"}


def metrics(admin):
    """The shard's /metrics as {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as answer:
        return parse_metrics(answer.read().decode())


def parse_metrics(text):
    """Prometheus text as {(name, frozenset(labels)): value} (label values without commas,
    as every label the shard exports)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = frozenset(
            tuple(part.split("=", 1)) for part in labels.rstrip("}").split(",") if "=" in part)
        out[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return out


def pressure():
    """CPU and I/O pressure, "some avg10" from /proc/pressure: the share of the last 10 s in
    which some task (the cluster's own included) waited for a CPU / for I/O."""
    out = {}
    for what in ("cpu", "io"):
        try:
            line = Path(f"/proc/pressure/{what}").read_text().splitlines()[0]
            out[what] = float(line.split("avg10=")[1].split()[0])
        except (OSError, IndexError, ValueError):
            out[what] = None
    return out


def metric(sample, name, **labels):
    """Sum of every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in sample.items() if n == name and want <= set(ls))


def login_trouble(cluster):
    """What the gateway says about logins: store lookups by result, connections cut at a
    deadline."""
    try:
        sample = metrics(cluster.gateway_admin)
    except OSError as error:
        return f"gateway metrics unavailable: {error}"
    lookups = {result: metric(sample, "meridian_gateway_store_lookups_total", result=result)
               for result in ("ok", "unavailable", "busy")}
    cut = metric(sample, "meridian_gateway_deadline_closes_total", deadline="login")
    return f"gateway store lookups {lookups}, logins cut at their deadline {cut:.0f}"


class Postgres:
    """A PostgreSQL server of this script's own: initdb in a temporary directory, loopback
    only, trust authentication, the server's default durability (fsync on). As root the
    tools run as the `postgres` user (PostgreSQL refuses to run as root)."""

    def __init__(self):
        versions = sorted((int(p.parent.name), p.parent)
                          for p in Path("/usr/lib/postgresql").glob("*/bin")
                          if (p / "initdb").exists() and p.parent.name.isdigit())
        if not versions:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: run "
                               "deploy/install-deps.sh test (Debian package postgresql)")
        self.version, home = versions[-1]
        self.bin = home / "bin"
        self.dir = Path(tempfile.mkdtemp(prefix="meridian-saves-pg-"))
        self.data = self.dir / "data"
        self.port = suite.free_port()
        self.running = False
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", str(self.dir)], check=True)
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"),
                 "-o", options, "-w", "start")
        self.running = True
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        log(f"PostgreSQL {self.version} on 127.0.0.1:{self.port} (pid {self.pid}, fsync on)")

    def run(self, tool, *args):
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, cwd=self.dir, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {args}: {done.returncode}\n{done.stdout}{done.stderr}")
        return done.stdout

    def new_database(self, name):
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def pids(self):
        return [self.pid] + suite.children_of(self.pid)

    def stop(self):
        if self.running:
            self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        self.work = self.out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.postgres = None
        self.runs = []
        self.rustc_seen = 0

    def note_builds(self):
        running = suite.sh("pgrep -c -x rustc || true")
        self.rustc_seen = max(self.rustc_seen, int(running or 0))

    def store_address(self, store, name):
        if store == "sqlite":
            path = self.work / f"{name}.db"
            for old in self.work.glob(f"{name}.db*"):
                old.unlink()
            return f"sqlite:{path}"
        if store == "postgres":
            if self.args.postgres_url:
                return self.args.postgres_url
            if self.postgres is None:
                self.postgres = Postgres()
            return self.postgres.new_database(name.replace("-", "_"))
        return None

    def measure(self, store, round_number):
        a = self.args
        name = f"saves-{store}-{round_number}-{os.getpid()}"
        address = self.store_address(store, name)
        log(f"round {round_number}: {LABELS[store]}: cluster (1 gateway, 1 shard"
            + (f", --store {address}" if address else "") + ")")
        extra = ["--store", address] if address else []
        env = {"MERIDIAN_SAVE_INTERVAL": str(a.save_interval), "MERIDIAN_LOGIN_TIMEOUT": "120s"}
        cluster = suite.Cluster(self.work, name, 1, "uring", extra=extra, env=env)
        bots_process = None
        try:
            admin = cluster.shard_admins[0]
            shard = cluster.shard_pids[0]
            # Long enough for every login, the settling interval and the window; the bots
            # are stopped as soon as the window ends.
            login_limit = 30 + int(a.bots * a.connect_interval) + a.bots // 100
            settle = a.save_interval + 2
            duration = login_limit + settle + a.window + 30
            command = [str(suite.RELEASE / "loadtest"), "--addr", cluster.game,
                       "--bots", str(a.bots), "--duration", f"{duration}s",
                       "--move-interval", "1s", "--seed", str(a.seed),
                       "--connect-interval", f"{round(a.connect_interval * 1000)}ms",
                       "--name-prefix", f"saves-{round_number}",
                       "--json", str(self.work / f"{name}.loadtest.json")]
            progress = open(self.work / f"{name}.loadtest.log", "w")
            bots_process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=progress)
            started = time.time()
            while True:
                online = metric(metrics(admin), "meridian_shard_players")
                if online >= a.bots:
                    break
                if bots_process.poll() is not None:
                    raise RuntimeError(f"loadtest exited ({bots_process.returncode}) with "
                                       f"{online:.0f} of {a.bots} bots on the shard; "
                                       + login_trouble(cluster))
                if time.time() - started > login_limit:
                    raise RuntimeError(f"only {online:.0f} of {a.bots} bots on the shard after "
                                       f"{login_limit} s; " + login_trouble(cluster))
                time.sleep(0.5)
            logins = time.time() - started
            log(f"  {a.bots} bots on the shard after {logins:.1f} s; settling {settle} s "
                "(one save interval) before the window")
            time.sleep(settle)

            # With a store the window runs from the end of one save batch to the end of the
            # k-th after it (k = window / save interval), so every window holds the same
            # number of save rounds whatever the phase of the shard's save clock (its rounds
            # come every 10.0-10.1 s: a fixed 60 s window holds 5 or 6). Without a store it
            # is --window seconds. Metrics are read 5 times a second in every run alike.
            rounds = max(1, round(a.window / a.save_interval))
            if address:
                self.wait_for_batch(admin, a.save_interval * 2 + 5)
            self.note_builds()
            watch = {"shard": [shard], "gateway": [cluster.gateway_pid]}
            if store == "postgres" and self.postgres is not None:
                watch["postgres"] = self.postgres.pids()
            before = metrics(admin)
            cpu_before = {k: suite.cpu_seconds(p) for k, p in watch.items()}
            load_before = suite.sh("cut -d' ' -f1-3 /proc/loadavg")
            t0 = time.time()
            next_progress = t0 + 10
            limit = a.window * 2 + a.save_interval
            while True:
                time.sleep(0.2)
                now = metrics(admin)
                elapsed = time.time() - t0
                batches = (metric(now, "meridian_shard_save_seconds_count")
                           - metric(before, "meridian_shard_save_seconds_count"))
                if (batches >= rounds) if address else (elapsed >= a.window):
                    break
                if bots_process.poll() is not None:
                    raise RuntimeError(f"loadtest exited ({bots_process.returncode}) "
                                       "during the window")
                if elapsed > limit:
                    raise RuntimeError(f"{batches:.0f} of {rounds} save batches in {limit} s")
                if time.time() >= next_progress:
                    next_progress += 10
                    saved = (metric(now, "meridian_shard_saves_total", result="written")
                             - metric(before, "meridian_shard_saves_total", result="written"))
                    cpu = suite.cpu_seconds([shard]) - cpu_before["shard"]
                    log(f"  {elapsed:4.0f} s: {saved:.0f} saves written in {batches:.0f} "
                        f"batches, shard CPU {cpu:.2f} s")
            wall = time.time() - t0
            after = now
            # PostgreSQL: the processes there were when the window opened (the shard's and
            # the gateway's connections are long-lived; nothing else connects meanwhile).
            cpu = {k: suite.cpu_seconds(p) - cpu_before[k] for k, p in watch.items()}
            self.note_builds()
            load_after = suite.sh("cut -d' ' -f1-3 /proc/loadavg")
            pressure_after = pressure()
        finally:
            if bots_process is not None:
                suite.stop(bots_process, "loadtest")
                progress.close()
            cluster.stop()

        def delta(name, **labels):
            return metric(after, name, **labels) - metric(before, name, **labels)

        result = {
            "store": store, "round": round_number, "address": address, "bots": a.bots,
            "login_s": round(logins, 1), "window_s": round(wall, 2),
            "load_average_before": load_before, "load_average_after": load_after,
            "pressure_at_end": pressure_after,
            "players": metric(after, "meridian_shard_players"),
            "moves": delta("meridian_shard_moves_total"),
            "saves_written": delta("meridian_shard_saves_total", result="written"),
            "saves_refused": delta("meridian_shard_saves_total", result="refused"),
            "saves_failed": delta("meridian_shard_saves_total", result="failed"),
            "save_batches": delta("meridian_shard_save_seconds_count"),
            "save_seconds": delta("meridian_shard_save_seconds_sum"),
            "saves_pending_at_end": metric(after, "meridian_shard_saves_pending"),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        }
        log(f"  -> {result['saves_written']:.0f} saves in {result['save_batches']:.0f} batches, "
            f"{result['moves']:.0f} moves, shard CPU {cpu['shard']:.2f} s in {wall:.1f} s")
        return result

    @staticmethod
    def wait_for_batch(admin, seconds):
        """Returns just after the shard has written its next batch of saves."""
        first = metric(metrics(admin), "meridian_shard_save_seconds_count")
        deadline = time.time() + seconds
        while time.time() < deadline:
            time.sleep(0.2)
            if metric(metrics(admin), "meridian_shard_save_seconds_count") > first:
                return
        raise RuntimeError(f"the shard wrote no batch of saves in {seconds} s")

    def run(self):
        for round_number in range(1, self.args.rounds + 1):
            order = STORES if round_number % 2 == 1 else tuple(reversed(STORES))
            for store in order:
                self.runs.append(self.measure(store, round_number))


def fmt(value, digits=0):
    return f"{value:,.{digits}f}"


def tables(runs, args):
    """One row per cluster. The comparison with no store is of CPU rates (the windows of
    runs with a store end on a save batch, so their lengths differ a little), against the
    run without a store of the same round."""
    lines = ["| store | round | window s | moves / s | saves written | saves / s | batches "
             "| saves / batch | batch write ms (mean) | shard CPU s | shard CPU % of a core "
             "| shard CPU µs / saved player | shard CPU vs no store (same round) "
             "| µs / saved player over no store | PostgreSQL server CPU % of a core "
             "| gateway CPU % of a core |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: | ---: |"]
    baseline = {r["round"]: r for r in runs if r["store"] == "none"}
    for r in sorted(runs, key=lambda r: (STORES.index(r["store"]), r["round"])):
        wall, saves = r["window_s"], r["saves_written"]
        shard = r["cpu_s"]["shard"]
        rate = shard / wall
        per_save = extra = extra_per_save = "-"
        base = baseline.get(r["round"])
        if saves > 0:
            per_save = fmt(shard * 1e6 / saves, 1)
        if base and r["store"] != "none":
            base_rate = base["cpu_s"]["shard"] / base["window_s"]
            difference = rate - base_rate
            extra = f"{difference * 100:+.2f} points ({difference / base_rate * 100:+.0f}%)"
            if saves > 0:
                extra_per_save = fmt(difference * 1e6 / (saves / wall), 1)
        batches = r["save_batches"]
        lines.append(" | ".join([
            f"| {LABELS[r['store']]}", str(r["round"]), fmt(wall, 1), fmt(r["moves"] / wall),
            fmt(saves), fmt(saves / wall), fmt(batches),
            fmt(saves / batches) if batches else "-",
            fmt(r["save_seconds"] * 1e3 / batches, 1) if batches else "-",
            fmt(shard, 2), fmt(rate * 100, 2), per_save, extra, extra_per_save,
            fmt(r["cpu_s"]["postgres"] / wall * 100, 2) if "postgres" in r["cpu_s"] else "-",
            fmt(r["cpu_s"]["gateway"] / wall * 100, 1)]) + " |")
    return "\n".join(lines)


def conditions(runs):
    """What else the machine was doing during each window."""
    lines = ["| store | round | all bots in after (s) | load average at start / end of the window "
             "| CPU / I/O pressure % at its end |",
             "| --- | ---: | ---: | --- | --- |"]
    for r in runs:
        p = r["pressure_at_end"]
        show = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        lines.append(f"| {LABELS[r['store']]} | {r['round']} | {r['login_s']} | "
                     f"{r['load_average_before']} / "
                     f"{r['load_average_after']} | {show(p['cpu'])} / {show(p['io'])} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bots", type=int, default=5000)
    parser.add_argument("--window", type=int, default=60, help="seconds measured per cluster")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--save-interval", type=int, default=10, help="seconds")
    parser.add_argument("--seed", type=int, default=1, help="the bots' seed")
    parser.add_argument("--connect-interval", type=suite.parse_duration, default=0.002,
                        help="between two bots' connections (a duration: 2ms)")
    # The former name, in milliseconds: still taken.
    parser.add_argument("--connect-interval-ms", type=lambda ms: int(ms) / 1000,
                        dest="connect_interval", help=argparse.SUPPRESS)
    parser.add_argument("--postgres-url", help="use this server instead of one of our own")
    parser.add_argument("--out", default=str(suite.RELEASE.parent / "bench-saves"))
    args = parser.parse_args()
    problems = []
    if not 1 <= args.bots <= MAX_BOTS:
        problems.append(f"--bots {args.bots} must be 1 to {MAX_BOTS}")
    if not 10 <= args.window <= MAX_WINDOW:
        problems.append(f"--window {args.window} must be 10 to {MAX_WINDOW}")
    if not 1 <= args.rounds <= 5:
        problems.append(f"--rounds {args.rounds} must be 1 to 5")
    if not 0.001 <= args.connect_interval <= 0.1:
        problems.append(f"--connect-interval {args.connect_interval} s must be 1ms to 100ms")
    if not 1 <= args.save_interval <= 60:
        problems.append(f"--save-interval {args.save_interval} must be 1 to 60")
    if args.postgres_url and not args.postgres_url.startswith(("postgres://", "postgresql://")):
        problems.append(f"--postgres-url {args.postgres_url!r} is not a postgres:// address")
    for binary in ("meridian", "loadtest"):
        if not (suite.RELEASE / binary).exists():
            problems.append(f"{suite.RELEASE / binary} is missing: cargo build --release "
                            "-p meridian -p loadtest")
    if problems:
        print("saves.py: bad command line:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    bench = Bench(args)
    load_at_start = suite.sh("cut -d' ' -f1-3 /proc/loadavg")
    log(f"{args.bots} bots, a move per second each, {args.window} s windows, save interval "
        f"{args.save_interval} s, {args.rounds} round(s); output in {bench.out}")
    try:
        bench.run()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        log(f"FAILED: {error}")
        return 1
    finally:
        if bench.postgres is not None:
            bench.postgres.stop()
    machine = {
        "nproc": os.cpu_count(), "kernel": os.uname().release,
        "cpu": suite.sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
        "memory": suite.sh("free -h | awk '/Mem:/ {print $2}'"),
        "commit": suite.sh(f"git -C {suite.ROOT} rev-parse --short HEAD"),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_average_at_start": load_at_start, "rustc_seen": bench.rustc_seen,
        "postgres": bench.postgres.version if bench.postgres else args.postgres_url,
    }
    table = tables(bench.runs, args) + "\n\n" + conditions(bench.runs)
    (bench.out / "saves.json").write_text(json.dumps(
        {"settings": vars(args), "machine": machine, "runs": bench.runs}, indent=2))
    (bench.out / "saves.md").write_text(table + "\n")
    print(f"\n{machine['nproc']} cores ({machine['cpu']}), kernel {machine['kernel']}, commit "
          f"{machine['commit']}, {machine['date_utc']} UTC; load average at start "
          f"{load_at_start}; up to {bench.rustc_seen} rustc processes seen\n")
    print(f"{args.bots} bots, 1 move/s each, 1 shard, save interval {args.save_interval} s, "
          f"{args.window} s windows\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
