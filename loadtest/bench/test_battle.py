"""Unit tests of battle.py's parsing and plot (no cluster is started)."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import battle  # noqa: E402


class Steps(unittest.TestCase):
    def test_steps_parse_in_order(self):
        self.assertEqual(battle.parse_steps("spread:5000,battle:2000,border:1000"),
                         [("spread", 5000), ("battle", 2000), ("border", 1000)])

    def test_a_bad_step_is_refused(self):
        for bad in ("crowd:10", "battle:", "battle:x", "spread"):
            with self.assertRaises(SystemExit):
                battle.parse_steps(bad)


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
