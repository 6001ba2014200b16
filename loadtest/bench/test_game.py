"""Tests of the game section's parsing and tables: `python3 -m unittest loadtest/bench/test_game.py`.

They feed recorded shard metrics and made-up results to the functions that turn them into
figures and tables, so a renamed metric or a wrong division shows up here rather than as a
silently wrong BENCHMARKS.md.
"""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import game  # noqa: E402
import suite  # noqa: E402

METRICS = """\
# HELP meridian_shard_npcs NPCs owned by this shard.
# TYPE meridian_shard_npcs gauge
meridian_shard_npcs{shard="1"} 250
meridian_shard_game_ticks_total{shard="1"} 40
meridian_shard_game_tick_seconds_bucket{shard="1",le="0.001"} 38
meridian_shard_game_tick_seconds_sum{shard="1"} 0.02
meridian_shard_game_tick_seconds_count{shard="1"} 40
meridian_shard_actions_total{shard="1"} 600
meridian_shard_actions_forwarded_total{shard="1"} 60
meridian_shard_actions_rejected_total{shard="1"} 500
"""


def shard(ticks, tick_s, npcs, actions=0, forwarded=0):
    return {"meridian_shard_game_tick_seconds_count": ticks,
            "meridian_shard_game_tick_seconds_sum": tick_s, "meridian_shard_npcs": npcs,
            "meridian_shard_actions_total": actions,
            "meridian_shard_actions_forwarded_total": forwarded}


class Metrics(unittest.TestCase):
    def test_series_are_read_by_name(self):
        sample = game.parse_metrics(METRICS)
        self.assertEqual(sample["meridian_shard_npcs"], 250)
        self.assertEqual(sample["meridian_shard_game_tick_seconds_count"], 40)
        self.assertEqual(sample["meridian_shard_game_tick_seconds_sum"], 0.02)
        self.assertEqual(sample["meridian_shard_actions_forwarded_total"], 60)

    def test_tick_cost_is_divided_by_each_shards_own_npcs(self):
        before = [shard(0, 0.0, 250), shard(0, 0.0, 0)]
        after = [shard(10, 0.005, 250), shard(10, 0.001, 0)]
        figures = game.tick_figures(before, after, cpu_s=0.05)
        self.assertEqual(figures["ticks"], 20)
        self.assertEqual(figures["npcs"], 250)
        self.assertEqual(figures["npc_ticks"], 2500, "only the shard with NPCs counts")
        self.assertEqual(figures["tick_us_mean"], 300.0)
        self.assertEqual(figures["tick_us_per_npc"], 2.4, "6 ms over 2,500 NPC-ticks")
        self.assertEqual(figures["cpu_us_per_tick"], 2500.0)

    def test_no_ticks_gives_no_figures_rather_than_a_division_by_zero(self):
        figures = game.tick_figures([shard(5, 0.1, 0)], [shard(5, 0.1, 0)], cpu_s=0.0)
        self.assertIsNone(figures["tick_us_per_npc"])
        self.assertIsNone(figures["tick_us_mean"])

    def test_action_counters_are_deltas_summed_over_shards(self):
        before = [shard(0, 0, 0, 100, 10), shard(0, 0, 0, 50, 0)]
        after = [shard(0, 0, 0, 400, 70), shard(0, 0, 0, 350, 20)]
        self.assertEqual(game.action_figures(before, after),
                         {"handled": 600, "forwarded": 80, "rejected": 0})


def action_run(cpu_shards, handled, forwarded, p99_across, p99_within):
    return {"p50_ms": 1.0, "p99_ms": 5.0, "cpu_s": {"shards": cpu_shards, "gateway": 2.0},
            "shard_actions": {"handled": handled, "forwarded": forwarded, "rejected": 0},
            "actions": {"sent": handled, "answered": 10, "rejected": handled - 10, "lost": 0,
                        "aimed_across": forwarded,
                        "delay_ms": {"p50": 1.0, "p99": p99_across},
                        "delay_across_ms": {"p50": 2.0, "p99": p99_across},
                        "delay_within_ms": {"p50": 1.0, "p99": p99_within}}}


