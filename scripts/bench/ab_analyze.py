#!/usr/bin/env python3
"""Analysis of the in-process A/B training measurement (train_bench.py --ab-blocks):
the overhead of gpuguard's books with a 95% interval, from blocks of identical steps
run alternately with the books on and paused (gpuguard_bench_set_books, a benchmark
aid) inside one process. Method and arithmetic: docs/performance.md, "Training
overhead to ±0.5%: method". Standard library only.

  ab_analyze.py FILE...  [--pair-ns 2000] [--passthrough-ns 60] [--target 0.005]
                         [--boot 4000] [--seed 1] [--json OUT]
      FILE: train_bench.py output (its `AB {json}` lines; other lines are ignored);
      several runs of one workload combine (pairs stay within their process).
      One line per workload:
        ABR workload=W pairs=N steps_per_block=K step_ms=S
            wall=+0.42% [+0.18,+0.66] cpu=+0.9% [...] ratio=0.9958 [0.9934,0.9982]
            calls_step=C bound=+x.xx% passthrough<=+y.yy% precision=met|missed(need N')
      wall/cpu: mean over pairs of log(t_on / t_off) (as a percentage, exp-1), 95%
      interval from a circular block bootstrap over the pair sequence (fixed seed);
      cycles/instr (where the blocks carry them): the same for user-space CPU cycles
      and instructions of all threads (hardware counters; immune to steal and to the
      host's load, so their interval is much narrower on a shared machine).
      ratio: the throughput ratio (books on / paused) = 1/exp(mean), its interval.
      median: the median pair's log ratio with its block-bootstrap interval (and the
      ratio it gives): robust to spells of host slow-down that make the pairs'
      log ratios heavy-tailed; printed beside the mean, judged by robust_precision.
      calls_step: hooked calls per step seen in the on-blocks (allocs, frees, unknown
      frees, failures from the C API's counters); bound: calls_step x pair-ns/2 over
      the step time, the cost the hooks' measured price predicts; passthrough: the
      same calls at the paused price (trampoline + one load), which the A/B difference
      does not see and which is added to the interval's upper end.
      precision: half-width of the wall interval <= target, else the pairs needed at
      the observed spread.
  ab_analyze.py plan --step-ms 21 --cv-step 0.05 [--block-steps 10] [--target 0.005]
      the pairs and device seconds needed for the target half-width at a given per-step
      noise (independent steps; a block's noise is cv-step/sqrt(K)).
  ab_analyze.py --self-test
      synthetic runs with drift, jitter and spikes: a known +1.0% is recovered inside
      its interval at <= the target half-width, 0% gives an interval holding ratio 1.0
      and excluding +1.0%, strong drift is cancelled by the ABBA order, the interval's
      coverage is near 95%, and the call-count bound is arithmetic. Prints SELF-TEST OK.
"""

import argparse
import json
import math
import random
import sys

Z95 = 1.959964


# ---- reading --------------------------------------------------------------------------

def read_records(paths):
    """{workload: {"meta": {...}, "blocks": [...]}} from the `AB {json}` lines."""
    out = {}
    run = 0
    for p in paths:
        with open(p, errors="replace") as f:
            for line in f:
                if not line.startswith("AB "):
                    continue
                try:
                    r = json.loads(line[3:])
                except ValueError:
                    continue
                w = out.setdefault(r.get("workload", "?"), {"meta": {}, "blocks": [], "runs": 0})
                if r.get("record") == "ab_meta":
                    # A new process: its pairs are its own (several runs combine).
                    run += 1
                    w["meta"] = r
                    w["runs"] += 1
                elif r.get("record") == "ab_block":
                    r["run"] = run
                    w["blocks"].append(r)
    return out


