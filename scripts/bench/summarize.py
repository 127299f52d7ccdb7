#!/usr/bin/env python3
"""Turns the tagged result lines of the gpuguard benchmarks into markdown tables.

  summarize.py micro RESULTS    microbench / gpu_microbench (run_cpu.sh, run_gpu.sh)
  summarize.py train RESULTS [MICRO_RESULTS]
                                train_bench.py pairs (run_train.sh); with the GPU
                                microbenchmark's results, the analytic bound uses the
                                added cost per pair measured there

RESULTS holds one record per line, "key=value" words, each line tagged by the runner
with round=R variant=V (bare: no shim; s0: GPUGUARD_STACK_DEPTH=0; s16: defaults). The
baseline is "bare"; "added" is the median over rounds of the per-round difference
(variant - bare of the same round: the rounds interleave, so drift cancels).
"""
import statistics as st
import sys
from collections import defaultdict

VARIANT_NAMES = {"bare": "bare", "s0": "stacks off", "s16": "stacks 16 (default)"}


def kv(words):
    d = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            d[k] = v
    return d


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def med(v):
    v = [x for x in v if x is not None]
    return st.median(v) if v else None


def fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def span(v, nd=0):
    v = [x for x in v if x is not None]
    if not v:
        return "–"
    return f"{fmt(min(v), nd)}–{fmt(max(v), nd)}"


def nd_for(x):
    if x is None:
        return 0
    a = abs(x)
    return 0 if a >= 100 else (1 if a >= 10 else 2)


def read(path):
    """Yields (kind, tags, fields, proc) where proc is the INFO of the process."""
    proc = {}
    for line in open(path, errors="replace"):
        words = line.split()
        if len(words) < 4:
            continue
        # tag words come first (GROUP round=R variant=V), then KIND, then fields
        group = words[0]
        i = 1
        tags = {"group": group}
        while i < len(words) and "=" in words[i]:
            k, v = words[i].split("=", 1)
            tags[k] = v
            i += 1
        if i >= len(words):
            continue
        kind = words[i]
        fields = kv(words[i + 1:])
        if kind == "INFO":
            proc = dict(fields)
            proc.update(tags)
        yield kind, tags, fields, proc