class Tables(unittest.TestCase):
    def results(self):
        ramp = lambda p99s: {  # noqa: E731
            "ramp_largest_passing": 1000,
            "ramp_steps": [{"bots_target": 500 * (i + 1), "p99_ms": p, "passed": p <= 50}
                           for i, p in enumerate(p99s)]}
        idle = lambda cpu, npcs: {"npcs": npcs, "ticks": 160, "npc_ticks": npcs * 40,  # noqa
                                  "tick_us_mean": 100.0, "tick_us_per_npc": 0.4,
                                  "cpu_s": cpu, "cpu_us_per_tick": 1000.0}
        return {
            "shards": 4, "wolves_per_shard": 250,
            "settings": game.SETTINGS["quick"],
            "ramp_none": ramp([10.0, 20.0, 60.0]), "ramp_wolves": ramp([20.0, 40.0, 80.0]),
            "idle_none": idle(0.1, 0), "idle_wolves": idle(0.5, 1000),
            "band_moves": {"p50_ms": 1.0, "p99_ms": 4.0, "cpu_s": {"shards": 1.0,
                                                                   "gateway": 1.0}},
            "band_actions": action_run(2.0, 2000, 400, 9.0, 3.0),
        }

    def test_the_ramp_table_pairs_steps_and_says_the_ratio(self):
        tables = game.game_tables(self.results(), suite.fmt, suite.ratio)
        ramp = next(t for t in tables if "capacity ramp" in t["title"])
        self.assertEqual(ramp["rows"][0], ["500", "10.000", "20.000", "2.00x", "pass", "pass"])
        self.assertEqual(ramp["rows"][2][4:], ["fail", "fail"])

    def test_idle_npc_cost_is_the_difference_over_npc_ticks(self):
        tables = game.game_tables(self.results(), suite.fmt, suite.ratio)
        ticks = next(t for t in tables if "per game tick" in t["title"])
        row = next(r for r in ticks["rows"] if r[0].startswith("idle: 1,000 NPCs minus"))
        # 0.4 s more CPU over 1,000 NPCs x 40 ticks = 10 µs per NPC per tick.
        self.assertEqual(row[4], "10.000")

    def test_cpu_per_action_is_over_the_baseline_run(self):
        results = self.results()
        self.assertEqual(game.per_action_cpu(results["band_actions"], [results["band_moves"]],
                                             "shards"), 500.0, "1 s more over 2,000 actions")
        again = {"p50_ms": 1.0, "p99_ms": 6.0, "cpu_s": {"shards": 1.4, "gateway": 1.0}}
        self.assertEqual(game.per_action_cpu(results["band_actions"],
                                             [results["band_moves"], again], "shards"),
                         400.0, "over the mean of the bracketing runs")
        tables = game.game_tables(results, suite.fmt, suite.ratio)
        actions = next(t for t in tables if t["title"].startswith("Game: actions"))
        across = actions["rows"][0]
        self.assertEqual(across[:4], ["band: aimed across a border", "400", "2.000", "9.000"])
        totals = next(r for r in actions["rows"] if r[0] == "band: totals")
        self.assertIn("400 forwarded (20.0%)", totals[4])
        self.assertEqual(totals[5], "500.00")

    def test_the_suite_adds_the_game_tables_and_skips_issue_5s_targets_alone(self):
        tables = suite.build_tables({"game": self.results()}, suite.SETTINGS["quick"])
        titles = [t["title"] for t in tables]
        self.assertTrue(any(t.startswith("Game: capacity ramp") for t in titles), titles)
        self.assertNotIn("Targets of issue 5", titles, "a game-only run has no issue-5 runs")


if __name__ == "__main__":
    unittest.main()
