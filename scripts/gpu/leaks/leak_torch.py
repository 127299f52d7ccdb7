#!/usr/bin/env python3
"""PyTorch leak workload (issue 6): a small MLP training loop that leaks one 8 MiB
tensor per step into a global list, at the line marked GGV_LEAK_LINE below.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh (judged by scripts/gpu/leaks/leak_check.py);
by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/leaks/leak_torch.py

Allocator mode from the environment only (PYTORCH_CUDA_ALLOC_CONF unset,
expandable_segments:True, backend:cudaMallocAsync). GPUGUARD_SNAPSHOT_EVERY must be
unset. CUDA is started first, then about a second of Python (a start-up phase, in
which gpuguard's bridge measures the frame layout and, with GPUGUARD_PYTHON=lines,
turns PyTorch's recorder on), then a small prewarm block is allocated and dropped,
then the loop. After the steps listed in GGV_SIGNAL_STEPS (default "10,30") the
script sends itself SIGUSR1 (gpuguard's report signal) and waits, running Python (a
50 ms poll, so that gpuguard's pending call runs on this main thread), for the new
signal report. The exit report is written at exit (from Python's atexit).

Expected, default settings (GPUGUARD_PYTHON unset: no recorder; Python lines from
the allocating thread's stack, framework "python-stack"): the leak keeps PyTorch's
cache growing once the 64 MiB prewarm is used up, so `gpuguard diff` of the two
signal reports lists this file's GGV_LEAK_LINE first, as a Python site; with
backend:cudaMallocAsync each leaked tensor is one allocation and the exit report's
python-stack site for that line holds all the leaked bytes. With
GPUGUARD_PYTHON=lines (run with GGV_PREWARM_MIB=1024, so that the leak never grows
the cache): python_sites[0] is that line, framework "pytorch", with exactly the
leaked bytes. Every mode: devices[0].in_use_bytes >= the leaked bytes.

Output: GGV_LEAK_SITE file=... line=N (where the leak is), GGV_JSON records
("config", "signal", "summary"). Knobs: GGV_STEPS (40), GGV_SIGNAL_STEPS ("10,30"),
GGV_LEAK_MIB (8), GGV_SIGNAL_WAIT_S (15), GGV_STARTUP_S (1.0), GGV_PREWARM_MIB (64: a
block allocated and dropped before the loop, which the first leaks are carved from;
0: off).
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
LEAK = []  # the leak: one tensor per step, never dropped


def leak_line():
    return tl.marked_line(os.path.abspath(__file__))


def main():
    steps, sig_steps, leak_numel, wait_s, startup_s, prewarm_mib, rep_dir = tl.leak_knobs()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    pid = os.getpid()
    g = tl.guard()
    if not g.present:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1234)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    mode = "cudaMallocAsync" if "cudaMallocAsync" in conf else "expandable" if "expandable_segments:True" in conf \
        else "default"
    print("GGV_LEAK_SITE file=%s line=%s" % (os.path.abspath(__file__), leak_line()), flush=True)
    tl.emit("config", pid=pid, mode=mode, backend=torch.cuda.memory.get_allocator_backend(), steps=steps,
            signal_steps=sig_steps, leak_bytes_per_step=leak_numel * 4, file=os.path.abspath(__file__),
            line=leak_line(), prewarm_mib=prewarm_mib, python=os.environ.get("GPUGUARD_PYTHON", "on"),
            torch=torch.__version__, gpuguard=g.present, gpuguard_version=g.version)

    # CUDA up, then a start-up phase (data loading, in a real run): about a second of
    # Python, in which gpuguard's bridge runs at a bytecode boundary (its attempts come
    # 0, 0.2, 0.5, 1 s... after the first CUDA call): it measures the frame layout the
    # hooks need to read this thread's Python stack, and with GPUGUARD_PYTHON=lines
    # turns PyTorch's recorder on. Allocations before that carry no Python line.
    torch.zeros(1, device=dev)
    t0 = time.time()
    while time.time() - t0 < startup_s:
        time.sleep(0.02)

    # A warm cache, as in a real training run: a dropped block the first leaked tensors
    # are then carved from. Default 64 MiB: used up by step 8, after which the leak
    # makes PyTorch grow its cache (new segments, or mapped pages with expandable
    # segments) at the leak line, which is what names the line without a recorder.
    # With GPUGUARD_PYTHON=lines the runner sets 1024 MiB: the leak then never grows
    # the cache, and only the recorder's block-exact lines can name it.
    warm = torch.empty(prewarm_mib * MiB, dtype=torch.uint8, device=dev) if prewarm_mib else None
    del warm
    # Small on purpose: the leak (40 x 8 MiB) must be the largest Python site.
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i):
        x = torch.randn(256, 512, device=dev)
        loss = F.mse_loss(model(x), torch.tanh(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        LEAK.append(torch.full((leak_numel,), float(i), device=dev))  # GGV_LEAK_LINE
        return loss.item()

    losses = []
    last_seq = -1
    for i in range(steps):
        losses.append(step(i))
        if i in sig_steps:
            torch.cuda.synchronize()
            t0 = time.time()
            os.kill(pid, signal.SIGUSR1)
            e, rep, waited = tl.wait_report(rep_dir, pid, "signal", last_seq, wait_s) if g.present else (None, None, 0)
            if e:
                last_seq = e["seq"]
            d0 = tl.dev_entry(rep, 0) or {}
            ps = (rep or {}).get("python_sites") or []
            tl.emit("signal", step=i, leaked=len(LEAK), leaked_bytes=len(LEAK) * leak_numel * 4,
                    report=e["path"] if e else None, seq=e["seq"] if e else None, waited_s=round(waited, 3),
                    allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(),
                    report_in_use=d0.get("in_use_bytes"), report_cached=d0.get("cached_bytes"),
                    python_sites=len(ps), top_frame=(ps[0].get("frames") or [None])[0] if ps else None,
                    top_framework=ps[0].get("framework") if ps else None, t=round(t0, 3))
    torch.cuda.synchronize()
    c = g.counters(0) or {}
    tl.emit("summary", mode=mode, steps_done=len(losses), losses=losses, leaked=len(LEAK),
            leaked_bytes=len(LEAK) * leak_numel * 4, allocated=torch.cuda.memory_allocated(),
            reserved=torch.cuda.memory_reserved(), gg_current=c.get("current_bytes"))
    print("RESULT leak_torch mode=%s leaked=%d x %d MiB" % (mode, len(LEAK), leak_numel * 4 // MiB), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
