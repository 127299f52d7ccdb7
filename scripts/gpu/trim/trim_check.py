#!/usr/bin/env python3
"""Judges the trim runs (issue 4) of scripts/gpu/validate_trim_leaks.sh.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Each RUNDIR holds stdout.log (the workload's GGV_JSON lines), stderr.log, rc.txt
(exit status; -1 = skipped for time), reports/ (GPUGUARD_DIR) and, where the runner
acted, actions.txt / cli_*.{out,err,rc}. Every check becomes one row (PASS, FAIL,
WARN, INFO or SKIP) appended to the summary file and printed.

  trim_check.py torch   --mode M --ref NOSIGNAL_DIR --dir SIGNAL_DIR --summary S
  trim_check.py cupy    --dir D --summary S
  trim_check.py jax     --dir D --summary S
  trim_check.py hold    --dir D [--ref NOSIGNAL_DIR] --summary S     (gpuguard trim PID; 5 x SIGUSR2)
  trim_check.py foreign --dir D --summary S                          (gpuguard trim on a plain `sleep`)

Thresholds (flags): --nvml-frac 0.7 (the driver's per-process usage must fall by at
least this fraction of what the cache held), --slack-mib 416 (gpuguard's
current_bytes after the trim within this of memory_allocated(): 256 MiB of allocator
rounding and segments kept for live blocks + two cuBLAS handles of ~64 MiB that
cuBLAS allocates outside PyTorch's allocator), --loss-rtol 1e-6.
Standard library only.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB, GiB = tl.MiB, tl.GiB
mib = tl.mib


def measures(recs):
    return {m.get("tag"): m for m in recs.get("measure", [])}


def used_drop(before, after):
    """Drop of the process's driver usage: nvidia-smi per process, else cudaMemGetInfo's
    device-wide used (the runs are alone on the GPU)."""
    if before.get("nvml_used") is not None and after.get("nvml_used") is not None:
        return before["nvml_used"] - after["nvml_used"], "nvidia-smi process", before["nvml_used"], after["nvml_used"]
    if before.get("device_used") is not None and after.get("device_used") is not None:
        return (before["device_used"] - after["device_used"], "device used (cudaMemGetInfo; nvidia-smi: %s)"
                % before.get("nvml_how"), before["device_used"], after["device_used"])
    return None, "no measurement (%s)" % before.get("nvml_how"), None, None


def trim_reports(run_dir, pid):
    out = []
    for e in tl.list_reports(os.path.join(run_dir, "reports"), pid, "trim"):
        rep, err = tl.load_json(e["path"])
        out.append((e, rep, err))
    return out


def check_trim_report(R, run_dir, pid, expect_trigger="signal", label="trim_report"):
    """The first trim report of pid: reason, trim object, trigger, python, merged."""
    reps = trim_reports(run_dir, pid)
    if not reps:
        others = [e["name"] for e in tl.list_reports(os.path.join(run_dir, "reports"))]
        R.check(label, False, "no gpuguard.*.%s.*.trim.json (reports there: %s)" % (pid, ", ".join(others)[:200] or "none"))
        return None
    e, rep, err = reps[0]
    if rep is None:
        R.check(label, False, "%s unreadable: %s" % (e["name"], err))
        return None
    t = tl.trim_obj(rep)
    probs = []
    if rep.get("schema") != "gpuguard-report/1":
        probs.append("schema %r" % rep.get("schema"))
    if rep.get("reason") != "trim":
        probs.append("reason %r" % rep.get("reason"))
    if t is None:
        probs.append("no trim object")
        t = {}
    if expect_trigger and t.get("trigger") != expect_trigger:
        probs.append("trigger %r != %r" % (t.get("trigger"), expect_trigger))
    if t.get("python") != "ran":
        probs.append("python %r" % t.get("python"))
    merged = tl.as_int(t.get("merged"))
    if merged is None or merged < 1:
        probs.append("merged %r" % t.get("merged"))
    if not isinstance(t.get("mechanisms"), list):
        probs.append("no mechanisms list")
    td = tl.trim_dev(rep, 0) or {}
    R.check(label, not probs, "%s: trigger %s merged %s python %s released %s dev0 %s->%s; %s%s" % (
        e["name"], t.get("trigger"), t.get("merged"), t.get("python"), mib(t.get("released_bytes")),
        mib(td.get("before_bytes")), mib(td.get("after_bytes")), tl.mech_text(rep),
        ("; problems: " + "; ".join(probs)) if probs else ""),
            report=e["path"], trim=t, n_trim_reports=len(reps))
    return rep


def check_cuda_pools(R, rep):
    m = tl.mechanism(rep, "cuda_pools")
    R.check("mech_cuda_pools", m is not None,
            "cuda_pools listed: %s" % ("status %s released %s (%s)" % (m.get("status"), mib(m.get("released_bytes")),
                                                                       (m.get("detail") or "")[:120])
                                       if m else "MISSING (always expected)"), mechanism=m)


def check_stderr(R, run_dir):
    lines = tl.stderr_trim_lines(run_dir)
    R.check("stderr_trim_line", bool(lines), (lines[0][:200] if lines else
                                              "no stderr line matching 'gpuguard[...]: trim'"), lines=lines[:5])


def losses_of(recs):
    s = tl.first(recs, "summary") or {}
    return s.get("losses") or []


def compare_losses(R, la, lb, rtol, label="losses_match", what="nosignal vs signal"):
    n = min(len(la), len(lb))
    if n == 0:
        R.check(label, False, "%s: no losses (%d vs %d values)" % (what, len(la), len(lb)))
        return
    same = sum(1 for i in range(n) if la[i] == lb[i])
    worst, wi = 0.0, -1
    bad = 0
    for i in range(n):
        a, b = la[i], lb[i]
        if a == b:
            continue
        if not tl.rel_close(a, b, rtol):
            bad += 1
        try:
            r = abs(a - b) / max(abs(a), abs(b))
        except (TypeError, ZeroDivisionError):
            r = float("inf")
        if r > worst:
            worst, wi = r, i
    ok = len(la) == len(lb) and bad == 0
    R.check(label, ok, "%s: %d steps, %d identical, max rel diff %.3g%s (tol %g); first %r last %r" % (
        what, n, same, worst, (" at step %d" % wi) if wi >= 0 else "", rtol, la[0], la[n - 1])
            + ("" if len(la) == len(lb) else "; lengths %d vs %d" % (len(la), len(lb))),
            identical=same, n=n, max_rel=worst, a=la, b=lb)


# ---- torch -------------------------------------------------------------------------

def cmd_torch(a):
    R = tl.Rows(a.summary, "trim", "torch_" + a.mode)
    if tl.skipped(a.dir) or tl.skipped(a.ref):
        R.skip("run", "skipped: time budget spent")
        return 0
    rc_ref, rc = tl.read_rc(a.ref), tl.read_rc(a.dir)
    rec_ref = tl.read_records(os.path.join(a.ref, "stdout.log"))
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    tl.started(R, a.ref, rec_ref, rc_ref, "workload_started_nosignal")
    if not tl.started(R, a.dir, rec, rc):
        return 0
    R.check("exit_status", rc_ref == 0 and rc == 0, "nosignal rc %s, signal rc %s" % (rc_ref, rc))
    cfg = tl.first(rec, "config") or {}
    summ = tl.first(rec, "summary") or {}
    R.check("kept_running", summ.get("steps_done") is not None and summ.get("steps_done") == summ.get("steps"),
            "signal run: %s of %s steps done, the trim at step %s (backend %s)" % (
                summ.get("steps_done"), summ.get("steps"), cfg.get("trim_step"), cfg.get("backend")))
    compare_losses(R, losses_of(rec_ref), losses_of(rec), a.loss_rtol)

    pid = tl.run_pid(a.dir, rec)
    rep = check_trim_report(R, a.dir, pid, "signal")
    seen = tl.first(rec, "trim_seen") or {}
    M = measures(rec)
    b, af = M.get("before") or {}, M.get("after") or {}
    cached = None
    if b.get("reserved") is not None and b.get("allocated") is not None:
        cached = b["reserved"] - b["allocated"]

    # The PyTorch mechanism.
    m = tl.mechanism(rep, "pytorch") if rep else None
    mp = tl.mechanism(rep, "cuda_pools") if rep else None
    rel = tl.as_int((m or {}).get("released_bytes"))
    relp = tl.as_int((mp or {}).get("released_bytes")) or 0
    if a.mode == "cudaMallocAsync":
        # The pool's reserve may go back through cuMemPoolTrimTo (cuda_pools) before
        # empty_cache() runs, leaving PyTorch nothing to release: either counts.
        ok = m is not None and m.get("status") == "released" and (rel or 0) + relp > 0
        extra = "; async backend: pytorch + cuda_pools released %s" % mib((rel or 0) + relp)
    else:
        ok = m is not None and m.get("status") == "released" and (rel or 0) > 0
        extra = ""
    R.check("mech_pytorch", ok, "pytorch %s%s" % (
        ("status %s released %s (%s)" % (m.get("status"), mib(rel), (m.get("detail") or "")[:140])) if m
        else "MISSING", extra), mechanism=m)
    if rep:
        check_cuda_pools(R, rep)

    # The driver's view from outside.
    drop, how, u0, u1 = used_drop(b, af)
    if cached is None or drop is None:
        R.check("nvml_drop", False, "missing measurements: cached %s drop %s (%s)" % (mib(cached), mib(drop), how))
    elif cached < GiB:
        R.check("nvml_drop", False, "the cache held only %s before the trim (fill failed?); drop %s" % (
            mib(cached), mib(drop)))
    else:
        R.check("nvml_drop", drop >= a.nvml_frac * cached,
                "%s %s -> %s: dropped %s; cache held %s (reserved %s - allocated %s); want >= %.0f%%" % (
                    how, mib(u0), mib(u1), mib(drop), mib(cached), mib(b.get("reserved")), mib(b.get("allocated")),
                    100 * a.nvml_frac), drop=drop, cached=cached, before=b, after=af)

    # gpuguard's count after the trim vs the live tensors.
    gg, al = af.get("gg_current"), af.get("allocated")
    if gg is None or al is None:
        R.check("gg_vs_allocated", False, "missing: gpuguard current %s, memory_allocated %s" % (mib(gg), mib(al)))
    else:
        tr = M.get("trained") or {}
        const = None
        if tr.get("gg_current") is not None and tr.get("reserved") is not None and a.mode != "cudaMallocAsync":
            const = tr["gg_current"] - tr["reserved"]
        R.check("gg_vs_allocated", abs(gg - al) <= a.slack_mib * MiB,
                "after trim: gpuguard current %s, memory_allocated %s (diff %s, bound %d MiB), reserved %s; "
                "gpuguard before %s; gpuguard-reserved before the fill %s" % (
                    mib(gg), mib(al), mib(gg - al), a.slack_mib, mib(af.get("reserved")), mib(b.get("gg_current")),
                    mib(const)), gg=gg, allocated=al)
    if rep:
        t = tl.trim_obj(rep) or {}
        td = tl.trim_dev(rep, 0) or {}
        R.info("released_numbers", "report released %s (dev0 %s -> %s); torch reserved %s -> %s (drop %s); "
               "gpuguard %s -> %s; driver drop %s; report seen after %s s" % (
                   mib(t.get("released_bytes")), mib(td.get("before_bytes")), mib(td.get("after_bytes")),
                   mib(b.get("reserved")), mib(af.get("reserved")),
                   mib(None if b.get("reserved") is None or af.get("reserved") is None
                       else b["reserved"] - af["reserved"]),
                   mib(b.get("gg_current")), mib(gg), mib(drop), seen.get("waited_s", "-")))
    check_stderr(R, a.dir)

    # The reference run: no signal, so no trim: the cache stays.
    M0 = measures(rec_ref)
    b0, a0 = M0.get("before") or {}, M0.get("after") or {}
    ref_pid = tl.run_pid(a.ref, rec_ref)
    n0 = len(trim_reports(a.ref, ref_pid)) if ref_pid else 0
    kept = (b0.get("reserved") is not None and a0.get("reserved") is not None
            and a0["reserved"] >= b0["reserved"] - 64 * MiB)
    d0, how0, _, _ = used_drop(b0, a0)
    cached0 = (b0.get("reserved") or 0) - (b0.get("allocated") or 0)
    still = d0 is None or d0 < 0.2 * max(cached0, 1)
    R.check("control_no_trim", n0 == 0 and kept and still,
            "nosignal run: %d trim reports; reserved %s -> %s; %s drop %s (cache %s)" % (
                n0, mib(b0.get("reserved")), mib(a0.get("reserved")), how0, mib(d0), mib(cached0)))
    return 0


# ---- cupy --------------------------------------------------------------------------

def cmd_cupy(a):
    R = tl.Rows(a.summary, "trim", "cupy")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    rc = tl.read_rc(a.dir)
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, rec, rc):
        return 0
    R.check("exit_status", rc == 0, "rc %s" % rc)
    pid = tl.run_pid(a.dir, rec)
    rep = check_trim_report(R, a.dir, pid, "signal")
    M = measures(rec)
    b, af = M.get("before") or {}, M.get("after") or {}
    m = tl.mechanism(rep, "cupy") if rep else None
    rel = tl.as_int((m or {}).get("released_bytes"))
    R.check("mech_cupy", m is not None and m.get("status") == "released" and (rel or 0) > 0,
            "cupy %s" % (("status %s released %s (%s)" % (m.get("status"), mib(rel), (m.get("detail") or "")[:160]))
                         if m else "MISSING"), mechanism=m)
    if rep:
        check_cuda_pools(R, rep)
    free0 = b.get("pool_free")
    if free0 is None or af.get("pool_total") is None:
        R.check("pool_released", False, "missing pool measurements")
    else:
        R.check("pool_released", free0 >= GiB and af["pool_total"] <= b["pool_used"] + 16 * MiB,
                "pool total %s -> %s (used %s, free %s before; free after %s)" % (
                    mib(b.get("pool_total")), mib(af["pool_total"]), mib(b.get("pool_used")), mib(free0),
                    mib(af.get("pool_free"))))
    drop, how, u0, u1 = used_drop(b, af)
    if free0 is None or drop is None:
        R.check("nvml_drop", False, "missing measurements (%s)" % how)
    else:
        R.check("nvml_drop", free0 >= GiB and drop >= a.nvml_frac * free0,
                "%s %s -> %s: dropped %s; the pool's free blocks were %s; want >= %.0f%%" % (
                    how, mib(u0), mib(u1), mib(drop), mib(free0), 100 * a.nvml_frac))
    gg, pt = af.get("gg_current"), af.get("pool_total")
    if gg is None or pt is None:
        R.check("gg_vs_pool", False, "missing: gpuguard current %s, pool total %s" % (mib(gg), mib(pt)))
    else:
        R.check("gg_vs_pool", abs(gg - pt) <= a.slack_mib * MiB,
                "after trim: gpuguard current %s, pool total_bytes %s (diff %s, bound %d MiB)" % (
                    mib(gg), mib(pt), mib(gg - pt), a.slack_mib))
    comp = tl.first(rec, "after_trim_compute") or {}
    R.check("arrays_intact", comp.get("live_sums_ok") is True,
            "live arrays' int64 sums after the trim %s; matmul %s" % (
                "equal" if comp.get("live_sums_ok") else "DIFFER or missing: %r vs %r" % (comp.get("got"),
                                                                                           comp.get("want")),
                "ok" if comp.get("matmul_ok") else "off: %r" % comp.get("matmul_sum")))
    R.info("pinned", "pinned pool free blocks %s -> %s; gpuguard host pinned %s -> %s" % (
        b.get("pinned_free_blocks"), af.get("pinned_free_blocks"), mib(b.get("gg_host_pinned")),
        mib(af.get("gg_host_pinned"))))
    check_stderr(R, a.dir)
    return 0


# ---- jax ---------------------------------------------------------------------------

def cmd_jax(a):
    R = tl.Rows(a.summary, "trim", "jax")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    rc = tl.read_rc(a.dir)
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, rec, rc):
        return 0
    R.check("exit_status", rc == 0, "rc %s" % rc)
    pid = tl.run_pid(a.dir, rec)
    rep = check_trim_report(R, a.dir, pid, "signal")
    m = tl.mechanism(rep, "jax") if rep else None
    det = (m or {}).get("detail") or ""
    R.check("mech_jax", m is not None and m.get("status") == "not_releasable"
            and "XLA_PYTHON_CLIENT_PREALLOCATE" in det,
            "jax %s" % (("status %s released %s; detail: %s" % (m.get("status"), mib(m.get("released_bytes")),
                                                                 det[:220])) if m else "MISSING"), mechanism=m)
    R.info("jax_advice_platform", "detail names XLA_PYTHON_CLIENT_ALLOCATOR=platform: %s" % (
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in det))
    if rep:
        check_cuda_pools(R, rep)
    comp = tl.first(rec, "after_trim_compute") or {}
    R.check("kept_running", comp.get("same") is True, "jitted result before %r, after the trim %r" % (
        comp.get("before"), comp.get("after")))
    M = measures(rec)
    b, af = M.get("before") or {}, M.get("after") or {}
    R.info("numbers", "gpuguard %s -> %s; nvml %s -> %s; bytes_in_use %s; pool_bytes %s; bytes_limit %s" % (
        mib(b.get("gg_current")), mib(af.get("gg_current")), mib(b.get("nvml_used")), mib(af.get("nvml_used")),
        mib(b.get("bytes_in_use")), mib(b.get("pool_bytes")), mib(b.get("bytes_limit"))))
    lines = tl.stderr_trim_lines(a.dir)
    R.info("stderr_trim_line", lines[0][:200] if lines else "none")
    return 0


# ---- hold: gpuguard trim PID, then a burst of signals -------------------------------------

def cmd_hold(a):
    R = tl.Rows(a.summary, "trim", "cli_and_burst")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    rc = tl.read_rc(a.dir)
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, rec, rc):
        return 0
    R.check("exit_status", rc == 0, "rc %s" % rc)
    pid = tl.run_pid(a.dir, rec)

    # gpuguard trim PID
    crc = tl.read_text(os.path.join(a.dir, "cli_trim.rc")).strip()
    cout = tl.read_text(os.path.join(a.dir, "cli_trim.out")).strip()
    cerr = tl.read_text(os.path.join(a.dir, "cli_trim.err")).strip()
    first_line = (cout.splitlines() or [""])[0]
    R.check("cli_trim_exit0", crc == "0" and bool(cout),
            "`gpuguard trim %s` rc %s; stdout: %s%s" % (
                pid, crc or "(not run)", (" | ".join(cout.splitlines()[:3]))[:220] or "(empty)",
                ("; stderr: " + cerr.splitlines()[0][:120]) if cerr else ""), stdout=cout[:2000], stderr=cerr[:2000])
    cli = tl.first(rec, "cli_phase") or {}
    names = cli.get("reports") or []
    rep = None
    if names:
        rep, _ = tl.load_json(os.path.join(a.dir, "reports", names[0]))
    t = tl.trim_obj(rep) or {}
    R.check("cli_trim_report", bool(names) and t.get("python") == "ran",
            "%d trim report(s) during the CLI phase%s" % (
                len(names), (": %s trigger %s python %s released %s; %s" % (
                    names[0], t.get("trigger"), t.get("python"), mib(t.get("released_bytes")), tl.mech_text(rep)))
                if names else ""))
    R.info("cli_summary_mentions", "stdout names released bytes: %s; first line: %s" % (
        any(w in cout.lower() for w in ("released", "freed", "mib", "gib", "bytes")), first_line[:160]))

    # Burst.
    acts = tl.read_text(os.path.join(a.dir, "actions.txt"))
    sent = sum(1 for ln in acts.splitlines() if ln.strip().endswith("burst kill ok"))
    burst = tl.first(rec, "burst") or {}
    reps = burst.get("reports") or []
    merged = [tl.as_int((r.get("trim") or {}).get("merged")) for r in reps]
    trig = [(r.get("trim") or {}).get("trigger") for r in reps]
    msum = sum(x for x in merged if x)
    R.check("burst_reports", 1 <= len(reps) <= 2,
            "%d SIGUSR2 sent back to back -> %d trim report(s) (want 1 or 2): merged %s, triggers %s" % (
                sent, len(reps), merged, trig), reports=reps)
    want = sent or 5
    if msum >= want - 1 and msum <= want:
        st, why = "PASS", "merged counts sum to %d of %d signals" % (msum, want)
    elif 1 <= msum < want - 1:
        st, why = "WARN", ("merged counts sum to %d of %d signals: standard signals sent back to back can be "
                           "coalesced by the kernel before delivery" % (msum, want))
    else:
        st, why = "FAIL", "merged counts sum to %d for %d signals" % (msum, want)
    R.add("burst_merged", st, why, merged=merged, sent=sent)
    summ = tl.first(rec, "summary") or {}
    R.check("kept_running", summ.get("steps_done") is not None and summ.get("steps_done") == summ.get("steps"),
            "after the CLI trim and the burst: %s of %s steps done" % (summ.get("steps_done"), summ.get("steps")))
    if a.ref and not tl.skipped(a.ref) and os.path.exists(os.path.join(a.ref, "stdout.log")):
        compare_losses(R, losses_of(tl.read_records(os.path.join(a.ref, "stdout.log"))), losses_of(rec),
                       a.loss_rtol, label="losses_match_ref", what="torch_default nosignal vs this run (3 trims)")
    M = measures(rec)
    R.info("numbers", "reserved before %s, after CLI %s, burst_before %s, burst_after %s; nvml %s/%s/%s/%s" % (
        mib((M.get("before") or {}).get("reserved")), mib((M.get("after_cli") or {}).get("reserved")),
        mib((M.get("burst_before") or {}).get("reserved")), mib((M.get("burst_after") or {}).get("reserved")),
        mib((M.get("before") or {}).get("nvml_used")), mib((M.get("after_cli") or {}).get("nvml_used")),
        mib((M.get("burst_before") or {}).get("nvml_used")), mib((M.get("burst_after") or {}).get("nvml_used"))))
    R.info("stderr_trim_lines", "%d lines matching 'gpuguard: trim'" % len(tl.stderr_trim_lines(a.dir)))
    return 0


# ---- gpuguard trim on a process without gpuguard -------------------------------------------

def cmd_foreign(a):
    R = tl.Rows(a.summary, "trim", "cli_foreign")
    crc = tl.read_text(os.path.join(a.dir, "cli_foreign.rc")).strip()
    out = (tl.read_text(os.path.join(a.dir, "cli_foreign.out")) + tl.read_text(
        os.path.join(a.dir, "cli_foreign.err"))).strip()
    alive = tl.read_text(os.path.join(a.dir, "sleep_alive.txt")).strip()
    try:
        rc = int(crc)
    except ValueError:
        rc = None
    R.check("cli_refuses", rc is not None and rc not in (0, 124, 137) and bool(out),
            "`gpuguard trim <pid of sleep 30>` rc %s (want non-zero, not a timeout) message: %s" % (
                crc or "(not run)", (out.splitlines() or ["(none)"])[0][:200]), output=out[:2000])
    if alive == "yes":
        R.info("sleep_survived", "the plain process was left alive")
    else:
        R.warn("sleep_survived", "the plain process is gone after `gpuguard trim` (%s): was it sent SIGUSR2?" % (
            alive or "unknown"))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("torch", "cupy", "jax", "hold", "foreign"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--summary")
        p.add_argument("--nvml-frac", type=float, default=0.7)
        p.add_argument("--slack-mib", type=int, default=416)
        p.add_argument("--loss-rtol", type=float, default=1e-6)
        if name in ("torch", "hold"):
            p.add_argument("--ref", required=(name == "torch"))
        if name == "torch":
            p.add_argument("--mode", required=True)
    a = ap.parse_args()
    fn = {"torch": cmd_torch, "cupy": cmd_cupy, "jax": cmd_jax, "hold": cmd_hold, "foreign": cmd_foreign}[a.cmd]
    try:
        return fn(a)
    except Exception as e:  # noqa: BLE001 - a checker bug must not stop the runner
        import traceback

        traceback.print_exc()
        tl.Rows(a.summary, "trim", a.cmd).check("checker", False, "checker error: %s: %s" % (type(e).__name__, e))
        return 0


if __name__ == "__main__":
    sys.exit(main())
