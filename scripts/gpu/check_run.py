#!/usr/bin/env python3
"""Checks one gpuguard validation run and prints the summary table.

  check_run.py run --name N --kind K --dir RUNDIR --rc RC [--summary FILE]
      RUNDIR holds stdout.log, stderr.log, reports/ (GPUGUARD_DIR) and, when the
      runner sent SIGUSR1, signal_sent.txt. Prints the workload's comparison
      lines and a verdict block; appends one JSON row to FILE.
      K: framework (torch/jax/cupy), leaks (alloc_paths, cudarc: LEAK lines must
      appear in the exit report's live[]), inert (a process that never calls
      CUDA: no report expected).
  check_run.py table --summary FILE [--out JSON]
      Prints the compact table of all rows; writes them (and env) to JSON.

Standard library only: it runs on the GPU machine's python3.
"""

import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import ggv  # noqa: E402  (scripts/gpu/lib/ggv.py)

REPORT_RE = ggv.REPORT_RE
LEAK_RE = re.compile(r"^LEAK (0x[0-9a-fA-F]+) bytes (\d+)(.*)$")
STDERR_REPORT_RE = re.compile(r"gpuguard\[(\d+)\]: report")
MiB = 1 << 20
load_json = ggv.load_json
as_int = ggv.as_int


def dev0(rep, key="current_bytes"):
    if not isinstance(rep, dict):
        return None
    for d in rep.get("devices") or []:
        if isinstance(d, dict) and d.get("device") == 0:
            return d.get(key)
    return None


def parse_stdout(path):
    checks, leaks, mids, other = [], [], [], 0
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        lines = []
    for ln in lines:
        s = ln.strip()
        m = LEAK_RE.match(s)
        if m:
            extra = dict(kv.split("=", 1) for kv in m.group(3).split() if "=" in kv)
            leaks.append({"address": int(m.group(1), 16), "bytes": int(m.group(2)), **extra})
            continue
        if s.startswith("GGV_MIDRUN"):
            mids.append(s)
            continue
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except ValueError:
                other += 1
                continue
            if isinstance(obj, dict) and "check" in obj:
                checks.append(obj)
                continue
        other += 1
    return checks, leaks, mids, other


def find_live(rep, leak):
    """Entry of rep['live'] whose address (or, for VMM, handle) matches the leak."""
    want = {leak["address"]}
    h = as_int(leak.get("handle"))
    if h:
        want.add(h)
    for e in (rep or {}).get("live") or []:
        if isinstance(e, dict) and as_int(e.get("address")) in want:
            return e
    return None


def fmt(n):
    if n is None:
        return "-"
    return "%.1fMiB" % (n / MiB) if abs(n) >= MiB else str(n)


