"""Tests of the suite's parsing and verdicts: `python3 -m unittest loadtest/bench/test_suite.py`.

They feed recorded tool output (divan's table, strace lines) and made-up results to the
functions that turn them into numbers and verdicts, so a change in a tool's format or a
wrong comparison shows up here rather than as a silently wrong BENCHMARKS.md.
"""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402

DIVAN = """\
Timer precision: 20 ns
codec                    fastest       │ slowest       │ median        │ mean          │ samples │ iters
├─ decode_moves                        │               │               │               │         │
│  ├─ 1                  79.69 ns      │ 1.638 ms      │ 99.69 ns      │ 540.6 ns      │ 13984   │ 13984
│  │                     12.54 Mitem/s │ 610.2 item/s  │ 10.03 Mitem/s │ 1.849 Mitem/s │         │
│  ╰─ 256                8.846 µs      │ 7.364 ms      │ 9.166 µs      │ 25.18 µs      │ 2208    │ 2208
│                        28.93 Mitem/s │ 34.76 Kitem/s │ 27.92 Mitem/s │ 10.16 Mitem/s │         │
├─ encode_moved          45.39 ns      │ 84.62 µs      │ 46.64 ns      │ 181.9 ns      │ 3869    │ 247616
╰─ split_frames_only     811.1 ns      │ 731.9 µs      │ 821.4 ns      │ 3.542 µs      │ 3495    │ 13980
"""


def run(label, p99, cpu_gateway, messages=1000, **extra):
    base = {"label": label, "p50_ms": p99 / 4, "p99_ms": p99, "messages": messages,
            "wall_s": 5.0, "moves_lost": 0, "disconnects": 0, "bots": 300,
            "notifications_per_s": 1000.0, "send_lag_max_ms": 0.5,
            "cpu_us_per_msg": {"gateway": cpu_gateway, "shards": 1.0, "loadtest": 2.0}}
    base.update(extra)
    return base


class ParseDivan(unittest.TestCase):
    def test_rows_are_named_by_their_tree_path(self):
        rows = suite.parse_divan(DIVAN)
        self.assertEqual(list(rows), ["decode_moves/1", "decode_moves/256", "encode_moved",
                                      "split_frames_only"])
        self.assertEqual(rows["decode_moves/256"], {"fastest": "8.846 µs", "median": "9.166 µs"})
        self.assertEqual(rows["encode_moved"]["median"], "46.64 ns")

    def test_output_without_a_table_gives_nothing(self):
        self.assertEqual(suite.parse_divan("error: no benchmarks\n"), {})


class CountSyscalls(unittest.TestCase):
    def test_calls_are_counted_per_thread_kind_and_resumptions_once(self):
        lines = [
            "101 io_uring_enter(3, 1, 0, 0, NULL, 8) = 1",
            "101 io_uring_enter(3, 2, 0, 0, NULL, 8) = 2",
            "102 epoll_wait(5, [], 1024, 10 <unfinished ...>",
            "102 <... epoll_wait resumed>) = 0",
            "103 futex(0x7f, FUTEX_WAKE_PRIVATE, 1) = 0",
            "+++ exited with 0 +++",
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".strace", delete=False) as trace:
            trace.write("\n".join(lines) + "\n")
        names = {101: "gw-uring-0", 102: "gw-uring-1", 103: "tokio-rt-worker"}
        counted = suite.count_syscalls(trace.name, names, messages=8)
        Path(trace.name).unlink()
        self.assertEqual(counted["all_threads"], 4)
        self.assertEqual(counted["io_workers"], 3)
        self.assertEqual(counted["all_per_msg"], 0.5)
        self.assertEqual(counted["workers_per_msg"], 0.375)
        self.assertEqual(counted["by_thread"]["tokio-rt-worker"], 1)


class ReadPerf(unittest.TestCase):
    def test_per_thread_counts_are_summed_by_thread_kind(self):
        text = ("# started on Mon Nov 30 05:17:49 2026\n\n"
                "gw-uring-0-101,4000,,raw_syscalls:sys_enter,39122070,100.00,,\n"
                "gw-uring-1-102,1000,,raw_syscalls:sys_enter,39122070,100.00,,\n"
                "tokio-rt-worker-103,500,,raw_syscalls:sys_enter,39122070,100.00,,\n"
                "meridian-100,<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n")
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as csv:
            csv.write(text)
        counts = suite.read_perf_syscalls(csv.name)
        Path(csv.name).unlink()
        self.assertEqual(counts, {"gw-uring": 5000, "tokio-rt-worker": 500})
        figures = suite.per_message(counts, 1000)
        self.assertEqual(figures["workers_per_msg"], 5.0)
        self.assertEqual(figures["all_per_msg"], 5.5)


