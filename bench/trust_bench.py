#!/usr/bin/env python3
"""trust_bench.py - push and pull signed and encrypted against in the clear, side by side.

Starts Debian's docker-registry on 127.0.0.1 (tests/e2e/registry.py, plain
HTTP), makes the keys (an ECDSA P-256 signing key, a recipient's key pair, a
tenant secret), then in alternating rounds pushes one snapshot and pulls it
back into an empty store, once per variant:
  - clear:   `gpusnap push`, `gpusnap pull --policy` (insecureAcceptAnything);
  - sealed:  `push --sign-by-sigstore-private-key --encryption-key jwe:PUB
             --encryption-secret-file`, `pull --policy` (sigstoreSigned) and
             `--decryption-key`;
  - with --breakdown also `signed` (signing alone) and `encrypted`
    (encryption alone), to tell the two costs apart.
Each push goes to a repository of its own, so every blob is uploaded again;
each pull goes into a store of its own, removed afterwards. The figures:
wall seconds and gpusnap's CPU seconds (user + system) of each, medians over
the rounds, and the sealed variant's cost against the clear one (goal: the
pull's under 10% of the clear pull's time). Last, a second sealed push of
the same snapshot under the same secret: the blobs it moved (goal: 0).

With --make-fake MIB it makes its own snapshot first: a vmm_worker under
`gpusnap run --gpushare` on the fake libcuda (GPUSNAP_FAKE_CUDA_DIR), MIB of
device memory in 64 MiB chunks (bench/registry_bench.py's); on the GPU
machine, name the 8B-class server's snapshot with --snapshot.

usage: trust_bench.py [--store DIR] (--snapshot ID | --make-fake MIB)
                      [--rounds N] [--jobs J] [--key rsa|ec] [--breakdown]
                      [--registry-dir DIR] [--json OUT]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
import registry  # noqa: E402  (the project's own registry fixture)
from registry_bench import GPUSNAP, make_fake, run  # noqa: E402

TARGET = 0.10  # the sealed pull's cost, as a share of the clear pull's time


def owner_only(path, data=None):
    if data is not None:
        with open(path, "wb") as f:
            f.write(data)
    os.chmod(path, 0o600)
    return path


def make_keys(work, key_type):
    """The signing pair, the recipient's pair and the tenant secret, as docs/DISTRIBUTION.md makes them."""
    keys = os.path.join(work, "keys")
    os.makedirs(keys, mode=0o700)
    k = {n: os.path.join(keys, n) for n in ("sign.pem", "sign.pub", "enc.pem", "enc.pub", "secret")}
    run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", k["sign.pem"]])
    run(["openssl", "pkey", "-in", k["sign.pem"], "-pubout", "-out", k["sign.pub"]])
    if key_type == "ec":
        run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", k["enc.pem"]])
    else:
        run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072", "-out", k["enc.pem"]])
    run(["openssl", "pkey", "-in", k["enc.pem"], "-pubout", "-out", k["enc.pub"]])
    owner_only(k["sign.pem"])
    owner_only(k["enc.pem"])
    owner_only(k["secret"], os.urandom(32))
    return k


def write_policies(work, reg, keys):
    accept = os.path.join(work, "policy-accept.json")
    signed = os.path.join(work, "policy-signed.json")
    with open(accept, "w") as f:
        json.dump({"default": [{"type": "insecureAcceptAnything"}]}, f)
    with open(signed, "w") as f:
        json.dump({"default": [{"type": "reject"}],
                   "transports": {"docker": {f"{reg.host}/bench": [{"type": "sigstoreSigned",
                                                                    "keyPath": keys["sign.pub"]}]}}}, f)
    return accept, signed


class Variant:
    def __init__(self, name, push_flags, pull_flags):
        self.name, self.push_flags, self.pull_flags = name, push_flags, pull_flags
        self.push_s, self.push_cpu, self.pull_s, self.pull_cpu = [], [], [], []


