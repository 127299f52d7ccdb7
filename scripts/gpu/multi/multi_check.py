#!/usr/bin/env python3
"""Two GPUs (issue 15): runs the workloads of scripts/gpu/multi/ and judges them, one
PASS/FAIL line per check (rows of group "multi" in the suite's summary file).

  multi_check.py torch  --dir D --lib LIB --summary F [--mode default|expandable|cudaMallocAsync]
      run 1, PyTorch: torch_two.py under GPUGUARD_CAP=0:4GiB,1:8GiB (GGV_MULTI_CAPS).
      Checks: meminfo_is_cap (torch.cuda.mem_get_info(d) and cuDeviceTotalMem of each
      device answer that device's cap); nvml_is_cap (NVML inside the process, the device
      with the ordinal's UUID, answers the cap); books_<label> (the report written at
      the label: devices[d].current_bytes == memory_reserved(d) to the byte; with
      cudaMallocAsync pool_reserved_bytes == memory_reserved(d)); peer (a 0 -> 1 -> 0
      copy arrives and the books after it still agree: books_after_peer); oom_dev<d>
      (torch.OutOfMemoryError naming GPU d, memory_reserved(d) within 512 MiB below the
      cap); cap_report_dev<d> (a cap report whose denial names device d and its cap);
      exit_report (cap_bytes and denied >= 1 on both devices); exit (status 0).
  multi_check.py jax --dir D --lib LIB --summary F
      run 1, JAX: jax_two.py, default preallocation. Checks: meminfo_is_cap, nvml_is_cap,
      bytes_limit_dev<d> (memory_stats()["bytes_limit"] <= cap), books_dev<d> (gpuguard
      current between bytes_limit and the cap), peer (equal, and gpuguard's counters
      unchanged by the copies: XLA's arena holds them), oom_dev<d>, exit_report, exit.
  multi_check.py remap --dir D --lib LIB --summary F
      run 2: remap.py physical (no shim), then CUDA_VISIBLE_DEVICES=1 with
      GPUGUARD_CAP=0:4GiB and CUDA_VISIBLE_DEVICES=1,0 with 0:4GiB,1:8GiB. Checks per
      case: ordinals (each ordinal's UUID is the physical device the variable names),
      meminfo_is_cap (per ordinal), nvml_by_uuid (NVML shows each cap on the physical
      GPU with that UUID; a device the process cannot see shows its real size),
      oom_ord0 (the refusal names GPU 0 and stops at ordinal 0's cap).
  multi_check.py ranks --dir D --lib LIB --cli CLI --summary F
      run 3: torchrun --nproc_per_node=2 ddp_leak.py, GPUGUARD_SNAPSHOT_EVERY=2s,
      GPUGUARD_CAP=0:20GiB,1:24GiB; `gpuguard trim <rank 0>` at rank 0's handshake;
      `gpuguard show` of every report. Checks: exit; cap_per_rank (mem_get_info total of
      each rank's device is that device's cap; its exit report's cap_bytes too);
      report_names (gpuguard.<prog>.r<rank>.<pid>.<seq>.<reason>.json, an exit report
      and >= 2 snapshots per rank); trim_one_rank (gpuguard trim exit 0 naming rank 0's
      pid, a trim report of rank 0 only); show_ranks (one "rank r/2" line per rank);
      leak_rank1 (rank 1's suspected leaks start at ddp_leak.py's GGV_LEAK_LINE);
      no_leak_rank0 (that line is not suspected in rank 0).
  multi_check.py soak --dir D --lib LIB --summary F [--seconds S]
      run 4: soak_two.py guarded and bare at once, SIGUSR1/SIGUSR2 alternately every
      2-3 s to the guarded run between GGV_SOAK_READY and GGV_SOAK_STEPS_DONE. Checks:
      exit (both 0), losses (bit-identical over the common steps, at least half of
      the longer run), books_dev<d> (gpuguard current_bytes vs memory_reserved(d) at the
      end: within 2 MiB PASS, a constant extra up to 512 MiB WARN), signals (report and
      trim reports written, every report valid JSON, the exit report last).
  multi_check.py judge KIND --dir D [--summary F]   judges an existing run folder again
  multi_check.py selftest    the judges on synthetic runs (good ones pass, broken fail)

Each run folder: stdout.log, stderr.log, rc.txt, reports/ (GPUGUARD_DIR); remap and
soak: one folder per process inside. Standard library only (the workloads need torch /
jax).
"""

import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv  # noqa: E402

MiB, GiB = ggv.MiB, ggv.GiB
GROUP = "multi"
CAPS_ONE = os.environ.get("GGV_MULTI_CAPS", "0:4GiB,1:8GiB")
CAPS_RANKS = os.environ.get("GGV_MULTI_RANK_CAPS", "0:20GiB,1:24GiB")


# ---- running ---------------------------------------------------------------------------

def start(cmd, run_dir, env, preload=None):
    """Starts cmd with env added (and LD_PRELOAD=preload), GPUGUARD_DIR=run_dir/reports,
    its output in run_dir/stdout.log and stderr.log; the command line in cmd.txt."""
    os.makedirs(os.path.join(run_dir, "reports"), exist_ok=True)
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update(env)
    e["GPUGUARD_DIR"] = os.path.join(run_dir, "reports")
    if preload:
        e["LD_PRELOAD"] = preload
    with open(os.path.join(run_dir, "cmd.txt"), "w") as f:
        f.write(" ".join("%s=%s" % kv for kv in sorted(env.items())) + " " + " ".join(cmd) + "\n")
    so = open(os.path.join(run_dir, "stdout.log"), "w")
    se = open(os.path.join(run_dir, "stderr.log"), "w")
    return subprocess.Popen(cmd, env=e, stdout=so, stderr=se)