class Verdicts(unittest.TestCase):
    def results(self, uring_workers, epoll_workers, capacity_p99, notifications):
        strace = lambda workers: {"syscalls": {"workers_per_msg": workers,  # noqa: E731
                                               "all_per_msg": workers * 2}}
        return {
            "uring_dense": run("uring dense", 10, 1.0),
            "epoll_dense": run("epoll dense", 12, 2.0),
            "uring_dense_strace": strace(uring_workers),
            "epoll_dense_strace": strace(epoll_workers),
            "uring_direct": run("uring spread", 5, 10.0),
            "nginx_relay": run("via nginx", 7, 10.0, cpu_us_per_msg={"nginx": 25.0,
                                                                      "gateway": 10.0}),
            "capacity": run("capacity", capacity_p99, 2.0, bots=5000,
                            ramp_steps=[{"p99_ms": capacity_p99,
                                         "passed": capacity_p99 < 50}]),
            "uring4_dense": run("4 shards dense", 30, 1.0,
                                notifications_per_s=notifications),
        }

    def verdicts(self, results):
        rows = suite.target_rows(results, suite.SETTINGS["quick"])
        return {row[0].split(":")[0]: row[2] for row in rows}

    def test_met_targets_say_yes(self):
        verdicts = self.verdicts(self.results(0.01, 0.5, 20.0, 400_000.0))
        self.assertEqual(verdicts["io_uring"], "yes")
        self.assertEqual(verdicts["relay hop"], "yes")
        self.assertEqual(verdicts[">= 5,000 bots through 1 gateway + 4 shards at 1 move/s "
                                  "with p99 < 50 ms and zero lost moves"], "yes")
        self.assertEqual(verdicts[">= 300,000 notifications / s in the densest configuration"],
                         "yes")

    def test_misses_are_reported_as_no(self):
        verdicts = self.verdicts(self.results(0.1, 0.5, 400.0, 200_000.0))
        self.assertEqual(verdicts["io_uring"], "**no**", "5x fewer is not 47x fewer")
        self.assertEqual(verdicts[">= 5,000 bots through 1 gateway + 4 shards at 1 move/s "
                                  "with p99 < 50 ms and zero lost moves"], "**no**")
        self.assertEqual(verdicts[">= 300,000 notifications / s in the densest configuration"],
                         "**no**")

    def test_a_target_met_by_one_count_and_missed_by_another_says_partly(self):
        results = self.results(0.01, 0.5, 20.0, 400_000.0)
        results["uring_dense"]["syscalls_perf"] = {"workers_per_msg": 0.002,
                                                   "all_per_msg": 0.01}
        results["epoll_dense"]["syscalls_perf"] = {"workers_per_msg": 0.2, "all_per_msg": 0.2}
        verdict = self.verdicts(results)["io_uring"]
        self.assertTrue(verdict.startswith("partly"), verdict)
        self.assertIn("perf I/O workers yes", verdict)
        self.assertIn("perf all threads no", verdict)

    def test_lost_moves_fail_the_capacity_target_even_with_a_low_p99(self):
        results = self.results(0.01, 0.5, 20.0, 400_000.0)
        results["capacity"]["moves_lost"] = 3
        verdicts = self.verdicts(results)
        self.assertEqual(verdicts[">= 5,000 bots through 1 gateway + 4 shards at 1 move/s "
                                  "with p99 < 50 ms and zero lost moves"], "**no**")


class Transport(unittest.TestCase):
    def test_tcp_and_quic_runs_make_one_table_with_gateway_cpu(self):
        results = {
            "uring_direct": run("uring spread", 2.0, 8.0),
            "quic_direct": run("quic spread", 3.0, 16.0),
        }
        tables = suite.build_tables(results, suite.SETTINGS["quick"])
        table = next(t for t in tables if t["title"].startswith("Transport: TCP vs QUIC"))
        cpu = next(row for row in table["rows"] if row[0] == "gateway CPU µs / message")
        self.assertEqual(cpu[1:], ["8.00", "16.00", "2.00x"])


