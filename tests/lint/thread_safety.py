#!/usr/bin/env python3
"""thread_safety.py COMPILE_COMMANDS SOURCE_DIR - check the lock annotations
(src/util/thread_annotations.h) with clang's -Wthread-safety.

Every source of the build that includes the annotations header, directly or
through other headers of the tree, is compiled with clang++ -fsyntax-only
-Wthread-safety, errors on, with the include paths and defines the build uses
for it (compile_commands.json). Exits 0 when all are clean, 1 naming each that
is not, and 77 (skipped) where clang++ is not installed: the annotations only
mean something to clang."""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

HEADER = "util/thread_annotations.h"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# What clang needs of the build's flags; the rest (gcc's warnings, output) is not its business.
KEEP_JOINED = ("-I", "-D", "-U", "-std=", "-isystem", "-iquote", "-include")
KEEP_SEPARATE = ("-I", "-D", "-U", "-isystem", "-iquote", "-include")


def find_clang():
    for name in ("clang++", "clang++-14"):
        path = shutil.which(name)
        if path:
            return path
    return None


def includes_of(path, roots, cache):
    """The tree's headers `path` includes, resolved like the compiler would."""
    if path in cache:
        return cache[path]
    cache[path] = []
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return cache[path]
    found = []
    for name in INCLUDE.findall(text):
        for base in [os.path.dirname(path)] + roots:
            candidate = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(candidate):
                found.append(candidate)
                break
    cache[path] = found
    return found


def reaches_header(path, roots, cache, memo):
    if path in memo:
        return memo[path]
    memo[path] = False  # cycles: #pragma once headers
    for inc in includes_of(path, roots, cache):
        if inc.endswith("/" + HEADER) or reaches_header(inc, roots, cache, memo):
            memo[path] = True
            break
    return memo[path]


def clang_args(entry):
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = []
    i = 1
    while i < len(args):
        a = args[i]
        if a in KEEP_SEPARATE and i + 1 < len(args):
            out += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith(KEEP_JOINED):
            out.append(a)
        i += 1
    return out


def check(clang, entry):
    cmd = [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", *clang_args(entry), entry["file"]]
    p = subprocess.run(cmd, cwd=entry.get("directory"), capture_output=True, text=True)
    return entry["file"], p.returncode, p.stdout + p.stderr


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[0])
    commands, source_dir = sys.argv[1], os.path.realpath(sys.argv[2])
    clang = find_clang()
    if clang is None:
        print("SKIP: clang++ is not installed (Debian package clang): the thread-safety annotations are not checked")
        sys.exit(77)
    try:
        entries = json.load(open(commands))
    except (OSError, ValueError) as e:
        print(f"cannot read the build's compile commands `{commands}`: {e} (configure with "
              "CMAKE_EXPORT_COMPILE_COMMANDS=ON)")
        sys.exit(1)
    roots = [os.path.join(source_dir, "src"), os.path.join(source_dir, "include")]
    # Sources the build generates (the layer probes) are not the project's code.
    build_dir = os.path.dirname(os.path.realpath(commands))
    cache, memo, chosen = {}, {}, {}
    for e in entries:
        f = os.path.realpath(os.path.join(e.get("directory", ""), e["file"]))
        if (f.startswith(source_dir + os.sep) and not f.startswith(build_dir + os.sep) and f not in chosen
                and reaches_header(f, roots, cache, memo)):
            chosen[f] = dict(e, file=f)
    if not chosen:
        print(f"no source of the build includes {HEADER}: nothing would be checked")
        sys.exit(1)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for f, rc, output in pool.map(lambda e: check(clang, e), chosen.values()):
            if rc != 0:
                failed.append(os.path.relpath(f, source_dir))
                print(output, end="")
    if failed:
        print(f"thread-safety: {len(failed)} of {len(chosen)} sources fail: {', '.join(sorted(failed))}")
        sys.exit(1)
    print(f"thread-safety: {len(chosen)} sources checked with {os.path.basename(clang)}, clean")


if __name__ == "__main__":
    main()
