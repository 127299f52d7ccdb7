#!/usr/bin/env python3
"""Summarises callgrind dumps written by microbench under valgrind.

microbench, when it runs under callgrind, zeroes the counters before each timed block
and dumps them right after it (CALLGRIND_ZERO_STATS / CALLGRIND_DUMP_STATS_AT), so each
dump file holds exactly one block: "<path>-hooked" or "<path>-raw". Its "CG" lines on
stdout give the pairs per block, in the same order as the dumps.

Usage:
  cg_summary.py totals LABEL=DIR [LABEL=DIR ...]
      Instructions per pair for every path and kind, one row per LABEL (a variant:
      bare, stacks off, stacks 16), from DIR/cg.out.* and DIR/stdout.txt.
  cg_summary.py hot DIR PATH [TOP]
      Where the extra instructions of PATH's hooked block go: self instructions per
      pair of each function, hooked minus raw, largest first.
  cg_summary.py top DIR LABEL [TOP]
      The functions with the most self instructions in the dump LABEL (e.g. "report").

Reads the uncompressed format (--compress-strings=no --compress-pos=no); the call
cost line after every "calls=" line is skipped so costs are self costs (callgrind_annotate
3.19 mis-attributes the "calls=0" arcs that a zeroed dump starts with).
"""
import glob
import os
import re
import sys
from collections import defaultdict


def parse(path):
    """Returns (trigger label, summary Ir, {(object, function): self Ir})."""
    label, summary = None, None
    selfcost = defaultdict(int)
    ob, fn = "???", "???"
    skip_next = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("desc: Trigger:"):
                m = re.search(r"Client Request: (\S+)", line)
                label = m.group(1) if m else line.split(":", 2)[-1].strip()
                continue
            if line.startswith("summary:") or line.startswith("totals:"):
                summary = int(line.split()[1])
                continue
            if line.startswith("ob="):
                ob = line[3:]
                continue
            if line.startswith("fn="):
                fn = line[3:]
                continue
            if line.startswith("calls="):
                skip_next = True
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    try:
                        selfcost[(os.path.basename(ob), fn)] += int(parts[1])
                    except ValueError:
                        pass
    return label, summary, selfcost


def dumps(d):
    """[(label, iters, summary, selfcost)] in dump order, matched with CG lines."""
    files = [p for p in glob.glob(os.path.join(d, "cg.out.*")) if re.search(r"\.\d+\.\d+$", p)]
    files.sort(key=lambda p: int(p.rsplit(".", 1)[1]))
    iters = []
    so = os.path.join(d, "stdout.txt")
    if os.path.exists(so):
        for line in open(so):
            if line.startswith("CG "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                iters.append((kv["path"] + "-" + kv["kind"], int(kv["iters"])))
    out = []
    for i, p in enumerate(files):
        label, summary, sc = parse(p)
        n = iters[i][1] if i < len(iters) and iters[i][0] == label else None
        out.append((label, n, summary, sc))
    return out


def last_blocks(d):
    """The last dump of each label (the timed block, after the warm-up one)."""
    best = {}
    for label, n, summary, sc in dumps(d):
        best[label] = (n, summary, sc)
    return best


def cmd_totals(args):
    rows = []
    paths = ["link", "dlsym", "proc", "vmm", "pool"]
    for a in args:
        name, d = a.split("=", 1)
        b = last_blocks(d)
        rows.append((name, b))
    print("| variant | path | Ir/pair hooked | Ir/pair raw | added Ir/pair |")
    print("|---|---|---:|---:|---:|")
    for name, b in rows:
        for p in paths:
            h, r = b.get(p + "-hooked"), b.get(p + "-raw")
            if not h or not r or not h[0] or not r[0]:
                continue
            hi, ri = h[1] / h[0], r[1] / r[0]
            print(f"| {name} | {p} | {hi:.0f} | {ri:.0f} | {hi - ri:+.0f} |")


def cmd_hot(args):
    d, path = args[0], args[1]
    top = int(args[2]) if len(args) > 2 else 25
    b = last_blocks(d)
    h, r = b[path + "-hooked"], b[path + "-raw"]
    hn, rn = h[0], r[0]
    keys = set(h[2]) | set(r[2])
    diff = []
    for k in keys:
        dv = h[2].get(k, 0) / hn - r[2].get(k, 0) / rn
        diff.append((dv, k))
    diff.sort(reverse=True)
    total = h[1] / hn - r[1] / rn
    by_obj = defaultdict(float)
    for dv, k in diff:
        by_obj[k[0]] += dv
    print(f"{path}: {h[1] / hn:.0f} Ir/pair hooked, {r[1] / rn:.0f} raw, added {total:+.0f}")
    print()
    print("| object | added self Ir/pair |")
    print("|---|---:|")
    for o, v in sorted(by_obj.items(), key=lambda x: -x[1]):
        if abs(v) >= 0.5:
            print(f"| {o} | {v:+.0f} |")
    print()
    print("| function (object) | added self Ir/pair | share |")
    print("|---|---:|---:|")
    for dv, (o, fn) in diff[:top]:
        if dv < 0.5:
            break
        fn_s = fn if len(fn) <= 110 else fn[:107] + "..."
        print(f"| `{fn_s}` ({o}) | {dv:.0f} | {100 * dv / total:.0f}% |")


def cmd_top(args):
    d, label = args[0], args[1]
    top = int(args[2]) if len(args) > 2 else 25
    b = last_blocks(d)
    if label not in b:
        print(f"no dump labelled {label} in {d}")
        return
    _, total, sc = b[label]
    by_obj = defaultdict(int)
    for (o, _), v in sc.items():
        by_obj[o] += v
    print(f"{label}: {total:,} instructions")
    print()
    print("| object | self Ir | share |")
    print("|---|---:|---:|")
    for o, v in sorted(by_obj.items(), key=lambda x: -x[1]):
        if v * 1000 >= total:
            print(f"| {o} | {v:,} | {100 * v / total:.1f}% |")
    print()
    print("| function (object) | self Ir | share |")
    print("|---|---:|---:|")
    for (o, fn), v in sorted(sc.items(), key=lambda x: -x[1])[:top]:
        fn_s = fn if len(fn) <= 110 else fn[:107] + "..."
        print(f"| `{fn_s}` ({o}) | {v:,} | {100 * v / total:.1f}% |")


def main():
    cmds = {"totals": cmd_totals, "hot": cmd_hot, "top": cmd_top}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        print(__doc__)
        sys.exit(2)
    cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
