#!/usr/bin/env python3
"""CuPy leak workload (issue 6): a loop of small computations that leaks one 8 MiB
array per step (cupy.full, appended to a global list) at the line marked
GGV_LEAK_LINE below.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh (judged by scripts/gpu/leaks/leak_check.py);
by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/leaks/leak_cupy.py

CUDA is started, then about a second of Python (gpuguard's bridge measures the frame
layout and, with GPUGUARD_PYTHON=lines, installs its CuPy memory hook on this main
thread), then a prewarm chunk is allocated and dropped. After the steps in
GGV_SIGNAL_STEPS (default "10,30") it sends itself SIGUSR1 and waits (running
Python) for the signal report. Expected, default settings (no hook): CuPy's pool
cudaMallocs each request's rounded size when no cached chunk fits, so once the 64 MiB
prewarm is used up every leaked array is one cudaMalloc at the leak line, and
`gpuguard diff` of the two signal reports lists that line first as a python-stack
Python site (under cupy.full's own Python frame). With GPUGUARD_PYTHON=lines (run
with GGV_PREWARM_MIB=1024): the exit report's python_sites[0] (framework cupy, from
gpuguard's CuPy memory hook) names this file and the GGV_LEAK_LINE line.

Knobs: GGV_STEPS (40), GGV_SIGNAL_STEPS ("10,30"), GGV_LEAK_MIB (8), GGV_SIGNAL_WAIT_S (15),
GGV_STARTUP_S (1.0), GGV_PREWARM_MIB (64: a chunk allocated and dropped first, which
the first leaks are carved from; 0: off).
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
LEAK = []  # the leak: one array per step, never dropped


def leak_line():
    return tl.marked_line(os.path.abspath(__file__))


def main():
    steps, sig_steps, leak_numel, wait_s, startup_s, prewarm_mib, rep_dir = tl.leak_knobs()

    import cupy as cp

    pid = os.getpid()
    g = tl.guard()
    if not g.present:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    pool = cp.get_default_memory_pool()
    print("GGV_LEAK_SITE file=%s line=%s" % (os.path.abspath(__file__), leak_line()), flush=True)
    tl.emit("config", pid=pid, mode="default_pool", steps=steps, signal_steps=sig_steps,
            leak_bytes_per_step=leak_numel * 4, file=os.path.abspath(__file__), line=leak_line(),
            prewarm_mib=prewarm_mib, python=os.environ.get("GPUGUARD_PYTHON", "on"), cupy=cp.__version__,
            gpuguard=g.present, gpuguard_version=g.version)

    # CUDA up, then a start-up phase (data loading, in a real run): about a second of
    # Python, in which gpuguard's bridge runs at a bytecode boundary (its attempts come
    # 0, 0.2, 0.5, 1 s... after the first CUDA call): it measures the frame layout the
    # hooks need, and with GPUGUARD_PYTHON=lines installs its CuPy memory hook.
    # Allocations before that carry no Python line.
    cp.cuda.Device(0).use()
    cp.zeros(1, dtype=cp.float32)
    t0 = time.time()
    while time.time() - t0 < startup_s:
        time.sleep(0.02)

    # A warm pool: one dropped chunk the first leaked arrays are carved from (64 MiB:
    # used up by step 8; then each leaked array is a cudaMalloc at the leak line).
    if prewarm_mib:
        cp.empty(prewarm_mib * MiB, dtype=cp.uint8)  # allocated, then dropped at once
    w = cp.full((512, 512), 0.001, dtype=cp.float32)

    def step(i):
        x = cp.arange(256 * 512, dtype=cp.float32).reshape(256, 512) / (256 * 512)
        y = cp.tanh(x @ w).sum()
        LEAK.append(cp.full((leak_numel,), i, dtype=cp.float32))  # GGV_LEAK_LINE
        return float(y)

    vals = []
    last_seq = -1
    for i in range(steps):
        vals.append(step(i))
        if i in sig_steps:
            cp.cuda.Device(0).synchronize()
            os.kill(pid, signal.SIGUSR1)
            e, rep, waited = tl.wait_report(rep_dir, pid, "signal", last_seq, wait_s) if g.present else (None, None, 0)
            if e:
                last_seq = e["seq"]
            d0 = tl.dev_entry(rep, 0) or {}
            ps = (rep or {}).get("python_sites") or []
            tl.emit("signal", step=i, leaked=len(LEAK), leaked_bytes=len(LEAK) * leak_numel * 4,
                    report=e["path"] if e else None, seq=e["seq"] if e else None, waited_s=round(waited, 3),
                    pool_used=int(pool.used_bytes()), pool_total=int(pool.total_bytes()),
                    report_in_use=d0.get("in_use_bytes"), report_cached=d0.get("cached_bytes"),
                    python_sites=len(ps), top_frame=(ps[0].get("frames") or [None])[0] if ps else None,
                    top_framework=ps[0].get("framework") if ps else None)
    cp.cuda.Device(0).synchronize()
    c = g.counters(0) or {}
    tl.emit("summary", mode="default_pool", steps_done=len(vals), leaked=len(LEAK),
            leaked_bytes=len(LEAK) * leak_numel * 4, pool_used=int(pool.used_bytes()),
            pool_total=int(pool.total_bytes()), gg_current=c.get("current_bytes"))
    print("RESULT leak_cupy leaked=%d x %d MiB" % (len(LEAK), leak_numel * 4 // MiB), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