def run(cmd, run_dir, env, timeout, preload=None):
    """start, then finish: the exit status (124 after the timeout), also in rc.txt."""
    return finish(start(cmd, run_dir, env, preload), run_dir, timeout)


def finish(p, run_dir, timeout):
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = 124
    with open(os.path.join(run_dir, "rc.txt"), "w") as f:
        f.write("%d\n" % rc)
    return rc


# ---- judging helpers -------------------------------------------------------------------

def caps_of(spec):
    sys.path.insert(0, HERE)
    import mg
    return mg.caps_of(spec)


def cap_for(caps, d):
    v = (caps or {}).get(str(d), (caps or {}).get(d))
    return int(v) if v is not None else None


def reports(run_dir, pid=None, reason=None):
    return ggv.list_reports(os.path.join(run_dir, "reports"), pid, reason)


def common(R, run_dir, recs):
    """exit and config checks; False when the rest cannot be judged."""
    rc = ggv.read_rc(run_dir)
    if recs.get("skip"):
        R.skip("exit", recs["skip"][0].get("reason", "skipped"))
        return False
    if not ggv.started(R, run_dir, recs, rc, check="exit"):
        return False
    R.check("exit", rc == 0 and bool(recs.get("done")), "exit status %s, done record %s" % (rc, bool(recs.get("done"))))
    return True


def check_views(R, recs, caps, label=""):
    devs = recs.get("dev", [])
    nv = {e.get("uuid"): e for e in recs.get("nvml", [])}
    bad, rows = [], []
    for r in devs:
        d, cap = r["ordinal"], cap_for(caps, r["ordinal"])
        if cap is None:
            continue
        got = [r.get("total_mem")] + ([r["torch_total"]] if "torch_total" in r else [])
        rows.append("ord %d: cuDeviceTotalMem %s mem_get_info %s" % (d, ggv.mib(r.get("total_mem")),
                                                                     ggv.mib(r.get("torch_total"))))
        if any(g != cap for g in got):
            bad.append("ordinal %d answers %s, cap %s" % (d, [ggv.mib(g) for g in got], ggv.mib(cap)))
    R.check("meminfo_is_cap" + label, bool(rows) and not bad, "; ".join(bad or rows) or "no dev record")
    bad, rows = [], []
    for r in devs:
        cap = cap_for(caps, r["ordinal"])
        n = nv.get(r.get("uuid"))
        if cap is None:
            continue
        if n is None:
            bad.append("no NVML device with ordinal %d's UUID %s" % (r["ordinal"], r.get("uuid")))
        elif n.get("total") != cap:
            bad.append("NVML %s (ordinal %d) total %s, cap %s" % (r.get("uuid"), r["ordinal"], ggv.mib(n.get("total")),
                                                                 ggv.mib(cap)))
        else:
            rows.append("ordinal %d = NVML index %s: total %s" % (r["ordinal"], n.get("index"), ggv.mib(n["total"])))
    R.check("nvml_is_cap" + label, bool(rows) and not bad, "; ".join(bad or rows) or "no dev record")


def oom_named(msg, d):
    return bool(re.search(r"\bGPU %d\b|\bdevice %d\b|cuda:%d\b" % (d, d, d), msg or ""))


def check_oom(R, recs, caps, check, d, slack=512 * MiB):
    o = ggv.first(recs, "oom", device=d)
    cap = cap_for(caps, d)
    if not o:
        return R.check(check, False, "no oom record for device %d" % d)
    res = o.get("reserved_at_refusal")
    ok = o.get("refused") and oom_named(o.get("message"), d) and (
        res is None or (cap is not None and cap - slack <= res <= cap))
    return R.check(check, bool(ok), "refused %s after %s; memory_reserved %s vs cap %s; message: %s" % (
        o.get("refused"), ggv.mib(o.get("filled")), ggv.mib(res), ggv.mib(cap), (o.get("message") or "")[:160]))


def check_exit_report(R, run_dir, pid, caps, want_denied):
    ex = reports(run_dir, pid, "exit")
    if not ex:
        return R.check("exit_report", False, "no exit report of pid %s" % pid)
    rep = ggv.load(ex[-1]["path"]) or {}
    bad, rows = [], []
    for d in sorted(int(k) for k in caps):
        e = ggv.dev_entry(rep, d) or {}
        rows.append("dev %d cap_bytes %s denied %s" % (d, ggv.mib(e.get("cap_bytes")), e.get("denied")))
        if e.get("cap_bytes") != cap_for(caps, d) or (want_denied and not (e.get("denied") or 0) >= 1):
            bad.append(rows[-1])
    R.check("exit_report", not bad, "; ".join(rows) + ("; want the caps%s" % (" and a refusal each" if want_denied
                                                                              else "") if bad else ""))


# ---- run 1: PyTorch --------------------------------------------------------------------

