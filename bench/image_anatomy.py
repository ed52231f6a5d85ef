#!/usr/bin/env python3
"""What a process's CRIU image will hold, mapping by mapping.

CRIU saves, of a private mapping, the pages that are present and anonymous
(never written file pages stay in their file), and of a shared anonymous
mapping (shmem, memfd, /dev/zero) every present page. This reads
/proc/PID/smaps and /proc/PID/pagemap (root) and prints, grouped by what the
mapping is, how many bytes of each kind CRIU would write, with the largest
mappings, so that a large image can be explained before it is cut.

    sudo python3 bench/image_anatomy.py PID [--top 15] [--json]

Run it on a GPU process in the state CRIU sees it (after the driver's
checkpoint and, under gpushare, the shim's release): for example after
`gpusnap gpushare suspend PID` (with the shim) and `gpusnap cuda suspend PID`,
resuming them after in the other order (docs/CUDA.md, docs/GPUSHARE.md).
"""
import argparse
import json
import os
import re
import struct
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
PM_PRESENT = 1 << 63
PM_SWAP = 1 << 62
PM_FILE_OR_SHARED = 1 << 61

HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")


def parse_smaps(text):
    """[{start, end, perms, inode, name, fields{Rss, Anonymous, ...} (bytes), flags}]. Pure."""
    out, cur = [], None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            cur = {"start": int(m[1], 16), "end": int(m[2], 16), "perms": m[3], "inode": int(m[4]),
                   "name": m[5].strip(), "fields": {}, "flags": ""}
            out.append(cur)
        elif cur is not None and line.startswith("VmFlags:"):
            cur["flags"] = line.split(":", 1)[1].strip()
        elif cur is not None and ":" in line:
            k, v = line.split(":", 1)
            parts = v.split()
            if len(parts) == 2 and parts[1] == "kB":
                cur["fields"][k] = int(parts[0]) * 1024
    return out


def kind(vma):
    """What the mapping is, in words CRIU's treatment follows. Pure."""
    name, shared = vma["name"], vma["perms"][3] == "s"
    if name.startswith("/dev/nvidia"):
        return "device (/dev/nvidia*)"
    if name in ("[heap]", "[stack]") or name.startswith("[stack"):
        return name
    if name.startswith("["):
        return "special " + name
    if shared:
        if name.startswith("/memfd:") or name.startswith("/dev/shm") or name.startswith("/SYSV") or \
                name.startswith("/dev/zero") or name == "":
            return "shared anonymous (shmem/memfd)"
        return "shared file"
    if name == "":
        return "private anonymous"
    if name.startswith("/memfd:"):
        return "private memfd"
    return "private file"


def dumped_bytes(vma, pagemap_fd):
    """Bytes CRIU would write for this mapping (present anonymous pages of a
    private one, present pages of a shared anonymous one)."""
    if vma["fields"].get("Rss", 0) == 0 and vma["fields"].get("Swap", 0) == 0:
        return 0
    k = kind(vma)
    if k.startswith("device") or k == "shared file" or k.startswith("special [vsyscall"):
        return 0
    shared_anon = k.startswith("shared anonymous")
    n_pages = (vma["end"] - vma["start"]) // PAGE
    total, first, step = 0, vma["start"] // PAGE, 1 << 16
    for off in range(0, n_pages, step):
        cnt = min(step, n_pages - off)
        data = os.pread(pagemap_fd, cnt * 8, (first + off) * 8)
        for (e,) in struct.iter_unpack("<Q", data):
            if not (e & (PM_PRESENT | PM_SWAP)):
                continue
            if shared_anon or not (e & PM_FILE_OR_SHARED):
                total += PAGE
    return total


def summarize(vmas, dumped):
    """Per kind: mappings, size, Rss, Anonymous, CRIU bytes. Pure."""
    groups = {}
    for v, d in zip(vmas, dumped):
        g = groups.setdefault(kind(v), {"mappings": 0, "size": 0, "rss": 0, "anonymous": 0, "criu": 0})
        g["mappings"] += 1
        g["size"] += v["end"] - v["start"]
        g["rss"] += v["fields"].get("Rss", 0)
        g["anonymous"] += v["fields"].get("Anonymous", 0)
        g["criu"] += d
    return groups


def gib(n):
    return f"{n / 2**30:7.3f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pid", type=int)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    with open(f"/proc/{a.pid}/smaps") as f:
        vmas = parse_smaps(f.read())
    fd = os.open(f"/proc/{a.pid}/pagemap", os.O_RDONLY)
    try:
        dumped = [dumped_bytes(v, fd) for v in vmas]
    finally:
        os.close(fd)
    groups = summarize(vmas, dumped)
    top = sorted(zip(vmas, dumped), key=lambda x: -x[1])[: a.top]
    if a.json:
        json.dump({"groups": groups, "total_criu": sum(dumped),
                   "top": [{"name": v["name"], "perms": v["perms"], "size": v["end"] - v["start"], "criu": d,
                            "anonymous": v["fields"].get("Anonymous", 0), "flags": v["flags"]} for v, d in top]},
                  sys.stdout, indent=1)
        print()
        return 0
    print(f"pid {a.pid}: CRIU would write {gib(sum(dumped))} GiB; smaps Anonymous "
          f"{gib(sum(v['fields'].get('Anonymous', 0) for v in vmas))} GiB, Rss "
          f"{gib(sum(v['fields'].get('Rss', 0) for v in vmas))} GiB")
    print(f"{'kind':34} {'maps':>5} {'size GiB':>9} {'rss GiB':>8} {'anon GiB':>8} {'criu GiB':>8}")
    for k, g in sorted(groups.items(), key=lambda kv: -kv[1]["criu"]):
        print(f"{k:34} {g['mappings']:5} {gib(g['size'])}  {gib(g['rss'])} {gib(g['anonymous'])} {gib(g['criu'])}")
    print(f"\nlargest {a.top} by CRIU bytes:")
    for v, d in top:
        print(f"  {gib(d)} GiB  {v['start']:x}-{v['end']:x} {v['perms']} size {gib(v['end'] - v['start'])} "
              f"{v['name'] or '(anon)'}  [{v['flags']}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
