#!/usr/bin/env python3
"""Shared Python helpers of the GPU validation (scripts/gpu/validate.sh and every
workload and checker under scripts/gpu/): gpuguard's C API through ctypes, report
files, the GGV_JSON output protocol, summary rows and the tables.

Standard library only (the workloads import torch/cupy/jax themselves), so the
checkers and the tables run in a bare python3. Scripts find it with
  sys.path.insert(0, os.path.join(HERE, "..", "lib")); import ggv

Workload output protocol (stdout, one line each; the checkers parse it):
  GGV_JSON {"record": KIND, ...}   structured data (measurements, losses, reports seen)
  GGV_TRIM_READY pid=N             the cache is full and measured; the runner now sends
                                   SIGUSR2 (or runs `gpuguard trim N`) from outside
  GGV_BURST_READY pid=N            (hold role) the runner now sends 5 SIGUSR2 at once
  INFO / WARN text                 human-readable notes

Summary rows (one JSON object per line in a suite's summary file, written by the
trim, leak and reliability checkers):
  {"group": "trim"|"leaks"|"rel"|..., "workload": W, "check": C,
   "status": "PASS"|"FAIL"|"WARN"|"INFO"|"SKIP", "detail": text, "data": {...}}

  python3 ggv.py table --summary FILE [--txt OUT.txt] [--json OUT.json] [--env env.txt]
      prints the compact PASS/FAIL table of such rows; writes the full table (every
      detail) and the rows as JSON.
  python3 ggv.py merge --work DIR --txt summary.txt --json summary.json [--env env.txt]
      the combined summary of validate.sh: every suite's summary.jsonl under DIR
      (core, caps: one row per workload; trim-leaks, reliability: one row per check),
      one PASS/FAIL line per suite and workload; exit status 1 if any FAIL.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30

REPORT_RE = re.compile(
    r"^gpuguard\.(?P<prog>.+?)(?:\.r(?P<rank>\d+))?\.(?P<pid>\d+)\.(?P<seq>\d+)\.(?P<reason>[a-z_]+)\.json$")
STDERR_TRIM_RE = re.compile(r"gpuguard(\[\d+\])?: trim")
STDERR_REPORT_RE = re.compile(r"gpuguard(\[\d+\])?: report")


def mib(n):
    if n is None:
        return "-"
    try:
        return "%.1fMiB" % (float(n) / MiB)
    except (TypeError, ValueError):
        return str(n)


def as_int(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == int(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


def torch_alloc_mode():
    """PyTorch's allocator mode from the environment: default, expandable, cudaMallocAsync."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    conf = conf.replace(" ", "")
    if "backend:cudaMallocAsync" in conf:
        return "cudaMallocAsync"
    if "expandable_segments:True" in conf:
        return "expandable"
    return "default"


def marked_line(path, marker="# GGV_" + "LEAK_LINE"):
    """The number of the line of path that ends with marker (the leak workloads' leak)."""
    with open(path) as f:
        for i, ln in enumerate(f, 1):
            if ln.rstrip().endswith(marker):
                return i
    return None


def leak_knobs():
    """The leak workloads' settings: (steps, signal steps, leak float32 elements, signal
    wait s, startup s, prewarm MiB, GPUGUARD_DIR)."""
    steps = int(os.environ.get("GGV_STEPS", "40"))
    sig_steps = [int(s) for s in os.environ.get("GGV_SIGNAL_STEPS", "10,30").split(",") if s.strip()]
    leak_numel = int(float(os.environ.get("GGV_LEAK_MIB", "8")) * MiB) // 4
    wait_s = float(os.environ.get("GGV_SIGNAL_WAIT_S", "15"))
    startup_s = float(os.environ.get("GGV_STARTUP_S", "1.0"))
    prewarm_mib = int(os.environ.get("GGV_PREWARM_MIB", "64"))
    return steps, sig_steps, leak_numel, wait_s, startup_s, prewarm_mib, os.environ.get("GPUGUARD_DIR")


