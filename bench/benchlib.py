#!/usr/bin/env python3
"""The JSON and arithmetic of bench/run_bench.sh, one subcommand per need.

    benchlib.py free-port
    benchlib.py port-free PORT                  exit 0 if 127.0.0.1:PORT can be bound
    benchlib.py alive PID                       exit 0 if PID runs (not a zombie)
    benchlib.py get FILE KEY[.KEY...]           print a value of a JSON file ('' if absent)
    benchlib.py running                         stdin: `gpusnap --json ps`; prints "NAME PID REAPER_PID" per running one
    benchlib.py env --out F [--prepare-log L] [key=value ...]
    benchlib.py cold --raw F --log L --out F    cold-start record: client output + the server's PHASE lines
    benchlib.py checkpoint --raw F --t0 T --t1 T --out F [--store DIR]
    benchlib.py compare --tokens-ref F --prev F --new F --label TEXT
    benchlib.py report --dir D --out F [--demo] [--check-targets] [--error TEXT]
    benchlib.py combine --out F ENGINE=FILE...  the results of one run per engine, side by side

Only the standard library; every function below the commands is pure and
unit-tested (bench/test_bench.py).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

# The first targets of docs/BENCHMARK.md ("Targets"): an 8B-class server back
# to its first token from a snapshot in the page cache. Today's (restore under
# 1 s, wake under 0.5 s) are not checked here.
TARGET_RESTORE_S = 8.0
TARGET_SPEEDUP = 5.0

# The server's start phases, in order, and what each interval means.
def run_gpusnap(gpusnap, args, env, check=True, timeout=None):
    """`gpusnap --json -q ARGS`: the finished process, its stdout and stderr
    as text. Files, not pipes: a workload that `run` or `restore` starts
    would hold a pipe open. SystemExit with gpusnap's error when it fails and
    `check`."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.run([gpusnap, "--json", "-q", *args], env=env, stdout=out, stderr=err, text=True,
                           timeout=timeout)
        out.seek(0)
        err.seek(0)
        p.stdout, p.stderr = out.read(), err.read()
    if check and p.returncode != 0:
        raise SystemExit(f"gpusnap {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


COLD_PHASES = [
    ("start", "launch → Python running (gpusnap run, interpreter)"),
    ("imports", "imports (torch, transformers, safetensors)"),
    ("device", "CUDA init"),
    ("weights", "weights: safetensors → GPU"),
    ("model", "model built around the weights"),
    ("kvcache", "KV-cache pool allocated"),
    ("compile", "torch.compile of the prompt's forward (inductor, Triton)"),
    ("capture", "CUDA graph captured"),
    ("pinned", "pinned host buffer"),
    ("warmup", "warm-up generate"),
    ("ready", "HTTP listener up"),
]


# --------------------------------------------------------------------------
# pure functions


def dig(doc, path):
    """doc["a"]["b"] for path "a.b"; list indexes as numbers; None if absent."""
    cur = doc
    for key in path.split(".") if path else []:
        if isinstance(cur, dict) and key in cur:
            cur = cur[key]
        elif isinstance(cur, list) and key.lstrip("-").isdigit() and -len(cur) <= int(key) < len(cur):
            cur = cur[int(key)]
        else:
            return None
    return cur


def as_text(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def running_workloads(ps):
    """(name, pid, reaper_pid) of the running workloads in `gpusnap --json ps`."""
    out = []
    for w in ps if isinstance(ps, list) else []:
        if isinstance(w, dict) and w.get("running"):
            out.append((str(w.get("name", "")), int(w.get("pid") or 0), int(w.get("reaper_pid") or 0)))
    return out


def parse_phase_lines(text):
    """{name: unix time} from the server's `PHASE <name> <time>` lines. A
    restored server appends to the same log; only the first occurrence of a
    name (the cold start's) counts."""
    phases = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "PHASE":
            try:
                t = float(parts[2])
            except ValueError:
                continue
            phases.setdefault(parts[1], t)
    return phases


def parse_info_lines(text):
    """The server's `INFO {json}` lines, merged (later keys win)."""
    info = {}
    for line in text.splitlines():
        if line.startswith("INFO "):
            try:
                doc = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(doc, dict):
                info.update(doc)
    return info


def cold_intervals(phases, t0, t_first):
    """[(label, seconds)] from the launch (t0) through the server's phases to
    the first answer (t_first); phases the server did not report are skipped."""
    out, prev = [], t0
    for name, label in COLD_PHASES:
        if name in phases:
            out.append((label, phases[name] - prev))
            prev = phases[name]
    if t_first is not None:
        out.append(("first token of /generate", t_first - prev))
    return out


def answer_of(doc):
    """The server's answer in a client output (plain, or under "answer" with --exec)."""
    if isinstance(doc, dict) and isinstance(doc.get("answer"), dict):
        return doc["answer"]
    return doc if isinstance(doc, dict) else {}


def compare(tokens_ref, prev, new, label):
    """Problems (a list of strings; empty: all good) with a new answer, given
    the reference tokens (the cold start's) and the answer given just before
    the state the new one comes from (served counts one on from it, the
    process started at the same time: the state was restored, not rebuilt)."""
    ref, p, n = answer_of(tokens_ref), answer_of(prev), answer_of(new)
    problems = []
    if not isinstance(n.get("tokens"), list):
        return [f"{label}: no tokens in the answer"]
    if n["tokens"] != ref.get("tokens"):
        first = next((i for i, (a, b) in enumerate(zip(ref.get("tokens") or [], n["tokens"])) if a != b), None)
        problems.append(f"{label}: tokens differ from the cold start's "
                        f"(first difference at index {first}):\n  cold:  {ref.get('tokens')}\n  now:   {n['tokens']}")
    if p.get("started") is not None and n.get("started") != p.get("started"):
        problems.append(f"{label}: the server's start time changed ({p.get('started')} -> {n.get('started')}): "
                        "this is a new process, not the restored one")
    if isinstance(p.get("served"), int) and n.get("served") != p["served"] + 1:
        problems.append(f"{label}: served count {n.get('served')}, expected {p['served'] + 1} "
                        "(the state did not come back as it was)")
    if n.get("pinned_mb"):
        if not n.get("pinned_ok"):
            problems.append(f"{label}: the pinned host buffer changed: {n.get('pinned_check')} "
                            f"(expected {ref.get('pinned_check')})")
        if ref.get("pinned_check") is not None and n.get("pinned_check") != ref.get("pinned_check"):
            problems.append(f"{label}: pinned checksums {n.get('pinned_check')} differ from the cold start's "
                            f"{ref.get('pinned_check')}")
    return problems


def fmt_s(v):
    return "—" if v is None else f"{v:.2f}"


def fmt_bytes(n):
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n} B"


def fmt_ratio(v, cold, speed=True):
    """this ÷ cold start, and (speed) the speed-up it means."""
    if v is None or not cold:
        return ""
    r = v / cold
    if abs(r - 1.0) < 1e-9 or not speed:
        return f"{r:.2f}"
    return f"{r:.2f} ({cold / v:.1f}x faster)" if r < 1 else f"{r:.2f} ({r:.1f}x slower)"


# The order gpusnap's phases happen in (its JSON lists them alphabetically);
# phases not named here are shown after these, in its order, total last.
PHASE_ORDER = ["pull-files", "resolve", "verify", "namespace", "quiesce", "release", "lock", "gpu-lock", "checkpoint",
               "gpu-checkpoint", "freeze", "dump", "publish", "prefetch", "lazy-pages-start", "criu-restore", "restore",
               "gpu-restore", "pull-chunks-wait", "load", "remap", "unlock", "gpu-unlock", "resume", "pull"]


def timing_rows(timings):
    """Sub-rows for gpusnap's timings_s: every key it reports, in the order
    the phases happen, total last."""
    known = {k: i for i, k in enumerate(PHASE_ORDER)}
    keys = [k for k, v in timings.items() if k != "total" and isinstance(v, (int, float))]
    keys.sort(key=lambda k: (0, known[k]) if k in known else (1, 0))  # stable: unknown keep their order
    rows = [(k, timings[k]) for k in keys]
    if isinstance(timings.get("total"), (int, float)):
        rows.append(("total (gpusnap)", timings["total"]))
    return rows


def summarize(results):
    """The headline numbers from the assembled results."""
    cold = dig(results, "cold_start.first_token_s")
    cycles = results.get("cycles") or []
    s = {"cold_start_s": cold}
    if cycles:
        first = cycles[0]
        s["checkpoint_s"] = dig(first, "checkpoint.wall_s")
        s["snapshot_bytes"] = dig(first, "checkpoint.output.total_bytes")
        s["restore_page_cache_s"] = dig(first, "restore.first_token_s")
        rs = [dig(c, "restore.first_token_s") for c in cycles if dig(c, "restore.first_token_s") is not None]
        if len(rs) > 1:
            s["restore_page_cache_median_s"] = statistics.median(rs)
            s["restore_page_cache_max_s"] = max(rs)
    dropped = dig(results, "restore_dropped_caches.first_token_s")
    if dropped is not None:
        s["restore_dropped_caches_s"] = dropped
    if cold and s.get("restore_page_cache_s"):
        s["speedup_page_cache"] = cold / s["restore_page_cache_s"]
    if cold and dropped:
        s["speedup_dropped_caches"] = cold / dropped
    return s


def targets(summary, model):
    """Pass/fail of the targets (defined for the 8B-class server)."""
    r, sp = summary.get("restore_page_cache_s"), summary.get("speedup_page_cache")
    if r is None or sp is None:
        return {}
    return {
        "applies": model == "8b",
        "restore_page_cache_le_8s": {"value": r, "target": TARGET_RESTORE_S, "pass": r <= TARGET_RESTORE_S},
        "speedup_ge_5x": {"value": sp, "target": TARGET_SPEEDUP, "pass": sp >= TARGET_SPEEDUP},
    }


def markdown_table(results):
    """phase | seconds | ratio vs cold start, with gpusnap's own phases as sub-rows."""
    cold = dig(results, "cold_start.first_token_s")
    lines = ["| phase | seconds | ratio vs cold start |", "|---|---:|---|"]

    def row(name, v, ratio=True, speed=True):
        lines.append(f"| {name} | {fmt_s(v)} | {fmt_ratio(v, cold, speed) if ratio else ''} |")

    def full_answer(doc):
        if isinstance(doc, dict) and doc.get("full_answer_s") is not None:
            row("  ↳ … → full answer (every token)", doc["full_answer_s"], ratio=False)

    if cold is not None:
        row("cold start → first token", cold)
        for iv in dig(results, "cold_start.intervals") or []:
            row(f"  ↳ {iv.get('phase')}", iv.get("seconds"), ratio=False)
        full_answer(results.get("cold_start"))
    cycles = results.get("cycles") or []
    for i, c in enumerate(cycles):
        tag = f" #{i + 1}" if len(cycles) > 1 else ""
        ck = c.get("checkpoint") or {}
        if ck:
            size = fmt_bytes(dig(ck, "output.total_bytes"))
            row(f"checkpoint{tag} ({size})", ck.get("wall_s"), speed=False)
            for k, v in timing_rows(dig(ck, "output.timings_s") or {}):
                row(f"  ↳ {k}", v, ratio=False)
        rs = c.get("restore") or {}
        if rs:
            thp = f", THP {rs['thp']}" if rs.get("thp") else ""
            lazy = ", lazy pages" if rs.get("lazy_pages") else ""
            row(f"restore{tag}, page cache{thp}{lazy} → first token", rs.get("first_token_s"))
            for k, v in timing_rows(dig(rs, "cmd_output.timings_s") or {}):
                row(f"  ↳ {k}", v, ratio=False)
            row("  ↳ after gpusnap returned: /health + first token of /generate",
                (rs.get("first_token_s") or 0) - (rs.get("cmd_s") or 0), ratio=False)
            if rs.get("lazy_pages_s") is not None:
                row("  ↳ lazy pages: the server's start to every page in", rs["lazy_pages_s"], ratio=False)
            full_answer(rs)
    reg = results.get("registry") or {}
    if reg.get("push"):
        p = reg["push"]
        sealed = ", signed and encrypted" if p.get("sealed") else ""
        row(f"push to the registry ({fmt_bytes(p.get('bytes_total'))}, {p.get('blobs')} blobs{sealed})", p.get("wall_s"),
            speed=False)
    for key, label in (("restore_ref", "restore from the registry reference, empty store"),
                       ("restore_ref_agent", "restore from the registry reference through the agent, empty store"),
                       ("pull_then_restore", "pull, then restore, empty store")):
        r = reg.get(key)
        if not r:
            continue
        row(f"{label} → first token", r.get("first_token_s"))
        if key == "pull_then_restore" and reg.get("pull"):
            row("  ↳ gpusnap pull", reg["pull"].get("seconds"), ratio=False)
        for k, v in timing_rows(dig(r, "cmd_output.timings_s") or {}):
            row(f"  ↳ {k}", v, ratio=False)
        row("  ↳ after gpusnap returned: /health + first token of /generate",
            (r.get("first_token_s") or 0) - (r.get("cmd_s") or 0), ratio=False)
        full_answer(r)
    d = results.get("restore_dropped_caches")
    if d:
        row("restore, dropped caches → first token", d.get("first_token_s"))
        for k, v in timing_rows(dig(d, "cmd_output.timings_s") or {}):
            row(f"  ↳ {k}", v, ratio=False)
        row("  ↳ after gpusnap returned: /health + first token of /generate",
            (d.get("first_token_s") or 0) - (d.get("cmd_s") or 0), ratio=False)
        full_answer(d)
    return "\n".join(lines)


def assemble(files):
    """The results document from the step files ({name: parsed JSON})."""
    res = {"meta": files.get("env", {}), "cold_start": files.get("cold"), "cycles": []}
    k = 1
    while f"cycle-{k}-checkpoint" in files or f"cycle-{k}-restore" in files:
        res["cycles"].append({"checkpoint": files.get(f"cycle-{k}-checkpoint"),
                              "restore": files.get(f"cycle-{k}-restore")})
        k += 1
    if "restore-dropped" in files:
        res["restore_dropped_caches"] = files["restore-dropped"]
    if "registry-push" in files:
        res["registry"] = {"push": files["registry-push"], "restore_ref": files.get("registry-ref"),
                           "restore_ref_agent": files.get("registry-agent"),
                           "pull": files.get("registry-pull"), "pull_then_restore": files.get("registry-pull-restore")}
    if "cold-repeat" in files:
        res["cold_repeat"] = files["cold-repeat"]
    res["summary"] = summarize(res)
    res["targets"] = targets(res["summary"], dig(res, "meta.model"))
    return res


def engine_text(server):
    """The server's engine in words, from its INFO lines (cold_start.server)."""
    server = server if isinstance(server, dict) else {}
    e = server.get("engine")
    if not e:
        return ""
    if e != "static":
        return e
    parts = []
    if server.get("kv_pool_bytes"):
        parts.append(f"KV-cache pool {fmt_bytes(server['kv_pool_bytes'])}")
    if server.get("kv_scratch"):
        parts.append(f"scratch {server['kv_scratch']}")
    if server.get("cuda_graphs") is not None:
        parts.append(f"{server['cuda_graphs']} CUDA graph{'s' if server['cuda_graphs'] != 1 else ''}")
    return f"static ({', '.join(parts)})" if parts else "static"


def per_token_ms(doc, n):
    """Milliseconds a token after the first in a streamed answer."""
    if not isinstance(doc, dict) or not n or n < 2:
        return None
    first, full = doc.get("first_token_s"), doc.get("full_answer_s")
    if first is None or full is None:
        return None
    return (full - first) / (n - 1) * 1e3


def side_by_side(by_engine):
    """One column per engine ({engine: results of one run}): each run's cold
    start and restores to the first token (ratio to its own cold start), the
    full answers, checkpoints, and what its engine held."""
    names = list(by_engine)
    rows = []   # (label, {engine: text})

    def add(label, fn):
        vals = {e: fn(r) for e, r in by_engine.items()}
        if any(v not in (None, "") for v in vals.values()):
            rows.append((label, {e: "" if v is None else v for e, v in vals.items()}))

    def secs(v, cold=None):
        if v is None:
            return None
        return f"{fmt_s(v)} ({cold / v:.1f}x faster)" if cold and v else fmt_s(v)

    add("engine", lambda r: engine_text(dig(r, "cold_start.server")) or dig(r, "meta.engine"))
    add("cold start → first token", lambda r: secs(dig(r, "cold_start.first_token_s")))
    add("cold start → full answer", lambda r: secs(dig(r, "cold_start.full_answer_s")))
    labels = []
    for r in by_engine.values():
        for iv in dig(r, "cold_start.intervals") or []:
            if iv.get("phase") not in labels:
                labels.append(iv.get("phase"))
    for label in labels:
        add(f"  ↳ {label}", lambda r, lb=label: next((fmt_s(iv.get("seconds")) for iv in dig(r, "cold_start.intervals")
                                                      or [] if iv.get("phase") == lb), None))
    n_cycles = max([len(r.get("cycles") or []) for r in by_engine.values()] + [0])
    for k in range(n_cycles):
        tag = f" #{k + 1}" if n_cycles > 1 else ""

        def cyc(r, key, k=k):
            c = r.get("cycles") or []
            return dig(c[k], key) if k < len(c) else None

        add(f"checkpoint{tag}", lambda r: (f"{fmt_s(cyc(r, 'checkpoint.wall_s'))} "
                                           f"({fmt_bytes(cyc(r, 'checkpoint.output.total_bytes'))})"
                                           if cyc(r, "checkpoint.wall_s") is not None else None))
        add(f"restore{tag}, page cache → first token",
            lambda r: secs(cyc(r, "restore.first_token_s"), dig(r, "cold_start.first_token_s")))
        add("  ↳ … → full answer", lambda r: secs(cyc(r, "restore.full_answer_s")))
        add("  ↳ ms a token after the first",
            lambda r: (lambda v: None if v is None else f"{v:.1f}")(
                per_token_ms(cyc(r, "restore") or {}, dig(r, "meta.max_new_tokens"))))
    add("restore, dropped caches → first token",
        lambda r: secs(dig(r, "restore_dropped_caches.first_token_s"), dig(r, "cold_start.first_token_s")))
    add("result", lambda r: "ok" if r.get("ok", True) and not r.get("error") else f"FAILED: {r.get('error')}")
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, vals in rows:
        lines.append(f"| {label} | " + " | ".join(str(vals[e]) for e in names) + " |")
    return "\n".join(lines)


def demo_lines(res):
    s, m = res["summary"], res.get("meta") or {}
    out = []
    if s.get("cold_start_s") is not None:
        out.append(f"cold start → first token:  {fmt_s(s['cold_start_s'])} s")
    if s.get("checkpoint_s") is not None:
        out.append(f"checkpoint:                 {fmt_s(s['checkpoint_s'])} s, snapshot {fmt_bytes(s.get('snapshot_bytes'))}")
    if s.get("restore_page_cache_s") is not None:
        out.append(f"restore → first token:      {fmt_s(s['restore_page_cache_s'])} s "
                   f"({s.get('speedup_page_cache', 0):.1f}x faster than the cold start)")
    toks = dig(res, "cold_start.answer.tokens")
    if toks is not None and res["cycles"] and not res.get("error"):
        eng = f", engine {m['engine']}" if m.get("engine") else ""
        out.append(f"tokens after restore identical to the cold start's ({len(toks)} tokens, model {m.get('model')}{eng})")
    return out


# --------------------------------------------------------------------------
# commands


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, doc):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def cmd_free_port(a):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def cmd_port_free(a):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", a.port))
        except OSError as e:
            print(f"port {a.port}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


def cmd_alive(a):
    try:
        with open(f"/proc/{a.pid}/stat") as f:
            return 0 if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X") else 1
    except (OSError, IndexError):
        return 1


def cmd_get(a):
    print(as_text(dig(load(a.file), a.path)))


def cmd_running(a):
    text = sys.stdin.read()
    for name, pid, reaper in running_workloads(json.loads(text) if text.strip() else []):
        print(name, pid, reaper)


def cmd_env(a):
    doc = {}
    for kv in a.pairs:
        k, _, v = kv.partition("=")
        doc[k] = v
    if a.prepare_log and os.path.exists(a.prepare_log):
        with open(a.prepare_log, errors="replace") as f:
            doc["server"] = parse_info_lines(f.read())
    doc["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for k in ("cycles", "pinned_mb", "max_new_tokens"):
        if k in doc and doc[k].isdigit():
            doc[k] = int(doc[k])
    save(a.out, doc)


def cmd_cold(a):
    doc = load(a.raw)
    with open(a.log, errors="replace") as f:
        text = f.read()
    doc["phases"] = parse_phase_lines(text)
    doc["server"] = parse_info_lines(text)
    doc["intervals"] = [{"phase": label, "seconds": v}
                        for label, v in cold_intervals(doc["phases"], doc.get("t0"),
                                                       (doc.get("t0") or 0) + (doc.get("first_token_s") or 0))]
    save(a.out, doc)


def cmd_checkpoint(a):
    with open(a.raw) as f:
        text = f.read()
    try:
        out = json.loads(text)
    except ValueError:
        out = {"text": text}
    doc = {"wall_s": float(a.t1) - float(a.t0), "output": out}
    if a.store:
        total = 0
        for root, _, names in os.walk(a.store):
            for n in names:
                try:
                    total += os.lstat(os.path.join(root, n)).st_blocks * 512
                except OSError:
                    pass
        doc["store_disk_bytes"] = total
    save(a.out, doc)
    print(as_text(out.get("id")))


def cmd_compare(a):
    problems = compare(load(a.tokens_ref), load(a.prev), load(a.new), a.label)
    for p in problems:
        print(f"MISMATCH {p}", file=sys.stderr)
    return 1 if problems else 0


def cmd_report(a):
    files = {}
    for n in sorted(os.listdir(a.dir)) if os.path.isdir(a.dir) else []:
        if n.endswith(".json"):
            try:
                files[n[:-5]] = load(os.path.join(a.dir, n))
            except (OSError, ValueError):
                pass
    res = assemble(files)
    res["ok"] = not a.error
    if a.error:
        res["error"] = a.error
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        save(a.out, res)
    if a.demo:
        for line in demo_lines(res):
            print(line)
    else:
        m = res["meta"]
        srv = m.get("server") or {}
        params = f" ({srv['params'] / 1e9:.2f} B params, bf16)" if srv.get("params") else ""
        version = (m.get("gpusnap_version") or "").splitlines()
        eng = engine_text(dig(res, "cold_start.server")) or m.get("engine")
        print(f"\nmodel {m.get('model')}{params}, backend {m.get('backend')}, "
              f"{'engine ' + eng + ', ' if eng else ''}"
              f"GPU {m.get('gpu') or srv.get('gpu') or '?'}, driver {m.get('driver') or '?'}, "
              f"{version[0] if version else 'gpusnap ?'}")
        print()
        print(markdown_table(res))
        t = res["targets"]
        if t:
            print()
            scope = "" if t["applies"] else " (the targets are set for --model 8b; shown for reference)"
            r, sp = t["restore_page_cache_le_8s"], t["speedup_ge_5x"]
            print(f"targets{scope}:")
            print(f"  restore from page cache to first token ≤ {r['target']:.0f} s: {fmt_s(r['value'])} s "
                  f"{'PASS' if r['pass'] else 'FAIL'}")
            print(f"  ≥ {sp['target']:.0f}x faster than the cold start:  {sp['value']:.1f}x "
                  f"{'PASS' if sp['pass'] else 'FAIL'}")
    if a.out:
        print(f"raw results: {a.out}")
    if a.check_targets and res["targets"] and res["targets"]["applies"]:
        t = res["targets"]
        if not (t["restore_page_cache_le_8s"]["pass"] and t["speedup_ge_5x"]["pass"]):
            return 3
    return 0


def cmd_combine(a):
    by_engine, missing = {}, []
    for pair in a.pairs:
        e, _, path = pair.partition("=")
        try:
            by_engine[e] = load(path)
        except (OSError, ValueError):
            missing.append(e)
            by_engine[e] = {"ok": False, "error": f"no results ({path})"}
    doc = {"engines": by_engine, "ok": all(r.get("ok", False) for r in by_engine.values()),
           "summary": {e: r.get("summary") for e, r in by_engine.items()}}
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        save(a.out, doc)
    print("\nengines side by side (each against its own cold start):\n")
    print(side_by_side(by_engine))
    if a.out:
        print(f"raw results: {a.out}")
    return 1 if missing else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("free-port").set_defaults(fn=cmd_free_port)
    s = sub.add_parser("port-free")
    s.add_argument("port", type=int)
    s.set_defaults(fn=cmd_port_free)
    s = sub.add_parser("alive")
    s.add_argument("pid", type=int)
    s.set_defaults(fn=cmd_alive)
    s = sub.add_parser("get")
    s.add_argument("file")
    s.add_argument("path")
    s.set_defaults(fn=cmd_get)
    sub.add_parser("running").set_defaults(fn=cmd_running)
    s = sub.add_parser("env")
    s.add_argument("--out", required=True)
    s.add_argument("--prepare-log")
    s.add_argument("pairs", nargs="*")
    s.set_defaults(fn=cmd_env)
    s = sub.add_parser("cold")
    s.add_argument("--raw", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_cold)
    s = sub.add_parser("checkpoint")
    s.add_argument("--raw", required=True)
    s.add_argument("--t0", required=True)
    s.add_argument("--t1", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--store")
    s.set_defaults(fn=cmd_checkpoint)
    s = sub.add_parser("compare")
    s.add_argument("--tokens-ref", required=True)
    s.add_argument("--prev", required=True)
    s.add_argument("--new", required=True)
    s.add_argument("--label", required=True)
    s.set_defaults(fn=cmd_compare)
    s = sub.add_parser("report")
    s.add_argument("--dir", required=True)
    s.add_argument("--out")
    s.add_argument("--demo", action="store_true")
    s.add_argument("--check-targets", action="store_true")
    s.add_argument("--error", default="")
    s.set_defaults(fn=cmd_report)
    s = sub.add_parser("combine")
    s.add_argument("--out")
    s.add_argument("pairs", nargs="+", metavar="ENGINE=FILE")
    s.set_defaults(fn=cmd_combine)
    a = p.parse_args(argv)
    return a.fn(a) or 0


if __name__ == "__main__":
    sys.exit(main())
