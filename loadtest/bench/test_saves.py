"""Tests of saves.py's parsing and table: `python3 -m unittest loadtest/bench/test_saves.py`."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saves  # noqa: E402

METRICS = """\
# HELP meridian_shard_saves_total Player saves.
# TYPE meridian_shard_saves_total counter
meridian_shard_saves_total{shard="1",result="written"} 4700
meridian_shard_saves_total{shard="1",result="refused"} 3
meridian_shard_saves_total{shard="1",result="failed"} 0
meridian_shard_save_seconds_sum{shard="1"} 0.25
meridian_shard_save_seconds_count{shard="1"} 2
meridian_shard_players{shard="1"} 5000
"""


def run(store, round_number, shard_cpu, saves, moves=300_000):
    return {"store": store, "round": round_number, "window_s": 60.0, "moves": moves,
            "saves_written": saves, "save_batches": saves / 4700 if saves else 0,
            "save_seconds": 0.1 * saves / 4700, "cpu_s": {"shard": shard_cpu, "gateway": 5.0}}


class ParseMetrics(unittest.TestCase):
    def test_series_are_found_by_name_and_labels(self):
        sample = saves.parse_metrics(METRICS)
        self.assertEqual(saves.metric(sample, "meridian_shard_saves_total", result="written"),
                         4700)
        self.assertEqual(saves.metric(sample, "meridian_shard_saves_total"), 4703)
        self.assertEqual(saves.metric(sample, "meridian_shard_save_seconds_count"), 2)
        self.assertEqual(saves.metric(sample, "meridian_shard_players", shard="2"), 0)


class Table(unittest.TestCase):
    def test_a_store_is_compared_with_the_no_store_run_of_its_round(self):
        runs = [run("none", 1, 10.0, 0), run("sqlite", 1, 12.0, 28_200),
                run("none", 2, 11.0, 0), run("sqlite", 2, 11.5, 28_200)]
        rows = saves.tables(runs, None).splitlines()[2:]
        self.assertEqual(len(rows), 4)
        round_one = [r for r in rows if r.startswith("| SQLite | 1 |")][0]
        self.assertIn("+3.33 points (+20%)", round_one)
        self.assertIn("| 70.9 |", round_one, "2 s over 28,200 saves")
        round_two = [r for r in rows if r.startswith("| SQLite | 2 |")][0]
        self.assertIn("+0.83 points (+5%)", round_two)
        none = [r for r in rows if r.startswith("| no store | 1 |")][0]
        self.assertIn("| - |", none)

    def test_cpu_is_compared_as_rates_when_windows_differ(self):
        longer = run("sqlite", 1, 12.12, 28_200)
        longer["window_s"] = 60.6
        rows = saves.tables([run("none", 1, 10.0, 0), longer], None).splitlines()[2:]
        sqlite = [r for r in rows if r.startswith("| SQLite | 1 |")][0]
        self.assertIn("+3.33 points (+20%)", sqlite, "20.00% of a core against 16.67%")


if __name__ == "__main__":
    unittest.main()
