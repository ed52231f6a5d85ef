#!/usr/bin/env python3
"""A standby's wake against a restore, side by side, to the first streamed token; through the node agent too.

Given a snapshot of bench/server.py (run_bench.sh --keep leaves one), each
round does the kinds asked (--kinds), in alternating order:

    restore          `gpusnap restore ID` in this process, timed to the first
                     token of a streamed answer
    wake             `gpusnap restore ID --standby` first (not timed: a standby
                     is made ahead of need), then `gpusnap wake NAME`, timed
                     the same way
    restore-agent    the restore through the bench's node agent (started with
                     --pinned-cache SIZE and --huge-pages as asked), after
                     `gpusnap warm ID` pinned the snapshot's chunks
    wake-agent       the standby made through that agent (which pins its
                     chunks), woken through it
    wake-agent-cold  the standby made in this process, woken through a fresh
                     agent whose tier holds nothing yet
    pause, pause-nokeep
                     the snapshot restored (not timed), then `checkpoint
                     --leave-running` twice through an agent; the second's
                     pause, with every chunk stored, is the figure.
                     pause-nokeep does the same through an agent with
                     GPUSNAP_GPUSHARE_KEEP=0 (the source loads its memory
                     back from the chunks)

Every answer must carry the same tokens (and --tokens-ref's, when given: the
cold start's), so a wake that lost state, or CUDA graphs that do not replay
after it, fails the run. Prints a Markdown table with gpusnap's phases and
each agent kind against its baseline, and writes the raw figures as JSON (--out).

    sudo python3 bench/wake_bench.py --snapshot ID --port 18080 [--rounds 2]
    sudo python3 bench/wake_bench.py --snapshot ID --port 18080 --pinned-cache 48GiB --huge-pages \
        --kinds restore,restore-agent,wake,wake-agent-cold,wake-agent,pause-nokeep,pause
"""
import argparse
import json
import os
import shutil
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


AGENT_KINDS = ("restore-agent", "wake-agent", "wake-agent-cold", "pause", "pause-nokeep")
# Each agent kind, and the kind it is measured against.
BASELINES = {"restore-agent": "restore", "wake-agent": "wake", "wake-agent-cold": "wake", "pause": "pause-nokeep"}