def cmd_run(a):
    d = a.dir
    rc = int(a.rc)
    checks, leaks, mids, _ = parse_stdout(os.path.join(d, "stdout.log"))
    try:
        stderr = open(os.path.join(d, "stderr.log"), errors="replace").read().splitlines()
    except OSError:
        stderr = []
    main_pid = None
    for c in checks:
        if c.get("check") == "gpuguard_present" and c.get("pid"):
            main_pid = int(c["pid"])
            break
    if main_pid is None:
        for m in mids:
            mm = re.search(r"pid=(\d+)", m)
            if mm:
                main_pid = int(mm.group(1))

    # ---- reports ------------------------------------------------------------
    reports = {}  # reason -> list of (path, report)
    other_pid = []
    bad = []
    for p in sorted(glob.glob(os.path.join(d, "reports", "*"))):
        name = os.path.basename(p)
        m = REPORT_RE.match(name)
        if not m:
            bad.append(name + " (unexpected name)")
            continue
        rep, err = load_json(p)
        if err:
            bad.append(name + " (" + err + ")")
            continue
        if rep.get("schema") != "gpuguard-report/1":
            bad.append(name + " (schema %r)" % rep.get("schema"))
        if main_pid is not None and int(m.group("pid")) != main_pid:
            other_pid.append(name)
            continue
        reports.setdefault(m.group("reason"), []).append((p, rep))
    n_sig = len(reports.get("signal", []))
    n_exit = len(reports.get("exit", []))
    n_req = len(reports.get("request", []))
    exit_rep = reports["exit"][-1][1] if n_exit else None
    with open(os.path.join(d, "exit_report_path.txt"), "w") as f:
        f.write(reports["exit"][-1][0] if n_exit else "")
    sig_rep = reports["signal"][0][1] if n_sig else None
    stderr_lines = [s for s in stderr if STDERR_REPORT_RE.search(s)]

    # ---- verdicts from the workload's own lines ------------------------------
    counts = {"agree": 0, "explained": 0, "mismatch": 0, "no-gpuguard": 0}
    problems = []
    for c in checks:
        if c.get("check") in ("signal_report", "request_report") and "verdict" not in c:
            rp = c.get("report")
            rep, err = load_json(rp) if rp else (None, "no report path")
            cur = dev0(rep)
            if rep is None:
                c["verdict"], c["explanation"] = "mismatch", "report not found/readable: %s" % err
            elif cur is not None and cur == c.get("gpuguard_current"):
                c["verdict"], c["explanation"] = "agree", "the report's device-0 current_bytes equals the C API's"
            else:
                c["verdict"] = "mismatch"
                c["explanation"] = "report current_bytes %r vs C API %r" % (cur, c.get("gpuguard_current"))
            c["report_current"] = cur
        v = c.get("verdict")
        if v in counts:
            counts[v] += 1
            if v == "mismatch":
                problems.append("%s: %s" % (c.get("check"), c.get("explanation")))

    # ---- report-level checks ---------------------------------------------------
    extra_checks = []
    if exit_rep is not None and a.kind != "inert":
        uf = dev0(exit_rep, "unknown_frees")
        failed = dev0(exit_rep, "failed")
        if uf:
            extra_checks.append(("exit_unknown_frees", "mismatch",
                                 "%d frees of addresses gpuguard never saw allocated (a missed allocation path?)" % uf))
        else:
            extra_checks.append(("exit_unknown_frees", "agree", "no unknown frees"))
        if failed:
            extra_checks.append(("exit_failed", "info", "%d failed allocations (real OOM or errors)" % failed))
    leak_found = leak_hard = 0
    leak_rows = []
    if leaks:
        for lk in leaks:
            kind = lk.get("kind", "device")
            soft = kind == "host_pinned"
            if not soft:
                leak_hard += 1
            row = {"address": hex(lk["address"]), "bytes": lk["bytes"], "kind": kind, "api": lk.get("api")}
            for label, rep in (("exit", exit_rep), ("signal", sig_rep)):
                e = find_live(rep, lk) if rep else None
                if e is None:
                    row[label] = "absent" + (" (soft: pinned may be reported under host_pinned only)" if soft else "")
                else:
                    same = as_int(e.get("bytes")) == lk["bytes"]
                    row[label] = "found" + ("" if same else " bytes=%s" % e.get("bytes"))
                    row[label + "_site"] = e.get("site")
                    row[label + "_api"] = e.get("api")
                    if label == "exit" and not soft and (same or kind == "array"):
                        leak_found += 1
            leak_rows.append(row)
        v = "agree" if leak_found == leak_hard else "mismatch"
        extra_checks.append(("leaks_in_exit_report", v, "%d of %d device leaks found in the exit report's live[] "
                                                      "with the same bytes" % (leak_found, leak_hard)))
    for name, v, why in extra_checks:
        if v in counts:
            counts[v] += 1
        if v == "mismatch":
            problems.append("%s: %s" % (name, why))

    # ---- pass/fail ----------------------------------------------------------------
    req = []
    if a.kind == "inert":
        ok = rc == 0 and not reports and not other_pid
        if reports or other_pid:
            req.append("an inert process wrote %d report(s)" % (sum(len(v) for v in reports.values()) + len(other_pid)))
    else:
        if rc != 0:
            req.append("exit status %d" % rc)
        if n_sig < 1:
            req.append("no signal report")
        if n_exit < 1:
            req.append("no exit report")
        if not checks:
            req.append("no comparison lines")
        if counts["no-gpuguard"]:
            req.append("gpuguard C API missing in %d checks" % counts["no-gpuguard"])
        if bad:
            req.append("bad reports: " + "; ".join(bad[:3]))
        # Nothing on the program's stderr but gpuguard's own lines: each other line
        # must be one the bare twin printed too (run_workload runs it first).
        bare_path = os.path.join(d, "bare", "stderr.log")
        if os.path.exists(bare_path):
            bare = open(bare_path, errors="replace").read().splitlines()
            foreign = ggv.foreign_stderr(stderr, bare)
            if foreign:
                req.append("%d stderr line(s) a bare run lacks, first: %s" % (len(foreign), foreign[0][:160]))
        ok = not req and counts["mismatch"] == 0
    status = "SKIP" if rc == -1 else ("PASS" if ok else "FAIL")

    # ---- print ----------------------------------------------------------------------
    print("---- %s: comparison lines ----" % a.name)
    for c in checks:
        if c.get("check") == "summary":
            s = dict(c)
            if isinstance(s.get("losses"), list):
                s["losses"] = "%d values: %s ... %s" % (len(s["losses"]), s["losses"][:5], s["losses"][-5:])
            print("  summary: " + json.dumps(s, sort_keys=True)[:1500])
            continue
        if c.get("verdict") == "info" and c.get("check") != "gpuguard_present":
            print("  %-26s info %s" % (c.get("check"), json.dumps({k: v for k, v in c.items() if k not in ("check", "verdict")})[:400]))
            continue
        print("  %-26s %-11s fw=%-12s gg=%-12s diff=%-10s %s" % (
            c.get("check"), c.get("verdict"),
            fmt(c.get("framework_bytes", c.get("expected_delta"))),
            fmt(c.get("gpuguard_current") if "framework_bytes" in c else c.get("gpuguard_delta", c.get("gpuguard_current"))),
            fmt(c.get("diff")), (c.get("explanation") or "")[:200]))
    for name, v, why in extra_checks:
        print("  %-26s %-11s %s" % (name, v, why))
    for r in leak_rows:
        print("  leak %s %s bytes kind=%s api=%s exit:%s signal:%s" % (
            r["address"], r["bytes"], r["kind"], r.get("api"), r.get("exit"), r.get("signal")))
    print("  reports: signal=%d exit=%d request=%d other-pid=%d bad=%d; stderr report lines=%d" % (
        n_sig, n_exit, n_req, len(other_pid), len(bad), len(stderr_lines)))
    if exit_rep is not None:
        print("  exit report device0: current=%s peak=%s allocs=%s frees=%s by_kind=%s host_pinned=%s live=%d sites=%d" % (
            fmt(dev0(exit_rep)), fmt(dev0(exit_rep, "peak_bytes")), dev0(exit_rep, "allocs"), dev0(exit_rep, "frees"),
            json.dumps(dev0(exit_rep, "by_kind")), json.dumps(exit_rep.get("host_pinned")),
            len(exit_rep.get("live") or []), len(exit_rep.get("sites") or [])))
    print("  %s %s%s" % (a.name, status, (": " + "; ".join(req + problems[:6])) if (req or problems) else ""))

    row = {
        "workload": a.name, "kind": a.kind, "rc": rc, "status": status,
        "agree": counts["agree"], "explained": counts["explained"], "mismatch": counts["mismatch"],
        "no_gpuguard": counts["no-gpuguard"], "signal_reports": n_sig, "exit_reports": n_exit,
        "request_reports": n_req, "other_pid_reports": len(other_pid), "bad_reports": bad,
        "stderr_report_lines": len(stderr_lines), "leaks": ("%d/%d" % (leak_found, leak_hard)) if leaks else "-",
        "problems": req + problems, "checks": checks, "leak_rows": leak_rows,
        "exit_device0": {k: dev0(exit_rep, k) for k in ("current_bytes", "peak_bytes", "allocs", "frees",
                                                         "failed", "denied", "unknown_frees", "by_kind")}
        if exit_rep else None,
        "elapsed_s": float(a.elapsed) if a.elapsed else None,
    }
    ggv.save_row(d, row, a.summary)
    return 0


