"""Tests of .ci/rooms on tiny synthetic crates: `python3 -m unittest discover -s .ci -p "test_*.py"`.

Each test writes a crate into a temporary tree and runs the script on it, as CI would.
"""

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOMS = Path(__file__).resolve().parent / "rooms"


class Tree:
    """A temporary repository of packages, written file by file."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)

    def write(self, path, text):
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)

    def package(self, path, files):
        self.write(f"{path}/Cargo.toml", f'[package]\nname = "{Path(path).name}"\n')
        for name, text in files.items():
            self.write(f"{path}/{name}", text)

    def rooms(self, *args):
        done = subprocess.run([sys.executable, str(ROOMS), "--root", str(self.root), "--no-cargo", *args],
                              capture_output=True, text=True, check=False)
        return done.returncode, done.stdout + done.stderr

    def close(self):
        self.dir.cleanup()


class RoomsTest(unittest.TestCase):
    def setUp(self):
        self.tree = Tree()
        self.addCleanup(self.tree.close)

    def test_a_circle_through_three_files_is_listed(self):
        self.tree.package("services/a", {
            "src/lib.rs": "mod one;\nmod two;\nmod three;\n",
            "src/one.rs": "use crate::two::Two;\npub struct One(Two);\n",
            "src/two.rs": "pub struct Two;\nfn f() { crate::three::go(); }\n",
            "src/three.rs": "use super::one::{self, One};\npub fn go() {}\n",
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 1, out)
        self.assertIn("circle among 3 files of services/a", out)
        self.assertIn("services/a/src/one.rs -> services/a/src/two.rs -> "
                      "services/a/src/three.rs -> services/a/src/one.rs", out)

    def test_a_shared_item_moved_to_its_own_file_passes(self):
        # The testkit's old shape, bot <-> stream, fixed as it was: the name both use lives
        # in a third file that imports neither.
        self.tree.package("services/kit", {
            "src/lib.rs": "mod bot;\nmod code;\nmod stream;\npub use bot::Bot;\n",
            "src/bot.rs": "use crate::code::code_name;\nuse crate::stream::Check;\npub struct Bot;\n",
            "src/stream.rs": "//! Run by a [`Bot`](crate::Bot::run).\npub struct Check;\n"
                             "fn f() -> String { crate::code::code_name(1) }\n",
            "src/code.rs": "pub fn code_name(c: i32) -> String { format!(\"{c}\") }\n",
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 0, out)
        self.assertIn("rooms: 1 packages", out)

    def test_an_item_reached_through_a_re_export_is_charged_to_its_file(self):
        # stream.rs names `crate::Bot`, which lib.rs only re-exports from bot.rs.
        self.tree.package("services/kit", {
            "src/lib.rs": "mod bot;\nmod stream;\npub use bot::{Bot, Other};\n",
            "src/bot.rs": "use crate::stream::Check;\npub struct Bot;\npub struct Other;\n",
            "src/stream.rs": "pub struct Check;\nfn f(b: &crate::Bot) {}\n",
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 1, out)
        self.assertIn("services/kit/src/bot.rs -> services/kit/src/stream.rs -> "
                      "services/kit/src/bot.rs", out)

    def test_a_parent_and_its_children_are_no_circle_unless_strict(self):
        # lib.rs declares and calls `child`; child uses an item lib.rs defines; a mod.rs
        # parent the same one level down.
        self.tree.package("loadtest", {
            "src/lib.rs": "mod child;\nmod report;\npub struct Shared;\n"
                          "pub fn run() { child::go(); }\n",
            "src/child.rs": "use crate::Shared;\npub fn go() {}\n",
            "src/report/mod.rs": "mod plots;\npub struct Page;\npub fn draw() { plots::draw(); }\n",
            "src/report/plots.rs": "use super::Page;\npub fn draw() {}\n",
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 0, out)
        code, out = self.tree.rooms("--strict")
        self.assertEqual(code, 1, out)
        self.assertIn("loadtest/src/child.rs -> loadtest/src/lib.rs -> loadtest/src/child.rs", out)
        self.assertIn("loadtest/src/report/mod.rs -> loadtest/src/report/plots.rs -> "
                      "loadtest/src/report/mod.rs", out)

    def test_tests_comments_and_strings_import_nothing(self):
        self.tree.package("examples/game", {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": "// crate::a::A in a comment\npub struct B;\n"
                        "const S: &str = \"crate::a::A\";\nconst R: &str = r#\"super::a::A\"#;\n"
                        "#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
            "tests/it.rs": "mod common;\n",
            "tests/common.rs": "use crate::Nothing;\n",
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 0, out)

    def test_a_production_file_over_the_limit_is_caught_and_its_tests_do_not_count(self):
        body = "pub fn f() {}\n" * 1001
        short = "pub fn f() {}\n" * 990 + "#[cfg(test)]\nmod tests {\n" + "    // x\n" * 50 + "}\n"
        self.tree.package("services/big", {
            "src/lib.rs": "mod long;\nmod short;\n#[cfg(test)]\nmod long_tests;\n",
            "src/long.rs": body,
            "src/short.rs": short,
            "src/long_tests.rs": body,
        })
        code, out = self.tree.rooms()
        self.assertEqual(code, 1, out)
        self.assertIn("services/big/src/long.rs: 1001 lines before its tests (at most 1000)", out)
        self.assertNotIn("short.rs", out)
        self.assertNotIn("long_tests.rs", out)

    def test_the_size_limit_is_for_services_only(self):
        self.tree.package("loadtest", {"src/main.rs": "fn main() {}\n" * 1500})
        code, out = self.tree.rooms()
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