class Agent:
    """A node agent of the bench's own: its socket, store and state in `work`."""

    def __init__(self, bench, work, env_extra=None):
        self.bench, self.work = bench, work
        os.makedirs(work, exist_ok=True)
        self.socket = os.path.join(work, "agent.sock")
        self.log = open(os.path.join(work, "agent.log"), "w")
        args = [bench.a.gpusnap, "agent", "--socket", self.socket, "--store", bench.store,
                "--state-dir", os.path.join(work, "state")]
        if bench.a.pinned_cache:
            args += ["--pinned-cache", bench.a.pinned_cache]
        if bench.a.huge_pages:
            args.append("--huge-pages")
        self.proc = subprocess.Popen(args, env=dict(bench.env, **(env_extra or {})), stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self.listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the agent did not start: {self.tail()}")
            time.sleep(0.05)

    def listening(self):
        with open(self.log.name) as f:
            return "listening on" in f.read()

    def tail(self):
        with open(self.log.name) as f:
            return f.read()[-600:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Bench:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                        NVSHMEM_DISABLE_NVLS="1")
        self.store = a.store or os.environ.get("GPUSNAP_STORE", "/var/lib/gpusnap")
        self.env["GPUSNAP_STORE"] = self.store
        self.work = tempfile.mkdtemp(prefix="gpusnap-wake-bench-")
        self.agents = {}  # kept for the run: by the environment it was started with
        self.warmed = False

    def gs(self, *args, env=None):
        return benchlib.run_gpusnap(self.a.gpusnap, args, env or self.env).stdout

    def agent(self, keep=True):
        """The run's agent (one per setting of GPUSNAP_GPUSHARE_KEEP)."""
        if keep not in self.agents:
            self.agents[keep] = Agent(self, os.path.join(self.work, f"agent-{'keep' if keep else 'nokeep'}"),
                                      None if keep else {"GPUSNAP_GPUSHARE_KEEP": "0"})
        return self.agents[keep]

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

    def answer(self):
        """The running server's answer (not timed)."""
        p = subprocess.run([sys.executable, os.path.join(HERE, "client.py"), "--port", str(self.a.port),
                            "--timeout", str(self.a.timeout)], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"the server did not answer: {p.stderr.strip()[-300:]}")
        return json.loads(p.stdout)

    def stop(self):
        for w in json.loads(self.gs("ps")):
            # A record of an earlier run's workload stays, its tree gone.
            if w.get("name") == NAME and w.get("reaper_pid") and alive(w["reaper_pid"]):
                r = w["reaper_pid"]
                try:
                    os.kill(r, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                deadline = time.monotonic() + 60
                while alive(r) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if alive(r):
                    os.kill(r, signal.SIGKILL)

    def close(self):
        for agent in self.agents.values():
            agent.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def in_process(self, *args):
        return [*args, "--no-agent", *(["--huge-pages"] if self.a.huge_pages and args[0] == "restore" else [])]

    def restore(self):
        return self.timed_answer(*self.in_process("restore", self.a.snapshot, "--name", NAME)), {}

    def restore_agent(self):
        agent = self.agent()
        extra = {}
        if self.a.pinned_cache and not self.warmed:
            warmed = json.loads(self.gs("warm", self.a.snapshot, "--agent", agent.socket))
            extra["warm"] = warmed
            self.warmed = True
        return self.timed_answer("restore", self.a.snapshot, "--name", NAME, "--agent", agent.socket), extra

    def standby_then_wake(self, standby_args, wake_args):
        t = time.monotonic()
        standby = json.loads(self.gs("restore", self.a.snapshot, "--standby", "--name", NAME, *standby_args))
        made = {"standby_s": time.monotonic() - t, "standby_phases": standby.get("timings_s", {})}
        time.sleep(self.a.settle)
        return self.timed_answer("wake", NAME, *wake_args), made

    def wake(self):
        return self.standby_then_wake(["--no-agent"], ["--no-agent"])

    def wake_agent(self):
        socket = self.agent().socket
        return self.standby_then_wake(["--agent", socket], ["--agent", socket])

    def wake_agent_cold(self):
        fresh = Agent(self, tempfile.mkdtemp(prefix="cold-agent-", dir=self.work))
        try:
            return self.standby_then_wake(["--no-agent"], ["--agent", fresh.socket])
        finally:
            self.stop()
            fresh.close()

    def pause(self, keep=True):
        """Two `checkpoint --leave-running` of the restored server; the second's record."""
        self.gs(*self.in_process("restore", self.a.snapshot, "--name", NAME))
        socket = self.agent(keep).socket  # the setting is the agent's environment
        first = None
        for _ in range(2):
            out = json.loads(self.gs("checkpoint", NAME, "--leave-running", "--agent", socket))
            self.gs("rm", out["id"])
            first = first or out
        answer = self.answer()
        t = out.get("timings_s", {})
        rec = {"first_token_s": t.get("paused", float("nan")), "cmd_s": t.get("total"), "answer": answer,
               "cmd_output": out}
        return rec, {"first_paused_s": first.get("timings_s", {}).get("paused")}

    def run(self):
        ref = None
        if self.a.tokens_ref:
            with open(self.a.tokens_ref) as f:
                ref = json.load(f)
            ref = ref.get("tokens", ref) if isinstance(ref, dict) else ref
        rows = []
        do = {"restore": self.restore, "wake": self.wake, "restore-agent": self.restore_agent,
              "wake-agent": self.wake_agent, "wake-agent-cold": self.wake_agent_cold, "pause": self.pause,
              "pause-nokeep": lambda: self.pause(keep=False)}
        kinds = self.a.kinds.split(",")
        try:
            self.stop()
            for rnd in range(self.a.rounds):
                for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                    try:
                        rec, extra = do[kind]()
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
                    what = "paused" if kind.startswith("pause") else "first token"
                    print(f"round {rnd} {kind:15} {what} {rec['first_token_s']:.3f} s, full answer "
                          f"{rec.get('full_answer_s') or 0:.3f} s, gpusnap {rec.get('cmd_s') or 0:.3f} s "
                          f"{'ok' if ok else 'TOKENS DIFFER'}", flush=True)
                    if not ok:
                        raise SystemExit(f"{kind} answered {tokens[:8]}..., expected {ref[:8]}...")
        finally:
            self.close()
        return {"snapshot": self.a.snapshot, "pinned_cache": self.a.pinned_cache, "huge_pages": self.a.huge_pages,
                "rows": rows}


LABELS = {"restore": "`gpusnap restore` in process", "wake": "`gpusnap wake` of a standby, in process",
          "restore-agent": "restore through the agent", "wake-agent": "wake through the agent, standby made by it",
          "wake-agent-cold": "wake through a fresh agent, nothing pinned",
          "pause-nokeep": "`checkpoint --leave-running`, GPUSNAP_GPUSHARE_KEEP=0: pause",
          "pause": "`checkpoint --leave-running`: pause"}


def table(res):
    def med(kind, key):
        v = [r[key] for r in res["rows"] if r["kind"] == kind and isinstance(r.get(key), (int, float))]
        return statistics.median(v) if v else None

    lines = ["| | first streamed token (pause) | full answer | gpusnap command | phases (median row) |",
             "|---|---:|---:|---:|---|"]
    for kind, label in LABELS.items():
        rows = [r for r in res["rows"] if r["kind"] == kind]
        if not rows:
            continue
        mid = sorted(rows, key=lambda r: r["first_token_s"])[len(rows) // 2]
        ph = ", ".join(f"{k} {v:.2f}" for k, v in sorted(mid["phases"].items()) if isinstance(v, (int, float)) and v >= 0.005)
        lines.append(f"| {label} (median of {len(rows)}) | {med(kind, 'first_token_s'):.2f} s | "
                     f"{med(kind, 'full_answer_s') or 0:.2f} s | {med(kind, 'cmd_s') or 0:.2f} s | {ph} |")
    lines.append("")
    r, w = med("restore", "first_token_s"), med("wake", "first_token_s")
    if r and w:
        lines.append(f"wake: {r / w:.2f}x faster than a restore to the first token")
    for kind, base in BASELINES.items():
        k, b = med(kind, "first_token_s"), med(base, "first_token_s")
        if k and b:
            lines.append(f"{LABELS[kind]}: {k:.2f} s against {b:.2f} s ({k / b:.2f}x)")
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
    p.add_argument("--kinds", default="restore,wake",
                   help="which rows, of " + ", ".join(LABELS) + " (restore alone: a dry run on a CPU snapshot)")
    p.add_argument("--pinned-cache", help="the agent's --pinned-cache (none: an agent without a tier)")
    p.add_argument("--huge-pages", action="store_true",
                   help="restores in process with --huge-pages, and the agent with it")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between making a standby and waking it")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "wake-bench.json"))
    a = p.parse_args(argv)
    unknown = [k for k in a.kinds.split(",") if k not in LABELS]
    if unknown:
        p.error(f"unknown kind(s) {', '.join(unknown)}: the kinds are {', '.join(LABELS)}")
    res = Bench(a).run()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