def judge_torch(run_dir, R):
    recs = ggv.read_records(os.path.join(run_dir, "stdout.log"))
    if not common(R, run_dir, recs):
        return
    cfg = recs["config"][0]
    caps, mode, pid = cfg.get("caps") or {}, cfg.get("mode"), cfg.get("pid")
    check_views(R, recs, caps)
    for label in ("before_peer", "after_peer", "end"):
        bad, rows = [], []
        for b in [b for b in recs.get("books", []) if b.get("label") == label]:
            d = b["device"]
            rep = ggv.load(b.get("report") or "") or {}
            e = ggv.dev_entry(rep, d) or {}
            mine = e.get("pool_reserved_bytes") if mode == "cudaMallocAsync" else e.get("current_bytes")
            what = "pool_reserved_bytes" if mode == "cudaMallocAsync" else "current_bytes"
            rows.append("dev %d: %s %s vs memory_reserved %s" % (d, what, mine, b.get("reserved")))
            if mine != b.get("reserved"):
                bad.append(rows[-1] + " (diff %s)" % (None if mine is None else mine - b.get("reserved")))
        R.check("books_" + label, bool(rows) and not bad, "; ".join(bad or rows) or "no books record")
    p = ggv.first(recs, "peer") or {}
    R.check("peer", p.get("equal") is True and p.get("can_access") is True,
            "can_device_access_peer %s, 0 -> 1 -> 0 copy equal %s" % (p.get("can_access"), p.get("equal")))
    for d in (0, 1):
        check_oom(R, recs, caps, "oom_dev%d" % d, d)
        o = ggv.first(recs, "oom", device=d) or {}
        den = o.get("denial") or {}
        R.check("cap_report_dev%d" % d, den.get("device") == d and den.get("cap_bytes") == cap_for(caps, d),
                "cap report %s: denial %s" % (os.path.basename(o.get("cap_report") or "none"), den))
    check_exit_report(R, run_dir, pid, caps, True)


def cmd_torch(a):
    mode = a.mode
    d = a.dir
    conf = {"default": "", "expandable": "expandable_segments:True", "cudaMallocAsync": "backend:cudaMallocAsync"}
    run([sys.executable, os.path.join(HERE, "torch_two.py")], d,
        {"GPUGUARD_CAP": CAPS_ONE, "PYTORCH_CUDA_ALLOC_CONF": conf[mode]}, a.timeout, preload=a.lib)
    judge("torch", d, a.summary, "torch_" + mode)


# ---- run 1: JAX --------------------------------------------------------------------------

def judge_jax(run_dir, R):
    recs = ggv.read_records(os.path.join(run_dir, "stdout.log"))
    if not common(R, run_dir, recs):
        return
    cfg = recs["config"][0]
    caps, pid = cfg.get("caps") or {}, cfg.get("pid")
    check_views(R, recs, caps)
    for d in (0, 1):
        cap = cap_for(caps, d)
        s = ggv.first(recs, "stats", label="start", device=d) or {}
        lim = (s.get("memory_stats") or {}).get("bytes_limit")
        R.check("bytes_limit_dev%d" % d, lim is not None and cap is not None and lim <= cap,
                "bytes_limit %s, cap %s" % (ggv.mib(lim), ggv.mib(cap)))
        cur = (s.get("gg") or {}).get("current_bytes")
        R.check("books_dev%d" % d, None not in (cur, lim, cap) and lim <= cur <= cap,
                "gpuguard current %s (want from bytes_limit %s to the cap %s: XLA's arena)" % (
                    ggv.mib(cur), ggv.mib(lim), ggv.mib(cap)))
    p = ggv.first(recs, "peer") or {}
    moved = []
    for d in (0, 1):
        b = (ggv.first(recs, "stats", label="before_peer", device=d) or {}).get("gg") or {}
        f = (ggv.first(recs, "stats", label="after_peer", device=d) or {}).get("gg") or {}
        if b.get("current_bytes") != f.get("current_bytes"):
            moved.append("dev %d %s -> %s" % (d, b.get("current_bytes"), f.get("current_bytes")))
    R.check("peer", p.get("equal") is True and not moved,
            "copy 0 -> 1 -> 0 equal %s; gpuguard's books across it: %s" % (p.get("equal"), "; ".join(moved) or
                                                                           "unchanged"))
    for d in (0, 1):
        o = ggv.first(recs, "oom", device=d) or {}
        R.check("oom_dev%d" % d, bool(o.get("refused")), "refused %s after %s: %s" % (
            o.get("refused"), ggv.mib(o.get("filled")), (o.get("message") or "")[:160]))
    check_exit_report(R, run_dir, pid, caps, False)


def cmd_jax(a):
    run([sys.executable, os.path.join(HERE, "jax_two.py")], a.dir, {"GPUGUARD_CAP": CAPS_ONE}, a.timeout,
        preload=a.lib)
    judge("jax", a.dir, a.summary, "jax_prealloc")


# ---- run 2: remapped devices -------------------------------------------------------------

REMAP_CASES = (("visible_1", "1", "0:4GiB"), ("visible_1_0", "1,0", "0:4GiB,1:8GiB"))


