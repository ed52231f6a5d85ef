#!/usr/bin/env python3
"""Tests of the benchmark's non-GPU parts: no torch needed.

    python3 -m unittest discover -s bench -p 'test_*.py' -v

- benchlib (the JSON and arithmetic of run_bench.sh), client and server
  argument parsing, the prompt, parameter counts;
- the HTTP protocol, against server.py's fake backend;
- run_bench.sh itself under the real gpusnap and CRIU with the fake backend
  (root and a built gpusnap needed, else skipped; GPUSNAP_BIN picks the binary).
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib  # noqa: E402
import client  # noqa: E402
import server  # noqa: E402
import wake_bench  # noqa: E402

GPUSNAP = os.environ.get("GPUSNAP_BIN", os.path.join(HERE, "..", "build", "gpusnap"))

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


class quiet_stderr:
    """argparse's usage and error on stderr, out of the test output."""

    def __enter__(self):
        self.saved, sys.stderr = sys.stderr, open(os.devnull, "w")

    def __exit__(self, *exc):
        sys.stderr.close()
        sys.stderr = self.saved


def answer(tokens, served, started=100.0, **kw):
    return {"tokens": tokens, "served": served, "started": started, "seconds": 0.1, **kw}


class Pure(unittest.TestCase):
    def test_param_counts_match_the_real_models(self):
        self.assertAlmostEqual(server.param_count(server.PRESETS["8b"]) / 1e9, 8.03, places=2)
        # Llama-3.2-1B has 1.24 B with tied embeddings; untied adds one vocab x hidden matrix.
        p = server.PRESETS["1b"]
        self.assertAlmostEqual((server.param_count(p) - p["vocab_size"] * p["hidden_size"]) / 1e9, 1.24, places=2)

    def test_prompt_is_fixed_and_in_vocab(self):
        a = server.prompt_ids(32, 128256)
        self.assertEqual(a, server.prompt_ids(32, 128256))
        self.assertEqual(len(a), 32)
        self.assertTrue(all(0 <= t < 128256 for t in a))
        self.assertNotEqual(a, server.prompt_ids(32, 128256, seed=1))

    def test_server_args(self):
        a = server.parse_args(["--model", "1b", "--port", "9", "--pinned-mb", "64"])
        self.assertEqual((a.model, a.port, a.pinned_mb, a.max_new_tokens, a.backend), ("1b", 9, 64, 32, "torch"))
        with self.assertRaises(SystemExit):
            server.parse_args(["--model", "70b"])
        with self.assertRaises(SystemExit):
            server.parse_args(["--max-new-tokens", "0"])

    def test_engine_args(self):
        a = server.parse_args([])
        self.assertEqual((a.engine, a.gpu_memory_utilization, a.kv_cache_gib, a.max_seq_len, a.kv_sized),
                         ("static", 0.9, None, 4096, False))
        self.assertEqual(server.parse_args(["--engine", "eager"]).engine, "eager")
        self.assertEqual(server.parse_args(["--backend", "fake", "--engine", "eager"]).engine, "eager")
        a = server.parse_args(["--kv-cache-gib", "2.5"])
        self.assertEqual((a.kv_cache_gib, a.gpu_memory_utilization, a.kv_sized), (2.5, None, True))
        self.assertEqual(server.parse_args(["--gpu-memory-utilization", "0.5"]).gpu_memory_utilization, 0.5)
        # Prompt + answer beyond the static cache: refused for static, fine for eager.
        self.assertEqual(server.parse_args(["--engine", "eager", "--max-seq-len", "32", "--max-new-tokens", "64"])
                         .max_seq_len, 32)
        a = server.parse_args(["--self-test"])
        self.assertEqual((a.max_new_tokens, a.self_test_models), (64, ["tiny", "1b"]))
        for bad in (["--engine", "vllm"], ["--gpu-memory-utilization", "0"], ["--gpu-memory-utilization", "1.5"],
                    ["--kv-cache-gib", "0"], ["--kv-cache-gib", "1", "--gpu-memory-utilization", "0.5"],
                    ["--max-seq-len", "100"], ["--max-seq-len", "32", "--max-new-tokens", "8"],
                    ["--self-test", "--backend", "fake"], ["--self-test-models", "tiny,70b"]):
            with self.assertRaises(SystemExit, msg=bad), quiet_stderr():
                server.parse_args(bad)

    def test_kv_pool_is_sized_as_a_serving_engine_sizes_it(self):
        p8 = server.PRESETS["8b"]
        self.assertEqual(server.kv_slot_bytes(p8, 4096), 512 << 20)   # 32 layers x k,v x 8 heads x 128 x bf16
        gib = 1 << 30
        # 0.9 of 140 GiB, less the 20 GiB in use (weights, context): 106 GiB.
        self.assertEqual(server.kv_budget_bytes(140 * gib, 120 * gib, 0.9), 106 * gib)
        self.assertEqual(server.kv_budget_bytes(140 * gib, 120 * gib, 0.9, kv_cache_gib=1.5), 3 * gib // 2)
        plan = server.kv_plan(p8, 4096, 106 * gib + 5)
        self.assertEqual(plan["slots"], 212)
        self.assertEqual(plan["bytes"], 106 * gib)
        self.assertEqual(plan["tokens"], 212 * 4096)
        self.assertEqual(plan["shape"], [32, 2, 212, 8, 4096, 128])
        self.assertEqual(server.kv_plan(server.PRESETS["tiny"], 4096, 1 * gib)["shape"], [2, 2, 256, 2, 4096, 64])
        for budget in (0, -5 * gib, (512 << 20) - 1):
            with self.assertRaises(ValueError):
                server.kv_plan(p8, 4096, budget)

    def test_mark_scratch_calls_the_shims_function_when_there_is_one(self):
        # This process has no shim: nothing to call, and no failure.
        self.assertEqual(server.mark_scratch([(0x7000000000, 1 << 30)]), "absent")

        class Lib:
            def __init__(self, rc=0):
                self.calls, self.rc = [], rc
                lib = self

                def fn(ptr, n):
                    lib.calls.append((ptr, n))
                    return lib.rc
                setattr(self, server.SCRATCH_SYMBOL, fn)

        lib = Lib()
        self.assertEqual(server.mark_scratch([(1, 2), (3, 4)], lib), "marked")
        self.assertEqual(lib.calls, [(1, 2), (3, 4)])
        import ctypes
        self.assertEqual(getattr(lib, server.SCRATCH_SYMBOL).argtypes, [ctypes.c_uint64, ctypes.c_size_t])
        self.assertIn("returned -22", server.mark_scratch([(1, 2)], Lib(rc=-22)))
        self.assertEqual(server.mark_scratch([(1, 2)], object()), "absent")

    def test_max_new_tokens_from_query_or_body(self):
        f = server.parse_max_new_tokens
        self.assertEqual(f("/generate", b"", 32), 32)
        self.assertEqual(f("/generate?max_new_tokens=5", b"", 32), 5)
        self.assertEqual(f("/generate", b'{"max_new_tokens": 7}', 32), 7)
        self.assertEqual(f("/generate", b"{}", 32), 32)
        for path, body in [("/generate?max_new_tokens=x", b""), ("/generate", b"[1]"), ("/generate", b"nope"),
                           ("/generate", b'{"max_new_tokens": 0}'), ("/generate", b'{"max_new_tokens": true}'),
                           ("/generate", b'{"max_new_tokens": 1.5}')]:
            with self.assertRaises(ValueError, msg=(path, body)):
                f(path, body, 32)

    def test_weights_spec_names_what_matters(self):
        a = server.parse_args(["--model", "8b"])
        spec = server.weights_spec(a)
        self.assertEqual(spec["hidden_size"], 4096)
        self.assertEqual(spec["seed"], server.WEIGHT_SEED)
        self.assertFalse(spec["tied"])
        self.assertEqual(server.model_dir(a), "/tmp/gpusnap-weights/8b")

    def test_client_exec_takes_the_rest_of_the_line(self):
        a = client.parse_args(["--port", "1", "--exec", "--", "gpusnap", "--json", "run", "--port", "x"])
        self.assertEqual(a.cmd, ["gpusnap", "--json", "run", "--port", "x"])
        self.assertEqual(a.port, 1)
        self.assertEqual(client.parse_args(["--port", "1", "--exec", "ls", "-l"]).cmd, ["ls", "-l"])
        self.assertIsNone(client.parse_args(["--port", "1"]).cmd)
        with self.assertRaises(SystemExit):
            client.parse_args(["--port", "1", "--exec", "--"])

    def test_client_watches_the_pid_gpusnap_printed(self):
        self.assertEqual(client.watched_pid({"pid": 42, "reaper_pid": 41}), 42)
        self.assertIsNone(client.watched_pid("42\n"))
        self.assertIsNone(client.watched_pid({"pid": 0}))
        self.assertTrue(client.alive(os.getpid()))
        self.assertFalse(client.alive(2 ** 22 + 12345))

    def test_dig(self):
        d = {"a": {"b": [1, {"c": 2}]}}
        self.assertEqual(benchlib.dig(d, "a.b.1.c"), 2)
        self.assertEqual(benchlib.dig(d, "a.b.-1.c"), 2)
        self.assertIsNone(benchlib.dig(d, "a.x"))
        self.assertIsNone(benchlib.dig(d, "a.b.7"))
        self.assertEqual(benchlib.as_text(None), "")
        self.assertEqual(benchlib.as_text(True), "true")

    def test_running_workloads(self):
        ps = [{"name": "bench", "pid": 10, "reaper_pid": 9, "running": True},
              {"name": "old", "pid": 5, "reaper_pid": 4, "running": False}]
        self.assertEqual(benchlib.running_workloads(ps), [("bench", 10, 9)])
        self.assertEqual(benchlib.running_workloads({}), [])

    def test_phase_lines_first_occurrence_wins(self):
        text = "PHASE start 10.0\nnoise\nPHASE imports 12.5\nPHASE bad x\nPHASE ready 20\nPHASE start 99\n"
        self.assertEqual(benchlib.parse_phase_lines(text), {"start": 10.0, "imports": 12.5, "ready": 20.0})
        self.assertEqual(benchlib.parse_info_lines('INFO {"a": 1}\nINFO {"b": 2}\nINFO nope\n'), {"a": 1, "b": 2})

    def test_static_engine_phases_are_intervals_of_the_cold_start(self):
        names = [n for n, _ in benchlib.COLD_PHASES]
        self.assertLess(names.index("model"), names.index("kvcache"))
        self.assertLess(names.index("kvcache"), names.index("capture"))
        self.assertLess(names.index("capture"), names.index("warmup"))
        phases = {"start": 1.0, "model": 2.0, "kvcache": 2.5, "capture": 4.0, "warmup": 4.5, "ready": 4.6}
        iv = dict(benchlib.cold_intervals(phases, 1.0, 5.0))
        self.assertEqual(iv["KV-cache pool allocated"], 0.5)
        self.assertEqual(iv["CUDA graph captured"], 1.5)

    def test_engine_text(self):
        self.assertEqual(benchlib.engine_text({"engine": "eager"}), "eager")
        self.assertEqual(benchlib.engine_text({"engine": "static", "kv_pool_bytes": 100 << 30, "kv_scratch": "marked",
                                               "cuda_graphs": 1}),
                         "static (KV-cache pool 100.0 GiB, scratch marked, 1 CUDA graph)")
        self.assertEqual(benchlib.engine_text({}), "")
        self.assertEqual(benchlib.engine_text(None), "")

    def test_side_by_side_has_a_column_per_engine(self):
        runs = {}
        for e, cold, r in (("static", 30.0, 3.0), ("eager", 20.0, 2.5)):
            res = benchlib.assemble(self.files(cold=cold, restores=(r,)))
            res["meta"]["max_new_tokens"] = 32
            res["cold_start"]["server"] = {"engine": e}
            res["cycles"][0]["restore"]["full_answer_s"] = r + 0.31
            runs[e] = res
        runs["eager"]["ok"], runs["eager"]["error"] = False, "boom"
        lines = benchlib.side_by_side(runs).splitlines()
        self.assertEqual(lines[0], "| | static | eager |")
        self.assertIn("| cold start → first token | 30.00 | 20.00 |", lines)
        self.assertIn("| restore, page cache → first token | 3.00 (10.0x faster) | 2.50 (8.0x faster) |", lines)
        self.assertIn("|   ↳ ms a token after the first | 10.0 | 10.0 |", lines)
        self.assertIn("| checkpoint | 9.00 (18.0 GiB) | 9.00 (18.0 GiB) |", lines)
        self.assertIn("| result | ok | FAILED: boom |", lines)
        self.assertTrue(all(line.count("|") == 4 for line in lines))

    def test_combine_command(self):
        d = tempfile.mkdtemp()
        try:
            benchlib.save(os.path.join(d, "s.json"), {**benchlib.assemble(self.files()), "ok": True})
            out = os.path.join(d, "all.json")
            with open(os.devnull, "w") as null:
                stdout, sys.stdout = sys.stdout, null
                try:
                    self.assertEqual(benchlib.main(["combine", "--out", out, "static=" + os.path.join(d, "s.json")]), 0)
                    res = benchlib.load(out)
                    self.assertTrue(res["ok"])
                    self.assertEqual(res["summary"]["static"]["cold_start_s"], 40.0)
                    self.assertEqual(benchlib.main(["combine", "--out", out, "static=" + os.path.join(d, "s.json"),
                                                    "eager=" + os.path.join(d, "none.json")]), 1)
                finally:
                    sys.stdout = stdout
            self.assertFalse(benchlib.load(out)["ok"])
        finally:
            shutil.rmtree(d)

    def test_cold_intervals_chain_from_launch_to_first_answer(self):
        phases = {"start": 1.5, "imports": 5.0, "device": 5.5, "weights": 9.0, "model": 9.2, "warmup": 10.0,
                  "ready": 10.1}
        iv = benchlib.cold_intervals(phases, 1.0, 11.0)
        self.assertAlmostEqual(sum(v for _, v in iv), 10.0)
        self.assertEqual(iv[0][1], 0.5)
        self.assertEqual(iv[-1][0], "first token of /generate")
        self.assertNotIn("pinned host buffer", [label for label, _ in iv])

    def test_compare_accepts_a_true_restore(self):
        cold = {"answer": answer([1, 2, 3], 1, pinned_mb=8, pinned_ok=True, pinned_check={"cpu": 1, "gpu": 2})}
        prev = answer([1, 2, 3], 2)
        new = {"answer": answer([1, 2, 3], 3, pinned_mb=8, pinned_ok=True, pinned_check={"cpu": 1, "gpu": 2})}
        self.assertEqual(benchlib.compare(cold, prev, new, "r"), [])

    def test_compare_catches_each_kind_of_difference(self):
        cold, prev = answer([1, 2, 3], 1), answer([1, 2, 3], 2)
        self.assertIn("tokens differ", benchlib.compare(cold, prev, answer([1, 9, 3], 3), "r")[0])
        self.assertIn("index 1", benchlib.compare(cold, prev, answer([1, 9, 3], 3), "r")[0])
        self.assertIn("new process", benchlib.compare(cold, prev, answer([1, 2, 3], 3, started=5.0), "r")[0])
        self.assertIn("served count", benchlib.compare(cold, prev, answer([1, 2, 3], 1), "r")[0])
        bad_pin = answer([1, 2, 3], 3, pinned_mb=8, pinned_ok=False, pinned_check={"cpu": 0, "gpu": 0})
        self.assertIn("pinned", benchlib.compare(cold, prev, bad_pin, "r")[0])
        self.assertIn("no tokens", benchlib.compare(cold, prev, {"error": "x"}, "r")[0])

    def test_timing_rows_in_phase_order_total_last(self):
        rows = benchlib.timing_rows({"total": 3.0, "publish": 0.1, "dump": 2.0, "resolve": 0.1, "zz-new": 0.5,
                                     "gpu-checkpoint": 0.3, "note": "text"})
        self.assertEqual([k for k, _ in rows], ["resolve", "gpu-checkpoint", "dump", "publish", "zz-new",
                                                "total (gpusnap)"])
        rows = benchlib.timing_rows({"criu-restore": 1, "verify": 1, "unlock": 1, "gpu-restore": 1, "namespace": 1})
        self.assertEqual([k for k, _ in rows], ["verify", "namespace", "criu-restore", "gpu-restore", "unlock"])

    def test_ratio_formatting(self):
        self.assertEqual(benchlib.fmt_ratio(10, 10), "1.00")
        self.assertEqual(benchlib.fmt_ratio(2, 10), "0.20 (5.0x faster)")
        self.assertEqual(benchlib.fmt_ratio(20, 10), "2.00 (2.0x slower)")
        self.assertEqual(benchlib.fmt_ratio(2, 10, speed=False), "0.20")
        self.assertEqual(benchlib.fmt_ratio(None, 10), "")
        self.assertEqual(benchlib.fmt_bytes(3 * 1024 ** 3), "3.0 GiB")

    def files(self, cold=40.0, restores=(6.0,), dropped=None, model="8b"):
        f = {"env": {"model": model},
             "cold": {"t0": 1000.0, "first_token_s": cold, "answer": answer([1, 2], 1),
                      "intervals": [{"phase": "imports", "seconds": 5.0}]}}
        for i, r in enumerate(restores, 1):
            f[f"cycle-{i}-checkpoint"] = {"wall_s": 9.0, "output": {"id": f"s{i}", "total_bytes": 18 << 30,
                                                                    "timings_s": {"dump": 5.0, "total": 8.9}}}
            f[f"cycle-{i}-restore"] = {"cmd_s": r - 1, "first_token_s": r,
                                       "cmd_output": {"timings_s": {"verify": 0.5, "criu-restore": 3.0}}}
        if dropped:
            f["restore-dropped"] = {"cmd_s": dropped - 1, "first_token_s": dropped, "cmd_output": {"timings_s": {}}}
        return f

    def test_assemble_summary_and_targets(self):
        res = benchlib.assemble(self.files(dropped=15.0))
        s = res["summary"]
        self.assertEqual(s["cold_start_s"], 40.0)
        self.assertEqual(s["restore_page_cache_s"], 6.0)
        self.assertAlmostEqual(s["speedup_page_cache"], 40 / 6)
        self.assertEqual(s["restore_dropped_caches_s"], 15.0)
        self.assertEqual(s["snapshot_bytes"], 18 << 30)
        t = res["targets"]
        self.assertTrue(t["applies"] and t["restore_page_cache_le_8s"]["pass"] and t["speedup_ge_5x"]["pass"])
        t = benchlib.assemble(self.files(cold=30.0, restores=(9.0,)))["targets"]
        self.assertFalse(t["restore_page_cache_le_8s"]["pass"])
        self.assertFalse(t["speedup_ge_5x"]["pass"])
        self.assertFalse(benchlib.assemble(self.files(model="1b"))["targets"]["applies"])
        self.assertEqual(benchlib.assemble({"env": {"model": "8b"}})["targets"], {})

    def test_cycles_summary(self):
        res = benchlib.assemble(self.files(restores=(6.0, 5.0, 7.0)))
        self.assertEqual(len(res["cycles"]), 3)
        self.assertEqual(res["summary"]["restore_page_cache_median_s"], 6.0)
        self.assertEqual(res["summary"]["restore_page_cache_max_s"], 7.0)
        table = benchlib.markdown_table(res)
        self.assertIn("restore #3, page cache → first token | 7.00 |", table)

    def test_markdown_table(self):
        table = benchlib.markdown_table(benchlib.assemble(self.files(dropped=15.0)))
        lines = table.splitlines()
        self.assertEqual(lines[0], "| phase | seconds | ratio vs cold start |")
        self.assertIn("| cold start → first token | 40.00 | 1.00 |", lines)
        self.assertIn("| checkpoint (18.0 GiB) | 9.00 | 0.23 |", lines)
        self.assertIn("| restore, page cache → first token | 6.00 | 0.15 (6.7x faster) |", lines)
        self.assertIn("| restore, dropped caches → first token | 15.00 | 0.38 (2.7x faster) |", lines)
        self.assertIn("|   ↳ criu-restore | 3.00 |  |", lines)
        self.assertIn("|   ↳ imports | 5.00 |  |", lines)
        self.assertTrue(all(line.count("|") == 4 for line in lines))

    def test_report_command_writes_json_and_flags_missed_targets(self):
        d = tempfile.mkdtemp()
        try:
            for name, doc in self.files(cold=30.0, restores=(9.0,)).items():
                benchlib.save(os.path.join(d, name + ".json"), doc)
            out = os.path.join(d, "out", "bench.json")
            with open(os.devnull, "w") as null:
                stdout = sys.stdout
                sys.stdout = null
                try:
                    self.assertEqual(benchlib.main(["report", "--dir", d, "--out", out]), 0)
                    self.assertEqual(benchlib.main(["report", "--dir", d, "--out", out, "--check-targets"]), 3)
                    self.assertEqual(benchlib.main(["report", "--dir", d, "--out", out, "--error", "boom"]), 0)
                finally:
                    sys.stdout = stdout
            res = benchlib.load(out)
            self.assertFalse(res["ok"])
            self.assertEqual(res["error"], "boom")
            self.assertEqual(res["summary"]["cold_start_s"], 30.0)
        finally:
            shutil.rmtree(d)


class WakeBenchTable(unittest.TestCase):
    def row(self, kind, first, **phases):
        return {"kind": kind, "first_token_s": first, "full_answer_s": first + 0.3, "cmd_s": first - 0.1,
                "phases": phases}

    def test_each_agent_kind_is_set_against_its_baseline(self):
        rows = [self.row("restore", 2.0, total=1.9), self.row("restore", 1.9), self.row("restore-agent", 1.5),
                self.row("wake", 1.6), self.row("wake-agent", 0.8, **{"gpushare-preload": 0.5}),
                self.row("wake-agent-cold", 1.2), self.row("pause-nokeep", 3.0), self.row("pause", 2.0)]
        text = wake_bench.table({"rows": rows})
        self.assertIn("| `gpusnap restore` in process (median of 2) | 1.95 s |", text)
        self.assertIn("gpushare-preload 0.50", text)
        self.assertIn("restore through the agent: 1.50 s against 1.95 s (0.77x)", text)
        self.assertIn("wake through the agent, standby made by it: 0.80 s against 1.60 s (0.50x)", text)
        self.assertIn("wake through a fresh agent, nothing pinned: 1.20 s against 1.60 s (0.75x)", text)
        self.assertIn("`checkpoint --leave-running`: pause: 2.00 s against 3.00 s (0.67x)", text)
        self.assertIn("wake: 1.22x faster than a restore to the first token", text)

    def test_a_kind_without_its_baseline_gets_no_ratio(self):
        text = wake_bench.table({"rows": [self.row("restore-agent", 1.5)]})
        self.assertIn("restore through the agent (median of 1)", text)
        self.assertNotIn("against", text)

    def test_an_unknown_kind_is_refused_before_anything_runs(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as raised:
            wake_bench.main(["--snapshot", "none", "--port", "1", "--kinds", "restore,wake-fast"])
        self.assertEqual(raised.exception.code, 2)
        self.assertIn("unknown kind(s) wake-fast", err.getvalue())


class Protocol(unittest.TestCase):
    """server.py (fake backend) and client.py over real HTTP."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gpusnap-bench-test-")
        cls.port = int(subprocess.check_output([sys.executable, os.path.join(HERE, "benchlib.py"), "free-port"]))
        args = ["--backend", "fake", "--fake-mb", "1", "--model", "tiny", "--weights-dir", cls.tmp,
                "--port", str(cls.port), "--max-new-tokens", "8"]
        subprocess.run([sys.executable, os.path.join(HERE, "server.py"), *args, "--prepare"], check=True,
                       stdout=subprocess.DEVNULL)
        cls.log = open(os.path.join(cls.tmp, "log"), "w+")
        cls.proc = subprocess.Popen([sys.executable, "-u", os.path.join(HERE, "server.py"), *args],
                                    stdout=cls.log, stderr=subprocess.STDOUT)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(10)
        cls.log.close()
        shutil.rmtree(cls.tmp)

    def client(self, *args):
        return subprocess.run([sys.executable, os.path.join(HERE, "client.py"), "--port", str(self.port), *args],
                              capture_output=True, text=True, timeout=60)

    def test_generate_is_deterministic_and_counts(self):
        a = self.client("--timeout", "30")
        self.assertEqual(a.returncode, 0, a.stderr)
        first = json.loads(a.stdout)
        self.assertEqual(len(first["tokens"]), 8)
        second = json.loads(self.client().stdout)
        self.assertEqual(second["tokens"], first["tokens"])
        self.assertEqual(second["served"], first["served"] + 1)
        self.assertEqual(second["started"], first["started"])
        three = json.loads(self.client("--max-new-tokens", "3").stdout)
        self.assertEqual(three["tokens"], first["tokens"][:3])

    def test_exec_times_a_command_and_the_first_answer(self):
        r = self.client("--exec", "--", sys.executable, "-c", "import json; print(json.dumps({'pid': 0, 'x': 1}))")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["cmd_output"], {"pid": 0, "x": 1})
        self.assertGreaterEqual(doc["first_token_s"], doc["cmd_s"])
        self.assertEqual(len(doc["answer"]["tokens"]), 8)

    def test_a_streamed_answer_comes_token_by_token_and_ends_with_the_whole_answer(self):
        plain = json.loads(self.client().stdout)
        status, body = client.request("127.0.0.1", self.port, "POST", "/generate", body=b'{"stream": true}')
        self.assertEqual(status, 200)
        lines = [json.loads(line) for line in body.decode().splitlines()]
        self.assertEqual([line["token"] for line in lines[:-1]], plain["tokens"])
        self.assertEqual(lines[-1]["tokens"], plain["tokens"])
        self.assertEqual(lines[-1]["served"], plain["served"] + 1)
        r = self.client("--stream", "--exec", "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertTrue(doc["streamed"])
        self.assertLessEqual(doc["first_token_s"], doc["full_answer_s"])
        self.assertEqual(doc["answer"]["tokens"], plain["tokens"])

    def test_exec_fails_when_the_command_fails(self):
        r = self.client("--exec", "false")
        self.assertEqual(r.returncode, 1)
        self.assertIn("command failed", r.stderr)

    def test_health_and_info_and_errors(self):
        self.assertEqual(self.client("--health-only").returncode, 0)
        self.client()
        status, body = client.request("127.0.0.1", self.port, "GET", "/info")
        info = json.loads(body)
        self.assertEqual(status, 200)
        self.assertEqual(info["prompt"], server.prompt_ids(32, server.PRESETS["tiny"]["vocab_size"]))
        self.assertEqual(set(info["phases"]) >= {"start", "imports", "weights", "warmup", "ready"}, True)
        # The default engine: static (the fake marks its phases, holds no pool, captures nothing).
        self.assertEqual((info["engine"], info["cuda_graphs"], info["kv_pool_bytes"]), ("static", 0, 0))
        self.assertLess(info["phases"]["model"], info["phases"]["kvcache"])
        self.assertLessEqual(info["phases"]["kvcache"], info["phases"]["capture"])
        self.assertEqual(client.request("127.0.0.1", self.port, "GET", "/nope")[0], 404)
        self.assertEqual(client.request("127.0.0.1", self.port, "POST", "/generate", body=b"[")[0], 400)

    def test_the_eager_engine_serves_the_same_protocol(self):
        port = int(subprocess.check_output([sys.executable, os.path.join(HERE, "benchlib.py"), "free-port"]))
        args = ["--backend", "fake", "--fake-mb", "1", "--model", "tiny", "--weights-dir", self.tmp,
                "--port", str(port), "--max-new-tokens", "8", "--engine", "eager"]
        proc = subprocess.Popen([sys.executable, "-u", os.path.join(HERE, "server.py"), *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            r = subprocess.run([sys.executable, os.path.join(HERE, "client.py"), "--port", str(port), "--stream",
                                "--exec", "--", "true"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            ans = json.loads(r.stdout)["answer"]
            self.assertEqual(ans["engine"], "eager")
            self.assertEqual(ans["tokens"], json.loads(self.client().stdout)["tokens"])  # the fake: same either way
            info = json.loads(client.request("127.0.0.1", port, "GET", "/info")[1])
            self.assertEqual(info["engine"], "eager")
            self.assertNotIn("capture", info["phases"])
        finally:
            proc.terminate()
            proc.wait(10)

    def test_no_server_means_a_quick_clear_failure(self):
        port = subprocess.check_output([sys.executable, os.path.join(HERE, "benchlib.py"), "free-port"]).strip()
        t = time.time()
        r = subprocess.run([sys.executable, os.path.join(HERE, "client.py"), "--port", port, "--timeout", "0.5"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no healthy answer", r.stderr)
        self.assertLess(time.time() - t, 10)


class RunBenchOptions(unittest.TestCase):
    """run_bench.sh refuses bad engine options before it starts anything."""

    def run_bench(self, *args):
        return subprocess.run(["bash", os.path.join(HERE, "run_bench.sh"), *args], capture_output=True, text=True,
                              timeout=60)

    def test_bad_engine_options_are_refused(self):
        for args, msg in ((["--engine", "vllm"], "takes static or eager, not 'vllm'"),
                          (["--engines", "static,bogus"], "not 'bogus'"),
                          (["--engine", "static", "--engines", "eager"], "exclude each other"),
                          (["--engines", "static,static"], "names an engine twice"),
                          (["--gpu-memory-utilization", "2"], "must be in (0, 1]"),
                          (["--kv-cache-gib", "x"], "number of GiB"),
                          (["--kv-cache-gib", "4", "--gpu-memory-utilization", ".5"], "exclude each other")):
            r = self.run_bench(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(msg, r.stderr, args)
        self.assertIn("--engines E1,E2", self.run_bench("--help").stdout)


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class StaticEngineMath(unittest.TestCase):
    """static_engine's decode (cached K/V, one token at a time) against its own
    prefill of the whole sequence, on the CPU in float32 (no graphs)."""

    def test_decode_matches_a_full_prefill(self):
        import torch
        import static_engine
        p = server.PRESETS["tiny"]
        g = torch.Generator().manual_seed(1)
        sd = {n: (torch.ones(s) if n.endswith("norm.weight") else torch.randn(s, generator=g) * 0.02)
              for n, s in self.shapes(p).items()}
        eng = static_engine.StaticLlama(sd, p, "cpu", 64, 10000.0, 1e-5)
        eng.alloc_pool(1)
        ids = server.prompt_ids(8, p["vocab_size"])
        rec = []
        toks = eng.generate(ids, 6, use_graph=False, record=rec)
        self.assertEqual(len(toks), 6)
        for i in range(1, 6):   # the logits of token i, from a prefill of everything before it
            full = eng.prefill(torch.tensor(ids + toks[:i], dtype=torch.long))[0]
            self.assertGreater(float(torch.nn.functional.cosine_similarity(full, rec[i], dim=0)), 0.9999)
            self.assertEqual(int(full.argmax()), toks[i])
        eng.pool_buf.fill_(float("nan"))
        self.assertEqual(eng.generate(ids, 6, use_graph=False), toks)

    @staticmethod
    def shapes(p):
        h, inter, vocab, kvd = (p["hidden_size"], p["intermediate_size"], p["vocab_size"],
                                p["num_key_value_heads"] * p["hidden_size"] // p["num_attention_heads"])
        s = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
        for i in range(p["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            s.update({pre + "self_attn.q_proj.weight": (h, h), pre + "self_attn.k_proj.weight": (kvd, h),
                      pre + "self_attn.v_proj.weight": (kvd, h), pre + "self_attn.o_proj.weight": (h, h),
                      pre + "mlp.gate_proj.weight": (inter, h), pre + "mlp.up_proj.weight": (inter, h),
                      pre + "mlp.down_proj.weight": (h, inter), pre + "input_layernorm.weight": (h,),
                      pre + "post_attention_layernorm.weight": (h,)})
        return s


@unittest.skipUnless(os.geteuid() == 0 and os.access(GPUSNAP, os.X_OK), "needs root and a built gpusnap")
class UnderGpusnap(unittest.TestCase):
    """run_bench.sh end to end, the fake backend checkpointed and restored by the real CRIU."""

    def run_registry_script(self, script, *args):
        """bench/`script` on a snapshot of 200 MiB on the fake driver, in a
        store of its own: its stdout and its JSON results."""
        tmp = tempfile.mkdtemp(prefix="gpusnap-bench-script-")
        self.addCleanup(shutil.rmtree, tmp, True)
        out = os.path.join(tmp, "results.json")
        r = subprocess.run([sys.executable, os.path.join(HERE, script), "--store", os.path.join(tmp, "store"),
                            "--make-fake", "200", "--json", out, *args],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ, GPUSNAP_BIN=GPUSNAP))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        res = benchlib.load(out)
        self.assertGreater(res["bytes"], 200 << 20)
        return r.stdout, res

    def test_registry_bench_runs_pull_and_curl_side_by_side(self):
        if not shutil.which("docker-registry") or not shutil.which("curl"):
            self.skipTest("no docker-registry or curl (apt: docker-registry curl)")
        stdout, res = self.run_registry_script("registry_bench.py", "--rounds", "1")
        self.assertEqual(len(res["pull_s"]), 1)
        self.assertEqual(len(res["curl_s"]), 1)
        self.assertGreater(res["pull_vs_curl"], 0)
        self.assertIn("pull against curl:", stdout)
        # The second snapshot shares the chunks its model did not change.
        self.assertLess(res["second_pull"]["bytes_moved"], res["second_pull"]["bytes_total"] / 2)
        self.assertLess(res["second_push"]["bytes_moved"], res["second_push"]["bytes_total"] / 2)

    def test_trust_bench_pushes_and_pulls_sealed_beside_clear(self):
        if not shutil.which("docker-registry"):
            self.skipTest("no docker-registry (apt: docker-registry)")
        stdout, res = self.run_registry_script("trust_bench.py", "--rounds", "2", "--key", "ec", "--breakdown")
        self.assertEqual(set(res["variants"]), {"clear", "sealed", "signed", "encrypted"})
        for v in res["variants"].values():
            self.assertEqual((len(v["push_s"]), len(v["pull_s"])), (2, 2))
        # The sealed push under the same secret again: nothing moves.
        self.assertEqual(res["second_push"]["blobs_moved"], 0)
        self.assertEqual(res["second_push"]["blobs_skipped"], res["second_push"]["blobs"])
        self.assertIn("sealed pull's cost:", stdout)
        self.assertIn("| variant | push (median)", stdout)
        ratios = res["pull_ratio_per_round"]
        self.assertEqual(len(ratios), 2)
        for r, sealed, clear in zip(ratios, res["variants"]["sealed"]["pull_s"], res["variants"]["clear"]["pull_s"]):
            self.assertAlmostEqual(r, sealed / clear)
        self.assertRegex(stdout, r"sealed pull against clear, round by round: [0-9.]+x, [0-9.]+x \(median [0-9.]+x\)")

    def test_thp_even_restores_even_cycles_in_the_mode_and_puts_the_hosts_back(self):
        tmp = tempfile.mkdtemp(prefix="gpusnap-bench-thp-")
        try:
            thp = os.path.join(tmp, "enabled")  # stands for /sys/kernel/mm/transparent_hugepage/enabled
            with open(thp, "w") as f:
                f.write("always [madvise] never\n")
            out = os.path.join(tmp, "bench.json")
            env = {k: v for k, v in os.environ.items() if k not in ("GPUSNAP_STORE", "OUT")}
            env["GPUSNAP_BENCH_THP_FILE"] = thp
            r = subprocess.run(["bash", os.path.join(HERE, "run_bench.sh"), "--backend", "fake", "--model", "tiny",
                                "--gpusnap", GPUSNAP, "--work-dir", os.path.join(tmp, "work"), "--weights-dir",
                                os.path.join(tmp, "weights"), "--out", out, "--cycles", "2", "--no-drop-caches",
                                "--thp-even", "always"], capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            res = benchlib.load(out)
            self.assertEqual([c["restore"]["thp"] for c in res["cycles"]], ["madvise", "always"])
            self.assertIn("| restore #2, page cache, THP always → first token |", r.stdout)
            with open(thp) as f:
                self.assertEqual(f.read().strip(), "madvise")  # the host's mode, put back
            bad = subprocess.run(["bash", os.path.join(HERE, "run_bench.sh"), "--thp-even", "sometimes"],
                                 capture_output=True, text=True, env=env)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("--thp-even takes always, madvise or never", bad.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_engines_side_by_side(self):
        tmp = tempfile.mkdtemp(prefix="gpusnap-bench-engines-")
        try:
            out = os.path.join(tmp, "bench.json")
            env = {k: v for k, v in os.environ.items() if k not in ("GPUSNAP_STORE", "OUT")}
            r = subprocess.run(["bash", os.path.join(HERE, "run_bench.sh"), "--backend", "fake", "--model", "tiny",
                                "--gpusnap", GPUSNAP, "--work-dir", os.path.join(tmp, "work"), "--weights-dir",
                                os.path.join(tmp, "weights"), "--out", out, "--no-drop-caches",
                                "--engines", "static,eager"], capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            res = benchlib.load(out)
            self.assertTrue(res["ok"])
            self.assertEqual(sorted(res["engines"]), ["eager", "static"])
            for e, run in res["engines"].items():
                self.assertTrue(run["ok"], e)
                self.assertEqual(run["meta"]["engine"], e)
                self.assertEqual(run["cold_start"]["server"]["engine"], e)     # the server ran with it
                self.assertEqual(run["cold_start"]["answer"]["engine"], e)
                self.assertEqual(run["cycles"][0]["restore"]["answer"]["tokens"], run["cold_start"]["answer"]["tokens"])
            phases = [iv["phase"] for iv in res["engines"]["static"]["cold_start"]["intervals"]]
            self.assertIn("CUDA graph captured", phases)
            self.assertNotIn("CUDA graph captured",
                             [iv["phase"] for iv in res["engines"]["eager"]["cold_start"]["intervals"]])
            self.assertIn("| | static | eager |", r.stdout)
            self.assertIn("== engine eager: ", r.stdout)
            # Each engine's run left nothing behind.
            for e in ("static", "eager"):
                genv = dict(env, GPUSNAP_STORE=os.path.join(tmp, "work", f"engine-{e}", "store"),
                            GPUSNAP_RUN_DIR=os.path.join(tmp, "work", f"engine-{e}", "run"))
                ps = json.loads(subprocess.check_output([GPUSNAP, "--json", "ps"], env=genv))
                self.assertFalse([w for w in ps if w["running"]])
                self.assertEqual(json.loads(subprocess.check_output([GPUSNAP, "--json", "ls"], env=genv)), [])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_cycles_and_dropped_caches(self):
        tmp = tempfile.mkdtemp(prefix="gpusnap-bench-e2e-")
        try:
            out = os.path.join(tmp, "bench.json")
            base = ["bash", os.path.join(HERE, "run_bench.sh"), "--backend", "fake", "--model", "tiny",
                    "--gpusnap", GPUSNAP, "--work-dir", os.path.join(tmp, "work"),
                    "--weights-dir", os.path.join(tmp, "weights"), "--out", out]
            env = {k: v for k, v in os.environ.items() if k not in ("GPUSNAP_STORE", "OUT")}
            r = subprocess.run(base + ["--cycles", "2"], capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            res = benchlib.load(out)
            self.assertTrue(res["ok"])
            self.assertEqual(len(res["cycles"]), 2)
            self.assertEqual(res["cycles"][1]["restore"]["answer"]["served"], 4)
            self.assertIn("| restore #2, page cache → first token |", r.stdout)
            # After the cycles, the last snapshot once more with the caches dropped.
            self.assertEqual(res["restore_dropped_caches"]["answer"]["served"], 4)
            registry = shutil.which("docker-registry") is not None
            r = subprocess.run(base + ["--no-drop-caches"] + (["--registry"] if registry else []),
                               capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            res = benchlib.load(out)
            self.assertEqual(len(res["cycles"]), 1)
            self.assertNotIn("restore_dropped_caches", res)
            if registry:  # through a registry into empty stores, each answer checked against the cold start's
                self.assertFalse(res["registry"]["push"]["sealed"])
                self.assertEqual(res["registry"]["push"]["layers_encrypted"], 0)
                self.assertEqual(res["registry"]["restore_ref"]["answer"]["served"], 3)
                # And through a node agent, its job pulling as it restores.
                agent = res["registry"]["restore_ref_agent"]
                self.assertEqual(agent["answer"]["served"], 3)
                self.assertIn("pull-files", agent["cmd_output"]["timings_s"])
                self.assertEqual(res["registry"]["pull_then_restore"]["answer"]["served"], 3)
                self.assertIn("| restore from the registry reference, empty store → first token |", r.stdout)
            # Nothing left behind: no workload running, no snapshot.
            genv = dict(env, GPUSNAP_STORE=os.path.join(tmp, "work", "store"),
                        GPUSNAP_RUN_DIR=os.path.join(tmp, "work", "run"))
            ps = json.loads(subprocess.check_output([GPUSNAP, "--json", "ps"], env=genv))
            self.assertFalse([w for w in ps if w["running"]])
            self.assertEqual(json.loads(subprocess.check_output([GPUSNAP, "--json", "ls"], env=genv)), [])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_restores_from_a_signed_and_encrypted_reference(self):
        if not shutil.which("docker-registry"):
            self.skipTest("no docker-registry (apt: docker-registry)")
        tmp = tempfile.mkdtemp(prefix="gpusnap-bench-e2e-")
        try:
            out = os.path.join(tmp, "bench.json")
            env = {k: v for k, v in os.environ.items() if k not in ("GPUSNAP_STORE", "OUT")}
            r = subprocess.run(["bash", os.path.join(HERE, "run_bench.sh"), "--backend", "fake", "--model", "tiny",
                                "--gpusnap", GPUSNAP, "--work-dir", os.path.join(tmp, "work"),
                                "--weights-dir", os.path.join(tmp, "weights"), "--out", out, "--cycles", "1",
                                "--no-drop-caches", "--registry-sealed"],
                               capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            reg = benchlib.load(out)["registry"]
            self.assertTrue(reg["push"]["sealed"])
            self.assertGreater(reg["push"]["layers"], 1)
            self.assertEqual(reg["push"]["layers_encrypted"], reg["push"]["layers"])
            self.assertIn("signed and encrypted)", r.stdout)
            # Each restore passed the policy (the signature) and opened the blobs (the key), the
            # agent's job too, and answered as the cold start did.
            for key in ("restore_ref", "restore_ref_agent", "pull_then_restore"):
                self.assertEqual(reg[key]["answer"]["served"], 3, key)
            self.assertIn("pull-files", reg["restore_ref_agent"]["cmd_output"]["timings_s"])
            # The keys were the run's own: none is left.
            self.assertFalse(os.path.exists(os.path.join(tmp, "work", "trust")))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