def pairs_of(blocks, key):
    """[(on, off)] values of `key` per pair index, pairs with both halves only."""
    by = {}
    for b in blocks:
        by.setdefault((b.get("run", 0), b["pair"]), {})[b["mode"]] = b.get(key)
    out = []
    for k in sorted(by):
        d = by[k]
        if d.get("on") and d.get("off"):
            out.append((float(d["on"]), float(d["off"])))
    return out


# ---- statistics -------------------------------------------------------------------------

def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def sd(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def block_bootstrap(d, boot, seed, stat=mean):
    """95% percentile interval of stat(d) by a circular block bootstrap (block length
    ~n^(1/3)), which keeps short-range correlation between neighbouring pairs."""
    n = len(d)
    L = max(1, int(round(n ** (1.0 / 3.0))))
    rng = random.Random(seed)
    nb = -(-n // L)
    vals = []
    for _ in range(boot):
        s = []
        for _ in range(nb):
            i = rng.randrange(n)
            s.extend(d[(i + j) % n] for j in range(L))
        vals.append(stat(s[:n]))
    vals.sort()
    return vals[int(0.025 * boot)], vals[min(boot - 1, int(0.975 * boot))]


def log_ratios(pairs):
    return [math.log(on / off) for on, off in pairs if on > 0 and off > 0]


def estimate(pairs, boot, seed):
    """(mean log ratio, (lo, hi), sd of log ratios, n) or None."""
    d = log_ratios(pairs)
    if len(d) < 3:
        return None
    return mean(d), block_bootstrap(d, boot, seed), sd(d), len(d)


def pct(x):
    return "%+.2f%%" % (100.0 * (math.exp(x) - 1.0))


def pairs_needed(sd_log, target):
    return int(math.ceil((Z95 * sd_log / target) ** 2)) if target > 0 else 0


def analyze(w, name, a):
    blocks = w["blocks"]
    meta = w["meta"]
    res = {"workload": name, "meta": meta, "runs": w.get("runs", 1)}
    wall = estimate(pairs_of(blocks, "wall_s"), a.boot, a.seed)
    if wall is None:
        res["error"] = "fewer than 3 complete pairs"
        return res
    cpu = estimate(pairs_of(blocks, "cpu_s"), a.boot, a.seed + 1)
    m, (lo, hi), s, n = wall
    steps = sum(b["steps"] for b in blocks)
    step_s = sum(b["wall_s"] for b in blocks) / steps
    on = [b for b in blocks if b["mode"] == "on"]
    on_steps = sum(b["steps"] for b in on) or 1
    calls = sum(b.get("allocs", 0) + b.get("frees", 0) + b.get("unknown_frees", 0) + b.get("failed", 0)
                for b in on) / on_steps
    bound = calls * a.pair_ns * 0.5e-9 / step_s
    passthrough = calls * a.passthrough_ns * 0.5e-9 / step_s
    half = (hi - lo) / 2.0
    res.update({
        "pairs": n, "steps_per_block": blocks[0]["steps"], "step_ms": step_s * 1e3,
        "wall_overhead": math.exp(m) - 1, "wall_ci": [math.exp(lo) - 1, math.exp(hi) - 1],
        "ratio": math.exp(-m), "ratio_ci": [math.exp(-hi), math.exp(-lo)],
        "sd_log_pair": s, "half_width": half, "target": a.target,
        "precision_met": half <= a.target,
        # The interval narrows as 1/sqrt(pairs): scaled from the one just computed.
        "pairs_needed": int(math.ceil(n * (half / a.target) ** 2)) if a.target > 0 else 0,
        "calls_per_step": calls, "bound": bound, "passthrough_bound": passthrough,
        # The whole cost: books (A/B, its upper end) plus what the paused hooks still cost.
        "upper_total": math.exp(hi) - 1 + passthrough,
        "ratio_floor": 1.0 / (math.exp(hi) * (1 + passthrough)),
    })
    # Robust beside the mean: the median pair and its block-bootstrap interval. On a
    # shared host the slow-downs come in spells (the whole process 2x slower for
    # seconds) that make the log ratios heavy-tailed; a pair that straddles a spell's
    # edge moves the mean by its full size, the median hardly at all. Both are printed;
    # `precision` judges the mean, `robust_precision` the median.
    d = log_ratios(pairs_of(blocks, "wall_s"))
    md = median(d)
    rlo, rhi = block_bootstrap(d, a.boot, a.seed + 4, stat=median)
    res.update({
        "robust_overhead": math.exp(md) - 1, "robust_ci": [math.exp(rlo) - 1, math.exp(rhi) - 1],
        "robust_ratio": math.exp(-md), "robust_ratio_ci": [math.exp(-rhi), math.exp(-rlo)],
        "robust_half_width": (rhi - rlo) / 2.0, "robust_precision_met": (rhi - rlo) / 2.0 <= a.target,
    })
    if cpu:
        cm, (clo, chi), _, _ = cpu
        res.update({"cpu_overhead": math.exp(cm) - 1, "cpu_ci": [math.exp(clo) - 1, math.exp(chi) - 1]})
    # The hardware counters (user-space cycles and instructions of all threads), where
    # the blocks carry them: the same estimate; cycles do not count time the machine
    # gave to others, so their interval is what noise on a shared host leaves.
    for key, seed in (("cycles", 2), ("instructions", 3)):
        est = estimate(pairs_of(blocks, key), a.boot, a.seed + seed)
        if est:
            km, (klo, khi), ks, _ = est
            res.update({
                key + "_overhead": math.exp(km) - 1, key + "_ci": [math.exp(klo) - 1, math.exp(khi) - 1],
                key + "_ratio": math.exp(-km), key + "_ratio_ci": [math.exp(-khi), math.exp(-klo)],
                key + "_half_width": (khi - klo) / 2.0,
            })
    return res


def line(r):
    if "error" in r:
        return "ABR workload=%s error=%s" % (r["workload"], r["error"])
    s = ("ABR workload=%s runs=%d pairs=%d steps_per_block=%d step_ms=%.3f wall=%s [%s,%s] "
         % (r["workload"], r["runs"], r["pairs"], r["steps_per_block"], r["step_ms"],
            pct(math.log1p(r["wall_overhead"])), pct(math.log1p(r["wall_ci"][0])),
            pct(math.log1p(r["wall_ci"][1]))))
    if "cpu_overhead" in r:
        s += "cpu=%s [%s,%s] " % (pct(math.log1p(r["cpu_overhead"])), pct(math.log1p(r["cpu_ci"][0])),
                                  pct(math.log1p(r["cpu_ci"][1])))
    if "robust_overhead" in r:
        s += "median=%s [%s,%s] (ratio %.4f [%.4f,%.4f], ±%.2f%%) " % (
            pct(math.log1p(r["robust_overhead"])), pct(math.log1p(r["robust_ci"][0])),
            pct(math.log1p(r["robust_ci"][1])), r["robust_ratio"], r["robust_ratio_ci"][0],
            r["robust_ratio_ci"][1], 100 * r["robust_half_width"])
    for key, tag in (("cycles", "cycles"), ("instructions", "instr")):
        if key + "_overhead" in r:
            s += "%s=%s [%s,%s] " % (tag, pct(math.log1p(r[key + "_overhead"])),
                                     pct(math.log1p(r[key + "_ci"][0])), pct(math.log1p(r[key + "_ci"][1])))
    s += ("ratio=%.4f [%.4f,%.4f] floor=%.4f calls_step=%.1f bound=%+.3f%% passthrough<=%+.3f%% precision=%s"
          % (r["ratio"], r["ratio_ci"][0], r["ratio_ci"][1], r["ratio_floor"], r["calls_per_step"],
             100 * r["bound"], 100 * r["passthrough_bound"],
             "met(±%.2f%%)" % (100 * r["half_width"]) if r["precision_met"]
             else "missed(±%.2f%%,need %d pairs)" % (100 * r["half_width"], r["pairs_needed"])))
    return s


# ---- planning ---------------------------------------------------------------------------

def plan(step_ms, cv_step, k, target):
    """Pairs and seconds for the target half-width: a block of k steps has noise
    cv_step/sqrt(k), a pair's log ratio sqrt(2) times that."""
    sd_pair = math.sqrt(2.0) * cv_step / math.sqrt(k)
    n = pairs_needed(sd_pair, target)
    return {"sd_pair": sd_pair, "pairs": n, "seconds": n * 2 * k * step_ms / 1e3}


# ---- self-tests ---------------------------------------------------------------------------

def synth(overhead, pairs, seed, k=10, step_ms=21.0, cv_step=0.05, drift=0.05, spikes=0.01,
          calls_step=0.0):
    """Blocks as train_bench.py writes them: ABBA order, per-step lognormal jitter,
    a slow drift (a sine of +-drift and a random walk), rare +30% spikes."""
    rng = random.Random(seed)
    blocks, walk, t = [], 0.0, 0
    for p in range(pairs):
        order = ("on", "off") if p % 2 == 0 else ("off", "on")
        for mode in order:
            wall = 0.0
            for _ in range(k):
                walk += rng.gauss(0, drift / 50.0)
                base = step_ms * (1 + drift * math.sin(t / 700.0) + walk)
                x = base * math.exp(rng.gauss(0, cv_step))
                if rng.random() < spikes:
                    x *= 1.3
                wall += x * (1 + overhead if mode == "on" else 1)
                t += 1
            blocks.append({"record": "ab_block", "workload": "synth", "pair": p, "mode": mode,
                           "steps": k, "wall_s": wall / 1e3, "cpu_s": wall / 1e3 * 0.9,
                           "allocs": int(calls_step * k / 2) if mode == "on" else 0,
                           "frees": int(calls_step * k / 2) if mode == "on" else 0})
    return {"meta": {}, "blocks": blocks}


def self_test():
    a = argparse.Namespace(boot=2000, seed=1, pair_ns=400.0, passthrough_ns=60.0, target=0.005)
    fails = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            fails.append(what)

    # Plan: 5% per-step noise, 10-step blocks, 21 ms steps.
    p = plan(21.0, 0.05, 10, 0.005)
    check(70 <= p["pairs"] <= 80 and p["seconds"] < 35, "plan: %d pairs, %.0f s at 5%%/step" % (p["pairs"], p["seconds"]))

    r = analyze(synth(0.010, 250, 7), "synth", a)
    print("     " + line(r))
    lo, hi = r["wall_ci"]
    check(lo <= 0.010 <= hi, "+1.0%% inside its interval [%.3f%%, %.3f%%]" % (100 * lo, 100 * hi))
    check(r["half_width"] <= 0.005, "half-width %.3f%% <= 0.5%% with 250 pairs" % (100 * r["half_width"]))
    check(r["ratio_ci"][1] < 1.0, "ratio interval below 1.0 (the +1% is seen)")

    r = analyze(synth(0.0, 150, 11), "synth", a)
    print("     " + line(r))
    check(r["ratio_ci"][0] <= 1.0 <= r["ratio_ci"][1], "0%%: ratio interval [%.4f, %.4f] holds 1.0" % tuple(r["ratio_ci"]))
    check(r["wall_ci"][1] < 0.010, "0%: interval excludes +1.0%")

    # Strong drift (a +-20% sine and a faster random walk): the ABBA pairs cancel it.
    r = analyze(synth(0.0, 150, 13, drift=0.20), "synth", a)
    check(r["wall_ci"][0] <= 0.0 <= r["wall_ci"][1], "+-20%% drift, 0%%: interval [%.3f%%, %.3f%%] holds 0"
          % (100 * r["wall_ci"][0], 100 * r["wall_ci"][1]))

    # Coverage of the 95% interval over independent synthetic runs.
    a_fast = argparse.Namespace(**dict(vars(a), boot=400))
    runs, hit = 60, 0
    for s in range(runs):
        r = analyze(synth(0.010, 80, 1000 + s), "synth", a_fast)
        hit += r["wall_ci"][0] <= 0.010 <= r["wall_ci"][1]
    check(hit >= 0.85 * runs, "coverage %d/%d runs (95%% nominal, >= 85%% required)" % (hit, runs))

    # Call-count bound: 640 pool pairs a 21 ms step at 400 ns a pair = 1.22%.
    r = analyze(synth(0.0, 20, 3, calls_step=1280, cv_step=0.0, drift=0.0, spikes=0.0), "synth", a)
    check(abs(r["bound"] - 1280 * 200e-9 / 0.021) < 1e-6, "bound %.3f%% = 1280 x 200 ns / 21 ms" % (100 * r["bound"]))
    check(abs(r["passthrough_bound"] - 1280 * 30e-9 / 0.021) < 1e-6, "passthrough bound arithmetic")

    # Heavy tails (spells of a 2x slower host covering a quarter of the pairs'
    # halves unevenly): the median stays near the true +1.0% with a narrow interval.
    w = synth(0.010, 200, 17, cv_step=0.01, drift=0.0, spikes=0.0)
    rng = random.Random(3)
    for b in w["blocks"]:
        if rng.random() < 0.08:
            b["wall_s"] *= rng.uniform(1.3, 2.0)
    r = analyze(w, "synth", a)
    lo, hi = r["robust_ci"]
    check(lo <= 0.010 <= hi and r["robust_half_width"] < r["half_width"],
          "heavy tails: median +1.0%% inside [%.3f%%, %.3f%%], narrower than the mean's ±%.2f%%"
          % (100 * lo, 100 * hi, 100 * r["half_width"]))

    # Hardware counters: blocks that carry cycles get their own estimate; a +1.0% in
    # cycles with no noise is read exactly, whatever the wall times do.
    w = synth(0.0, 20, 5)
    for b in w["blocks"]:
        b["cycles"] = int(1e9 * (1.010 if b["mode"] == "on" else 1.0))
        b["instructions"] = int(2e9 * (1.004 if b["mode"] == "on" else 1.0))
    r = analyze(w, "synth", a)
    check(abs(r["cycles_overhead"] - 0.010) < 1e-6 and abs(r["cycles_ratio"] - 1 / 1.010) < 1e-6
          and r["cycles_half_width"] < 1e-6, "cycles: +1.0% read exactly")
    check(abs(r["instructions_overhead"] - 0.004) < 1e-6 and " instr=+0.40% " in line(r), "instructions: +0.4%")
    check("cycles_overhead" not in analyze(synth(0.0, 20, 5), "synth", a), "no cycles without counts")

    if fails:
        print("SELF-TEST FAILED: %d check(s)" % len(fails))
        return 1
    print("SELF-TEST OK")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "plan":
        ap = argparse.ArgumentParser(prog="ab_analyze.py plan")
        ap.add_argument("plan")
        ap.add_argument("--step-ms", type=float, required=True)
        ap.add_argument("--cv-step", type=float, required=True)
        ap.add_argument("--block-steps", type=int, default=10)
        ap.add_argument("--target", type=float, default=0.005)
        a = ap.parse_args()
        print(json.dumps(plan(a.step_ms, a.cv_step, a.block_steps, a.target)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--pair-ns", type=float, default=2000.0,
                    help="added ns of one alloc+free pair (bench-micro, the run's settings)")
    ap.add_argument("--passthrough-ns", type=float, default=60.0,
                    help="added ns of one paused pair (trampoline + one load)")
    ap.add_argument("--target", type=float, default=0.005)
    ap.add_argument("--boot", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.files:
        ap.error("no input files")
    data = read_records(a.files)
    results = [analyze(w, name, a) for name, w in data.items()]
    for r in results:
        print(line(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