def judge_remap(run_dir, R):
    phys = ggv.read_records(os.path.join(run_dir, "physical", "stdout.log"))
    P = [r.get("uuid") for r in sorted(phys.get("dev", []), key=lambda r: r["ordinal"])]
    real = {e.get("uuid"): e.get("total") for e in phys.get("nvml", [])}
    if len(P) < 2:
        R.skip("physical", "%d device(s) without CUDA_VISIBLE_DEVICES: run 2 needs two" % len(P))
        return
    R.info("physical", "ordinals by UUID: %s" % ", ".join(P))
    for name, cvd, spec in REMAP_CASES:
        d = os.path.join(run_dir, name)
        recs = ggv.read_records(os.path.join(d, "stdout.log"))
        R.workload = "remap_" + name
        if not common(R, d, recs):
            continue
        caps = recs["config"][0].get("caps") or {}
        want = [P[int(x)] for x in cvd.split(",")]
        got = [r.get("uuid") for r in sorted(recs.get("dev", []), key=lambda r: r["ordinal"])]
        R.check("ordinals", got == want, "CUDA_VISIBLE_DEVICES=%s: ordinals %s, want %s" % (cvd, got, want))
        check_views(R, recs, caps)
        nv = {e.get("uuid"): e.get("total") for e in recs.get("nvml", [])}
        bad, rows = [], []
        for u in P:
            ords = [i for i, w in enumerate(want) if w == u]
            exp = cap_for(caps, ords[0]) if ords and cap_for(caps, ords[0]) is not None else real.get(u)
            rows.append("%s: %s (want %s)" % (u, ggv.mib(nv.get(u)), ggv.mib(exp)))
            if nv.get(u) != exp:
                bad.append(rows[-1])
        R.check("nvml_by_uuid", not bad and len(nv) >= len(P), "; ".join(bad or rows))
        check_oom(R, recs, caps, "oom_ord0", 0)


def cmd_remap(a):
    run([sys.executable, os.path.join(HERE, "remap.py"), "physical"], os.path.join(a.dir, "physical"), {}, 60)
    for name, cvd, spec in REMAP_CASES:
        run([sys.executable, os.path.join(HERE, "remap.py"), "check"], os.path.join(a.dir, name),
            {"CUDA_VISIBLE_DEVICES": cvd, "GPUGUARD_CAP": spec}, a.timeout, preload=a.lib)
    judge("remap", a.dir, a.summary, "remap")


# ---- run 3: torchrun, two ranks ----------------------------------------------------------

def sections(show_text):
    """{pid: text} of show's "suspected leaks in ..." sections."""
    out = {}
    for m in re.finditer(r"^suspected leaks in .*?pid (\d+)\), across reports.*?(?=^\S|\Z)", show_text, re.S | re.M):
        out[int(m.group(1))] = m.group(0)
    return out


def judge_ranks(run_dir, R):
    recs = ggv.read_records(os.path.join(run_dir, "stdout.log"))
    rc = ggv.read_rc(run_dir)
    cfgs = {c["rank"]: c for c in recs.get("config", []) if "rank" in c}
    if len(cfgs) < 2:
        R.check("exit", False, "rank configs %s, exit status %s: %s" % (sorted(cfgs), rc, ggv.read_text(
            os.path.join(run_dir, "stderr.log")).strip().splitlines()[-1:]))
        return
    ends = {e["rank"]: e for e in recs.get("end", [])}
    R.check("exit", rc == 0 and sorted(ends) == [0, 1], "torchrun exit status %s; ranks ended: %s" % (rc, sorted(ends)))
    bad, rows = [], []
    for r, c in sorted(cfgs.items()):
        caps, dev = c.get("caps") or {}, c["local_rank"]
        m = ggv.first(recs, "meminfo", rank=r) or {}
        ex = reports(run_dir, c["pid"], "exit")
        rep = ggv.load(ex[-1]["path"]) if ex else {}
        cb = (ggv.dev_entry(rep, dev) or {}).get("cap_bytes")
        rows.append("rank %d device %d: mem_get_info total %s, exit report cap_bytes %s, cap %s" % (
            r, dev, ggv.mib(m.get("total")), ggv.mib(cb), ggv.mib(cap_for(caps, dev))))
        if m.get("total") != cap_for(caps, dev) or cb != cap_for(caps, dev):
            bad.append(rows[-1])
    R.check("cap_per_rank", not bad, "; ".join(bad or rows))
    names = [os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "reports", "gpuguard.*.json"))]
    bad, rows = [], []
    for r, c in sorted(cfgs.items()):
        mine = [n for n in names if (ggv.REPORT_RE.match(n) or {}) and ggv.REPORT_RE.match(n).group("pid") == str(c["pid"])]
        ranked = [n for n in mine if ggv.REPORT_RE.match(n).group("rank") == str(r)]
        snaps = [n for n in ranked if n.endswith(".snapshot.json")]
        exits = [n for n in ranked if n.endswith(".exit.json")]
        rows.append("rank %d pid %d: %d reports, %d named .r%d., %d snapshots, %d exit" % (
            r, c["pid"], len(mine), len(ranked), r, len(snaps), len(exits)))
        if not mine or len(ranked) != len(mine) or len(snaps) < 2 or len(exits) != 1:
            bad.append(rows[-1])
    R.check("report_names", not bad, "; ".join(bad or rows))
    trim_out = ggv.read_text(os.path.join(run_dir, "trim_out.txt"))
    trc = ggv.read_text(os.path.join(run_dir, "trim_rc.txt")).strip()
    t0 = reports(run_dir, cfgs[0]["pid"], "trim")
    t1 = reports(run_dir, cfgs[1]["pid"], "trim")
    R.check("trim_one_rank", trc == "0" and ("process %d" % cfgs[0]["pid"]) in trim_out and len(t0) >= 1 and not t1,
            "gpuguard trim %d: exit %s; trim reports rank 0: %d, rank 1: %d; output: %s" % (
                cfgs[0]["pid"], trc or "?", len(t0), len(t1), " | ".join(trim_out.strip().splitlines()[:3])))
    show = ggv.read_text(os.path.join(run_dir, "show.txt"))
    lines = [ln for ln in show.splitlines() if ln.startswith("  rank ")]
    ok = len(lines) == 2 and lines[0].startswith("  rank 0/2 ") and lines[1].startswith("  rank 1/2 ")
    R.check("show_ranks", ok, " | ".join(lines) or "no rank lines in show.txt")
    leak = ggv.marked_line(os.path.join(HERE, "ddp_leak.py"))
    pat = re.compile(r"ddp_leak\.py:%d\b" % leak)
    secs = sections(show)
    s1, s0 = secs.get(cfgs[1]["pid"], ""), secs.get(cfgs[0]["pid"], "")
    frames1 = [ln.strip() for ln in s1.splitlines() if ln.startswith("        ") and ".py:" in ln]
    R.check("leak_rank1", bool(frames1) and bool(pat.search(frames1[0])) and "rank 1" in s1.splitlines()[0],
            "rank 1's first Python line: %s (want ddp_leak.py:%s); header: %s" % (
                frames1[0] if frames1 else "none", leak, s1.splitlines()[0] if s1 else "no section"))
    R.check("no_leak_rank0", bool(s0) and not pat.search(s0),
            "rank 0's section: %s" % (" | ".join(s0.strip().splitlines()[:3]) if s0 else "none"))


