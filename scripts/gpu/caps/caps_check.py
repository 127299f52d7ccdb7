#!/usr/bin/env python3
"""Checks one gpuguard cap run from outside the process and prints the summary table.

  caps_check.py run --name N --dir RUNDIR --rc RC --cap-bytes B
                    [--expect-denial yes|no|any] [--elapsed S] [--summary FILE]
      RUNDIR holds stdout.log, stderr.log, monitor.csv (caps_monitor.py) and
      reports/ (GPUGUARD_DIR). Prints:
        - the workload's own PASS/FAIL lines (counted),
        - real usage from outside: baseline (NVML samples while the workload
          holds still after GGV_BASELINE), max(real - baseline) over the run vs
          the cap, and at each GGV_MARK the real usage next to what gpuguard
          charged (the difference is device memory the driver gives the process
          outside any allocation: module code, context growth),
        - the cap reports (denial: bytes, api, charged, cap, first frames), the
          exit report's cap_bytes / peak / denied / pool_reserved_bytes,
      then a verdict line; appends one JSON row to FILE.
  caps_check.py smi --dir RUNDIR --cap-bytes B --rc-bare R --rc-query R --rc-full R [--summary FILE]
      nvidia-smi under the shim with GPUGUARD_CAP: runs, shows the real total,
      writes no report.
  caps_check.py table --summary FILE [--out JSON] [--env FILE]
      The table of all rows; writes them (and env.txt) to JSON. Exit 1 if any FAIL.

Standard library only.
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import caps_common as cc  # noqa: E402

MiB = 1 << 20
# An overshoot of the real usage over the cap is a WARN, not a FAIL, when it is at most
# this and no larger than what the marks show outside gpuguard's books.
OUTSIDE_TOL = int(os.environ.get("GGV_OUTSIDE_TOL_MIB", "128")) * MiB
LINE_RE = re.compile(r"^(PASS|FAIL|INFO) (\S+): (.*)$")
KV_RE = re.compile(r"(\w+)=(\S+)")


def mib(n):
    return None if n is None else round(n / MiB, 1)


def fmt(n):
    return "-" if n is None else "%.1f" % (n / MiB)


def kv(line):
    out = {}
    for k, v in KV_RE.findall(line):
        try:
            out[k] = float(v) if "." in v else int(v)
        except ValueError:
            out[k] = None if v == "None" else v
    return out


def parse_stdout(path):
    res = {"checks": [], "data": [], "baseline": None, "marks": [], "result": None, "pid": None}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return res
    for ln in lines:
        s = ln.strip()
        m = LINE_RE.match(s)
        if m:
            res["checks"].append({"status": m.group(1), "check": m.group(2), "text": m.group(3)})
            mm = re.search(r" pid (\d+) ", s)
            if m.group(2) == "start" and mm:
                res["pid"] = int(mm.group(1))
            continue
        if s.startswith("GGV_JSON "):
            try:
                res["data"].append(json.loads(s[len("GGV_JSON "):]))
            except ValueError:
                pass
        elif s.startswith("GGV_BASELINE"):
            res["baseline"] = kv(s)
            res["pid"] = res["baseline"].get("pid", res["pid"])
        elif s.startswith("GGV_MARK"):
            res["marks"].append(kv(s))
        elif s.startswith("RESULT "):
            res["result"] = s
    return res


def parse_monitor(path):
    mon = {"samples": [], "comments": [], "error": None}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        mon["error"] = "no monitor file: %s" % e
        return mon
    for ln in lines:
        if ln.startswith("#"):
            mon["comments"].append(ln)
            continue
        if ln.startswith("t,"):
            continue
        parts = ln.split(",", 3)
        if len(parts) < 4:
            continue
        try:
            t = float(parts[0])
        except ValueError:
            continue
        dev = int(parts[1]) if parts[1].isdigit() else None
        procs = {}
        for item in parts[3].split(";"):
            if ":" in item:
                p, u = item.split(":", 1)
                if p.isdigit():
                    procs[int(p)] = int(u) if u.isdigit() else None
        mon["samples"].append((t, dev, procs))
    if not mon["samples"] and not mon["error"]:
        errs = [c for c in mon["comments"] if "error" in c]
        mon["error"] = "no samples" + ((": " + errs[0]) if errs else "")
    return mon


def analyse_real(out, mon, cap, t_end):
    """Real usage from outside vs the cap. Returns (checks, info dict)."""
    info = {"mode": None}
    checks = []
    b = out.get("baseline")
    if mon["error"] or b is None:
        why = mon["error"] or "the workload printed no GGV_BASELINE"
        checks.append(("FAIL", "real_peak_vs_cap", "not measured: " + why))
        info["error"] = why
        return checks, info
    pid, tb, hold = b.get("pid"), float(b.get("t", 0)), float(b.get("hold", 0.6))
    samples = [s for s in mon["samples"] if s[0] >= tb - 0.2 and (t_end is None or s[0] <= t_end + 0.5)]
    with_procs = [s for s in samples if s[2]]
    if any(pid in s[2] and s[2][pid] is not None for s in samples):
        mode, note = "pid", "NVML per-process used memory of pid %d" % pid
        val = lambda s: s[2].get(pid)  # noqa: E731
    elif with_procs and all(len(s[2]) == 1 for s in with_procs) and any(
            list(s[2].values())[0] is not None for s in with_procs):
        mode = "single"
        note = ("NVML lists pid(s) %s, not %d (pid namespaces?); the only compute process on the GPU is taken "
                "as the workload" % (sorted({p for s in with_procs for p in s[2]}), pid))
        val = lambda s: (list(s[2].values())[0] if len(s[2]) == 1 else None)  # noqa: E731
    else:
        mode, note = "device", "no usable per-process value: device-level used memory (whole GPU)"
        val = lambda s: s[1]  # noqa: E731
    info["mode"], info["note"] = mode, note

    def window(t0, t1, f):
        v = [f(s) for s in samples if t0 <= s[0] <= t1 and f(s) is not None]
        return v

    base = window(tb + 0.1, tb + hold, val) or window(tb, tb + hold + 0.2, val)
    base_dev = window(tb + 0.1, tb + hold, lambda s: s[1]) or window(tb, tb + hold + 0.2, lambda s: s[1])
    if not base:
        checks.append(("FAIL", "real_peak_vs_cap", "not measured: no monitor sample in the baseline window "
                       "(%s)" % note))
        info["error"] = "no baseline sample"
        return checks, info
    b0 = statistics.median(base)
    run = [(s[0], val(s)) for s in samples if s[0] >= tb and val(s) is not None]
    ts = [s[0] for s in samples if s[0] >= tb]
    gaps = [y - x for x, y in zip(ts, ts[1:])]
    peak_t, peak_v = max(run, key=lambda r: r[1]) if run else (None, None)
    peak = None if peak_v is None else peak_v - b0
    info.update({
        "baseline_bytes": b0, "baseline_samples": len(base), "samples": len(run),
        "max_gap_ms": round(1000 * max(gaps), 1) if gaps else None,
        "median_gap_ms": round(1000 * statistics.median(gaps), 1) if gaps else None,
        "peak_rel_bytes": peak, "peak_t_rel": None if peak_t is None else round(peak_t - tb, 2),
        "cap_bytes": cap, "margin_bytes": None if peak is None else cap - peak,
    })
    if base_dev:
        d0 = statistics.median(base_dev)
        dev_run = [s[1] for s in samples if s[0] >= tb and s[1] is not None]
        info["device_baseline_bytes"] = d0
        info["device_peak_rel_bytes"] = (max(dev_run) - d0) if dev_run else None
    # marks: real usage vs gpuguard's charge at steady points
    rows = []
    for m in out.get("marks") or []:
        t, h = float(m.get("t", 0)), float(m.get("hold", 0.5))
        w = window(t + 0.15, t + h, val)
        charged = m.get("charged") if isinstance(m.get("charged"), int) else m.get("current")
        if not w or not isinstance(charged, int):
            rows.append({"mark": m.get("name"), "real_rel_bytes": None, "charged_bytes": charged})
            continue
        rel = statistics.median(w) - b0
        rows.append({"mark": m.get("name"), "real_rel_bytes": rel, "charged_bytes": charged,
                     "outside_books_bytes": rel - charged, "samples": len(w)})
    info["marks"] = rows
    outside = [r["outside_books_bytes"] for r in rows if r.get("outside_books_bytes") is not None]
    info["outside_books_max_bytes"] = max(outside) if outside else None
    head = ("max(real - baseline) %s MiB at +%ss vs cap %s MiB: margin %s MiB (%s; baseline %s MiB from %d "
            "samples; %d samples, every %s ms median, largest gap %s ms)" % (
                fmt(peak), info["peak_t_rel"], fmt(cap), fmt(info["margin_bytes"]), note, fmt(b0), len(base),
                len(run), info["median_gap_ms"], info["max_gap_ms"]))
    if peak is None:
        checks.append(("FAIL", "real_peak_vs_cap", "no sample after the baseline"))
    elif peak <= cap:
        checks.append(("PASS", "real_peak_vs_cap", head))
    else:
        outside = info["outside_books_max_bytes"]
        extra = ""
        allocs_peak = None
        if outside is not None:
            allocs_peak = peak - max(outside, 0)
            info["alloc_peak_rel_bytes"] = allocs_peak
            extra = ("; at the marks up to %s MiB of the real usage was outside gpuguard's books (device memory "
                     "the driver gave the process that was no allocation gpuguard saw: context growth, lazily "
                     "loaded module code; or an allocation path gpuguard missed); peak minus that: %s MiB" % (
                         fmt(outside), fmt(allocs_peak)))
        explained = (allocs_peak is not None and allocs_peak <= cap and peak - cap <= OUTSIDE_TOL)
        checks.append(("WARN" if explained else "FAIL", "real_peak_vs_cap", "OVERSHOOT by %s MiB: %s%s%s" % (
            fmt(peak - cap), head, extra,
            " -- the allocations themselves stayed within the cap" if explained else
            " -- NOT explained by memory outside gpuguard's books (or more than %s MiB over)" % fmt(OUTSIDE_TOL))))
    if info.get("max_gap_ms") and info["max_gap_ms"] > 300:
        checks.append(("INFO", "monitor_gaps", "largest gap between samples %s ms: a short peak may be missed"
                       % info["max_gap_ms"]))
    return checks, info


def report_files(d, pid):
    out = {}
    for p in glob.glob(os.path.join(d, "reports", "*.json")):
        m = cc.REPORT_RE.match(os.path.basename(p))
        if not m:
            continue
        if pid is not None and int(m.group("pid")) != pid:
            out.setdefault("other_pid", []).append((int(m.group("seq")), p))
            continue
        out.setdefault(m.group("reason"), []).append((int(m.group("seq")), p))
    for k in out:
        out[k].sort()
    return out


def cmd_run(a):
    d = a.dir
    cap = int(a.cap_bytes)
    rc = int(a.rc)
    out = parse_stdout(os.path.join(d, "stdout.log"))
    mon = parse_monitor(os.path.join(d, "monitor.csv"))
    pid = out.get("pid")
    checks = []  # (status, name, text) from outside

    wl_pass = sum(c["status"] == "PASS" for c in out["checks"])
    wl_fail = [c for c in out["checks"] if c["status"] == "FAIL"]
    if rc != 0:
        checks.append(("FAIL", "exit_status", "exit status %d" % rc))
    if out["result"] is None:
        checks.append(("FAIL", "result_line", "the workload printed no RESULT line (crashed or timed out?)"))

    real_checks, real = analyse_real(out, mon, cap, float(a.t_end) if a.t_end else None)
    checks.extend(real_checks)

    reps = report_files(d, pid)
    cap_rows = []
    cap_probs = []
    for seq, p in reps.get("cap", []):
        rep = cc.load(p)
        probs = cc.validate_cap_report(rep, cap)
        e = cc.dev_entry(rep, 0) or {}
        den = (rep or {}).get("denial") or {}
        cap_rows.append({"file": os.path.basename(p), "seq": seq, "denial": {
            k: den.get(k) for k in ("device", "bytes", "api", "charged_bytes", "cap_bytes")},
            "frames": (den.get("frames") or [])[:6], "denied": e.get("denied"),
            "pool_reserved_bytes": e.get("pool_reserved_bytes"), "current_bytes": e.get("current_bytes"),
            "problems": probs})
        if probs:
            cap_probs.append("%s: %s" % (os.path.basename(p), "; ".join(probs)))
    n_cap = len(cap_rows)
    if a.expect_denial == "yes":
        if n_cap and not cap_probs:
            checks.append(("PASS", "cap_reports", "%d cap report(s), each with reason cap and a justified denial"
                           % n_cap))
        else:
            checks.append(("FAIL", "cap_reports", "%d cap report(s)%s" % (n_cap, (": " + " | ".join(cap_probs))
                                                                       if cap_probs else " (one expected)")))
    else:
        checks.append(("INFO" if not cap_probs else "FAIL", "cap_reports", "%d cap report(s) (%s expected)%s" % (
            n_cap, "none" if a.expect_denial == "no" else "any number", (": " + " | ".join(cap_probs))
            if cap_probs else "")))

    # A cap's refusal is the cap's, not the driver's: no `oom` report (a framework
    # allocating through cudaMalloc once had its cap refusals reported twice).
    ooms = [os.path.basename(p) for _, p in reps.get("oom", [])]
    checks.append(("FAIL" if ooms else "PASS", "no_driver_refusal",
                   "oom report(s) beside the cap's: " + ", ".join(ooms[:3]) if ooms
                   else "no oom report: every refusal was the cap's"))

    exit_rep = cc.load(reps["exit"][-1][1]) if reps.get("exit") else None
    ex = cc.dev_entry(exit_rep, 0) if exit_rep else None
    exit_row = None
    if ex is None:
        checks.append(("FAIL", "exit_report", "no exit report with a device-0 entry for pid %s" % pid))
    else:
        exit_row = {k: ex.get(k) for k in ("total_bytes", "cap_bytes", "current_bytes", "peak_bytes", "allocs",
                                           "frees", "failed", "denied", "unknown_frees", "pool_reserved_bytes",
                                           "by_kind")}
        probs = []
        if ex.get("cap_bytes") != cap:
            probs.append("cap_bytes %r" % ex.get("cap_bytes"))
        if (ex.get("peak_bytes") or 0) > cap:
            probs.append("gpuguard's own peak %s MiB is above the cap" % fmt(ex.get("peak_bytes")))
        if a.expect_denial == "yes" and not ex.get("denied"):
            probs.append("denied 0")
        if ex.get("unknown_frees"):
            probs.append("%d unknown frees (an allocation path gpuguard missed?)" % ex["unknown_frees"])
        checks.append(("FAIL" if probs else "PASS", "exit_report",
                       "cap_bytes %s, peak %s MiB, denied %s, failed %s, unknown_frees %s, pool_reserved %s MiB, "
                       "total_bytes %s MiB%s" % (ex.get("cap_bytes"), fmt(ex.get("peak_bytes")), ex.get("denied"),
                                                ex.get("failed"), ex.get("unknown_frees"),
                                                fmt(ex.get("pool_reserved_bytes")), fmt(ex.get("total_bytes")),
                                                ("; problems: " + "; ".join(probs)) if probs else "")))
    try:
        stderr = open(os.path.join(d, "stderr.log"), errors="replace").read().splitlines()
    except OSError:
        stderr = []
    gg = [s for s in stderr if s.startswith("gpuguard[")]
    bad = [s for s in gg if "internal error" in s or "tracking is off" in s]
    checks.append(("FAIL" if bad else "PASS", "gpuguard_stayed_on",
                   bad[0][:200] if bad else "no 'internal error' from gpuguard (%d gpuguard lines on stderr)" % len(gg)))

    # ---- print --------------------------------------------------------------------------------
    print("---- %s: the workload's checks (%d PASS, %d FAIL) ----" % (a.name, wl_pass, len(wl_fail)))
    for c in out["checks"]:
        print("  %s %s: %s" % (c["status"], c["check"], c["text"][:600]))
    print("---- %s: from outside ----" % a.name)
    for st, name, text in checks:
        print("  %s %s: %s" % (st, name, text))
    for r in real.get("marks") or []:
        if r.get("real_rel_bytes") is None:
            print("  INFO mark %-16s no samples in its window (charged %s MiB)" % (r["mark"], fmt(r.get("charged_bytes"))))
        else:
            print("  INFO mark %-16s real - baseline %9s MiB, gpuguard charged %9s MiB, outside gpuguard's books "
                  "%7s MiB (%d samples)" % (r["mark"], fmt(r["real_rel_bytes"]), fmt(r["charged_bytes"]),
                                           fmt(r["outside_books_bytes"]), r["samples"]))
    if real.get("device_peak_rel_bytes") is not None:
        print("  INFO device-level: max(device used - baseline) %s MiB (whole GPU, any process)" % fmt(
            real["device_peak_rel_bytes"]))
    for i, r in enumerate(cap_rows):
        dn = r["denial"]
        print("  INFO cap report %s: refused %s MiB (%s) with %s MiB charged of cap %s MiB; devices[0] denied %s "
              "pool_reserved %s MiB current %s MiB" % (
                  r["file"], fmt(dn.get("bytes")), dn.get("api"), fmt(dn.get("charged_bytes")),
                  fmt(dn.get("cap_bytes")), r["denied"], fmt(r["pool_reserved_bytes"]), fmt(r["current_bytes"])))
        if i == 0:  # the first refusal's stack; the rest are in caps_summary.json
            for f in r["frames"][:6]:
                print("         frame: %s" % f)
    if reps.get("other_pid"):
        print("  INFO reports of other pids: %s" % [os.path.basename(p) for _, p in reps["other_pid"]][:5])
    problems = ["%s: %s" % (c["check"], c["text"][:160]) for c in wl_fail]
    problems += ["%s: %s" % (n, t[:160]) for st, n, t in checks if st == "FAIL"]
    warnings = ["WARN %s: %s" % (n, t[:160]) for st, n, t in checks if st == "WARN"]
    status = "SKIP" if rc == -1 else ("FAIL" if problems else ("WARN" if warnings else "PASS"))
    print("  %s %s%s" % (a.name, status, (": " + "; ".join((problems + warnings)[:4]))
                         if problems or warnings else ""))

    row = {
        "workload": a.name, "status": status, "rc": rc, "workload_pass": wl_pass, "workload_fail": len(wl_fail),
        "outside": [{"status": s, "check": n, "text": t} for s, n, t in checks],
        "problems": problems + warnings, "workload_checks": out["checks"], "workload_data": out["data"],
        "real": real, "cap_reports": cap_rows, "exit_device0": exit_row,
        "elapsed_s": float(a.elapsed) if a.elapsed else None, "cap_bytes": cap,
        "monitor_comments": mon["comments"][:10],
    }
    cc.ggv.save_row(d, row, a.summary)
    return 0


def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def first_number(text):
    for ln in text.splitlines():
        parts = [p.strip() for p in ln.split(",")]
        if parts and parts[0].isdigit():
            return int(parts[0])
    return None


def cmd_smi(a):
    d = a.dir
    cap_mib = int(a.cap_bytes) // MiB
    bare = first_number(read(os.path.join(d, "bare_query.txt")))
    shim = first_number(read(os.path.join(d, "shim_query.txt")))
    full = read(os.path.join(d, "shim_full.txt"))
    errs = read(os.path.join(d, "shim_query.err")) + read(os.path.join(d, "shim_full.err"))
    reps = glob.glob(os.path.join(d, "reports", "*"))
    checks = []
    rcs = {"bare": int(a.rc_bare), "query": int(a.rc_query), "full": int(a.rc_full)}
    checks.append(("PASS" if rcs["query"] == 0 and rcs["full"] == 0 else "FAIL", "nvidia_smi_runs",
                   "exit status under the shim: query %d, plain nvidia-smi %d (bare query %d)" % (
                       rcs["query"], rcs["full"], rcs["bare"])))
    good = shim is not None and bare is not None and shim == bare and shim != cap_mib
    checks.append(("PASS" if good else "FAIL", "nvidia_smi_real_total",
                   "memory.total under the shim %s MiB, without it %s MiB, cap %d MiB (want the real total: an "
                   "NVML-only process is left alone)" % (shim, bare, cap_mib)))
    shows = bare is not None and ("%dMiB" % bare) in full.replace(" ", "")
    checks.append(("PASS" if shows else "FAIL", "nvidia_smi_table",
                   "the plain nvidia-smi table under the shim %s the real total %s MiB" % (
                       "shows" if shows else "does NOT show", bare)))
    gg = [ln for ln in errs.splitlines() if "gpuguard" in ln]
    checks.append(("PASS" if not reps and not gg else "FAIL", "nvidia_smi_inert",
                   "%d report(s) written, %d gpuguard line(s) on stderr (want none)" % (len(reps), len(gg))))
    print("---- nvidia_smi ----")
    for st, n, t in checks:
        print("  %s %s: %s" % (st, n, t))
    problems = ["%s: %s" % (n, t[:160]) for st, n, t in checks if st == "FAIL"]
    status = "PASS" if not problems else "FAIL"
    print("  nvidia_smi %s%s" % (status, (": " + "; ".join(problems)) if problems else ""))
    row = {"workload": "nvidia_smi", "status": status, "rc": max(rcs["query"], rcs["full"]), "workload_pass": 0,
           "workload_fail": 0, "outside": [{"status": s, "check": n, "text": t} for s, n, t in checks],
           "problems": problems, "real": {}, "cap_reports": [], "exit_device0": None, "cap_bytes": int(a.cap_bytes),
           "elapsed_s": None}
    cc.ggv.save_row(d, row, a.summary)
    return 0


def cmd_table(a):
    rows = cc.ggv.load_rows(a.summary)
    hdr = ("workload", "status", "rc", "pass", "fail", "denied", "capreps", "base", "real_peak", "cap", "margin",
           "gg_peak", "outside", "pool_res", "src", "time_s", "first problem")
    fmt_row = "%-18s %-6s %3s %4s %4s %6s %7s %7s %9s %7s %7s %8s %7s %8s %6s %6s  %s"
    print("(MiB: base = context baseline; real_peak = max(real - baseline) from outside; margin = cap - real_peak; "
          "gg_peak = gpuguard's own peak; outside = largest real - baseline - charged at a mark)")
    print(fmt_row % hdr)
    for r in rows:
        real = r.get("real") or {}
        ex = r.get("exit_device0") or {}
        print(fmt_row % (
            r["workload"], r["status"], r["rc"], r.get("workload_pass", 0), r.get("workload_fail", 0),
            ex.get("denied", "-") if ex else "-", len(r.get("cap_reports") or []) if r["workload"] != "nvidia_smi"
            else "-", fmt(real.get("baseline_bytes")), fmt(real.get("peak_rel_bytes")),
            fmt(r.get("cap_bytes")) if r["workload"] != "nvidia_smi" else "-", fmt(real.get("margin_bytes")),
            fmt(ex.get("peak_bytes")) if ex else "-", fmt(real.get("outside_books_max_bytes")),
            fmt(ex.get("pool_reserved_bytes")) if ex else "-", real.get("mode") or "-",
            "-" if r.get("elapsed_s") is None else "%.0f" % r["elapsed_s"],
            (r["problems"][0] if r.get("problems") else "")[:90]))
    n_fail = sum(r["status"] == "FAIL" for r in rows)
    n_skip = sum(r["status"] == "SKIP" for r in rows)
    n_warn = sum(r["status"] == "WARN" for r in rows)
    print("%d passed, %d failed%s%s" % (sum(r["status"] == "PASS" for r in rows), n_fail,
                                        (", %d passed with a warning" % n_warn) if n_warn else "",
                                        (", %d skipped" % n_skip) if n_skip else ""))
    if a.out:
        env = {}
        if a.env and os.path.exists(a.env):
            env = {"env_txt": read(a.env)}
        with open(a.out, "w") as f:
            json.dump({"rows": rows, **env}, f, indent=1, default=str)
    return 1 if n_fail else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--dir", required=True)
    r.add_argument("--rc", required=True)
    r.add_argument("--cap-bytes", required=True)
    r.add_argument("--expect-denial", choices=["yes", "no", "any"], default="yes")
    r.add_argument("--elapsed")
    r.add_argument("--t-end")
    r.add_argument("--summary")
    s = sub.add_parser("smi")
    s.add_argument("--dir", required=True)
    s.add_argument("--cap-bytes", required=True)
    s.add_argument("--rc-bare", required=True)
    s.add_argument("--rc-query", required=True)
    s.add_argument("--rc-full", required=True)
    s.add_argument("--summary")
    t = sub.add_parser("table")
    t.add_argument("--summary", required=True)
    t.add_argument("--out")
    t.add_argument("--env")
    a = ap.parse_args()
    return {"run": cmd_run, "smi": cmd_smi, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