def timed(env, args):
    """gpusnap's JSON answer, its wall seconds and its CPU seconds (the child's user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    out = json.loads(run([GPUSNAP, "--json", *args], env=env).stdout)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB memory, {platform.system()} {platform.release()}"


def commit():
    p = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("GPUSNAP_STORE", "/var/lib/gpusnap"))
    ap.add_argument("--snapshot")
    ap.add_argument("--make-fake", type=int, metavar="MIB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--key", choices=("rsa", "ec"), default="rsa", help="the recipient's key: RSA-3072 or EC P-256")
    ap.add_argument("--breakdown", action="store_true", help="also signing alone and encryption alone")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--registry-dir", help="where the registry keeps its storage (a folder of its own in it, removed "
                    "at the end; default: the work directory beside the store)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gpusnap-trust-bench-", dir=os.path.dirname(os.path.abspath(a.store)))
    reg_dir = os.path.join(a.registry_dir, f"gpusnap-trust-bench-{os.getpid()}") if a.registry_dir else \
        os.path.join(work, "registry")
    try:
        env = dict(os.environ, GPUSNAP_STORE=a.store)
        if a.make_fake:
            env["GPUSNAP_RUN_DIR"] = os.path.join(work, "run")
            a.snapshot, _ = make_fake(env, a.make_fake, work)
        if not a.snapshot:
            sys.exit("trust_bench: name a snapshot (--snapshot ID) or make one (--make-fake MIB)")
        keys = make_keys(work, a.key)
        reg = registry.Registry(reg_dir, "plain")
        reg.start()
        try:
            accept, signed = write_policies(work, reg, keys)
            sign = ["--sign-by-sigstore-private-key", keys["sign.pem"]]
            encrypt = ["--encryption-key", f"jwe:{keys['enc.pub']}", "--encryption-secret-file", keys["secret"]]
            variants = [Variant("clear", [], ["--policy", accept]),
                        Variant("sealed", sign + encrypt, ["--policy", signed, "--decryption-key", keys["enc.pem"]])]
            if a.breakdown:
                variants += [Variant("signed", sign, ["--policy", signed]),
                             Variant("encrypted", encrypt, ["--policy", accept, "--decryption-key", keys["enc.pem"]])]
            common = ["--plain-http", "--jobs", str(a.jobs)]
            pushed = {}
            for r in range(a.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for v in order:
                    ref = f"{reg.host}/bench/{v.name}-{r}:v1"
                    out, wall, cpu = timed(env, ["push", a.snapshot, ref, *common, *v.push_flags])
                    v.push_s.append(wall)
                    v.push_cpu.append(cpu)
                    pushed[v.name] = (ref, out)
                    into = os.path.join(work, f"pull-{v.name}-{r}")
                    _, wall, cpu = timed(dict(env, GPUSNAP_STORE=into), ["pull", ref, *common, *v.pull_flags])
                    subprocess.run(["sync", "-f", work], check=True)
                    v.pull_s.append(wall)
                    v.pull_cpu.append(cpu)
                    shutil.rmtree(into)
                    print(f"round {r + 1}/{a.rounds} {v.name:9s} push {v.push_s[-1]:7.2f} s  pull {v.pull_s[-1]:7.2f} s",
                          file=sys.stderr)
            # The same snapshot under the same secret, to the sealed variant's last repository.
            again_ref = pushed["sealed"][0].rsplit(":", 1)[0] + ":again"
            again, again_s, _ = timed(env, ["push", a.snapshot, again_ref, *common, *variants[1].push_flags])
        finally:
            reg.close()

        med = statistics.median
        first = pushed["clear"][1]
        res = {"date": time.strftime("%Y-%m-%d"), "commit": commit(), "machine": machine(),
               "command": " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
               "snapshot": a.snapshot, "bytes": first["bytes_total"], "blobs": first["blobs"], "jobs": a.jobs,
               "rounds": a.rounds, "key": a.key, "variants": {}}
        for v in variants:
            res["variants"][v.name] = {"push_s": v.push_s, "pull_s": v.pull_s, "push_cpu_s": v.push_cpu,
                                       "pull_cpu_s": v.pull_cpu, "push_median_s": med(v.push_s),
                                       "pull_median_s": med(v.pull_s), "push_cpu_median_s": med(v.push_cpu),
                                       "pull_cpu_median_s": med(v.pull_cpu)}
        clear, sealed = res["variants"]["clear"], res["variants"]["sealed"]
        res["pull_cost"] = (sealed["pull_median_s"] - clear["pull_median_s"]) / clear["pull_median_s"]
        # Rounds of one run differ more than the variants do: each round's own pair says how much.
        res["pull_ratio_per_round"] = [s / c for s, c in zip(sealed["pull_s"], clear["pull_s"])]
        res["push_cost"] = (sealed["push_median_s"] - clear["push_median_s"]) / clear["push_median_s"]
        res["second_push"] = dict(again, wall_s=again_s)

        mb = res["bytes"] / 1e6
        print(f"{res['date']} at {res['commit']}, {res['machine']}")
        print(f"command: {res['command']}")
        print(f"snapshot {a.snapshot}: {res['blobs']} blobs, {mb:.1f} MB; {a.rounds} rounds, --jobs {a.jobs}, "
              f"recipient key {a.key}\n")
        print("| variant | push (median) | push CPU | pull (median) | pull CPU | pull vs clear |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, v in res["variants"].items():
            print(f"| {name} | {v['push_median_s']:.2f} s ({mb / v['push_median_s']:.0f} MB/s) | "
                  f"{v['push_cpu_median_s']:.2f} s | {v['pull_median_s']:.2f} s ({mb / v['pull_median_s']:.0f} MB/s) | "
                  f"{v['pull_cpu_median_s']:.2f} s | {v['pull_median_s'] / clear['pull_median_s']:.2f}x |")
        verdict = "PASS" if res["pull_cost"] < TARGET else "FAIL"
        print(f"\nsealed pull's cost: {res['pull_cost'] * 100:+.1f}% of the clear pull's time "
              f"(goal < {TARGET * 100:.0f}%): {verdict}")
        print("sealed pull against clear, round by round: " +
              ", ".join(f"{r:.2f}x" for r in res["pull_ratio_per_round"]) +
              f" (median {statistics.median(res['pull_ratio_per_round']):.2f}x)")
        print(f"sealed push's cost: {res['push_cost'] * 100:+.1f}% of the clear push's time")
        sp = res["second_push"]
        print(f"second sealed push: {sp['blobs_moved']} of {sp['blobs']} blobs moved ({sp['bytes_moved']} bytes), "
              f"{sp['wall_s']:.2f} s (goal: 0 moved): {'PASS' if sp['blobs_moved'] == 0 else 'FAIL'}")
        if a.json_out:
            benchlib.save(a.json_out, res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if a.registry_dir:
            shutil.rmtree(reg_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