def cmd_table(a):
    rows = ggv.load_rows(a.summary)
    print("%-20s %-6s %4s %5s %5s %5s %4s %4s %4s %6s %7s  %s" % (
        "workload", "status", "rc", "agree", "expl", "mism", "sig", "exit", "req", "leaks", "time_s", "first problem"))
    for r in rows:
        print("%-20s %-6s %4s %5s %5s %5s %4s %4s %4s %6s %7s  %s" % (
            r["workload"], r["status"], r["rc"], r["agree"], r["explained"], r["mismatch"],
            r["signal_reports"], r["exit_reports"], r["request_reports"], r["leaks"],
            "-" if r.get("elapsed_s") is None else "%.0f" % r["elapsed_s"],
            (r["problems"][0] if r["problems"] else "")[:90]))
    n_pass = sum(r["status"] == "PASS" for r in rows)
    print("%d passed, %d failed" % (n_pass, sum(r["status"] == "FAIL" for r in rows))
          + (", %d skipped" % sum(r["status"] == "SKIP" for r in rows) if any(r["status"] == "SKIP" for r in rows) else ""))
    if a.out:
        env = {}
        if a.env and os.path.exists(a.env):
            env = {"env_txt": open(a.env, errors="replace").read()}
        with open(a.out, "w") as f:
            json.dump({"rows": rows, **env}, f, indent=1)
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--kind", required=True, choices=["framework", "leaks", "inert"])
    r.add_argument("--dir", required=True)
    r.add_argument("--rc", required=True)
    r.add_argument("--elapsed")
    r.add_argument("--summary")
    t = sub.add_parser("table")
    t.add_argument("--summary", required=True)
    t.add_argument("--out")
    t.add_argument("--env")
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_table(a)


if __name__ == "__main__":
    sys.exit(main())
