#!/usr/bin/env python3
"""Self-test of the trim/leak checkers without a GPU: builds run directories with
hand-made workload output and gpuguard reports (the shapes of the spec and of
src/report.rs), runs trim_check.py, leak_check.py and tl_common.py table on them,
and compares every row's status with the expected one.

  python3 scripts/gpu/trim/selftest.py [--cli PATH/TO/gpuguard] [--keep DIR]

(The GPU run itself: OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh.)

Without --cli it uses a stand-in for `gpuguard diff/show` that prints the diff
layout of src/main.rs ("    +<bytes>" then indented lines, a Python site headed
"[<framework> blocks, Python]", Python sites first); with --cli the real command reads the sample
reports (which also checks that they parse). Exit status 0 when every expectation
holds.
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
cmd = sys.argv[1]
if cmd == "diff":
    a, b = sites(load(sys.argv[2])), sites(load(sys.argv[3]))
    g = sorted(((b[k] - a.get(k, 0), k) for k in b if b[k] > a.get(k, 0)),
               key=lambda x: (not x[1].startswith("["), -x[0], x[1]))  # Python lines first
    print("gpuguard diff\n  A: %s\n  B: %s\n" % (sys.argv[2], sys.argv[3]))
    print("  %d call sites whose live bytes grew from A to B, most first:" % len(g))
    for d, k in g:
        print("    +%.1f MiB" % (d / 1048576.0))
        print("      A   %d\n      B   %d" % (a.get(k, 0), b[k]))
        for f in k.splitlines()[:6]:
            print("        " + f)
elif cmd == "show":
    for p in sys.argv[2:]:
        r = load(p)
        print("gpuguard report %s" % p)
        for s in r.get("python_sites", []):
            print("    py site %d %d" % (s["id"], s["live_bytes"]))
            for f in s["frames"][:6]:
                print("        " + f)
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

    # ---- leaks: torch default (good), cudaMallocAsync (unavailable), expandable (diff puts native first) ----
    L = os.path.join(tmp, "leaks")
    line = None
    for i, ln in enumerate(open(os.path.join(LEAKS, "leak_torch.py")), 1):
        if ln.rstrip().endswith("# GGV_" + "LEAK_LINE"):
            line = i
    path = os.path.abspath(os.path.join(LEAKS, "leak_torch.py"))

    def leak_reports(pid, framework, n1, n2, n3, native_growth=0, classified=True, fname=path, fline=None):
        fline = line if fline is None else fline
        fr = ["%s:%d in step" % (fname, fline), "%s:%d in main" % (fname, 120)]
        out = []
        for seq, (reason, n) in enumerate((("signal", n1), ("signal", n2), ("exit", n3)), 1):
            ps = ([{"id": 0, "framework": framework, "frames": fr, "live_bytes": n * 8 * MiB, "live_count": n},
                   {"id": 1, "framework": framework, "frames": ["/x/torch/optim/adamw.py:10 in _init_group"],
                    "live_bytes": 8 * MiB, "live_count": 4}] if classified else [])
            cls = [{"framework": framework, "status": "classified" if classified else "unavailable",
                    "detail": "native allocator" if classified else "cudaMallocAsync allocator: no Python lines"}]
            nat = [{"id": 0, "frames": ["cudaMalloc", "c10::alloc"], "live_bytes": GiB + seq * native_growth,
                    "live_count": 1}]
            extra = dict(classification=cls, sites=nat, live=[
                {"address": "0x7f0000000000", "bytes": GiB, "device": 0, "kind": "device", "api": "cudaMalloc",
                 "thread": pid, "age_s": 1.0, "site": 0, "owner": framework, "in_use_bytes": n * 8 * MiB}])
            if classified:
                extra.update(python_sites=ps, dev0_in_use_bytes=n * 8 * MiB + 24 * MiB,
                             dev0_cached_bytes=GiB - n * 8 * MiB)
            out.append(report(pid, seq, reason, GiB + 128 * MiB, **extra))
        return out

    def leak_run(name, pid, reps, framework="pytorch", file_=path):
        write_run(os.path.join(L, name), pid, [
            {"record": "config", "pid": pid, "signal_steps": [10, 30]},
            {"record": "signal", "step": 10, "report": "x", "python_sites": 2, "top_frame": "a"},
            {"record": "summary", "steps_done": 40, "leaked": 40, "leaked_bytes": 320 * MiB,
             "allocated": 340 * MiB, "reserved": GiB}], reps,
            raw_lines=["GGV_LEAK_SITE file=%s line=%d" % (file_, line)])

    leak_run("torch_default", 6000, leak_reports(6000, "pytorch", 11, 31, 40))
    leak_run("torch_cudaMallocAsync", 6100, leak_reports(6100, "pytorch", 11, 31, 40, classified=False))
    # The leak attributed to another line (and a native site growing more): both checks fail.
    leak_run("torch_expandable", 6200, leak_reports(6200, "pytorch", 11, 31, 40, native_growth=400 * MiB,
                                                    fline=line + 1))
    for mode in ("default", "cudaMallocAsync", "expandable"):
        run([lc, "torch", "--mode", mode, "--dir", os.path.join(L, "torch_" + mode), "--cli", cli,
             "--summary", summary])
    cpath = os.path.abspath(os.path.join(LEAKS, "leak_cupy.py"))
    cline = [i for i, ln in enumerate(open(cpath), 1) if ln.rstrip().endswith("# GGV_" + "LEAK_LINE")][0]
    reps = leak_reports(7000, "cupy", 11, 31, 40, fname=cpath, fline=cline)
    write_run(os.path.join(L, "cupy"), 7000, [
        {"record": "config", "pid": 7000, "signal_steps": [10, 30]},
        {"record": "summary", "steps_done": 40, "leaked": 40, "leaked_bytes": 320 * MiB, "pool_used": 330 * MiB,
         "pool_total": GiB}], reps, raw_lines=["GGV_LEAK_SITE file=%s line=%d" % (cpath, cline)])
    run([lc, "cupy", "--dir", os.path.join(L, "cupy"), "--cli", cli, "--summary", summary])
    write_run(os.path.join(L, "jax"), 8000, [{"record": "config", "pid": 8000},
                                             {"record": "summary", "leaked_bytes": 320 * MiB}],
              [report(8000, 1, "exit", 100 * GiB, classification=[
                  {"framework": "jax", "status": "unavailable", "detail": "JAX's arena is not visible"}])])
    run([lc, "jax", "--dir", os.path.join(L, "jax"), "--cli", cli, "--summary", summary])
    os.makedirs(os.path.join(L, "skipped", "reports"), exist_ok=True)
    with open(os.path.join(L, "skipped", "rc.txt"), "w") as f:
        f.write("-1\n")
    run([lc, "cupy", "--dir", os.path.join(L, "skipped"), "--cli", cli, "--summary", summary])

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
    exp = {("torch_default", c): P for c in ("exit_status", "reports", "classification", "python_site_top",
                                              "python_site_bytes", "in_use_cached", "diff_first_site",
                                              "show_renders")}
    exp.update({("torch_cudaMallocAsync", "classification"): I, ("torch_cudaMallocAsync", "python_site_top"): I,
                ("torch_cudaMallocAsync", "in_use_cached"): I, ("torch_cudaMallocAsync", "diff_first_site"): I,
                ("torch_cudaMallocAsync", "exit_status"): P,
                ("torch_expandable", "python_site_top"): F, ("torch_expandable", "diff_first_site"): F,
                ("cupy", "python_site_top"): P, ("cupy", "in_use_cached"): P, ("cupy", "diff_first_site"): I,
                ("cupy", "run"): S,
                ("jax", "exit_status"): P, ("jax", "exit_report"): P, ("jax", "classification"): I})
    problems += expect_rows([r for r in rows if r["group"] == "leaks"], exp, "leaks")

    out = subprocess.run([sys.executable, os.path.join(HERE, "tl_common.py"), "table", "--summary", summary,
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
