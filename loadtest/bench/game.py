"""The suite's game section (issue 13): a world with NPCs and combat.

Run by suite.py (`run.sh --quick --only-game` runs this section alone). Two clusters in one
run, `meridian up --game wolves --shards 4`, identical but for the wolves each shard keeps
(MERIDIAN_WOLVES_PER_SHARD: 0, then 250, i.e. 1,000 NPCs in total, 10 Hz game tick):

1. idle window, no bots: shard CPU from /proc/<pid>/stat and the shards' own tick timing
   (`meridian_shard_game_tick_seconds` sum and count, `meridian_shard_npcs`): CPU per game
   tick per NPC;
2. the suite's capacity ramp (the same one as "Capacity ramp: 1 move/s per bot"): delay
   p99 per step with and without the NPCs;
3. on the cluster with wolves only: bots that also send the example's ATTACK
   (`loadtest --actions-per-second`) aimed at the nearest wolf in sight, spawned in a band
   across the x = 200 border (whole height, so the partition stays balanced and the
   coordinator moves no border) and spread over the whole map, each once without actions
   (the baseline) and once with: action delay split by whether the wolf stood across a
   border when the bot aimed (`--border-x/--border-y`: a ghost on the bot's shard, the
   action forwarded to the wolf's owner) or on the bot's side, the shards' counters of
   actions and forwarded actions, and shard CPU per action (with-actions run minus the
   baseline, over the actions the shards handled).

Everything is bounded in bots and seconds (SETTINGS below) and on loopback.
"""

import json
import time
import urllib.request

WOLVES_PER_SHARD = 250
SHARDS = 4
# The initial partition of 4 shards on the 400 x 400 map is a 2 x 2 grid.
BORDERS = (200, 200)

SETTINGS = {
    "quick": {"idle_seconds": 4, "action_bots": 300, "action_seconds": 6,
              "actions_per_second": 2, "band_half_width": 10},
    "full": {"idle_seconds": 10, "action_bots": 600, "action_seconds": 15,
             "actions_per_second": 2, "band_half_width": 10},
}


def parse_metrics(text):
    """Prometheus text -> {name: value}, summing every series of a name (one shard's
    /metrics has one series per name for what this section reads)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.partition("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def read_shards(admins):
    """Each shard's metrics, in the order of `admins`."""
    samples = []
    for admin in admins:
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as answer:
            samples.append(parse_metrics(answer.read().decode()))
    return samples


def tick_figures(before, after, cpu_s):
    """Game tick figures of a window from the shards' metrics at its edges (lists, one
    entry per shard) and the shards' CPU seconds in it."""
    ticks = tick_s = npc_ticks = 0.0
    npcs = 0.0
    for b, a in zip(before, after):
        n_ticks = a.get("meridian_shard_game_tick_seconds_count", 0) - b.get(
            "meridian_shard_game_tick_seconds_count", 0)
        ticks += n_ticks
        tick_s += a.get("meridian_shard_game_tick_seconds_sum", 0) - b.get(
            "meridian_shard_game_tick_seconds_sum", 0)
        owned = (a.get("meridian_shard_npcs", 0) + b.get("meridian_shard_npcs", 0)) / 2
        npcs += owned
        npc_ticks += n_ticks * owned
    return {
        "ticks": int(ticks), "npcs": round(npcs), "npc_ticks": round(npc_ticks),
        "tick_s": round(tick_s, 6), "cpu_s": round(cpu_s, 3),
        "tick_us_mean": round(tick_s * 1e6 / ticks, 2) if ticks else None,
        "tick_us_per_npc": round(tick_s * 1e6 / npc_ticks, 4) if npc_ticks else None,
        "cpu_us_per_tick": round(cpu_s * 1e6 / ticks, 2) if ticks else None,
    }


def action_figures(before, after):
    """The shards' action counters over a run."""
    def delta(name):
        return round(sum(a.get(name, 0) - b.get(name, 0) for b, a in zip(before, after)))
    return {"handled": delta("meridian_shard_actions_total"),
            "forwarded": delta("meridian_shard_actions_forwarded_total"),
            "rejected": delta("meridian_shard_actions_rejected_total")}