def emit(record, **fields):
    obj = {"record": record}
    obj.update(fields)
    print("GGV_JSON " + json.dumps(obj, default=str), flush=True)


def note(text):
    print("INFO " + text, flush=True)


class DeviceCounters(ctypes.Structure):
    # Mirrors the C API's struct gpuguard_device_counters (int32, u32, 9 x u64).
    _fields_ = [
        ("device", ctypes.c_int32),
        ("reserved0", ctypes.c_uint32),
        ("total_bytes", ctypes.c_uint64),
        ("cap_bytes", ctypes.c_uint64),
        ("current_bytes", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("allocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("denied", ctypes.c_uint64),
        ("unknown_frees", ctypes.c_uint64),
    ]


class Guard:
    """ctypes view of the gpuguard C API; every method returns None without the shim."""

    def __init__(self):
        self.version = None
        self._counters = self._pinned = self._write = None
        try:
            lib = ctypes.CDLL(None)  # global scope: LD_PRELOAD objects included
        except OSError:
            return
        try:
            fn = lib.gpuguard_device_counters
        except AttributeError:
            return
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(DeviceCounters)]
        fn.restype = ctypes.c_int
        self._counters = fn
        try:
            v = lib.gpuguard_version
            v.argtypes = []
            v.restype = ctypes.c_char_p
            raw = v()
            self.version = raw.decode(errors="replace") if raw else "?"
        except AttributeError:
            self.version = "?"
        try:
            p = lib.gpuguard_host_pinned
            p.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
            p.restype = ctypes.c_int
            self._pinned = p
        except AttributeError:
            pass
        try:
            w = lib.gpuguard_write_report
            w.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
            w.restype = ctypes.c_int
            self._write = w
        except AttributeError:
            pass

    @property
    def present(self):
        return self._counters is not None

    def counters(self, device=0):
        if self._counters is None:
            return None
        c = DeviceCounters()
        rc = self._counters(device, ctypes.byref(c))
        if rc != 0:
            return {"error": rc}
        return {name: int(getattr(c, name)) for name, _ in DeviceCounters._fields_}

    def current(self, device=0):
        """Device current_bytes, or None (no shim, or an error)."""
        c = self.counters(device)
        return c.get("current_bytes") if c and "error" not in c else None

    def host_pinned(self):
        if self._pinned is None:
            return None
        cur, peak = ctypes.c_uint64(0), ctypes.c_uint64(0)
        rc = self._pinned(ctypes.byref(cur), ctypes.byref(peak))
        if rc != 0:
            return {"error": rc}
        return {"current_bytes": cur.value, "peak_bytes": peak.value}

    def write_report(self, reason="request"):
        """Returns (rc, path) or None without the shim."""
        if self._write is None:
            return None
        buf = ctypes.create_string_buffer(4096)
        rc = self._write(reason.encode(), buf, len(buf))
        return rc, buf.value.decode(errors="replace")


def guard():
    return Guard()


# ---- reports ----------------------------------------------------------------------

def load_json(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, str(e)


def load(path):
    return load_json(path)[0]


def reports_of(pid, reason, directory=None):
    """[(seq, path)] of pid's reports with that reason in directory (default
    GPUGUARD_DIR), by sequence number."""
    return [(e["seq"], e["path"]) for e in list_reports(directory or os.environ.get("GPUGUARD_DIR"), pid, reason)]


def list_reports(directory, pid=None, reason=None):
    """[{path, name, pid, seq, reason}] in directory, by seq."""
    out = []
    if not directory:
        return out
    for p in glob.glob(os.path.join(directory, "gpuguard.*.json")):
        m = REPORT_RE.match(os.path.basename(p))
        if not m:
            continue
        if pid is not None and int(m.group("pid")) != int(pid):
            continue
        if reason is not None and m.group("reason") != reason:
            continue
        out.append({"path": p, "name": os.path.basename(p), "pid": int(m.group("pid")),
                    "seq": int(m.group("seq")), "reason": m.group("reason")})
    out.sort(key=lambda r: (r["pid"], r["seq"]))
    return out


def wait_report(directory, pid, reason, after_seq=-1, timeout_s=20.0, poll=0.05):
    """Waits (running Python bytecode between short sleeps, so that gpuguard's pending
    call can run on this main thread) for a complete report of pid with that reason
    and seq > after_seq. Returns (entry, report, waited_s) or (None, None, waited_s)."""
    t0 = time.time()
    while True:
        for e in list_reports(directory, pid, reason):
            if e["seq"] <= after_seq:
                continue
            rep, err = load_json(e["path"])
            if rep is not None:
                return e, rep, time.time() - t0
        if time.time() - t0 >= timeout_s:
            return None, None, time.time() - t0
        time.sleep(poll)


def wait_settled(directory, pid, reason, after_seq=-1, first_timeout_s=10.0, quiet_s=3.0, max_s=15.0,
                 poll=0.05):
    """Waits for reports with seq > after_seq until at least one exists and none new
    has appeared for quiet_s (or max_s passed). Returns [(entry, report)]."""
    t0 = time.time()
    seen = {}
    last_new = None
    while True:
        for e in list_reports(directory, pid, reason):
            if e["seq"] <= after_seq or e["seq"] in seen:
                continue
            rep, _ = load_json(e["path"])
            if rep is not None:
                seen[e["seq"]] = (e, rep)
                last_new = time.time()
        now = time.time()
        if now - t0 >= max_s:
            break
        if not seen and now - t0 >= first_timeout_s:
            break
        if seen and now - last_new >= quiet_s:
            break
        time.sleep(poll)
    return [seen[k] for k in sorted(seen)]


def dev_entry(rep, device=0):
    for d in (rep or {}).get("devices") or []:
        if isinstance(d, dict) and d.get("device") == device:
            return d
    return None


def trim_obj(rep):
    t = (rep or {}).get("trim")
    return t if isinstance(t, dict) else None


def mechanism(rep, name):
    t = trim_obj(rep) or {}
    for m in t.get("mechanisms") or []:
        if isinstance(m, dict) and m.get("name") == name:
            return m
    return None


def trim_dev(rep, device=0):
    t = trim_obj(rep) or {}
    for d in t.get("devices") or []:
        if isinstance(d, dict) and d.get("device") == device:
            return d
    return None


def mech_text(rep):
    t = trim_obj(rep) or {}
    parts = []
    for m in t.get("mechanisms") or []:
        if isinstance(m, dict):
            parts.append("%s:%s:%s" % (m.get("name"), m.get("status"), mib(m.get("released_bytes"))))
    return ",".join(parts) or "none"


# ---- measurements --------------------------------------------------------------------

def nvml_process_used(pid):
    """What the driver says this process holds on the GPU, from OUTSIDE the process
    (nvidia-smi --query-compute-apps, run without LD_PRELOAD). Returns
    (bytes or None, method text). When pid is not listed (a PID namespace) and one
    process only is, that one is taken (the runs are sequential on this GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=15, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return None, "nvidia-smi failed: %s" % e
    rows = []
    for ln in r.stdout.splitlines():
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                rows.append((int(parts[0]), int(float(parts[1])) * MiB))
            except ValueError:
                continue
    for p, used in rows:
        if p == pid:
            return used, "nvidia-smi pid %d" % pid
    if len(rows) == 1:
        return rows[0][1], "nvidia-smi: pid %d not listed, the only process (pid %d) taken" % (pid, rows[0][0])
    return None, "nvidia-smi rc %s: pid %d not among %s" % (r.returncode, pid, [p for p, _ in rows])


# ---- stdout of a run -------------------------------------------------------------------

def read_records(path):
    """{record kind: [objects]} from the GGV_JSON lines of a stdout log."""
    out = {}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return out
    for ln in lines:
        if not ln.startswith("GGV_JSON "):
            continue
        try:
            obj = json.loads(ln[len("GGV_JSON "):])
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.setdefault(obj.get("record", "?"), []).append(obj)
    return out


def first(records, kind, **match):
    for r in records.get(kind, []):
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def read_text(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def read_rc(run_dir):
    t = read_text(os.path.join(run_dir, "rc.txt")).strip()
    try:
        return int(t)
    except ValueError:
        return None


def run_pid(run_dir, records=None):
    recs = records if records is not None else read_records(os.path.join(run_dir, "stdout.log"))
    c = first(recs, "config")
    if c and c.get("pid"):
        return int(c["pid"])
    m = re.search(r"pid=(\d+)", read_text(os.path.join(run_dir, "stdout.log")))
    return int(m.group(1)) if m else None


def stderr_trim_lines(run_dir):
    return [ln for ln in read_text(os.path.join(run_dir, "stderr.log")).splitlines() if STDERR_TRIM_RE.search(ln)]


# ---- summary rows ----------------------------------------------------------------------

class Rows:
    """Collects check rows for one workload, prints each, appends them to the summary."""

    def __init__(self, summary, group, workload, quiet=False):
        self.summary = summary
        self.group = group
        self.workload = workload
        self.quiet = quiet
        self.rows = []

    def add(self, check, status, detail, **data):
        row = {"group": self.group, "workload": self.workload, "check": check, "status": status,
               "detail": detail, "data": data}
        self.rows.append(row)
        if not self.quiet:
            print("  %-5s %-24s %s" % (status, check, detail[:300]), flush=True)
        if self.summary:
            with open(self.summary, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        return status

    def check(self, check, cond, detail, **data):
        return self.add(check, "PASS" if cond else "FAIL", detail, **data)

    def info(self, check, detail, **data):
        return self.add(check, "INFO", detail, **data)

    def warn(self, check, detail, **data):
        return self.add(check, "WARN", detail, **data)

    def skip(self, check, detail, **data):
        return self.add(check, "SKIP", detail, **data)

    def statuses(self):
        return [r["status"] for r in self.rows]


def started(R, run_dir, records, rc, check="workload_started"):
    """One FAIL row (with the last stderr line) instead of a cascade when the
    workload never printed its config record (crashed at import, not run)."""
    if records.get("config"):
        return True
    err = [ln for ln in read_text(os.path.join(run_dir, "stderr.log")).splitlines()
           if ln.strip() and not STDERR_REPORT_RE.search(ln)]
    R.check(check, False, "no output from the workload (rc %s): %s" % (rc, (err[-1] if err else "no stderr")[:220]))
    return False


def skipped(run_dir):
    """A run the runner skipped (time budget spent) has rc.txt = -1."""
    return read_rc(run_dir) == -1


def rel_close(a, b, tol):
    if a == b:
        return True
    if a is None or b is None:
        return False
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if a != a or b != b:  # NaN
        return False
    return abs(a - b) <= tol * max(abs(a), abs(b))


# ---- the table ---------------------------------------------------------------------------

ORDER = {"FAIL": 0, "WARN": 1, "SKIP": 2, "PASS": 3, "INFO": 4}


def load_rows(path):
    rows = []
    for ln in read_text(path).splitlines():
        if ln.strip():
            try:
                rows.append(json.loads(ln))
            except ValueError:
                pass
    return rows


def save_row(run_dir, row, summary=None):
    """A per-workload row (core, caps): run_dir/check.json, and appended to summary."""
    with open(os.path.join(run_dir, "check.json"), "w") as f:
        json.dump(row, f, indent=1, default=str)
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def counts_line(rows):
    c = {}
    for r in rows:
        c[r.get("status")] = c.get(r.get("status"), 0) + 1
    return ", ".join("%d %s" % (c[k], k) for k in sorted(c, key=lambda k: ORDER.get(k, 9)))


def cmd_table(a):
    rows = load_rows(a.summary)
    width = 104
    # Workload names up to 22 characters (torch_expandable_lines) stay whole.
    print("%-5s %-4s %-22s %-20s %s" % ("group", "stat", "workload", "check", "numbers (all: summary.txt)"))
    for r in rows:
        if r.get("status") == "INFO" and not a.with_info:
            continue
        print("%-5s %-4s %-22s %-20s %s" % (r.get("group", "")[:5], r.get("status"), r.get("workload", "")[:22],
                                            r.get("check", "")[:20], (r.get("detail") or "")[:width - 55]))
    print("checks: " + (counts_line(rows) or "none") + " (INFO rows: in summary.txt)")
    wl = {}
    for r in rows:
        k = (r.get("group"), r.get("workload"))
        s = wl.setdefault(k, set())
        s.add(r.get("status"))
    verdict = []
    for (g, w), s in wl.items():
        v = "FAIL" if "FAIL" in s else "WARN" if "WARN" in s else "SKIP" if s <= {"SKIP", "INFO"} else "PASS"
        verdict.append("%s/%s %s" % (g, w, v))
    print("workloads: " + "; ".join(verdict))
    if a.txt:
        with open(a.txt, "w") as f:
            f.write((a.title or "gpuguard GPU validation") + ": every check\n")
            f.write("generated %s\n" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if a.env and os.path.exists(a.env):
                f.write("\n--- environment\n" + read_text(a.env)[:6000] + "\n")
            f.write("\n--- checks: " + (counts_line(rows) or "none") + "\n")
            for g in ("FAIL", "WARN", "SKIP"):
                bad = ["%s/%s %s" % (r.get("group"), r.get("workload"), r.get("check")) for r in rows
                       if r.get("status") == g]
                if bad:
                    f.write("%s: %s\n" % (g, "; ".join(bad)))
            f.write("\n%-6s %-5s %-22s %-24s %s\n" % ("group", "stat", "workload", "check", "detail"))
            for r in rows:
                f.write("%-6s %-5s %-22s %-24s %s\n" % (r.get("group", ""), r.get("status"), r.get("workload", ""),
                                                        r.get("check", ""), r.get("detail") or ""))
            f.write("\nworkloads: " + "; ".join(verdict) + "\n")
    if a.json:
        env = read_text(a.env) if a.env else ""
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "env_txt": env}, f, indent=1, default=str)
    return 0


# ---- the combined summary of validate.sh --------------------------------------------------

SUITE_ORDER = ["core", "caps", "trim-leaks", "bench-micro", "reliability", "multi", "multi-soak"]


def workload_verdict(statuses):
    s = set(statuses)
    return "FAIL" if "FAIL" in s else "WARN" if "WARN" in s else "SKIP" if s <= {"SKIP", "INFO"} else "PASS"


def suite_lines(rows):
    """[(workload, status, first problem)] of one suite's rows: one row per workload
    (core, caps: "status" and "problems") or one per check (the others)."""
    out, per = [], {}
    for r in rows:
        if "check" in r and "group" in r:
            k = "%s/%s" % (r.get("group"), r.get("workload"))
            e = per.setdefault(k, {"st": [], "bad": []})
            e["st"].append(r.get("status"))
            if r.get("status") in ("FAIL", "WARN"):
                e["bad"].append("%s %s: %s" % (r.get("status"), r.get("check"), (r.get("detail") or "")[:120]))
        else:
            probs = r.get("problems") or []
            out.append((r.get("workload", "?"), r.get("status", "?"), str(probs[0]) if probs else ""))
    for k, e in per.items():
        out.append((k, workload_verdict(e["st"]), e["bad"][0] if e["bad"] else ""))
    return out


def cmd_merge(a):
    suites = a.suites.split() or SUITE_ORDER
    found = {}
    for s in suites:
        p = os.path.join(a.work, s, "summary.jsonl")
        if os.path.exists(p):
            found[s] = load_rows(p)
    table, any_fail = [], False
    for s, rows in found.items():
        for w, st, why in suite_lines(rows):
            table.append({"suite": s, "workload": w, "status": st, "first_problem": why})
            any_fail = any_fail or st == "FAIL"
        if not rows:
            table.append({"suite": s, "workload": "-", "status": "FAIL", "first_problem": "no rows (suite did not run?)"})
            any_fail = True
    lines = ["%-11s %-34s %-5s %s" % ("suite", "workload", "stat", "first problem")]
    for t in table:
        lines.append("%-11s %-34s %-5s %s" % (t["suite"], t["workload"][:34], t["status"], t["first_problem"][:110]))
    c = {}
    for t in table:
        c[t["status"]] = c.get(t["status"], 0) + 1
    lines.append("workloads: " + (", ".join("%d %s" % (c[k], k) for k in sorted(c, key=lambda k: ORDER.get(k, 9)))
                                  or "none") + ("  => FAIL" if any_fail else "  => PASS"))
    print("\n".join(lines))
    env = read_text(a.env) if a.env else ""
    if a.txt:
        with open(a.txt, "w") as f:
            f.write("gpuguard GPU validation (scripts/gpu/validate.sh): %s\n" % " ".join(found))
            f.write("generated %s\n\n" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            f.write("\n".join(lines) + "\n")
            for s, rows in found.items():
                f.write("\n===== %s: every row\n" % s)
                for r in rows:
                    if "check" in r and "group" in r:
                        f.write("%-6s %-5s %-22s %-24s %s\n" % (r.get("group", ""), r.get("status"),
                                                                r.get("workload", ""), r.get("check", ""),
                                                                r.get("detail") or ""))
                    else:
                        f.write("%-20s %-5s rc=%s problems: %s\n" % (r.get("workload"), r.get("status"), r.get("rc"),
                                                                      "; ".join(map(str, r.get("problems") or []))
                                                                      or "none"))
            if env:
                f.write("\n--- environment\n" + env[:8000] + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"table": table, "suites": {s: {"rows": rows} for s, rows in found.items()}, "env_txt": env},
                      f, indent=1, default=str)
    return 1 if any_fail else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table")
    t.add_argument("--summary", required=True)
    t.add_argument("--txt")
    t.add_argument("--json")
    t.add_argument("--env")
    t.add_argument("--with-info", action="store_true")
    t.add_argument("--title")
    m = sub.add_parser("merge")
    m.add_argument("--work", required=True)
    m.add_argument("--txt")
    m.add_argument("--json")
    m.add_argument("--env")
    m.add_argument("--suites", default="")
    a = ap.parse_args()
    return cmd_table(a) if a.cmd == "table" else cmd_merge(a)


if __name__ == "__main__":
    sys.exit(main())


GG_OWN_LINE = re.compile(r"^gpuguard(\[\d+\]| run)?: ")
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def _shape(line):
    """A stderr line with its numbers (times, pids, addresses) and the width of its
    padding (glog pads the thread id) made alike."""
    return " ".join(_NUMBERS.sub("0", line).split())


def foreign_stderr(guarded_lines, bare_lines):
    """The lines of a guarded run's stderr that are not gpuguard's own and that its
    bare twin (the same command without gpuguard) did not print, numbers aside: what
    gpuguard made the program or its framework say."""
    bare = {_shape(ln) for ln in bare_lines}
    out, summary = [], False
    for ln in guarded_lines:
        if GG_OWN_LINE.match(ln):
            # `gpuguard run`'s summary goes on in indented lines.
            summary = ln.startswith("gpuguard run: ")
            continue
        if summary and ln.startswith("  "):
            continue
        summary = False
        if ln.strip() and _shape(ln) not in bare:
            out.append(ln)
    return out
