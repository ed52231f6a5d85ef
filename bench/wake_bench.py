#!/usr/bin/env python3
"""A standby's wake against a restore, side by side, to the first streamed token.

Given a snapshot of bench/server.py (run_bench.sh --keep leaves one), each
round does, in alternating order:

    restore   `gpusnap restore ID`, timed to the first token of a streamed answer
    wake      `gpusnap restore ID --standby` first (not timed: a standby is
              made ahead of need), then `gpusnap wake NAME`, timed the same way

Every answer must carry the same tokens (and --tokens-ref's, when given: the
cold start's), so a wake that lost state, or CUDA graphs that do not replay
after it, fails the run. Prints a Markdown table with gpusnap's phases and
writes the raw figures as JSON (--out).

    sudo python3 bench/wake_bench.py --snapshot ID --port 18080 [--rounds 2]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib
from client import alive  # bench/client.py: the script's own folder is on the path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NAME = "wake-bench"


class Bench:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                        NVSHMEM_DISABLE_NVLS="1")
        if a.store:
            self.env["GPUSNAP_STORE"] = a.store

    def gs(self, *args):
        return benchlib.run_gpusnap(self.a.gpusnap, args, self.env).stdout

    def timed_answer(self, *gs_args):
        """client.py --stream --exec -- gpusnap ARGS: its record."""
        with tempfile.TemporaryFile("w+") as out:
            p = subprocess.run([sys.executable, os.path.join(HERE, "client.py"), "--port", str(self.a.port), "--stream",
                                "--timeout", str(self.a.timeout), "--exec", "--", self.a.gpusnap, "--json", "-q",
                                *gs_args], env=self.env, stdout=out)
            out.seek(0)
            text = out.read()
        if p.returncode != 0:
            raise SystemExit(f"gpusnap {' '.join(gs_args)} or its first answer failed ({p.returncode})")
        return json.loads(text)

    def stop(self):
        for w in json.loads(self.gs("ps")):
            if w.get("name") == NAME and w.get("reaper_pid"):
                r = w["reaper_pid"]
                os.kill(r, signal.SIGTERM)
                deadline = time.monotonic() + 60
                while alive(r) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if alive(r):
                    os.kill(r, signal.SIGKILL)

    def restore(self):
        rec = self.timed_answer("restore", self.a.snapshot, "--name", NAME)
        return rec, {}

    def wake(self):
        t = time.monotonic()
        standby = json.loads(self.gs("restore", self.a.snapshot, "--standby", "--name", NAME))
        made = {"standby_s": time.monotonic() - t, "standby_phases": standby.get("timings_s", {})}
        time.sleep(self.a.settle)
        rec = self.timed_answer("wake", NAME)
        return rec, made

    def run(self):
        ref = None
        if self.a.tokens_ref:
            with open(self.a.tokens_ref) as f:
                ref = json.load(f)
            ref = ref.get("tokens", ref) if isinstance(ref, dict) else ref
        rows = []
        self.stop()
        for rnd in range(self.a.rounds):
            kinds = self.a.kinds.split(",")
            for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                try:
                    rec, extra = self.restore() if kind == "restore" else self.wake()
                finally:
                    self.stop()
                tokens = rec["answer"]["tokens"]
                if ref is None:
                    ref = tokens
                ok = tokens == ref
                out = rec.get("cmd_output") if isinstance(rec.get("cmd_output"), dict) else {}
                rows.append({"round": rnd, "kind": kind, "first_token_s": rec["first_token_s"],
                             "full_answer_s": rec.get("full_answer_s"), "cmd_s": rec.get("cmd_s"),
                             "phases": out.get("timings_s", {}), "ok": ok, "engine": rec["answer"].get("engine"),
                             **extra})
                print(f"round {rnd} {kind:8} first token {rec['first_token_s']:.3f} s, full answer "
                      f"{rec.get('full_answer_s') or 0:.3f} s, gpusnap {rec.get('cmd_s') or 0:.3f} s "
                      f"{'ok' if ok else 'TOKENS DIFFER'}", flush=True)
                if not ok:
                    raise SystemExit(f"{kind} answered {tokens[:8]}..., expected {ref[:8]}...")
        return {"snapshot": self.a.snapshot, "rows": rows}


def table(res):
    def med(kind, key):
        v = [r[key] for r in res["rows"] if r["kind"] == kind and isinstance(r.get(key), (int, float))]
        return statistics.median(v) if v else None

    lines = ["| | first streamed token | full answer | gpusnap command | phases (median row) |", "|---|---:|---:|---:|---|"]
    for kind, label in (("restore", "`gpusnap restore`"), ("wake", "`gpusnap wake` of a standby")):
        rows = [r for r in res["rows"] if r["kind"] == kind]
        if not rows:
            continue
        mid = sorted(rows, key=lambda r: r["first_token_s"])[len(rows) // 2]
        ph = ", ".join(f"{k} {v:.2f}" for k, v in sorted(mid["phases"].items()) if isinstance(v, (int, float)) and v >= 0.005)
        lines.append(f"| {label} (median of {len(rows)}) | {med(kind, 'first_token_s'):.2f} s | "
                     f"{med(kind, 'full_answer_s') or 0:.2f} s | {med(kind, 'cmd_s') or 0:.2f} s | {ph} |")
    r, w = med("restore", "first_token_s"), med("wake", "first_token_s")
    if r and w:
        lines.append(f"\nwake: {r / w:.2f}x faster than a restore to the first token")
    sb = [r["standby_s"] for r in res["rows"] if "standby_s" in r]
    if sb:
        lines.append(f"making the standby (`restore --standby`, ahead of need): {statistics.median(sb):.2f} s")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--snapshot", required=True, help="a snapshot of bench/server.py")
    p.add_argument("--port", type=int, required=True, help="the port the snapshot's server listens on")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gpusnap", default=os.path.join(REPO, "build", "gpusnap"))
    p.add_argument("--store", help="default: gpusnap's ($GPUSNAP_STORE)")
    p.add_argument("--tokens-ref", help="JSON with the cold start's tokens (a list, or an answer with `tokens`)")
    p.add_argument("--kinds", default="restore,wake", help="which rows (restore alone: a dry run on a CPU snapshot)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between making a standby and waking it")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "wake-bench.json"))
    a = p.parse_args(argv)
    res = Bench(a).run()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
