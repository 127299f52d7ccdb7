"""Shared helpers for the gpuguard framework workloads (run on the GPU machine).

Reads gpuguard's counters through its C API (scripts/gpu/lib/ggv.py's Guard:
ctypes.CDLL(None), the preloaded libgpuguard.so in the global scope) and
prints one JSON line per checkpoint comparing them with the framework's own
count. Everything degrades gracefully when the shim is not preloaded: the
gpuguard fields are then null and the verdict is "no-gpuguard".

Output protocol (stdout, one JSON object per line; scripts/gpu/check_run.py
parses it):
  {"check": NAME, "framework": ..., "mode": ..., "framework_metric": ...,
   "framework_bytes": N, "gpuguard_current": N, "diff": gpuguard - framework,
   "verdict": "agree" | "explained" | "mismatch" | "no-gpuguard",
   "explanation": "...", ...extra}
  GGV_MIDRUN pid=N    (plain line: the runner sends SIGUSR1 to N when it sees it)

Environment:
  GPUGUARD_DIR          where gpuguard writes reports (used to find the
                        signal report after SIGUSR1)
  GGV_SIGNAL_SELF  1: the workload sends itself SIGUSR1 at mid-run
  GGV_EXPECT_SIGNAL     1: an outside process sends SIGUSR1 after GGV_MIDRUN;
                        the workload pauses until the signal report appears
  GGV_SIGNAL_WAIT_S     how long to wait for that report (default 20)
  GGV_TOL_BYTES         |diff| up to this counts as "agree" (default 2 MiB)
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ggv as _lib  # noqa: E402  (scripts/gpu/lib/ggv.py: the C API, report files)

Guard = _lib.Guard
torch_alloc_mode = _lib.torch_alloc_mode

MiB = 1 << 20
TOL_BYTES = int(os.environ.get("GGV_TOL_BYTES", str(2 * MiB)))


def emit(obj):
    print(json.dumps(obj, sort_keys=False), flush=True)


def mib(n):
    return None if n is None else round(n / MiB, 3)


class Checker:
    """Prints checkpoint lines and classifies gpuguard vs framework differences.

    Rules (the same for every framework, with a framework-specific bound):
      agree      |diff| <= TOL_BYTES
      explained  gpuguard is above the framework by a constant amount: the first
                 checkpoint after warm-up with a positive extra (0 < diff <=
                 overhead_bound) sets the reference; later checkpoints must show
                 the same extra within TOL_BYTES (a baseline checkpoint taken
                 before warm-up is explained without setting the reference). The extra is device memory allocated at the driver
                 layer outside the framework's allocator (library workspaces and
                 handles, runtime internals): gpuguard sees it, the framework
                 cannot.
      mismatch   anything else (gpuguard below the framework, an extra that grows
                 or shrinks, or one beyond the bound)
    """

    def __init__(self, framework, mode, overhead_bound, overhead_reason, guard=None,
                 under_frac=0.0, under_reason=""):
        self.framework = framework
        # Optional allowance for gpuguard BELOW the framework by at most
        # under_frac of the framework's bytes (e.g. a pool that rounds blocks up
        # while gpuguard records the requested sizes).
        self.under_frac = under_frac
        self.under_reason = under_reason
        self.mode = mode
        self.overhead_bound = overhead_bound
        self.overhead_reason = overhead_reason
        self.guard = guard or Guard()
        self.ref_extra = None
        self.last = {}
        self.mid_gpuguard = None
        emit({
            "check": "gpuguard_present",
            "framework": framework,
            "mode": mode,
            "present": self.guard.present,
            "version": self.guard.version,
            "pid": os.getpid(),
            "verdict": "info",
        })

    def classify(self, diff, framework_bytes=0, reference=True, have_gg=True):
        if not have_gg:
            return "no-gpuguard", "gpuguard C API not found (shim not preloaded?)"
        if diff is None:
            return "mismatch", "the framework gave no count to compare with"
        if abs(diff) <= TOL_BYTES:
            return "agree", "equal within %d bytes" % TOL_BYTES
        if diff < 0 and self.under_frac and -diff <= self.under_frac * max(framework_bytes, 0):
            return "explained", "gpuguard %.2f MiB below the framework (%.2f%%): %s" % (
                -diff / MiB, 100.0 * -diff / max(framework_bytes, 1), self.under_reason)
        if diff < 0:
            return "mismatch", "gpuguard counts %.1f MiB LESS than the framework" % (-diff / MiB)
        if diff > self.overhead_bound:
            return "mismatch", "gpuguard counts %.1f MiB more than the framework (bound %.0f MiB)" % (
                diff / MiB, self.overhead_bound / MiB)
        if not reference:
            return "explained", "%.2f MiB extra at the driver layer: %s (before warm-up: libraries may " \
                "still create handles/workspaces, so this does not set the reference)" % (diff / MiB, self.overhead_reason)
        if self.ref_extra is None:
            self.ref_extra = diff
            return "explained", "%.2f MiB extra at the driver layer: %s (reference for later checkpoints)" % (
                diff / MiB, self.overhead_reason)
        if abs(diff - self.ref_extra) <= TOL_BYTES:
            return "explained", "same %.2f MiB extra as the reference: %s" % (diff / MiB, self.overhead_reason)
        return "mismatch", "extra changed from %.2f to %.2f MiB (not a constant overhead)" % (
            self.ref_extra / MiB, diff / MiB)

    def check(self, name, framework_metric, framework_bytes, extra=None, explanation_prefix="", reference=True):
        """One checkpoint line. reference=False for checkpoints before warm-up."""
        c = self.guard.counters(0)
        cur = c.get("current_bytes") if c and "error" not in c else None
        diff = None if cur is None or framework_bytes is None else cur - int(framework_bytes)
        verdict, why = self.classify(diff, int(framework_bytes or 0), reference, cur is not None)
        obj = {
            "check": name,
            "framework": self.framework,
            "mode": self.mode,
            "framework_metric": framework_metric,
            "framework_bytes": None if framework_bytes is None else int(framework_bytes),
            "gpuguard_current": cur,
            "diff": diff,
            "diff_mib": mib(diff),
            "framework_mib": mib(framework_bytes),
            "gpuguard_mib": mib(cur),
            "verdict": verdict,
            "explanation": (explanation_prefix + why) if explanation_prefix else why,
            "gpuguard_counters": c,
            "t": round(time.time(), 3),
        }
        if extra:
            obj.update(extra)
        self.last = obj
        emit(obj)
        return obj

    # ---- mid-run signal protocol -------------------------------------------
    def midrun(self, pause_note=""):
        """Announce mid-run; optionally raise SIGUSR1 ourselves; then wait (idle)
        until gpuguard's signal report appears and compare it with the counters."""
        c = self.guard.counters(0)
        self.mid_gpuguard = c.get("current_bytes") if c and "error" not in c else None
        want_self = os.environ.get("GGV_SIGNAL_SELF") == "1"
        expect = want_self or os.environ.get("GGV_EXPECT_SIGNAL") == "1"
        if not self.guard.present:
            # Without the shim nothing handles SIGUSR1: ignore it so the runner's
            # kill does not terminate a bare run.
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        print("GGV_MIDRUN pid=%d" % os.getpid(), flush=True)
        if not expect or not self.guard.present:
            return None
        t0 = time.time()
        if want_self:
            os.kill(os.getpid(), signal.SIGUSR1)
        path, rep = wait_report("signal", float(os.environ.get("GGV_SIGNAL_WAIT_S", "20")))
        waited = round(time.time() - t0, 3)
        c2 = self.guard.counters(0)
        now = c2.get("current_bytes") if c2 and "error" not in c2 else None
        rep_cur = report_device_current(rep, 0) if rep else None
        if rep is None:
            verdict, why = "mismatch", "no signal report appeared within the wait"
        elif rep_cur is None:
            verdict, why = "mismatch", "signal report has no devices[] entry for device 0"
        elif now is not None and abs(rep_cur - now) <= TOL_BYTES:
            verdict, why = "agree", "signal report's current_bytes equals the C API's (process idle while waiting)"
        else:
            verdict, why = "mismatch", "signal report current_bytes differs from the C API's"
        emit({
            "check": "signal_report",
            "framework": self.framework,
            "mode": self.mode,
            "sent_by": "self" if want_self else "runner",
            "report": path,
            "report_schema": rep.get("schema") if isinstance(rep, dict) else None,
            "report_current": rep_cur,
            "gpuguard_current": now,
            "diff": None if rep_cur is None or now is None else rep_cur - now,
            "waited_s": waited,
            "verdict": verdict,
            "explanation": why + (("; " + pause_note) if pause_note else ""),
        })
        return rep

    def request_report(self):
        r = self.guard.write_report("request")
        if r is None:
            return None
        rc, path = r
        rep = None
        if rc == 0 and path:
            try:
                with open(path) as f:
                    rep = json.load(f)
            except (OSError, ValueError) as e:
                rep = {"error": str(e)}
        c = self.guard.counters(0)
        now = c.get("current_bytes") if c and "error" not in c else None
        rep_cur = report_device_current(rep, 0) if isinstance(rep, dict) else None
        ok = rc == 0 and rep_cur is not None and now is not None and abs(rep_cur - now) <= TOL_BYTES
        emit({
            "check": "request_report",
            "framework": self.framework,
            "mode": self.mode,
            "rc": rc,
            "report": path,
            "report_current": rep_cur,
            "gpuguard_current": now,
            "verdict": "agree" if ok else "mismatch",
            "explanation": "gpuguard_write_report(\"request\") wrote a report whose device-0 current_bytes "
                           "matches the C API" if ok else "request report missing or differs",
        })
        return rep


def report_device_current(rep, device):
    d = _lib.dev_entry(rep, device) if isinstance(rep, dict) else None
    return d.get("current_bytes") if d else None


def wait_report(reason, timeout_s):
    """This process's first complete report with that reason in GPUGUARD_DIR."""
    d = os.environ.get("GPUGUARD_DIR")
    if not d:
        return None, None
    e, rep, _ = _lib.wait_report(d, os.getpid(), reason, timeout_s=timeout_s)
    return (e["path"], rep) if e else (None, None)


def log(msg):
    print("[ggv] " + msg, file=sys.stderr, flush=True)