def cmd_ranks(a):
    d = a.dir
    for f in ("ready.rank0", "trim.done"):
        if os.path.exists(os.path.join(d, f)):
            os.remove(os.path.join(d, f))
    os.makedirs(d, exist_ok=True)
    env = {"GPUGUARD_CAP": CAPS_RANKS, "GPUGUARD_SNAPSHOT_EVERY": os.environ.get("GGV_MULTI_SNAPSHOT", "2s"),
           "GGV_RUN": d, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "4"}
    p = start([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(HERE, "ddp_leak.py")], d, env, preload=a.lib)
    ready = os.path.join(d, "ready.rank0")
    t0 = time.time()
    while not os.path.exists(ready) and p.poll() is None and time.time() - t0 < a.timeout:
        time.sleep(0.05)
    if os.path.exists(ready):
        pid = ggv.read_text(ready).strip()
        with open(os.path.join(d, "trim_out.txt"), "w") as f:
            trc = subprocess.run([a.cli, "trim", pid, "--timeout", "30"], stdout=f, stderr=subprocess.STDOUT,
                                 timeout=60).returncode
        with open(os.path.join(d, "trim_rc.txt"), "w") as f:
            f.write("%d\n" % trc)
    open(os.path.join(d, "trim.done"), "w").close()
    finish(p, d, max(10, a.timeout - (time.time() - t0)))
    files = sorted(glob.glob(os.path.join(d, "reports", "gpuguard.*.json")))
    with open(os.path.join(d, "show.txt"), "w") as f:
        subprocess.run([a.cli, "show"] + files, stdout=f, stderr=subprocess.STDOUT, timeout=120)
    judge("ranks", d, a.summary, "torchrun_ranks")


# ---- run 4: the soak ----------------------------------------------------------------------

def judge_soak(run_dir, R):
    g, b = os.path.join(run_dir, "guarded"), os.path.join(run_dir, "bare")
    rg, rb = ggv.read_records(os.path.join(g, "stdout.log")), ggv.read_records(os.path.join(b, "stdout.log"))
    cg, cb = ggv.read_rc(g), ggv.read_rc(b)
    R.check("exit", cg == 0 and cb == 0 and bool(rg.get("end")) and bool(rb.get("end")),
            "guarded exit %s, bare exit %s" % (cg, cb))
    lg = ggv.read_text(os.path.join(g, "losses.txt")).split()
    lb = ggv.read_text(os.path.join(b, "losses.txt")).split()
    n = min(len(lg), len(lb))
    diff = next((i for i in range(n) if lg[i] != lb[i]), None)
    R.check("losses", n >= 10 and diff is None and n >= 0.5 * max(len(lg), len(lb)),
            "%d guarded / %d bare steps; first difference at %s" % (len(lg), len(lb), diff))
    end = (rg.get("end") or [{}])[0]
    for e in end.get("devices", []) or [{"device": 0}, {"device": 1}]:
        cur, res = (e.get("gg") or {}).get("current_bytes"), e.get("reserved")
        if cur is None or res is None:
            R.check("books_dev%d" % e["device"], False, "no numbers: %s" % e)
            continue
        dd = cur - res
        st = "PASS" if abs(dd) <= 2 * MiB else "WARN" if 0 < dd <= 512 * MiB else "FAIL"
        R.add("books_dev%d" % e["device"], st, "gpuguard current %s vs memory_reserved %s (diff %.1f MiB)" % (
            ggv.mib(cur), ggv.mib(res), dd / MiB))
    reps = reports(g)
    bad = [e["name"] for e in reps if ggv.load(e["path"]) is None]
    reasons = [e["reason"] for e in reps]
    sent = ggv.read_text(os.path.join(run_dir, "signals.txt")).split()
    last = reps[-1]["reason"] if reps else None
    R.check("signals", len(sent) >= 4 and "signal" in reasons and "trim" in reasons and not bad and last == "exit",
            "%d signals sent; reports: %d signal, %d trim, %d invalid, last %s" % (
                len(sent), reasons.count("signal"), reasons.count("trim"), len(bad), last))