# ---------------------------------------------------------------------------------------
def micro(path):
    # (path, threads, live) -> variant -> round -> PATH fields; diag: the MD group
    data = defaultdict(lambda: defaultdict(dict))
    diag = defaultdict(lambda: defaultdict(dict))
    depth = defaultdict(list)  # GPUGUARD_STACK_DEPTH -> in-process added ns (pool path)
    rss = defaultdict(lambda: defaultdict(dict))  # (live, threads) -> variant -> round -> kb
    prefill = defaultdict(lambda: defaultdict(list))  # live -> variant -> ns
    reports = defaultdict(lambda: defaultdict(list))  # live -> variant -> (ms, bytes)
    order_paths = []
    for kind, tags, f, proc in read(path):
        v, r = tags.get("variant"), tags.get("round")
        if kind == "PATH":
            key = (f["path"], int(f["threads"]), int(f.get("live", 0)))
            if f["path"] not in order_paths:
                order_paths.append(f["path"])
            if tags["group"] == "DS":
                depth[int(tags["depth"])].append(fnum(f["delta_med"]))
                continue
            (diag if tags["group"] == "MD" else data)[key][v][r] = f
        elif kind == "RSS" and tags["group"] == "MB":
            live = int(f["live"])
            if live > 0:
                rss[(live, int(proc.get("threads", 1)))][v][r] = int(f["after_kb"]) - int(
                    f["before_kb"])
        elif kind == "PREFILL" and tags["group"] == "MB":
            prefill[int(f["live"])][v].append(fnum(f["ns_per_alloc"]))
        elif kind == "REPORT" and "ms" in f:
            extra = None
            if "hwm_kb" in f and "rss_before_kb" in f:
                extra = (int(f["hwm_kb"]) - int(f["rss_before_kb"])) / 1024
            reports[int(f["live"])][v].append((fnum(f["ms"]), int(f["bytes"]), extra))

    if not (data or depth or reports):
        print("no PATH records found in", path)
        return
    variants = [x for x in ("bare", "s0", "s16") if any(x in d for d in data.values())]
    others = [x for x in variants if x != "bare"]
    keys = sorted(data, key=lambda k: (k[2], order_paths.index(k[0]), k[1]))

    def rounds_of(d):
        return sorted(set().union(*[set(x) for x in d.values()]), key=lambda s: int(s))

    if not data:
        print_extras(depth, rss, prefill, reports, variants, others)
        return
    print("### ns per alloc+free pair, interleaved processes")
    print()
    print("Per thread; medians over rounds (min–max); added = median of the per-round "
          "differences (variant − bare of the same round).")
    print()
    hdr = "| live | path | threads | rounds | bare |"
    sep = "|---:|---|---:|---:|---:|"
    for o in others:
        hdr += f" {VARIANT_NAMES[o]} | added |"
        sep += "---:|---:|"
    print(hdr)
    print(sep)
    for key in keys:
        d = data[key]
        rounds = rounds_of(d)
        vals = {x: [fnum(d[x][r]["hooked_med"]) if r in d.get(x, {}) else None for r in rounds]
                for x in variants}
        b = med(vals.get("bare", []))
        row = f"| {key[2]:,} | {key[0]} | {key[1]} | {len(rounds)} | {fmt(b, nd_for(b))} " \
              f"({span(vals.get('bare', []), nd_for(b))}) |"
        for o in others:
            m = med(vals[o])
            diffs = [a - c for a, c in zip(vals[o], vals.get("bare", [])) if a is not None
                     and c is not None]
            dm = med(diffs)
            row += f" {fmt(m, nd_for(m))} ({span(vals[o], nd_for(m))}) | {fmt(dm, nd_for(dm))} |"
        print(row)

    print()
    print("### added ns per pair, in-process (hooked − raw)")
    print()
    print("Hooked − raw (the driver's own functions) in the same process: the median of each "
          "process's per-block differences, then the median over rounds (min–max). Without "
          "the shim (bare) both call the driver: the noise floor.")
    print()
    hdr = "| live | path | threads |"
    sep = "|---:|---|---:|"
    for x in variants:
        hdr += f" {VARIANT_NAMES[x]} |"
        sep += "---:|"
    print(hdr)
    print(sep)
    for key in keys:
        d = data[key]
        row = f"| {key[2]:,} | {key[0]} | {key[1]} |"
        for x in variants:
            dl = [fnum(f["delta_med"]) for f in d.get(x, {}).values()]
            m = med(dl)
            row += f" {fmt(m, nd_for(m))} ({span(dl, nd_for(m))}) |"
        print(row)

    threads = sorted({k[1] for k in keys})
    if len(threads) > 1:
        t1, tn = threads[0], threads[-1]
        print()
        print(f"### throughput, {t1} vs {tn} threads")
        print()
        print(f"Million pairs/s over all threads (median over rounds); scaling = "
              f"{tn}-thread / {t1}-thread.")
        print()
        hdr = "| live | path |"
        sep = "|---:|---|"
        for x in variants:
            hdr += f" {VARIANT_NAMES[x]} {t1}t | {tn}t | scaling |"
            sep += "---:|---:|---:|"
        print(hdr)
        print(sep)
        for live in sorted({k[2] for k in keys}):
            for p in order_paths:
                if (p, t1, live) not in data or (p, tn, live) not in data:
                    continue
                row = f"| {live:,} | {p} |"
                for x in variants:
                    a = med([fnum(f["mpairs_s"]) for f in data[(p, t1, live)].get(x, {}).values()])
                    c = med([fnum(f["mpairs_s"]) for f in data[(p, tn, live)].get(x, {}).values()])
                    sc = c / a if a and c else None
                    row += f" {fmt(a, 3)} | {fmt(c, 3)} | {fmt(sc, 2)} |"
                print(row)

    if diag:
        print()
        print("### diagnostic: 2 threads on 2 devices")
        print()
        print("2 threads spread over 2 simulated devices (own context, pool and counters per "
              "thread), live 0; compare with 2 threads on 1 device above. ns per pair per "
              "thread, in-process added ns, million pairs/s (medians).")
        print()
        hdr = "| path |"
        sep = "|---|"
        for x in variants:
            hdr += f" {VARIANT_NAMES[x]} ns/pair | added in-proc | Mpairs/s |"
            sep += "---:|---:|---:|"
        print(hdr)
        print(sep)
        for key in sorted(diag, key=lambda k: order_paths.index(k[0])):
            d = diag[key]
            row = f"| {key[0]} |"
            for x in variants:
                h = med([fnum(f["hooked_med"]) for f in d.get(x, {}).values()])
                dl = med([fnum(f["delta_med"]) for f in d.get(x, {}).values()])
                tp = med([fnum(f["mpairs_s"]) for f in d.get(x, {}).values()])
                row += f" {fmt(h, nd_for(h))} | {fmt(dl, nd_for(dl))} | {fmt(tp, 3)} |"
            print(row)

    print_extras(depth, rss, prefill, reports, variants, others)