class GameBench:
    def __init__(self, suite, cluster_class, work, cpu_seconds, log):
        self.suite = suite
        self.Cluster = cluster_class
        self.work = work
        self.cpu_seconds = cpu_seconds
        self.log = log
        self.g = SETTINGS[suite.mode]

    def start(self, wolves):
        name = f"bench-game-{wolves}"
        self.log(f"cluster: 1 gateway + {SHARDS} shards, --game wolves, {wolves} wolves/shard")
        cluster = self.Cluster(self.work, name, SHARDS, "uring", extra=["--game", "wolves"],
                               env={"MERIDIAN_WOLVES_PER_SHARD": str(wolves)})
        # The wolves' game spawns one wolf per shard per tick (250 take 25 s at 10 Hz):
        # wait until all are there.
        want = wolves * SHARDS
        deadline = time.time() + 45
        while True:
            npcs = sum(m.get("meridian_shard_npcs", 0) for m in read_shards(cluster.shard_admins))
            if npcs >= want or time.time() > deadline:
                break
            time.sleep(0.2)
        if npcs < want:
            self.log(f"  only {npcs:.0f} of {want} NPCs after 45 s; measuring anyway")
        return cluster

    def idle(self, cluster):
        seconds = self.g["idle_seconds"]
        before = read_shards(cluster.shard_admins)
        cpu_before = self.cpu_seconds(cluster.shard_pids)
        time.sleep(seconds)
        cpu = self.cpu_seconds(cluster.shard_pids) - cpu_before
        figures = tick_figures(before, read_shards(cluster.shard_admins), cpu)
        figures["window_s"] = seconds
        self.log(f"  idle {seconds} s: {figures}")
        return figures

    def measured(self, cluster, run):
        """Runs `run()` (a loadtest) and adds the shards' tick and action figures of it."""
        before = read_shards(cluster.shard_admins)
        result = run()
        after = read_shards(cluster.shard_admins)
        result["ticks"] = tick_figures(before, after, result["cpu_s"].get("shards", 0.0))
        result["shard_actions"] = action_figures(before, after)
        return result

    def action_run(self, cluster, label, area, actions):
        g = self.g
        extra = ["--spawn-area", area, "--border-x", str(BORDERS[0]),
                 "--border-y", str(BORDERS[1])]
        if actions:
            extra += ["--actions-per-second", str(g["actions_per_second"])]
        watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
        result = self.measured(cluster, lambda: self.suite.loadtest(
            label, cluster.game, g["action_bots"], g["action_seconds"], "1s", extra=extra,
            watch=watch, section="Game: actions, local and across a border"))
        summary = json.loads((self.suite.out / result["summary_file"]).read_text())
        result["actions"] = summary.get("actions")
        return result

    def run(self):
        out = {"wolves_per_shard": WOLVES_PER_SHARD, "shards": SHARDS,
               "settings": dict(self.g)}
        ramp_section = "Game: capacity ramp with and without 1,000 NPCs"
        for wolves, key in ((0, "none"), (WOLVES_PER_SHARD, "wolves")):
            cluster = self.start(wolves)
            try:
                out[f"idle_{key}"] = self.idle(cluster)
                watch = [("gateway", [cluster.gateway_pid]), ("shards", cluster.shard_pids)]
                label = f"game ramp, {wolves * SHARDS} NPCs"
                out[f"ramp_{key}"] = self.measured(
                    cluster, lambda: self.suite.ramp(label, cluster, ramp_section, watch=watch))
                if wolves:
                    half = self.g["band_half_width"]
                    band = f"{BORDERS[0] - half},0,{BORDERS[0] + half - 1},399"
                    # The runs without actions bracket the one with: their mean is the
                    # baseline, their difference how much the machine drifted meanwhile.
                    for where, area in (("band", band), ("spread", "0,0,399,399")):
                        for key, actions, what in (("moves", False, "moves only"),
                                                   ("actions", True, "actions"),
                                                   ("moves_again", False, "moves only, again")):
                            out[f"{where}_{key}"] = self.action_run(
                                cluster, f"game {where}, {what}", area, actions)
            finally:
                cluster.stop()
        return out


def per_action_cpu(with_actions, baselines, process):
    """CPU µs per action the shards handled, over the mean of the baseline runs without
    actions (the same bots, spawn area, length and moves)."""
    handled = with_actions["shard_actions"]["handled"]
    baselines = [b for b in baselines if b]
    if not handled or not baselines:
        return None
    base = sum(b["cpu_s"].get(process, 0) for b in baselines) / len(baselines)
    extra = with_actions["cpu_s"].get(process, 0) - base
    return round(extra * 1e6 / handled, 2)