def cmd_soak(a):
    d = a.dir
    procs = {}
    for name, pre in (("guarded", a.lib), ("bare", None)):
        sub = os.path.join(d, name)
        os.makedirs(sub, exist_ok=True)
        procs[name] = start([sys.executable, os.path.join(HERE, "soak_two.py")], sub,
                            {"GGV_SOAK_S": str(a.seconds), "GGV_RUN": sub}, preload=pre)
    g = procs["guarded"]
    out = os.path.join(d, "guarded", "stdout.log")
    t0 = time.time()
    while "GGV_SOAK_READY" not in ggv.read_text(out) and g.poll() is None and time.time() - t0 < 120:
        time.sleep(0.1)
    sent, sig = [], signal.SIGUSR1
    rnd = random.Random(15)
    while g.poll() is None and "GGV_SOAK_STEPS_DONE" not in ggv.read_text(out):
        os.kill(g.pid, sig)
        sent.append(sig.name)
        sig = signal.SIGUSR2 if sig == signal.SIGUSR1 else signal.SIGUSR1
        time.sleep(2 + rnd.random())
    with open(os.path.join(d, "signals.txt"), "w") as f:
        f.write("\n".join(sent) + "\n")
    for name, p in procs.items():
        finish(p, os.path.join(d, name), a.seconds + 120)
    judge("soak", d, a.summary, "soak")


# ---- judge, selftest ----------------------------------------------------------------------

JUDGES = {"torch": judge_torch, "jax": judge_jax, "remap": judge_remap, "ranks": judge_ranks, "soak": judge_soak}


def judge(kind, run_dir, summary, workload=None, quiet=False):
    R = ggv.Rows(summary, GROUP, workload or kind, quiet=quiet)
    print("%s: %s" % (workload or kind, run_dir), flush=True)
    JUDGES[kind](run_dir, R)
    return R


def cmd_judge(a):
    R = judge(a.kind, a.dir, a.summary)
    return 1 if "FAIL" in R.statuses() else 0


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _recs(*objs):
    return "".join("GGV_JSON " + json.dumps(o) + "\n" for o in objs)


def _report(run_dir, name, obj):
    _write(os.path.join(run_dir, "reports", name), json.dumps(obj))
    return os.path.join(run_dir, "reports", name)


def _views(caps, uuids, totals=None):
    out = []
    for d, u in enumerate(uuids):
        t = caps.get(d, (totals or {}).get(u))
        out.append({"record": "dev", "ordinal": d, "uuid": u, "total_mem": t, "torch_total": t, "torch_free": t})
    return out


def _nvml(totals):
    return [{"record": "nvml", "index": i, "uuid": u, "rc": 0, "total": t, "free": t, "used": 0}
            for i, (u, t) in enumerate(totals.items())]