class WebSocketTransport(unittest.TestCase):
    def test_gateway_threads_are_grouped_and_divided_by_messages(self):
        x = run("ws spread 1", 2.0, 10.0, messages=2_000_000,
                gateway_cpu_s_by_thread={"gw-ws": 6.0, "gw-uring": 2.0, "gw-quic": 0.5,
                                         "tokio-runtime-w": 1.0, "meridian": 0.5})
        self.assertEqual(suite.gateway_thread_split(x),
                         {"gw-ws": 3.0, "I/O workers": 1.0, "other threads": 1.0})
        epoll = run("e", 1.0, 1.0, messages=1_000_000, gateway_cpu_s_by_thread={"gw-epoll": 1.0})
        self.assertEqual(suite.gateway_thread_split(epoll)["I/O workers"], 1.0)
        self.assertEqual(suite.gateway_thread_split(run("none", 1.0, 1.0))["gw-ws"], 0.0)

    def test_the_table_compares_the_means_and_lists_every_run(self):
        results = {
            "ws_tcp_1": run("tcp spread 1", 2.0, 6.0, p999_ms=5.0),
            "ws_ws_1": run("ws spread 1", 3.0, 9.0, p999_ms=8.0),
            "ws_ws_2": run("ws spread 2", 5.0, 11.0, p999_ms=12.0),
            "ws_tcp_2": run("tcp spread 2", 4.0, 8.0, p999_ms=7.0),
        }
        tables = suite.build_tables(results, suite.SETTINGS["quick"])
        table = next(t for t in tables if t["title"].startswith("Transport: TCP vs WebSocket"))
        self.assertIn("1000 bots", table["title"])
        rows = {row[0]: row[1:] for row in table["rows"]}
        self.assertEqual(rows["gateway CPU µs / message"],
                         ["7.00", "10.00", "1.43x", "6.00 / 8.00", "9.00 / 11.00"])
        self.assertEqual(rows["delay p99 (ms)"][:3], ["3.000", "4.000", "1.33x"])
        self.assertEqual(rows["delay p999 (ms)"][:3], ["6.000", "10.000", "1.67x"])
        self.assertEqual(rows["messages relayed / s"][:3], ["200", "200", "1.00x"])
        self.assertEqual(rows["moves lost"][2], "-", "no ratio of zeros")
        # The four runs also appear in the per-process CPU table.
        cpu = next(t for t in tables if t["title"].startswith("Where the CPU goes"))
        self.assertEqual(len([row for row in cpu["rows"] if "spread" in row[0]]), 4)

    def test_no_table_without_both_transports(self):
        results = {"ws_tcp_1": run("tcp spread 1", 2.0, 6.0)}
        tables = suite.build_tables(results, suite.SETTINGS["quick"])
        self.assertFalse(any("WebSocket" in t["title"] for t in tables))


def relay_run(label, gateway_cpu, nginx_cpu=None, client_reads=1.0, client_sleeps=0.5,
              messages=1000):
    """A relay run as `Suite.loadtest(count_events=True)` records it."""
    cpu = {"gateway": gateway_cpu, "shards": 1.0, "loadtest": 3.0}
    extra = {}
    if nginx_cpu is not None:
        cpu["nginx"] = nginx_cpu
        extra["nginx_events"] = {"sched:sched_waking": 0.8, "raw_syscalls:sys_enter": 2.0}
    return run(label, 4.0, gateway_cpu, messages=messages, cpu_us_per_msg=cpu,
               syscalls_perf={"all_per_msg": 0.6, "workers_per_msg": 0.2},
               gateway_events={"sched:sched_waking": {"all_per_msg": 0.9,
                                                      "workers_per_msg": 0.4},
                               "sched:sched_switch": {"all_per_msg": 0.3,
                                                      "workers_per_msg": 0.1}},
               client_events={"raw_syscalls:sys_enter": 2.5,
                              "syscalls:sys_enter_recvfrom": client_reads,
                              "syscalls:sys_enter_epoll_wait": 0.25},
               client_voluntary_switches_per_msg=client_sleeps, **extra)