def print_extras(depth, rss, prefill, reports, variants, others):
    if depth:
        print()
        print("### stack depth sweep")
        print()
        print("In-process added ns per pool pair, 1 thread, GPUGUARD_STACK_DEPTH=N, the loop "
              "under 40 extra frames (median over rounds, min–max).")
        print()
        print("| depth | added ns/pair |")
        print("|---:|---:|")
        pts = []
        for dd in sorted(depth):
            m = med(depth[dd])
            print(f"| {dd} | {fmt(m)} ({span(depth[dd])}) |")
            if m is not None:
                pts.append((dd, m))
        if len(pts) >= 3:
            n = len(pts)
            mx = sum(x for x, _ in pts) / n
            my = sum(y for _, y in pts) / n
            sxx = sum((x - mx) ** 2 for x, _ in pts)
            slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0
            print()
            print(f"Least-squares line over the medians: {my - slope * mx:,.0f} ns + "
                  f"{slope:,.0f} ns per captured frame.")

    if rss:
        print()
        print("### memory per live allocation")
        print()
        print("VmRSS growth over the prefill (KiB, median over rounds); per live allocation "
              "= (growth with shim − growth bare) / live.")
        print()
        hdr = "| live | threads |"
        sep = "|---:|---:|"
        for x in variants:
            hdr += f" {VARIANT_NAMES[x]} KiB |"
            sep += "---:|"
        for o in others:
            hdr += f" bytes/alloc {VARIANT_NAMES[o]} (min–max) |"
            sep += "---:|"
        print(hdr)
        print(sep)
        for (live, t) in sorted(rss):
            d = rss[(live, t)]
            row = f"| {live:,} | {t} |"
            for x in variants:
                row += f" {fmt(med(list(d.get(x, {}).values())))} |"
            bare = med(list(d.get("bare", {}).values()))
            for o in others:
                per = [(kb - bare) * 1024 / live for kb in d.get(o, {}).values()] if bare is not None else []
                row += f" {fmt(med(per), 1)} ({span(per, 1)}) |"
            print(row)

    if prefill:
        print()
        print("### prefill")
        print()
        print("ns per cuMemAlloc_v2 while filling the ledger (median over processes).")
        print()
        print("| live | " + " | ".join(VARIANT_NAMES[x] for x in variants) + " |")
        print("|---:|" + "---:|" * len(variants))
        for live in sorted(prefill):
            print(f"| {live:,} | " + " | ".join(fmt(med(prefill[live].get(x, [])))
                                                 for x in variants) + " |")

    if reports:
        print()
        print("### report")
        print()
        print("gpuguard_write_report with the ledger prefilled: ms (median over rounds, "
              "min–max), file size, peak memory the report added (VmHWM − VmRSS before it).")
        print()
        print("| live | variant | ms | rounds | file MB | peak memory added by the report, MiB |")
        print("|---:|---|---:|---:|---:|---:|")
        for live in sorted(reports):
            for x in ("s0", "s16"):
                v = reports[live].get(x, [])
                if not v:
                    continue
                ms = [a for a, _, _ in v]
                mb = med([b / 1e6 for _, b, _ in v if b >= 0])
                hwm = med([e for _, _, e in v if e is not None])
                print(f"| {live:,} | {VARIANT_NAMES[x]} | {fmt(med(ms))} ({span(ms)}) | "
                      f"{len(v)} | {fmt(mb, 1)} | {fmt(hwm)} |")


# ---------------------------------------------------------------------------------------
def measured_added(micro_path):
    """(ns, what) added per pair by the shim at default settings on the GPU machine:
    the in-process hooked - raw of the pool path (cuMemAllocFromPoolAsync +
    cuMemFreeAsync), 1 thread, stacks 16 (else the largest driver path's)."""
    import os
    if not micro_path or not os.path.exists(micro_path):
        return None, None
    best = {}
    for kind, tags, f, proc in read(micro_path):
        if kind != "PATH" or tags.get("variant") != "s16" or f.get("threads") != "1":
            continue
        d = fnum(f.get("delta_med"))
        if d is not None:
            best.setdefault(f["path"], []).append(d)
    if not best:
        return None, None
    meds = {p: med(v) for p, v in best.items()}
    # the pool pair is the cheapest driver call, so its difference is the least noisy
    p = "pool" if "pool" in meds else max(meds, key=lambda k: meds[k])
    return meds[p], f"{p} path, in-process hooked − raw, stacks 16, 1 thread"