def selftest():
    """Good synthetic runs pass every check; each broken one fails the check it breaks."""
    U = ["GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"]
    REAL = 141 * GiB
    caps = {0: 4 * GiB, 1: 8 * GiB}
    jcaps = {"0": 4 * GiB, "1": 8 * GiB}
    tmp = tempfile.mkdtemp(prefix="multi-selftest-")
    failures = []

    def expect(kind, d, want_fail=(), workload=None):
        R = judge(kind, d, None, workload, quiet=True)
        st = {}
        for r in R.rows:
            st[r["check"]] = r["status"]
        fails = sorted(k for k, v in st.items() if v == "FAIL")
        ok = sorted(fails) == sorted(want_fail) if want_fail else not fails
        print("selftest %-6s %-28s %s: failed %s%s" % (kind, os.path.basename(d), "ok" if ok else "WRONG", fails,
                                                       "" if ok else " (want %s)" % list(want_fail)))
        if not ok:
            failures.append((kind, d, fails, st))

    # run 1, torch
    def torch_run(name, mode="default", diff=0, peer_eq=True, msg="GPU {d}", denial_dev=None, rc=0):
        d = os.path.join(tmp, name)
        pid = 4242
        recs = [{"record": "config", "pid": pid, "mode": mode, "device_count": 2, "caps": jcaps}]
        recs += _views(caps, U) + _nvml({U[0]: 4 * GiB, U[1]: 8 * GiB})
        for label in ("before_peer", "after_peer", "end"):
            for dv in (0, 1):
                res = (dv + 1) * 300 * MiB
                cur = res + (diff if label == "after_peer" and dv == 1 else 0)
                e = {"device": dv, "current_bytes": cur if mode != "cudaMallocAsync" else 1,
                     "pool_reserved_bytes": cur if mode == "cudaMallocAsync" else 0, "cap_bytes": caps[dv]}
                path = _report(d, "gpuguard.python.%d.%d.request.json" % (pid, 10 + dv + 3 * len(label)),
                               {"devices": [e]})
                recs.append({"record": "books", "label": label, "device": dv, "reserved": res, "report": path})
        recs.append({"record": "peer", "can_access": True, "equal": peer_eq})
        for dv in (0, 1):
            recs.append({"record": "oom", "device": dv, "refused": True, "message": msg.format(d=dv),
                         "reserved_at_refusal": caps[dv] - 256 * MiB, "filled": caps[dv] - 256 * MiB,
                         "cap_report": "x.cap.json", "denial": {"device": dv if denial_dev is None else denial_dev,
                                                                "cap_bytes": caps[dv]}})
        recs.append({"record": "done"})
        _write(os.path.join(d, "stdout.log"), _recs(*recs))
        _write(os.path.join(d, "rc.txt"), "%d\n" % rc)
        _report(d, "gpuguard.python.%d.99.exit.json" % pid,
                {"devices": [{"device": i, "cap_bytes": caps[i], "denied": 1} for i in (0, 1)]})
        return d

    expect("torch", torch_run("torch_good"))
    expect("torch", torch_run("torch_async_good", mode="cudaMallocAsync"))
    expect("torch", torch_run("torch_books_off", diff=2 * MiB), ["books_after_peer"])
    expect("torch", torch_run("torch_peer_bad", peer_eq=False), ["peer"])
    expect("torch", torch_run("torch_oom_unnamed", msg="CUDA out of memory"), ["oom_dev0", "oom_dev1"])
    expect("torch", torch_run("torch_wrong_denial", denial_dev=0), ["cap_report_dev1"])
    expect("torch", torch_run("torch_crash", rc=1), ["exit"])

    # run 1, JAX
    def jax_run(name, moved=0, limit=3 * GiB):
        d = os.path.join(tmp, name)
        pid = 5151
        recs = [{"record": "config", "pid": pid, "device_count": 2, "caps": jcaps}]
        recs += _views(caps, U) + _nvml({U[0]: 4 * GiB, U[1]: 8 * GiB})
        for label in ("start", "before_peer", "after_peer"):
            for dv in (0, 1):
                recs.append({"record": "stats", "label": label, "device": dv,
                             "memory_stats": {"bytes_limit": limit * (dv + 1)},
                             "gg": {"current_bytes": limit * (dv + 1) + 2 * MiB + (moved if label == "after_peer"
                                                                                   else 0)}})
        recs.append({"record": "peer", "equal": True})
        recs += [{"record": "oom", "device": dv, "refused": True, "message": "RESOURCE_EXHAUSTED"} for dv in (0, 1)]
        recs.append({"record": "done"})
        _write(os.path.join(d, "stdout.log"), _recs(*recs))
        _write(os.path.join(d, "rc.txt"), "0\n")
        _report(d, "gpuguard.python.%d.9.exit.json" % pid,
                {"devices": [{"device": i, "cap_bytes": caps[i], "denied": 0} for i in (0, 1)]})
        return d

    expect("jax", jax_run("jax_good"))
    expect("jax", jax_run("jax_peer_moved", moved=4 * MiB), ["peer"])
    expect("jax", jax_run("jax_limit_over", limit=5 * GiB),
           ["bytes_limit_dev0", "books_dev0", "bytes_limit_dev1", "books_dev1"])

    # run 2, remap
    def remap_run(name, swap_uuid=False, nvml_wrong=False):
        d = os.path.join(tmp, name)
        _write(os.path.join(d, "physical", "stdout.log"),
               _recs({"record": "config", "pid": 1, "what": "physical"}, *_views({}, U, {U[0]: REAL, U[1]: REAL}),
                     *_nvml({U[1]: REAL, U[0]: REAL}), {"record": "done"}))
        _write(os.path.join(d, "physical", "rc.txt"), "0\n")
        for case, cvd, spec in REMAP_CASES:
            c = {int(k): v for k, v in caps_of(spec).items()}
            order = [U[int(x)] for x in cvd.split(",")]
            if swap_uuid and len(order) > 1:
                order = order[::-1]
            nv = {u: REAL for u in U}
            for i, u in enumerate([U[int(x)] for x in cvd.split(",")]):
                nv[u] = c[i]
            if nvml_wrong:
                nv = {u: (c.get(i, REAL)) for i, u in enumerate(U)}
            recs = [{"record": "config", "pid": 2, "visible": cvd, "caps": {str(k): v for k, v in c.items()}}]
            recs += _views(c, order) + _nvml(nv)
            recs += [{"record": "oom", "device": 0, "refused": True, "message": "GPU 0 has a total capacity",
                      "reserved_at_refusal": c[0] - 100 * MiB}, {"record": "done"}]
            _write(os.path.join(d, case, "stdout.log"), _recs(*recs))
            _write(os.path.join(d, case, "rc.txt"), "0\n")
        return d

    expect("remap", remap_run("remap_good"))
    expect("remap", remap_run("remap_swapped", swap_uuid=True), ["ordinals", "nvml_is_cap"])
    expect("remap", remap_run("remap_nvml_by_index", nvml_wrong=True), ["nvml_by_uuid", "nvml_is_cap"])

    # run 3, ranks
    def ranks_run(name, leak_in_rank0=False, trim_both=False, names_plain=False):
        d = os.path.join(tmp, name)
        rc = {0: 20 * GiB, 1: 24 * GiB}
        pids = {0: 7000, 1: 7001}
        recs = []
        leak = ggv.marked_line(os.path.join(HERE, "ddp_leak.py"))
        for r in (0, 1):
            recs += [{"record": "config", "pid": pids[r], "rank": r, "local_rank": r, "world_size": 2,
                      "caps": {"0": rc[0], "1": rc[1]}},
                     {"record": "meminfo", "rank": r, "device": r, "free": 1, "total": rc[r]},
                     {"record": "end", "rank": r, "device": r}]
            tag = "" if names_plain else ".r%d" % r
            for seq, reason in ((1, "snapshot"), (2, "snapshot"), (3, "exit")):
                _report(d, "gpuguard.python%s.%d.%d.%s.json" % (tag, pids[r], seq, reason),
                        {"devices": [{"device": r, "cap_bytes": rc[r]}]})
            if r == 0 or trim_both:
                _report(d, "gpuguard.python%s.%d.4.trim.json" % (tag, pids[r]), {})
        _write(os.path.join(d, "stdout.log"), _recs(*recs))
        _write(os.path.join(d, "rc.txt"), "0\n")
        _write(os.path.join(d, "trim_rc.txt"), "0\n")
        _write(os.path.join(d, "trim_out.txt"), "trim of process %d (python): 0 B released\n" % pids[0])
        line0 = ("        ddp_leak.py:%d main\n" % leak) if leak_in_rank0 else ""
        _write(os.path.join(d, "show.txt"), (
            "summary\n\nsuspected leaks in python (rank 0/2, pid %d), across reports #1, #2, #3:\n%s"
            "  none: no call site's live bytes only grew\n\n"
            "suspected leaks in python (rank 1/2, pid %d), across reports #1, #2, #3:\n"
            "  call sites whose live bytes only grew, Python lines first, most first:\n    +400.0 MiB\n"
            "      #1 4.0 MiB in 1 block\n        [pytorch blocks, Python]\n        ddp_leak.py:%d main\n\n"
            "per rank (latest report of each):\n  rank 0/2 host h pid %d (#3 exit): device 0 1 GiB live\n"
            "  rank 1/2 host h pid %d (#3 exit): device 1 2 GiB live\n") % (
                pids[0], line0, pids[1], leak, pids[0], pids[1]))
        return d

    expect("ranks", ranks_run("ranks_good"))
    expect("ranks", ranks_run("ranks_leak_both", leak_in_rank0=True), ["no_leak_rank0"])
    expect("ranks", ranks_run("ranks_trim_both", trim_both=True), ["trim_one_rank"])
    expect("ranks", ranks_run("ranks_plain_names", names_plain=True), ["report_names"])

    # run 4, soak
    def soak_run(name, loss_diff=False, books_extra=0):
        d = os.path.join(tmp, name)
        for who in ("guarded", "bare"):
            sub = os.path.join(d, who)
            losses = ["0x1.%04xp-1" % i for i in range(200)]
            if loss_diff and who == "guarded":
                losses[150] = "0x1.ffffp-1"
            _write(os.path.join(sub, "losses.txt"), "\n".join(losses) + "\n")
            extra = books_extra if who == "guarded" else 0
            _write(os.path.join(sub, "stdout.log"), _recs(
                {"record": "config", "pid": 9}, {"record": "end", "steps": 200, "devices": [
                    {"device": i, "reserved": 100 * MiB, "gg": {"current_bytes": 100 * MiB + extra}} for i in (0, 1)]}))
            _write(os.path.join(sub, "rc.txt"), "0\n")
        for seq, reason in ((1, "signal"), (2, "trim"), (3, "signal"), (4, "exit")):
            _report(os.path.join(d, "guarded"), "gpuguard.python.9.%d.%s.json" % (seq, reason), {})
        _write(os.path.join(d, "signals.txt"), "SIGUSR1\nSIGUSR2\nSIGUSR1\nSIGUSR2\n")
        return d

    expect("soak", soak_run("soak_good"))
    expect("soak", soak_run("soak_loss_diff", loss_diff=True), ["losses"])
    expect("soak", soak_run("soak_books_off", books_extra=-64 * MiB), ["books_dev0", "books_dev1"])

    if failures:
        print("selftest: %d WRONG (kept in %s)" % (len(failures), tmp))
        for f in failures:
            print("  ", f)
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("selftest: every judge passed its good runs and failed its broken ones")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("torch", "jax", "remap", "ranks", "soak"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--lib", required=True)
        p.add_argument("--cli", default="gpuguard")
        p.add_argument("--summary")
        p.add_argument("--timeout", type=float, default=120)
        if name == "torch":
            p.add_argument("--mode", default="default", choices=("default", "expandable", "cudaMallocAsync"))
        if name == "soak":
            p.add_argument("--seconds", type=float, default=540)
    j = sub.add_parser("judge")
    j.add_argument("kind", choices=sorted(JUDGES))
    j.add_argument("--dir", required=True)
    j.add_argument("--summary")
    sub.add_parser("selftest")
    a = ap.parse_args()
    if a.cmd == "selftest":
        return selftest()
    if a.cmd == "judge":
        return cmd_judge(a)
    os.makedirs(a.dir, exist_ok=True)
    {"torch": cmd_torch, "jax": cmd_jax, "remap": cmd_remap, "ranks": cmd_ranks, "soak": cmd_soak}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