def game_tables(g, fmt, ratio):
    """The section's tables from the figures `GameBench.run` returned."""
    tables = []
    none, wolves = g.get("ramp_none"), g.get("ramp_wolves")
    if none and wolves:
        steps = {}
        for key, run in (("none", none), ("wolves", wolves)):
            for step in run.get("ramp_steps") or []:
                steps.setdefault(step["bots_target"], {})[key] = step
        rows = []
        for bots in sorted(steps):
            a, b = steps[bots].get("none", {}), steps[bots].get("wolves", {})
            rows.append([fmt(bots), fmt(a.get("p99_ms"), 3), fmt(b.get("p99_ms"), 3),
                         f"{fmt(ratio(b.get('p99_ms'), a.get('p99_ms')))}x"
                         if a.get("p99_ms") else "-",
                         "pass" if a.get("passed") else ("fail" if a else "-"),
                         "pass" if b.get("passed") else ("fail" if b else "-")])
        rows.append(["largest passing", fmt(none.get("ramp_largest_passing")),
                     fmt(wolves.get("ramp_largest_passing")), "", "", ""])
        tables.append({
            "title": f"Game: capacity ramp, 1 gateway + {g['shards']} shards, --game wolves, "
                     f"0 vs {g['wolves_per_shard'] * g['shards']} NPCs (10 Hz tick), "
                     "1 move/s per bot",
            "header": ["bots", "p99 ms, 0 NPCs", "p99 ms, 1,000 NPCs", "NPCs vs none",
                       "step, 0 NPCs", "step, 1,000 NPCs"],
            "rows": rows})
    rows = []
    for label, key in (("idle, 0 NPCs", "idle_none"), ("idle, 1,000 NPCs", "idle_wolves")):
        t = g.get(key)
        if t:
            rows.append([label, fmt(t["npcs"]), fmt(t["ticks"]), fmt(t["tick_us_mean"]),
                         fmt(t["tick_us_per_npc"], 3), fmt(t["cpu_us_per_tick"])])
    for label, key in (("ramp, 0 NPCs", "ramp_none"), ("ramp, 1,000 NPCs", "ramp_wolves"),
                       ("band, moves only", "band_moves"), ("band, actions", "band_actions"),
                       ("band, moves only, again", "band_moves_again"),
                       ("spread, moves only", "spread_moves"),
                       ("spread, actions", "spread_actions"),
                       ("spread, moves only, again", "spread_moves_again")):
        t = (g.get(key) or {}).get("ticks")
        if t:
            rows.append([label, fmt(t["npcs"]), fmt(t["ticks"]), fmt(t["tick_us_mean"]),
                         fmt(t["tick_us_per_npc"], 3), fmt(t["cpu_us_per_tick"])])
    idle_none, idle_wolves = g.get("idle_none"), g.get("idle_wolves")
    if idle_none and idle_wolves and idle_wolves["npc_ticks"]:
        extra = idle_wolves["cpu_s"] - idle_none["cpu_s"]
        per_npc = round(extra * 1e6 / idle_wolves["npc_ticks"], 4)
        rows.append(["idle: 1,000 NPCs minus 0 NPCs, /proc", fmt(idle_wolves["npcs"]),
                     fmt(idle_wolves["ticks"]), "-", fmt(per_npc, 3),
                     fmt(round(extra * 1e6 / max(idle_wolves["ticks"], 1), 2))])
    if rows:
        tables.append({
            "title": "Game: shard CPU per game tick (all 4 shards; ticks counted per shard)",
            "header": ["window", "NPCs", "ticks", "tick µs (mean, shard's own timing)",
                       "tick µs per NPC", "shard CPU µs per tick (whole process)"],
            "rows": rows})
    rows = []
    for where in ("band", "spread"):
        bases = [g.get(f"{where}_moves"), g.get(f"{where}_moves_again")]
        act = g.get(f"{where}_actions")
        if not (bases[0] and act and act.get("actions")):
            continue
        a = act["actions"]
        shard = act["shard_actions"]
        for label, delay, count in (
                ("aimed across a border", a.get("delay_across_ms") or {}, a.get("aimed_across")),
                ("aimed within", a.get("delay_within_ms") or {}, None),
                ("all answered", a["delay_ms"], a["answered"] + a["rejected"])):
            rows.append([f"{where}: {label}", fmt(count), fmt(delay.get("p50"), 3),
                         fmt(delay.get("p99"), 3), "", "", ""])
        rows.append([f"{where}: totals", f"{fmt(a['sent'])} sent, {fmt(a['answered'])} done, "
                     f"{fmt(a['rejected'])} rejected, {fmt(a['lost'])} lost",
                     f"moves p50 {fmt(act['p50_ms'], 3)} (without actions "
                     + " / ".join(fmt(b["p50_ms"], 3) for b in bases if b) + ")",
                     f"moves p99 {fmt(act['p99_ms'], 3)} (without actions "
                     + " / ".join(fmt(b["p99_ms"], 3) for b in bases if b) + ")",
                     f"{fmt(shard['handled'])} handled, {fmt(shard['forwarded'])} forwarded "
                     f"({fmt(100 * shard['forwarded'] / max(shard['handled'], 1), 1)}%)",
                     fmt(per_action_cpu(act, bases, "shards")),
                     fmt(per_action_cpu(act, bases, "gateway"))])
    if rows:
        tables.append({
            "title": f"Game: actions (ATTACK on the nearest wolf, {g['settings']['actions_per_second']}"
                     f"/s per bot, {g['settings']['action_bots']} bots, 1 move/s) in a band "
                     "across the x = 200 border and spread over the map",
            "header": ["run: actions", "count", "delay p50 ms", "delay p99 ms",
                       "shard action counters",
                       "shard CPU µs / action (over the mean of the runs without)",
                       "gateway CPU µs / action (same)"],
            "rows": rows})
    return tables