class RelayClients(unittest.TestCase):
    def results(self, nginx_bare_2000=10.0):
        return {"relay_clients": {
            "loadtest": {
                "1000": {"direct": relay_run("lt 1000 direct", 6.0),
                         "nginx": relay_run("lt 1000 via nginx", 7.0, nginx_cpu=12.0),
                         "direct_again": relay_run("lt 1000 direct again", 4.0)},
                "2000": {"direct": relay_run("lt 2000 direct", 3.0),
                         "nginx": relay_run("lt 2000 via nginx", 3.5, nginx_cpu=8.0),
                         "direct_again": relay_run("lt 2000 direct again", 3.0)},
            },
            "bare-client": {
                "1000": {"direct": relay_run("bare 1000 direct", 12.0, client_reads=0.5),
                         "nginx": relay_run("bare 1000 via nginx", 9.0, nginx_cpu=11.0),
                         "direct_again": relay_run("bare 1000 direct again", 14.0,
                                                   client_reads=0.7)},
                "2000": {"direct": relay_run("bare 2000 direct", 4.0),
                         "nginx": relay_run("bare 2000 via nginx", 4.0,
                                            nginx_cpu=nginx_bare_2000),
                         "direct_again": relay_run("bare 2000 direct again", 4.0)},
            },
        }}

    def test_a_table_per_client_with_every_run_and_the_ratio_on_the_nginx_row(self):
        tables = suite.build_tables(self.results(), suite.SETTINGS["full"])
        per_client = [t for t in tables if t["title"].startswith("Relay hop, client ")]
        self.assertEqual([t["title"].split(":")[0] for t in per_client],
                         ["Relay hop, client loadtest", "Relay hop, client bare-client"])
        header = per_client[0]["header"]
        for column in ("gateway syscalls/msg, whole process",
                       "gateway syscalls/msg, I/O threads", "nginx CPU µs/msg", "p99 ms"):
            self.assertIn(column, header)
        rows = [dict(zip(header, row)) for row in per_client[1]["rows"]]
        self.assertEqual([(row["bots"], row["path"]) for row in rows],
                         [("1,000", "direct"), ("1,000", "via nginx"), ("1,000", "direct again"),
                          ("2,000", "direct"), ("2,000", "via nginx"), ("2,000", "direct again")])
        # bare-client, 1,000 bots: the direct runs' mean 13.0 against nginx's 11.0.
        self.assertEqual(rows[1]["gateway (direct, mean) / nginx"], "1.18x")
        self.assertEqual(rows[1]["nginx CPU µs/msg"], "11.00")
        self.assertEqual(rows[0]["gateway (direct, mean) / nginx"], "-")
        self.assertEqual(rows[0]["gateway syscalls/msg, whole process"], "0.600")
        self.assertEqual(rows[0]["gateway syscalls/msg, I/O threads"], "0.200")
        self.assertEqual(rows[0]["client reads/msg"], "0.500")
        self.assertIn("a move per 250ms, 15 s per run", per_client[0]["title"])

    def test_the_side_by_side_table_compares_the_direct_means(self):
        tables = suite.build_tables(self.results(), suite.SETTINGS["full"])
        table = next(t for t in tables if t["title"].startswith("Relay hop: what the client"))
        self.assertEqual(table["header"][1:4],
                         ["loadtest, 1,000 bots", "bare-client, 1,000 bots",
                          "bare-client / loadtest"])
        rows = {row[0]: row[1:] for row in table["rows"]}
        self.assertEqual(rows["direct: gateway CPU µs / message"][:3], ["5.00", "13.00", "2.60x"])
        self.assertEqual(rows["direct: client reads / message"][:3], ["1.000", "0.600", "0.60x"])
        self.assertEqual(rows["through nginx: nginx CPU µs / message"][3:5], ["8.00", "10.00"])
        self.assertEqual(rows["gateway (direct, mean) / nginx, CPU per message"],
                         ["0.42x", "1.18x", "", "0.38x", "0.40x", ""])

    def test_the_target_needs_both_clients_at_every_size(self):
        def verdict(results):
            rows = suite.target_rows(results, suite.SETTINGS["full"])
            return next(row for row in rows if row[0].startswith("relay hop: gateway CPU"))

        row = verdict(self.results())
        self.assertEqual(row[2], "**no**", "bare-client at 1,000 bots is 1.18x")
        self.assertIn("bare-client, 1,000 bots: gateway 13.00 vs nginx 11.00 µs/msg (1.18x)",
                      row[1])
        results = self.results()
        results["relay_clients"]["bare-client"]["1000"]["direct"]["cpu_us_per_msg"]["gateway"] = 4
        results["relay_clients"]["bare-client"]["1000"]["direct_again"]["cpu_us_per_msg"][
            "gateway"] = 1
        self.assertEqual(verdict(results)[2], "yes")
        del results["relay_clients"]["bare-client"]["2000"]["nginx"]
        self.assertEqual(verdict(results)[2], "n/a", "a missing nginx run decides nothing")


class ReadPerfTotals(unittest.TestCase):
    def test_counts_without_per_thread_are_filed_under_all(self):
        text = ("# started on Wed Dec  2 08:56:14 2026\n\n"
                "48,,raw_syscalls:sys_enter,705849,100.00,,\n"
                "7,,sched:sched_waking,705849,100.00,,\n"
                "<not counted>,,syscalls:sys_enter_read,0,100.00,,\n")
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as csv:
            csv.write(text)
        counts = suite.read_perf_counts(csv.name)
        Path(csv.name).unlink()
        self.assertEqual(counts, {"raw_syscalls:sys_enter": {"all": 48},
                                  "sched:sched_waking": {"all": 7}})
        self.assertEqual(suite.totals_per_message(counts, 16),
                         {"raw_syscalls:sys_enter": 3.0, "sched:sched_waking": 0.4375})
        self.assertEqual(suite.event_flags(["a", "b"]), ["-e", "a", "-e", "b"])


class Docs(unittest.TestCase):
    def test_markdown_tables_escape_pipes(self):
        table = {"title": "t", "header": ["a", "b"], "rows": [["x|y", "1"]]}
        text = suite.render_markdown([table], ["note"], suite.SETTINGS["quick"])
        self.assertIn("| x\\|y | 1 |", text)
        self.assertIn("- note", text)


if __name__ == "__main__":
    unittest.main()