def train(path, micro_path=None):
    """Lines: TR round=R variant=bare|gg RESULT workload=W steps_s=X ..."""
    runs = defaultdict(lambda: defaultdict(dict))  # (workload) -> variant -> round -> f
    counts = {}
    diags = []  # FW, FWCALLS, ABSUM records of train_bench.py, in order
    for kind, tags, f, proc in read(path):
        if kind == "RESULT":
            wl = f.get("workload", "?")
            runs[wl][tags.get("variant")][tags.get("round")] = f
        elif kind == "CALLS":
            counts[f.get("workload", "?")] = f
        elif kind in ("FW", "FWCALLS", "ABSUM", "DIAG_ERROR"):
            diags.append((kind, tags, f))
    if not runs:
        print("no RESULT records found in", path)
        return
    print("### training throughput")
    print()
    print("Steps/s bare and under gpuguard (defaults), interleaved pairs; ratio = gpuguard / "
          "bare of the same pair.")
    print()
    print("| workload | pairs | bare steps/s med (min–max) | gpuguard med (min–max) | "
          "per-pair ratios | median ratio |")
    print("|---|---:|---:|---:|---|---:|")
    for wl in runs:
        b, g = runs[wl].get("bare", {}), runs[wl].get("gg", {})
        rounds = sorted(set(b) & set(g), key=int)
        bv = [fnum(b[r]["steps_s"]) for r in rounds]
        gv = [fnum(g[r]["steps_s"]) for r in rounds]
        ratios = [x / y for x, y in zip(gv, bv) if x and y]
        print(f"| {wl} | {len(rounds)} | {fmt(med(bv), 2)} ({span(bv, 2)}) | "
              f"{fmt(med(gv), 2)} ({span(gv, 2)}) | "
              f"{', '.join(f'{x:.3f}' for x in ratios)} | {fmt(med(ratios), 3)} |")
    if counts:
        print()
        print("### intercepted allocations per step and the bound")
        print()
        print("gpuguard's counters read around the timed steps (the last run under gpuguard).")
        print()
        added, what = measured_added(micro_path)
        if added is not None:
            print(f"Measured added cost per pair on this GPU machine: {added:,.0f} ns ({what}).")
            print()
        print("| workload | steps | allocs/step | frees/step | step ms | bound at measured "
              "| bound at 100 ns/pair | bound at 2 µs/pair |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for wl, f in counts.items():
            steps = fnum(f.get("steps")) or 0
            a = fnum(f.get("allocs")) or 0
            fr = fnum(f.get("frees")) or 0
            ms = fnum(f.get("step_ms"))
            aps = a / steps if steps else None
            fps = fr / steps if steps else None
            pairs = max(aps or 0, fps or 0)
            def bound(ns):
                if not ms or ns is None:
                    return "–"
                return f"{100 * pairs * ns * 1e-9 / (ms / 1e3):.4f}%"
            print(f"| {wl} | {fmt(steps)} | {fmt(aps, 2)} | {fmt(fps, 2)} | {fmt(ms, 2)} | "
                  f"{bound(added)} | {bound(100)} | {bound(2000)} |")
        print()
        print("bound = (intercepted pairs per step × added ns per pair) / step time: the "
              "slow-down gpuguard can cause through its hooks, independent of run-to-run noise.")
    if diags:
        print()
        print("### framework recorders (train_bench.py diagnostics)")
        print()
        print("FW: the recorder gpuguard turns on (before/after the timed steps); FWCALLS: "
              "framework allocations per timed step; ABSUM (runs before the A/B experiment was removed): "
              "the same steps in one process with gpuguard's recorder off and on.")
        print()
        print("| round | variant | record | fields |")
        print("|---:|---|---|---|")
        for kind, tags, f in diags:
            if kind == "FWCALLS":
                steps = fnum(f.get("steps")) or 0
                a = fnum(f.get("allocs"))
                if steps and a is not None:
                    f = dict(f, allocs_per_step=f"{a / steps:.1f}")
            print(f"| {tags.get('round', '?')} | {tags.get('variant', '?')} | {kind} | "
                  + " ".join(f"{k}={v}" for k, v in f.items()) + " |")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("micro", "train"):
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "micro":
        micro(sys.argv[2])
    else:
        train(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)


if __name__ == "__main__":
    main()
