#!/usr/bin/env python3
"""Self-test of the trim/leak checkers without a GPU: builds run directories with
hand-made workload output and gpuguard reports (the shapes of the spec and of
crates/core/src/report.rs), runs trim_check.py, leak_check.py and lib/ggv.py table on them,
and compares every row's status with the expected one.

  python3 scripts/gpu/trim/selftest.py [--cli PATH/TO/gpuguard] [--keep DIR]

(The GPU run itself: OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh.)

Without --cli it uses a stand-in for `gpuguard diff/show` that prints the layout of
src/main.rs (diff, and show's "suspected leaks in ..." section: "    +<bytes>" then
indented lines, a Python site headed "[<framework> blocks, Python]", Python sites
first); with --cli the real command reads the sample reports (which also checks that
they parse). The leak samples cover gpuguard's default (python_sites of framework
"python-stack", native sites ending with "python: " frames, PyTorch's recorder off),
GPUGUARD_PYTHON=lines (framework pytorch / cupy) and JAX (framework jax). Exit status
0 when every expectation holds.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LEAKS = os.path.join(HERE, "..", "leaks")
MiB, GiB = 1 << 20, 1 << 30

FAKE_CLI = r'''#!/usr/bin/env python3
import json, sys
def load(p):
    return json.load(open(p))
def sites(r):
    m = {}
    for s in r.get("sites", []):
        k = "\n".join(s["frames"]); m[k] = m.get(k, 0) + s["live_bytes"]
    for s in r.get("python_sites", []):
        k = "[%s blocks, Python]\n" % s["framework"] + "\n".join(s["frames"]); m[k] = m.get(k, 0) + s["live_bytes"]
    return m
def block(grew, labels, values, k):
    print("    +%.1f MiB" % (grew / 1048576.0))
    for lab, v in zip(labels, values):
        print("      %-10s %d" % (lab, v))
    for f in k.splitlines()[:6]:
        print("        " + f)
order = lambda x: (not x[1].startswith("["), -x[0], x[1])  # Python lines first, most growth first
cmd = sys.argv[1]
if cmd == "diff":
    a, b = sites(load(sys.argv[2])), sites(load(sys.argv[3]))
    g = sorted(((b[k] - a.get(k, 0), k) for k in b if b[k] > a.get(k, 0)), key=order)
    print("gpuguard diff\n  A: %s\n  B: %s\n" % (sys.argv[2], sys.argv[3]))
    print("  %d call sites whose live bytes grew from A to B, Python lines first, most first:" % len(g))
    for d, k in g:
        block(d, ["A", "B"], [a.get(k, 0), b[k]], k)
elif cmd == "show":
    reps = [load(p) for p in sys.argv[2:]]
    for p, r in zip(sys.argv[2:], reps):
        print("gpuguard report %s" % p)
        for s in r.get("python_sites", []):
            print("    py site %d %d" % (s["id"], s["live_bytes"]))
            for f in s["frames"][:6]:
                print("        " + f)
    if len(reps) >= 2:
        reps.sort(key=lambda r: r["seq"])
        maps = [sites(r) for r in reps]
        keys = sorted(set(k for m in maps for k in m))
        vals = dict((k, [m.get(k, 0) for m in maps]) for k in keys)
        g = sorted(((v[-1] - v[0], k) for k, v in vals.items()
                    if v[-1] > v[0] and all(y >= x for x, y in zip(v, v[1:]))), key=order)
        print("\nsuspected leaks in python3 (pid %d), across reports %s:" % (
            reps[0]["pid"], ", ".join("#%d" % r["seq"] for r in reps)))
        if not g:
            print("  none: no call site's live bytes only grew")
        else:
            print("  call sites whose live bytes only grew, Python lines first, most first:")
            for d, k in g[:10]:
                block(d, ["#%d" % r["seq"] for r in reps], vals[k], k)
else:
    sys.exit(2)
'''


def report(pid, seq, reason, current, **extra):
    r = {"schema": "gpuguard-report/1", "gpuguard_version": "0.1.0", "reason": reason, "seq": seq, "pid": pid,
         "program": "python3", "argv": ["python3", "x.py"], "time_unix_ms": 1, "uptime_s": 1.0,
         "devices": [{"device": 0, "total_bytes": 150 * GiB, "cap_bytes": None, "current_bytes": current,
                      "peak_bytes": current, "allocs": 10, "frees": 5, "failed": 0, "denied": 0, "unknown_frees": 0,
                      "pool_reserved_bytes": 0, "by_kind": {"device": current}, "live_count": 5}],
         "host_pinned": {"current_bytes": 0, "peak_bytes": 0, "allocs": 0, "frees": 0, "live_count": 0},
         "live": [], "live_omitted": 0, "sites": [], "config": {}}
    for k, v in extra.items():
        if k.startswith("dev0_"):
            r["devices"][0][k[5:]] = v
        else:
            r[k] = v
    return r


def trim_section(trigger="signal", merged=1, python="ran", before=5 * GiB, after=1 * GiB, mechs=()):
    return {"trigger": trigger, "merged": merged, "python": python,
            "devices": [{"device": 0, "before_bytes": before, "after_bytes": after}],
            "released_bytes": before - after, "mechanisms": list(mechs)}


def mech(name, status, rel, detail=""):
    return {"name": name, "status": status, "released_bytes": rel, "detail": detail}


def write_run(d, pid, records, reports=(), rc=0, stderr="", extra_files=None, raw_lines=()):
    os.makedirs(os.path.join(d, "reports"), exist_ok=True)
    with open(os.path.join(d, "stdout.log"), "w") as f:
        for ln in raw_lines:
            f.write(ln + "\n")
        for rec in records:
            f.write("GGV_JSON " + json.dumps(rec) + "\n")
    with open(os.path.join(d, "stderr.log"), "w") as f:
        f.write(stderr)
    with open(os.path.join(d, "rc.txt"), "w") as f:
        f.write("%d\n" % rc)
    for rep in reports:
        name = "gpuguard.python3.%d.%d.%s.json" % (rep["pid"], rep["seq"], rep["reason"])
        with open(os.path.join(d, "reports", name), "w") as f:
            json.dump(rep, f)
    for name, text in (extra_files or {}).items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def torch_measure(tag, allocated, reserved, gg, nvml):
    return {"record": "measure", "tag": tag, "allocated": allocated, "reserved": reserved, "gg_current": gg,
            "device_used": nvml, "nvml_used": nvml, "nvml_how": "test"}


def torch_runs(base, mode, pid, losses_sig=None, nvml_after=None, pyt_rel=4 * GiB, pools_rel=0, no_report=False):
    losses = [1.0 / (i + 1) for i in range(30)]
    cfg = {"record": "config", "pid": pid + 1, "role": "nosignal", "mode": mode, "steps": 30, "trim_step": 15}
    ms = [torch_measure("trained", 700 * MiB, 900 * MiB, 1028 * MiB, 1600 * MiB),
          torch_measure("before", 700 * MiB, 4996 * MiB, 5124 * MiB, 5700 * MiB),
          torch_measure("after", 700 * MiB, 4996 * MiB, 5124 * MiB, 5700 * MiB)]
    summ = {"record": "summary", "steps_done": 30, "steps": 30, "losses": losses}
    write_run(os.path.join(base, "torch_%s_nosignal" % mode), pid + 1, [cfg] + ms + [summ])
    cfg = dict(cfg, pid=pid, role="signal")
    ms = [torch_measure("trained", 700 * MiB, 900 * MiB, 1028 * MiB, 1600 * MiB),
          torch_measure("before", 700 * MiB, 4996 * MiB, 5124 * MiB, 5700 * MiB),
          torch_measure("after", 700 * MiB, 720 * MiB, 848 * MiB, nvml_after or 1420 * MiB)]
    summ = dict(summ, losses=losses_sig or losses)
    reps = [] if no_report else [report(pid, 1, "trim", 848 * MiB, trim=trim_section(
        before=5124 * MiB, after=848 * MiB, mechs=[mech("cuda_pools", "trimmed", pools_rel, "1 pool"),
                                                   mech("pytorch", "released", pyt_rel, "empty_cache")]))]
    write_run(os.path.join(base, "torch_%s_signal" % mode), pid, [cfg] + ms + [{"record": "trim_seen", "waited_s": 0.3},
                                                                              summ],
              reps, stderr="gpuguard[%d]: trim (signal): 4.2 GiB released\n" % pid)


def expect_rows(rows, expected, label):
    bad = []
    got = {}
    for r in rows:  # the first row of each (workload, check)
        got.setdefault((r["workload"], r["check"]), r["status"])
    for key, st in expected.items():
        if got.get(key) != st:
            det = next((r["detail"] for r in rows if (r["workload"], r["check"]) == key), "(no row)")
            bad.append("%s: %s/%s expected %s got %s: %s" % (label, key[0], key[1], st, got.get(key), det[:200]))
    return bad


def run(cmd):
    r = subprocess.run([sys.executable] + cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or "Traceback" in r.stderr or "checker error" in r.stdout:
        print(r.stdout, r.stderr)
        raise SystemExit("FAILED: %s" % " ".join(cmd))
    return r.stdout


def rows_of(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli")
    ap.add_argument("--keep")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="ggv-selftest-")
    os.makedirs(tmp, exist_ok=True)
    summary = os.path.join(tmp, "summary.jsonl")
    open(summary, "w").close()
    cli = a.cli
    if not cli:
        cli = os.path.join(tmp, "fake_gpuguard")
        with open(cli, "w") as f:
            f.write(FAKE_CLI)
        os.chmod(cli, 0o755)
    tc = os.path.join(HERE, "trim_check.py")
    lc = os.path.join(LEAKS, "leak_check.py")
    problems = []
    T = os.path.join(tmp, "trim")

    # ---- trim: torch, good (default), async with the pool doing the work, bad runs ----
    torch_runs(T, "default", 1000)
    torch_runs(T, "cudaMallocAsync", 1100, pyt_rel=0, pools_rel=4 * GiB)
    torch_runs(T, "expandable", 1200, losses_sig=[1.0 / (i + 1) + (1e-3 if i == 20 else 0) for i in range(30)],
               nvml_after=5000 * MiB, pyt_rel=0)
    torch_runs(T, "missing", 1300, no_report=True)
    for mode in ("default", "cudaMallocAsync", "expandable", "missing"):
        run([tc, "torch", "--mode", mode, "--ref", os.path.join(T, "torch_%s_nosignal" % mode),
             "--dir", os.path.join(T, "torch_%s_signal" % mode), "--summary", summary])
    # ---- trim: cupy ----
    pid = 2000
    cm = lambda tag, total, used, gg, nv: {"record": "measure", "tag": tag, "pool_total": total, "pool_used": used,  # noqa: E731
                                           "pool_free": total - used, "pinned_free_blocks": 4, "gg_current": gg,
                                           "nvml_used": nv, "device_used": nv}
    write_run(os.path.join(T, "cupy"), pid, [
        {"record": "config", "pid": pid}, cm("before", 4354 * MiB, 256 * MiB, 4420 * MiB, 5000 * MiB),
        cm("after", 256 * MiB, 256 * MiB, 322 * MiB, 900 * MiB),
        {"record": "after_trim_compute", "live_sums_ok": True, "matmul_ok": True}],
        [report(pid, 1, "trim", 322 * MiB, trim=trim_section(mechs=[mech("cuda_pools", "trimmed", 0),
                                                                    mech("cupy", "released", 4098 * MiB)]))],
        stderr="gpuguard[2000]: trim (signal): 4.0 GiB released\n")
    run([tc, "cupy", "--dir", os.path.join(T, "cupy"), "--summary", summary])
    # ---- trim: jax ----
    pid = 3000
    det = ("JAX/XLA keeps its memory in an arena it never gives back (preallocated unless "
           "XLA_PYTHON_CLIENT_PREALLOCATE=false); run with XLA_PYTHON_CLIENT_ALLOCATOR=platform to make it releasable")
    write_run(os.path.join(T, "jax"), pid, [
        {"record": "config", "pid": pid}, {"record": "measure", "tag": "before", "gg_current": 100 * GiB},
        {"record": "measure", "tag": "after", "gg_current": 100 * GiB},
        {"record": "after_trim_compute", "before": 1.5, "after": 1.5, "same": True}],
        [report(pid, 1, "trim", 100 * GiB, trim=trim_section(before=100 * GiB, after=100 * GiB, mechs=[
            mech("cuda_pools", "trimmed", 0), mech("jax", "not_releasable", 0, det)]))])
    run([tc, "jax", "--dir", os.path.join(T, "jax"), "--summary", summary])
    # ---- trim: hold (CLI + burst) and foreign ----
    pid = 4000
    r1 = report(pid, 1, "trim", 848 * MiB, trim=trim_section(mechs=[mech("cuda_pools", "trimmed", 0),
                                                                     mech("pytorch", "released", 4 * GiB)]))
    b1 = trim_section(merged=1, mechs=[mech("pytorch", "released", 2 * GiB)])
    b2 = trim_section(merged=4, before=GiB, after=GiB, mechs=[mech("pytorch", "released", 0)])
    losses = [1.0 / (i + 1) for i in range(30)]
    write_run(os.path.join(T, "cli_and_burst"), pid, [
        {"record": "config", "pid": pid}, {"record": "cli_phase", "reports": ["gpuguard.python3.4000.1.trim.json"]},
        {"record": "burst", "reports": [{"name": "a", "seq": 2, "trim": b1}, {"name": "b", "seq": 3, "trim": b2}]},
        {"record": "summary", "steps_done": 30, "steps": 30, "losses": losses}], [r1],
        extra_files={"cli_trim.rc": "0\n", "cli_trim.out": "gpuguard trim: process 4000 (python3), report x\n"
                     "  trim (signal, 1 request): 4.0 GiB released\n", "cli_trim.err": "",
                     "actions.txt": "".join("1.0 burst kill ok\n" for _ in range(5))})
    run([tc, "hold", "--dir", os.path.join(T, "cli_and_burst"), "--ref", os.path.join(T, "torch_default_nosignal"),
         "--summary", summary])
    # A burst whose signals the kernel coalesced: WARN, not FAIL.
    write_run(os.path.join(T, "burst_coalesced"), 4100, [
        {"record": "config", "pid": 4100}, {"record": "cli_phase", "reports": []},
        {"record": "burst", "reports": [{"name": "a", "seq": 2, "trim": trim_section(merged=2)}]},
        {"record": "summary", "steps_done": 30, "steps": 30, "losses": losses}], [],
        extra_files={"cli_trim.rc": "124\n", "cli_trim.out": "", "cli_trim.err": "",
                     "actions.txt": "".join("1.0 burst kill ok\n" for _ in range(5))})
    run([tc, "hold", "--dir", os.path.join(T, "burst_coalesced"), "--summary", summary])
    # A workload that never started (import error): one FAIL row.
    write_run(os.path.join(T, "crashed"), 4200, [], rc=1, stderr="ModuleNotFoundError: No module named 'cupy'\n")
    run([tc, "cupy", "--dir", os.path.join(T, "crashed"), "--summary", summary])
    os.makedirs(os.path.join(T, "cli_foreign"), exist_ok=True)
    for n, t in (("cli_foreign.rc", "2\n"), ("cli_foreign.err", "gpuguard: process 5 is not running gpuguard\n"),
                 ("cli_foreign.out", ""), ("sleep_alive.txt", "yes\n")):
        with open(os.path.join(T, "cli_foreign", n), "w") as f:
            f.write(t)
    run([tc, "foreign", "--dir", os.path.join(T, "cli_foreign"), "--summary", summary])

    # ---- leaks ----
    L = os.path.join(tmp, "leaks")

    def marked(script):
        path = os.path.abspath(os.path.join(LEAKS, script))
        return path, [i for i, ln in enumerate(open(path), 1) if ln.rstrip().endswith("# GGV_" + "LEAK_LINE")][0]

    path, line = marked("leak_torch.py")
    cpath, cline = marked("leak_cupy.py")
    jpath, jline = marked("leak_jax.py")
    N = (11, 31, 40)  # leaked tensors at the two signal reports and at exit

    def pyframes(p, ln, fn="main.<locals>.step"):
        return ["%s:%d in %s" % (p, ln, fn), "%s:150 in main" % p, "%s:170 in <module>" % p]

    def native(fr, py, bytes_, count, after=()):
        """A native site: native frames, then the thread's Python frames ("python: ")."""
        return {"frames": list(fr) + ["python: " + f for f in py] + list(after), "live_bytes": bytes_,
                "live_count": count}

    def series(pid, py_sites, nat_sites, cls, in_use=None, cached=None, current=None, signals=2):
        """Reports seq 1..3 (signal, signal, exit) with N[k] tensors leaked. py_sites and
        nat_sites: functions n -> list of sites; in_use/cached/current: n -> bytes."""
        out = []
        reasons = ["signal"] * signals + ["exit"]
        for seq, (reason, n) in enumerate(zip(reasons, N[-len(reasons):]), 1):
            ps = sorted([s for s in py_sites(n) if s["live_bytes"] > 0], key=lambda s: -s["live_bytes"])
            for i, x in enumerate(ps):
                x["id"] = i
            ns = nat_sites(n)
            for i, x in enumerate(ns):
                x["id"] = i
            extra = dict(classification=cls, sites=ns, python_sites=ps, live=[
                {"address": "0x7f0000000000", "bytes": GiB, "device": 0, "kind": "device", "api": "cudaMalloc",
                 "thread": pid, "age_s": 1.0, "site": 0, "owner": cls[0]["framework"] if cls else None,
                 "in_use_bytes": n * 8 * MiB}])
            if in_use is not None:
                extra.update(dev0_in_use_bytes=in_use(n), dev0_cached_bytes=cached(n))
            out.append(report(pid, seq, reason, current(n) if current else GiB + 128 * MiB, **extra))
        return out

    def leak_run(name, pid, reps, file_, fline, summ, signals=True):
        recs = [{"record": "config", "pid": pid, "signal_steps": [10, 30] if signals else [], "python": "on",
                 "prewarm_mib": 64}]
        if signals:
            recs.append({"record": "signal", "step": 10, "report": "x", "python_sites": 2, "top_frame": "a",
                         "top_framework": "python-stack"})
        recs.append(dict({"record": "summary", "steps_done": 40, "leaked": 40, "leaked_bytes": 320 * MiB}, **summ))
        write_run(os.path.join(L, name), pid, recs, reps, raw_lines=["GGV_LEAK_SITE file=%s line=%d" % (file_, fline)])

    def run_leak(args, summ_file=summary):
        run([lc] + args + ["--cli", cli, "--summary", summ_file])

    seg = lambda n: max(0, n - 8) * 10 * MiB  # noqa: E731  (20 MiB segments, 2 leaks each, after the prewarm)
    segn = lambda n: (max(0, n - 8) + 1) // 2  # noqa: E731
    torch_cls = lambda rec: [{"framework": "pytorch", "status": "classified",  # noqa: E731
                              "detail": "native allocator; blocks from PyTorch's memory snapshot; %s" % rec}]
    tsumm = {"allocated": 345 * MiB, "reserved": 700 * MiB}
    CUDA = ["cudaMalloc+0x10 (libcudart.so.13+0x1)", "c10::cuda::CUDACachingAllocator::malloc+0x2 (libc10_cuda.so+0x2)"]
    ASYNC = ["cudaMallocAsync+0x10 (libcudart.so.13+0x1)", "mallocAsync+0x3 (libc10_cuda.so+0x3)"]

    # Default settings, native: python-stack sites are segment-level (the leak line's
    # growing segments, the prewarm line's cached 64 MiB). Good.
    leak_run("torch_default", 6000, series(
        6000, lambda n: [{"framework": "python-stack", "frames": pyframes(path, line), "live_bytes": seg(n),
                          "live_count": segn(n)},
                         {"framework": "python-stack", "frames": pyframes(path, 99, "main")[1:],
                          "live_bytes": 64 * MiB, "live_count": 1}],
        lambda n: [native(CUDA, pyframes(path, line), seg(n), segn(n)),
                   native(CUDA, pyframes(path, 99, "main")[1:], 64 * MiB, 1), native(["cublasCreate_v2"], [], 32 * MiB, 1)],
        torch_cls("recorder off (GPUGUARD_PYTHON=lines turns it on)"),
        in_use=lambda n: n * 8 * MiB + 25 * MiB, cached=lambda n: seg(n) + 64 * MiB - n * 8 * MiB,
        current=lambda n: seg(n) + 96 * MiB), path, line, tsumm)
    # Default settings, cudaMallocAsync: each tensor one allocation, exact. Good.
    async_cls = [{"framework": "pytorch", "status": "classified", "detail": "cudaMallocAsync allocator: totals"}]
    leak_run("torch_cudaMallocAsync", 6100, series(
        6100, lambda n: [{"framework": "python-stack", "frames": pyframes(path, line), "live_bytes": n * 8 * MiB,
                          "live_count": n}],
        lambda n: [native(ASYNC, pyframes(path, line), n * 8 * MiB, n)], async_cls,
        in_use=lambda n: n * 8 * MiB + 25 * MiB, cached=lambda n: 600 * MiB, current=lambda n: n * 8 * MiB + 64 * MiB),
        path, line, tsumm)
    # Default settings, bad: the growth named at another line, a pytorch (recorder) site
    # although the recorder should be off, native frames after the Python ones.
    leak_run("torch_expandable", 6200, series(
        6200, lambda n: [{"framework": "python-stack", "frames": pyframes(path, line + 1), "live_bytes": seg(n),
                          "live_count": segn(n)},
                         {"framework": "pytorch", "frames": pyframes(path, line + 1), "live_bytes": n * 8 * MiB,
                          "live_count": n}],
        lambda n: [native(["cuMemCreate"], pyframes(path, line + 1), seg(n), segn(n), after=["c10::late+0x1"])],
        torch_cls("Python lines from its recorder"),
        in_use=lambda n: n * 8 * MiB + 25 * MiB, cached=lambda n: 300 * MiB, current=lambda n: seg(n) + 96 * MiB),
        path, line, tsumm)
    for mode in ("default", "cudaMallocAsync", "expandable"):
        run_leak(["torch", "--mode", mode, "--python", "on", "--dir", os.path.join(L, "torch_" + mode)])
    # cudaMallocAsync where the exit report comes after the teardown freed the tensors
    # (the old C-level exit report): the site falls, current_bytes is short.
    teardown = os.path.join(tmp, "teardown.jsonl")
    open(teardown, "w").close()
    leak_run("async_teardown", 6150, series(
        6150, lambda n: [{"framework": "python-stack", "frames": pyframes(path, line), "live_bytes":
                          (0 if n == 40 else n * 8 * MiB), "live_count": 0 if n == 40 else n}],
        lambda n: [native(ASYNC, pyframes(path, line), 0 if n == 40 else n * 8 * MiB, 0 if n == 40 else n)],
        async_cls, in_use=lambda n: 345 * MiB, cached=lambda n: 600 * MiB,
        current=lambda n: 129 * MiB if n == 40 else n * 8 * MiB + 64 * MiB), path, line, tsumm)
    run_leak(["torch", "--mode", "cudaMallocAsync", "--dir", os.path.join(L, "async_teardown")], teardown)

    # GPUGUARD_PYTHON=lines: block-exact pytorch sites. Good, and the leak named at
    # another line (bad).
    def lines_sites(fline):
        return lambda n: [{"framework": "pytorch", "frames": pyframes(path, fline), "live_bytes": n * 8 * MiB,
                           "live_count": n},
                          {"framework": "pytorch", "frames": ["%s:140 in main" % path], "live_bytes": 8 * MiB,
                           "live_count": 4}]
    for name, pid, fline in (("torch_default_lines", 6300, line), ("torch_expandable_lines", 6400, line + 1)):
        leak_run(name, pid, series(
            pid, lines_sites(fline), lambda n: [native(CUDA, [], GiB, 1)], torch_cls("Python lines from its recorder"),
            in_use=lambda n: n * 8 * MiB + 25 * MiB, cached=lambda n: GiB - n * 8 * MiB,
            current=lambda n: GiB + 96 * MiB), path, line, tsumm)
        run_leak(["torch", "--mode", name.split("_")[1], "--python", "lines", "--dir", os.path.join(L, name)])

    # CuPy, default settings: each leaked array one cudaMalloc once the prewarm is used
    # up, under cupy.full's own Python frame. Good.
    csumm = {"pool_used": 330 * MiB, "pool_total": 400 * MiB}
    cfull = "/x/cupy/_creation/basic.py:300 in full"
    cupy_cls = [{"framework": "cupy", "status": "classified", "detail": "default memory pool totals; hook off"}]
    leak_run("cupy", 7000, series(
        7000, lambda n: [{"framework": "python-stack", "frames": [cfull] + pyframes(cpath, cline),
                          "live_bytes": max(0, n - 8) * 8 * MiB, "live_count": max(0, n - 8)},
                         {"framework": "python-stack", "frames": pyframes(cpath, 80, "main")[1:],
                          "live_bytes": 64 * MiB, "live_count": 1}],
        lambda n: [native(CUDA, [cfull] + pyframes(cpath, cline), max(0, n - 8) * 8 * MiB, max(0, n - 8))],
        cupy_cls, in_use=lambda n: n * 8 * MiB, cached=lambda n: 64 * MiB,
        current=lambda n: (max(0, n - 8) * 8 + 64) * MiB), cpath, cline, csumm)
    run_leak(["cupy", "--dir", os.path.join(L, "cupy")])
    # CuPy, GPUGUARD_PYTHON=lines: the hook's block-exact sites. Good.
    leak_run("cupy_lines", 7100, series(
        7100, lambda n: [{"framework": "cupy", "frames": pyframes(cpath, cline), "live_bytes": n * 8 * MiB,
                          "live_count": n}],
        lambda n: [native(CUDA, [], GiB, 1)],
        [{"framework": "cupy", "status": "classified", "detail": "default memory pool; blocks from gpuguard's hook"}],
        in_use=lambda n: n * 8 * MiB, cached=lambda n: GiB - n * 8 * MiB, current=lambda n: GiB), cpath, cline, csumm)
    run_leak(["cupy", "--python", "lines", "--dir", os.path.join(L, "cupy_lines")])

    # JAX: python_sites of framework jax from its device memory profile; in use from
    # memory_stats(). Good; and the old unclassified report (bad, separate summary).
    jsumm = {"bytes_in_use": 321 * MiB, "pool_bytes": 100 * GiB}
    jax_cls = [{"framework": "jax", "status": "classified", "detail": "totals from JAX's memory_stats()"}]
    leak_run("jax", 8000, series(
        8000, lambda n: [{"framework": "jax", "frames": ["%s:%d in main" % (jpath, jline), "%s:90 in <module>" % jpath],
                          "live_bytes": n * 8 * MiB, "live_count": n},
                         {"framework": "jax", "frames": ["%s:60 in main" % jpath], "live_bytes": MiB, "live_count": 1}],
        lambda n: [native(CUDA, [], 100 * GiB, 1)], jax_cls, in_use=lambda n: n * 8 * MiB + MiB,
        cached=lambda n: 100 * GiB - n * 8 * MiB - MiB, current=lambda n: 100 * GiB + 32 * MiB, signals=0),
        jpath, jline, jsumm, signals=False)
    run_leak(["jax", "--dir", os.path.join(L, "jax")])
    jax_bad = os.path.join(tmp, "jax_bad.jsonl")
    open(jax_bad, "w").close()
    leak_run("jax_unclassified", 8100, series(
        8100, lambda n: [], lambda n: [native(CUDA, [], 32 * MiB, 1)],
        [{"framework": "jax", "status": "unavailable", "detail": "JAX's arena is not visible"}],
        current=lambda n: 32 * MiB, signals=0), jpath, jline, jsumm, signals=False)
    run_leak(["jax", "--dir", os.path.join(L, "jax_unclassified")], jax_bad)

    os.makedirs(os.path.join(L, "skipped", "reports"), exist_ok=True)
    with open(os.path.join(L, "skipped", "rc.txt"), "w") as f:
        f.write("-1\n")
    run_leak(["cupy", "--dir", os.path.join(L, "skipped")])

    rows = rows_of(summary)
    P, F, W, I, S = "PASS", "FAIL", "WARN", "INFO", "SKIP"
    exp = {
        ("torch_default", c): P for c in ("exit_status", "kept_running", "losses_match", "trim_report", "mech_pytorch",
                                           "mech_cuda_pools", "nvml_drop", "gg_vs_allocated", "stderr_trim_line",
                                           "control_no_trim")}
    exp.update({("torch_cudaMallocAsync", "mech_pytorch"): P, ("torch_cudaMallocAsync", "nvml_drop"): P,
                ("torch_expandable", "losses_match"): F, ("torch_expandable", "nvml_drop"): F,
                ("torch_expandable", "mech_pytorch"): F, ("torch_expandable", "trim_report"): P,
                ("torch_missing", "trim_report"): F, ("torch_missing", "mech_pytorch"): F,
                ("cupy", "mech_cupy"): P, ("cupy", "pool_released"): P, ("cupy", "nvml_drop"): P,
                ("cupy", "gg_vs_pool"): P, ("cupy", "arrays_intact"): P, ("cupy", "stderr_trim_line"): P,
                ("jax", "mech_jax"): P, ("jax", "mech_cuda_pools"): P, ("jax", "kept_running"): P,
                ("cli_and_burst", "cli_trim_exit0"): P, ("cli_and_burst", "cli_trim_report"): P,
                ("cli_and_burst", "burst_reports"): P, ("cli_and_burst", "burst_merged"): P,
                ("cli_and_burst", "kept_running"): P, ("cli_and_burst", "losses_match_ref"): P,
                ("cli_foreign", "cli_refuses"): P, ("cli_foreign", "sleep_survived"): I})
    trim_rows = [r for r in rows if r["group"] == "trim"]
    problems += expect_rows(trim_rows, exp, "trim")
    # The two runs above share workload names with others: check them by position.
    coal = [r for r in trim_rows if r["check"] in ("burst_merged", "cli_trim_exit0")]
    if [r["status"] for r in coal] != [P, P, F, W]:
        problems.append("burst/cli statuses %s, want PASS PASS FAIL WARN" % [r["status"] for r in coal])
    started = [r for r in trim_rows if r["check"] == "workload_started"]
    if [r["status"] for r in started] != [F] or "cupy" not in started[0]["detail"]:
        problems.append("crashed workload rows: %s" % started)
    if sum(1 for r in trim_rows if r["workload"] == "cupy") != len(
            [r for r in trim_rows if r["workload"] == "cupy" and r["check"] != "workload_started"]) + 1:
        problems.append("a crashed workload gave more than one row")
    judged_default = ("exit_status", "reports", "classification", "recorder_off", "stack_frames", "current_bytes",
                      "diff_first_site", "show_suspected", "show_renders")
    exp = {("torch_default", c): P for c in judged_default + ("in_use_cached",)}
    exp.update({("torch_default", "python_stack_site"): I, ("torch_default", "live_owners"): I})
    exp.update({("torch_cudaMallocAsync", c): P for c in judged_default + ("python_stack_site",)})
    exp.update({("torch_cudaMallocAsync", "in_use_cached"): I})
    exp.update({("torch_expandable", c): F for c in ("recorder_off", "stack_frames", "diff_first_site",
                                                     "show_suspected")})
    exp.update({("torch_expandable", c): P for c in ("exit_status", "reports", "classification", "in_use_cached",
                                                     "current_bytes", "show_renders")})
    exp.update({("torch_default_lines", c): P for c in ("exit_status", "reports", "classification", "python_site_top",
                                                        "python_site_bytes", "in_use_cached", "current_bytes",
                                                        "diff_first_site", "show_suspected", "show_renders")})
    exp.update({("torch_expandable_lines", c): F for c in ("python_site_top", "diff_first_site", "show_suspected")})
    exp.update({("torch_expandable_lines", c): P for c in ("classification", "in_use_cached", "show_renders")})
    exp.update({("cupy", c): P for c in judged_default + ("in_use_cached",)})
    exp.update({("cupy", "python_stack_site"): I, ("cupy", "run"): S})
    exp.update({("cupy_lines", c): P for c in ("classification", "python_site_top", "python_site_bytes",
                                               "in_use_cached", "current_bytes", "show_renders")})
    exp.update({("cupy_lines", "diff_first_site"): I, ("cupy_lines", "show_suspected"): I})
    exp.update({("jax", c): P for c in ("exit_status", "reports", "classification", "python_site_jax", "in_use_cached",
                                        "current_bytes", "show_renders")})
    exp.update({("jax", "jax_stats"): I})
    leak_rows = [r for r in rows if r["group"] == "leaks"]
    problems += expect_rows(leak_rows, exp, "leaks")
    # Where INFO rows say "ok"/"not met" (not judged): the numbers behind them.
    info = {(r["workload"], r["check"]): r["detail"] for r in leak_rows if r["status"] == I}
    for key, want in ((("torch_default", "python_stack_site"), "not met"), (("cupy", "python_stack_site"), "not met"),
                      (("cupy_lines", "diff_first_site"), "ok"), (("torch_cudaMallocAsync", "in_use_cached"), "ok")):
        if not info.get(key, "").startswith(want):
            problems.append("leaks: %s/%s INFO should say %r: %s" % (key[0], key[1], want, info.get(key)))
    if any(r["workload"] == "cupy" and r["check"] == "run" for r in leak_rows[:-1]):
        problems.append("the skipped run's row is not the last")
    exp = {("torch_cudaMallocAsync", c): F for c in ("python_stack_site", "current_bytes", "show_suspected")}
    exp.update({("torch_cudaMallocAsync", c): P for c in ("diff_first_site", "stack_frames", "recorder_off")})
    problems += expect_rows(rows_of(teardown), exp, "async_teardown")
    exp = {("jax", c): F for c in ("classification", "python_site_jax", "in_use_cached")}
    exp.update({("jax", "exit_status"): P, ("jax", "current_bytes"): F})
    problems += expect_rows(rows_of(jax_bad), exp, "jax_unclassified")

    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "lib", "ggv.py"), "table", "--summary", summary,
                          "--txt", os.path.join(tmp, "summary.txt"), "--json", os.path.join(tmp, "summary.json")],
                         capture_output=True, text=True, timeout=60)
    print(out.stdout[-3000:])
    if out.returncode != 0 or not os.path.exists(os.path.join(tmp, "summary.txt")):
        problems.append("table failed: %s" % out.stderr[-500:])
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    if problems:
        print("SELFTEST FAILED:\n  " + "\n  ".join(problems))
        return 1
    print("SELFTEST OK: %d rows as expected (%s)" % (len(rows), "real CLI " + cli if a.cli else "stand-in CLI"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
