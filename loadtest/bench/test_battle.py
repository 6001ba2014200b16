"""Unit tests of battle.py's parsing and plot (no cluster is started)."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import battle  # noqa: E402


class Steps(unittest.TestCase):
    def test_steps_parse_in_order(self):
        self.assertEqual(battle.parse_steps("spread:5000,battle:2000,border:1000,disperse:4000"),
                         [("spread", 5000), ("battle", 2000), ("border", 1000),
                          ("disperse", 4000)])

    def test_a_bad_step_is_refused(self):
        for bad in ("crowd:10", "battle:", "battle:x", "spread"):
            with self.assertRaises(SystemExit):
                battle.parse_steps(bad)


class Recovery(unittest.TestCase):
    def second(self, t, p99, errors=0):
        return {"t": t, "p99_ms": p99, "errors": errors}

    def test_recovery_ends_with_the_last_bad_second_after_the_dispersal(self):
        per_second = [self.second(9.0, 900.0, 50), self.second(10.0, 800.0, 40),
                      self.second(11.0, 300.0, 0), self.second(12.0, 40.0, 3),
                      self.second(13.0, 30.0), self.second(14.0, 20.0)]
        # Bad before 10 s does not count; 12 s still refused moves; 13 s on is normal.
        self.assertEqual(battle.recovery_seconds(per_second, 10.0), 2.0)

    def test_a_cluster_normal_at_once_recovers_in_no_time(self):
        per_second = [self.second(10.0, 900.0, 5), self.second(11.0, 30.0),
                      self.second(12.0, None)]
        self.assertEqual(battle.recovery_seconds(per_second, 10.0), 0.0)


class Plot(unittest.TestCase):
    def test_the_plot_has_a_line_per_build_and_workload(self):
        results = [
            {"label": "before", "kind": "battle", "bots": 1000, "p99_ms": 120.0},
            {"label": "before", "kind": "battle", "bots": 2000, "p99_ms": 4000.0},
            {"label": "after", "kind": "battle", "bots": 1000, "p99_ms": 40.0},
            {"label": "after", "kind": "spread", "bots": 5000, "p99_ms": 100.0},
        ]
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "p.svg"
            battle.svg_plot(results, path)
            text = path.read_text()
        self.assertEqual(text.count("<polyline"), 3)
        self.assertIn("after spread", text)


if __name__ == "__main__":
    unittest.main()
