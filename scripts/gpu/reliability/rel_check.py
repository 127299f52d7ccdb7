#!/usr/bin/env python3
"""Runs and judges the reliability suite on the GPU (issue 11 item 8); called by
scripts/gpu/suites/reliability.sh. Each command starts its workloads itself (subprocess,
LD_PRELOAD only for the runs under gpuguard), sends the signals from outside, and
appends one row per check to --summary (scripts/gpu/lib/ggv.py Rows, group "rel").

  rel_check.py graph --dir D --lib LIB [--summary F] [--timeout S]
      graph_capture.py twice at the same time, both with
      PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: under gpuguard (it signals
      itself SIGUSR1 and SIGUSR2 right after capture_begin) and without. Pass: both
      exit 0; capture and replays succeed; the signals were sent while the stream was
      capturing; replay losses and final parameters bit-identical; a signal and a trim
      report of the guarded pid; the signal report, written during the capture, says
      so (capture.streams >= 1) and the trim waited for the capture to end, then ran
      (trim.deferred.outcome "ran"); every report valid JSON.
  rel_check.py endings --dir D --lib LIB [--summary F]
      rel_train.py ending under gpuguard, three runs: SIGTERM from outside (default
      action: exit status -15, i.e. 143 from a shell, and a final report naming the
      signal: reason containing "term" or "signal", or a field signal/ending = 15 or
      SIGTERM), SIGTERM to a job with its own handler (handler runs, exit 0, an exit
      report last), SIGINT (Python's KeyboardInterrupt: exactly one exit report, the
      last, and the exit status of a bare twin: the same script without gpuguard,
      started at the same time and sent SIGINT 1 s after its own GGV_READY; Python's
      SIGINT ending is -2, but an atexit hook that runs code from a string, such as
      torch._dynamo's importing tabulate's namedtuples, makes it exit status 1).
  rel_check.py soak --dir D --lib LIB --deadline EPOCH [--summary F]
      rel_train.py soak, guarded and bare at the same time on the same GPU; SIGUSR1 and
      SIGUSR2 alternately every 2-3 s to the guarded run from its GGV_SOAK_READY to its
      GGV_SOAK_STEPS_DONE. Pass: both exit 0; the same number of steps (the bare run
      at least the guarded count); losses bit-identical step by step; gpuguard's
      current_bytes equals memory_reserved() at the end (core suite rule: within 2 MiB,
      or the constant extra of the warm-up within 2 MiB, at most 512 MiB); signal and
      trim reports written, all valid JSON, the exit report last. Afterwards only the
      first and last 3 reports of each reason are kept (the others listed in
      reports_index.txt) so that the results stay small.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv  # noqa: E402

PY = sys.executable
TRAIN = os.path.join(HERE, "rel_train.py")
GRAPH = os.path.join(HERE, "graph_capture.py")


def base_env():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not
           (k.startswith("GPUGUARD_") and k != "GPUGUARD_LOG")}
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start(cmd, run_dir, lib=None, extra=None):
    """Starts cmd with stdout/stderr in run_dir; under gpuguard when lib is given."""
    os.makedirs(os.path.join(run_dir, "reports"), exist_ok=True)
    env = base_env()
    env.update(extra or {})
    if lib:
        env["LD_PRELOAD"] = lib
        env["GPUGUARD_DIR"] = os.path.join(run_dir, "reports")
    out = open(os.path.join(run_dir, "stdout.log"), "w")
    err = open(os.path.join(run_dir, "stderr.log"), "w")
    with open(os.path.join(run_dir, "cmd.txt"), "w") as f:
        f.write("%s%s\n" % ("LD_PRELOAD=%s GPUGUARD_DIR=%s/reports " % (lib, run_dir) if lib else "",
                            " ".join(cmd)) + "".join("%s=%s\n" % kv for kv in (extra or {}).items()))
    return subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=run_dir)


def finish(p, timeout_s, run_dir):
    """Waits; kills (SIGKILL) past timeout_s. Returns (rc, timed_out); writes rc.txt."""
    timed_out = False
    try:
        rc = p.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
        p.kill()
        rc = p.wait()
    with open(os.path.join(run_dir, "rc.txt"), "w") as f:
        f.write("%d\n" % rc)
    return rc, timed_out


def wait_word(run_dir, word, p, max_s):
    """Waits for a line 'WORD pid=N' in run_dir/stdout.log; False if p ends first."""
    t0 = time.time()
    path = os.path.join(run_dir, "stdout.log")
    while time.time() - t0 < max_s:
        if re.search(r"^%s pid=\d+" % word, ggv.read_text(path), re.M):
            return True
        if p.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def check_reports(R, run_dir, pid, label="reports_valid"):
    """Every report of the run must parse; returns [(entry, report)] of pid by seq."""
    rdir = os.path.join(run_dir, "reports")
    entries = ggv.list_reports(rdir)
    bad, mine, tmp = [], [], []
    for e in entries:
        rep, err = ggv.load_json(e["path"])
        if rep is None:
            bad.append("%s: %s" % (e["name"], err))
        elif e["pid"] == pid:
            mine.append((e, rep))
    try:
        tmp = [n for n in os.listdir(rdir) if not n.endswith(".json")]
    except OSError:
        pass
    counts = {}
    for e, _ in mine:
        counts[e["reason"]] = counts.get(e["reason"], 0) + 1
    R.check(label, not bad and bool(mine), "%d report(s) of pid %s (%s), %d unreadable%s; other files: %s" % (
        len(mine), pid, ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none", len(bad),
        (": " + "; ".join(bad[:3])) if bad else "", ", ".join(tmp[:5]) or "none"), counts=counts, bad=bad,
        other_files=tmp)
    return mine


def stderr_problems(run_dir):
    lines = ggv.read_text(os.path.join(run_dir, "stderr.log")).splitlines()
    return [ln for ln in lines if re.search(r"panicked|Traceback|Segmentation|core dumped|fatal", ln, re.I)]


# ---- graph ----------------------------------------------------------------------------

def cmd_graph(a):
    R = ggv.Rows(a.summary, "rel", "graph_capture")
    dg, db = os.path.join(a.dir, "guarded"), os.path.join(a.dir, "bare")
    os.makedirs(dg, exist_ok=True)
    os.makedirs(db, exist_ok=True)
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    pg = start([PY, GRAPH], dg, a.lib, dict(conf, GGV_SEND_SIGNALS="1"))
    pb = start([PY, GRAPH], db, None, dict(conf, GGV_SEND_SIGNALS="0"))
    rcg, tog = finish(pg, a.timeout, dg)
    rcb, tob = finish(pb, max(a.timeout - 5, 10), db)
    g, b = ggv.read_records(os.path.join(dg, "stdout.log")), ggv.read_records(os.path.join(db, "stdout.log"))
    R.check("exit_status", rcg == 0 and rcb == 0, "guarded rc %d%s, bare rc %d%s" % (
        rcg, " (killed: timeout)" if tog else "", rcb, " (killed: timeout)" if tob else ""))
    if not ggv.started(R, dg, g, rcg, "guarded_started") or not ggv.started(R, db, b, rcb, "bare_started"):
        return 0
    cfg = ggv.first(g, "config") or {}
    R.check("backend", cfg.get("backend") == "cudaMallocAsync" and cfg.get("gpuguard") is True,
            "allocator backend %s, gpuguard C API %s (torch %s)" % (cfg.get("backend"), cfg.get("gpuguard"),
                                                                    cfg.get("torch")))
    cap, capb = ggv.first(g, "capture") or {}, ggv.first(b, "capture") or {}
    R.check("capture", cap and not cap.get("error") and capb and not capb.get("error"),
            "guarded capture: %s; bare capture: %s" % (cap.get("error") or ("ok" if cap else "no record"),
                                                     capb.get("error") or ("ok" if capb else "no record")))
    sent = cap.get("sent") or {}
    tb, te = cap.get("t_begin"), cap.get("t_end")
    during = all(isinstance(sent.get(k), float) and tb is not None and te is not None and tb <= sent[k] <= te
                 for k in ("usr1", "usr2"))
    R.check("signals_during_capture", during and cap.get("capturing_at_send") is True,
            "SIGUSR1 at +%s s, SIGUSR2 at +%s s after capture_begin, capture ended at +%s s; stream capturing when "
            "both were sent: %s; reports written during the capture: %s" % (
                _rel(sent.get("usr1"), tb), _rel(sent.get("usr2"), tb), _rel(te, tb), cap.get("capturing_at_send"),
                cap.get("reports_during_capture")), capture=cap)
    rg, rb = ggv.first(g, "replays") or {}, ggv.first(b, "replays") or {}
    lg, lb = rg.get("losses") or [], rb.get("losses") or []
    diff = next((i for i, (x, y) in enumerate(zip(lg, lb)) if x != y), None)
    R.check("replays", not rg.get("error") and len(lg) == cfg.get("replays") and len(lg) > 0,
            "%d replays under gpuguard (error: %s), %d without" % (len(lg), rg.get("error"), len(lb)))
    R.check("losses_identical", lg == lb and len(lg) > 0,
            "replay losses %s (%d vs %d; first difference at replay %s); last %s" % (
                "bit-identical" if lg == lb else "DIFFER", len(lg), len(lb), diff, lg[-1] if lg else None))
    pgs, pbs = (ggv.first(g, "params") or {}).get("sha256"), (ggv.first(b, "params") or {}).get("sha256")
    R.check("params_identical", pgs is not None and pgs == pbs, "final parameters sha256 %s vs %s" % (
        (pgs or "-")[:16], (pbs or "-")[:16]))
    mine = check_reports(R, dg, cfg.get("pid"))
    reasons = [e["reason"] for e, _ in mine]
    rep = ggv.first(g, "reports") or {}
    R.check("signal_and_trim_reports", "signal" in reasons and "trim" in reasons,
            "reasons by seq: %s; trim: %s" % (" ".join(reasons), ((rep.get("found") or {}).get("trim") or {})
                                              .get("trim")))
    found = rep.get("found") or {}
    dfr = (found.get("trim") or {}).get("deferred") or {}
    capn = (found.get("signal") or {}).get("capture") or {}
    R.check("trim_after_capture", dfr.get("outcome") == "ran" and (capn.get("streams") or 0) >= 1,
            "trim deferred by the capture: %s after %s ms; signal report written during the capture: "
            "%s stream(s) capturing" % (dfr.get("outcome"), dfr.get("waited_ms"), capn.get("streams")))
    probs = stderr_problems(dg)
    R.check("stderr_clean", not probs, "%d alarming stderr line(s)%s" % (len(probs), (": " + probs[0][:200])
                                                                        if probs else ""))
    return 0


def _rel(t, t0):
    return None if t is None or t0 is None else round(t - t0, 3)


# ---- endings ---------------------------------------------------------------------------

def signal_named(rep, sig):
    """(True, what) when the report says it was written for signal sig."""
    names = {signal.SIGTERM: "term", signal.SIGINT: "int"}
    found = []
    reason = str(rep.get("reason", ""))
    if names.get(sig, "?") in reason.lower() or "signal" in reason.lower():
        found.append("reason=%s" % reason)
    for obj in (rep, rep.get("ending") if isinstance(rep.get("ending"), dict) else {}):
        for k in ("signal", "ending", "signo", "signal_number"):
            v = obj.get(k) if isinstance(obj, dict) else None
            if v is None or isinstance(v, dict):
                continue
            if v == int(sig) or str(v).upper() in (signal.Signals(sig).name, signal.Signals(sig).name[3:]):
                found.append("%s=%s" % (k, v))
    return bool(found), ", ".join(found)


def ending_fields(rep):
    return {k: rep.get(k) for k in ("reason", "signal", "ending", "seq") if k in rep}


def signalled_run(cmd, run_dir, lib, sig, out):
    """Starts cmd (under gpuguard when lib is given), sends sig 1.0 s after its
    GGV_READY line, waits for the end. Fills out: pid, ready, rc, timed_out, t_sig."""
    p = start(cmd, run_dir, lib)
    out.update(pid=p.pid, ready=wait_word(run_dir, "GGV_READY", p, 90), t_sig=None)
    if out["ready"]:
        time.sleep(1.0)
        try:
            os.kill(p.pid, sig)
            out["t_sig"] = time.time()
        except OSError:
            pass
    out["rc"], out["timed_out"] = finish(p, 40 if out["ready"] else 5, run_dir)


def cmd_endings(a):
    cases = [("sigterm", signal.SIGTERM, False), ("sigterm_handled", signal.SIGTERM, True),
             ("sigint", signal.SIGINT, False)]
    for name, sig, handled in cases:
        if a.only and name not in a.only.split():
            continue
        R = ggv.Rows(a.summary, "rel", "ending_" + name)
        d = os.path.join(a.dir, name)
        os.makedirs(d, exist_ok=True)
        cmd = [PY, TRAIN, "ending", "--max-s", "90"] + (["--handle-term"] if handled else [])
        run, twin = {}, {}
        threads = [threading.Thread(target=signalled_run, args=(cmd, d, a.lib, sig, run))]
        if sig == signal.SIGINT:
            # How Python ends after an unhandled KeyboardInterrupt depends on the
            # program (an atexit hook that runs code from a string, as importing a
            # module that defines a namedtuple does, turns the SIGINT ending into
            # exit status 1: torch._dynamo's does), so the reference is the same
            # script without gpuguard, signalled the same way, at the same time.
            db = os.path.join(d, "bare")
            os.makedirs(db, exist_ok=True)
            threads.append(threading.Thread(target=signalled_run, args=(cmd, db, None, sig, twin)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rc, to = run["rc"], run["timed_out"]
        if not run["ready"]:
            R.check("ready", False, "no GGV_READY line (rc %d): %s" % (rc, (stderr_problems(d) or ["-"])[-1][:200]))
            continue
        R.info("signal_sent", "%s sent %.1f s after GGV_READY; process ended %s" % (
            signal.Signals(sig).name, 1.0, "after SIGKILL (hung)" if to else "by itself"))
        recs = ggv.read_records(os.path.join(d, "stdout.log"))
        if handled:
            R.check("exit_status", rc == 0 and not to, "rc %d (want 0: the job's own SIGTERM handler ends it)" % rc)
            R.check("handler_ran", "GGV_TERM_HANDLER ran" in ggv.read_text(os.path.join(d, "stdout.log")),
                    "the job's SIGTERM handler %s" % ("ran" if (ggv.first(recs, "result") or {})
                                                     .get("ended_by_handler") else "did NOT run"))
        elif sig == signal.SIGTERM:
            R.check("exit_status", rc == -signal.SIGTERM and not to,
                    "returncode %d (want -15 from Popen, 143 from a shell: the default action of SIGTERM)" % rc)
        else:
            kb = "KeyboardInterrupt" in ggv.read_text(os.path.join(d, "stderr.log"))
            kb_bare = "KeyboardInterrupt" in ggv.read_text(os.path.join(db, "stderr.log"))
            ok_twin = twin["ready"] and not twin["timed_out"] and kb_bare
            R.check("exit_status", ok_twin and rc == twin["rc"] and not to and kb,
                    "returncode %d, bare twin %s (want the same: -2 is Python's SIGINT ending, 1 where an atexit "
                    "hook of the program ran code from a string); KeyboardInterrupt raised: %s, in the twin: %s" % (
                        rc, twin["rc"] if twin["ready"] else "not ready", kb, kb_bare),
                    rc=rc, bare_rc=twin["rc"])
        mine = check_reports(R, d, run["pid"])
        if not mine:
            R.check("final_report", False, "no report of pid %d at all" % run["pid"])
            continue
        last_e, last = mine[-1]
        seqs = [e["seq"] for e, _ in mine]
        if sig == signal.SIGTERM and not handled:
            ok, what = signal_named(last, sig)
            R.check("final_report", ok, "last report %s (seq %d of %s): %s; fields %s" % (
                last_e["name"], last_e["seq"], seqs, what or "names no signal", json.dumps(ending_fields(last))))
        else:
            named, what = signal_named(last, sig)
            exits = sum(1 for e, _ in mine if e["reason"] == "exit")
            ok = last_e["reason"] == "exit" and exits == 1
            R.check("final_report", ok, "last report %s (seq %d of %s) reason %s%s, %d exit report(s); fields %s" % (
                last_e["name"], last_e["seq"], seqs, last_e["reason"], (", " + what) if what else "", exits,
                json.dumps(ending_fields(last))))
        rec_t = last.get("time_unix_ms") or last.get("time")
        R.info("report_time", "last report time_unix_ms %s, signal sent at %.3f s (unix)" % (rec_t, run["t_sig"] or 0))
    return 0


# ---- soak ------------------------------------------------------------------------------

def signaller(pid, run_dir, stop, log, seed=11):
    rnd = random.Random(seed)
    sigs = [signal.SIGUSR1, signal.SIGUSR2]
    i = 0
    while not stop.is_set():
        sig = sigs[i % 2]
        try:
            os.kill(pid, sig)
            log.append((round(time.time(), 3), sig.name, "ok"))
        except OSError as e:
            log.append((round(time.time(), 3), sig.name, "failed: %s" % e))
            break
        i += 1
        stop.wait(rnd.uniform(2.0, 3.0))


def prune_reports(run_dir, keep=3):
    rdir = os.path.join(run_dir, "reports")
    entries = ggv.list_reports(rdir)
    by = {}
    for e in entries:
        by.setdefault(e["reason"], []).append(e)
    lines, removed = [], 0
    for reason, es in by.items():
        for i, e in enumerate(es):
            size = os.path.getsize(e["path"])
            kept = i < keep or i >= len(es) - keep
            lines.append("%s %d %s" % (e["name"], size, "kept" if kept else "removed"))
            if not kept:
                os.remove(e["path"])
                removed += 1
    with open(os.path.join(run_dir, "reports_index.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return removed


def cmd_soak(a):
    R = ggv.Rows(a.summary, "rel", "soak")
    dg, db = os.path.join(a.dir, "guarded"), os.path.join(a.dir, "bare")
    os.makedirs(dg, exist_ok=True)
    os.makedirs(db, exist_ok=True)
    for f in ("target_steps", "target_final", "signals_stopped"):
        try:
            os.remove(os.path.join(a.dir, f))
        except OSError:
            pass
    args = ["--dir", a.dir, "--deadline", "%.1f" % a.deadline]
    t0 = time.time()
    R.info("plan", "deadline in %.0f s; guarded and bare start together" % (a.deadline - t0))
    pg = start([PY, TRAIN, "soak", "--role", "guarded"] + args, dg, a.lib)
    pb = start([PY, TRAIN, "soak", "--role", "bare"] + args, db, None)
    log, stop = [], threading.Event()
    th = None
    if wait_word(dg, "GGV_SOAK_READY", pg, 240):
        th = threading.Thread(target=signaller, args=(pg.pid, dg, stop, log), daemon=True)
        th.start()
        wait_word(dg, "GGV_SOAK_STEPS_DONE", pg, max(a.deadline - time.time() + 30, 10))
    stop.set()
    if th:
        th.join(5)
    with open(os.path.join(a.dir, "signals_stopped"), "w") as f:
        f.write("%.3f\n" % time.time())
    with open(os.path.join(dg, "signals.txt"), "w") as f:
        f.write("\n".join("%s %s %s" % x for x in log) + "\n")
    rcg, tog = finish(pg, a.deadline - time.time() + 15, dg)
    rcb, tob = finish(pb, a.deadline - time.time() + 20, db)
    g, b = ggv.read_records(os.path.join(dg, "stdout.log")), ggv.read_records(os.path.join(db, "stdout.log"))
    R.check("exit_status", rcg == 0 and rcb == 0 and not tog and not tob, "guarded rc %d%s, bare rc %d%s after "
            "%.0f s" % (rcg, " (killed: past the deadline)" if tog else "", rcb,
                        " (killed: past the deadline)" if tob else "", time.time() - t0))
    if not ggv.started(R, dg, g, rcg, "guarded_started") or not ggv.started(R, db, b, rcb, "bare_started"):
        return 0
    resg, resb = ggv.first(g, "result") or {}, ggv.first(b, "result") or {}
    ng, nb = resg.get("steps"), resb.get("steps")
    n_usr1 = sum(1 for x in log if x[1] == "SIGUSR1" and x[2] == "ok")
    n_usr2 = sum(1 for x in log if x[1] == "SIGUSR2" and x[2] == "ok")
    R.check("steps", isinstance(ng, int) and isinstance(nb, int) and ng > 0 and nb >= ng,
            "guarded %s steps in %s s (%s steps/s), bare %s steps in %s s (%s steps/s); %d plans, first %s" % (
                ng, resg.get("seconds"), resg.get("steps_per_s"), nb, resb.get("seconds"), resb.get("steps_per_s"),
                len(resg.get("target_history") or []), (resg.get("target_history") or [None])[0]),
            target_history=resg.get("target_history"))
    R.check("signals_sent", n_usr1 > 0 and n_usr2 > 0 and all(x[2] == "ok" for x in log),
            "%d SIGUSR1 and %d SIGUSR2 sent every 2-3 s during the steps (%s)" % (
                n_usr1, n_usr2, "all delivered" if all(x[2] == "ok" for x in log) else "a kill FAILED"))
    import array
    la, lb = array.array("f"), array.array("f")
    for arr, d, role in ((la, dg, "guarded"), (lb, db, "bare")):
        try:
            with open(os.path.join(a.dir, "losses_%s.f32" % role), "rb") as f:
                arr.frombytes(f.read())
        except (OSError, ValueError):
            pass
    n = ng if isinstance(ng, int) else 0
    same = n > 0 and len(la) >= n and len(lb) >= n and la[:n].tobytes() == lb[:n].tobytes()
    first_diff = None
    if not same and n > 0:
        first_diff = next((i for i in range(min(n, len(la), len(lb))) if la[i] != lb[i]), None)
    R.check("losses_identical", same, "%d losses %s (guarded %d, bare %d recorded; first difference at step %s); "
            "loss at step 1 %s, at step %d %s" % (n, "bit-identical" if same else "DIFFER", len(la), len(lb),
                                                 first_diff, la[0] if la else None, n, la[n - 1] if len(la) >= n > 0
                                                 else None))
    v = resg.get("books_verdict")
    R.check("books_equal_framework", v in ("agree", "explained"),
            "gpuguard current_bytes %s vs memory_reserved() %s at the end: diff %s MiB, %s: %s" % (
                ggv.mib(resg.get("gpuguard_current")), ggv.mib(resg.get("framework_bytes")),
                None if resg.get("books_diff") is None else round(resg["books_diff"] / ggv.MiB, 2), v,
                resg.get("books_explanation")))
    R.info("memory", "guarded memory_reserved at the end %s (max %s); bare %s (max %s)" % (
        ggv.mib(resg.get("memory_reserved")), ggv.mib(resg.get("max_memory_reserved")),
        ggv.mib(resb.get("memory_reserved")), ggv.mib(resb.get("max_memory_reserved"))))
    mine = check_reports(R, dg, pg.pid)
    reasons = [e["reason"] for e, _ in mine]
    n_sig, n_trim = reasons.count("signal"), reasons.count("trim")
    R.check("signal_and_trim_reports", n_sig > 0 and n_trim > 0,
            "%d signal reports for %d SIGUSR1, %d trim reports for %d SIGUSR2 (trims may merge)" % (
                n_sig, n_usr1, n_trim, n_usr2))
    if n_usr1 and n_sig < n_usr1 // 2:
        R.warn("signal_report_count", "fewer than half of the SIGUSR1 produced a report (%d of %d)" % (n_sig, n_usr1))
    R.check("exit_report_last", bool(mine) and reasons[-1] == "exit" and reasons.count("exit") == 1,
            "last report by seq: %s; exit reports: %d" % (mine[-1][0]["name"] if mine else None,
                                                         reasons.count("exit")))
    probs = stderr_problems(dg)
    R.check("stderr_clean", not probs, "%d alarming stderr line(s)%s" % (len(probs), (": " + probs[0][:200])
                                                                        if probs else ""))
    R.info("pruned", "%d reports removed after the checks (listed in reports_index.txt)" % prune_reports(dg))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("graph", "endings", "soak"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--lib", required=True)
        p.add_argument("--summary")
        if name == "graph":
            p.add_argument("--timeout", type=float, default=150)
        if name == "endings":
            p.add_argument("--only", default="")
        if name == "soak":
            p.add_argument("--deadline", type=float, required=True)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    return {"graph": cmd_graph, "endings": cmd_endings, "soak": cmd_soak}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
