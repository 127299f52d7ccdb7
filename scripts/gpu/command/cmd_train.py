#!/usr/bin/env python3
"""The `command` suite's workload (issue 13): a PyTorch training loop with a planted
leak, run under `gpuguard run --cap 20GiB --trace ... --dir ...` by
scripts/gpu/suites/command.sh, which uses `gpuguard ps`, `show --leaks` and `trim`
on it while it runs.

Phases (wall-clock driven, so the run lasts GGV_CMD_SECONDS whatever the GPU's speed):
  1. CUDA up, a start-up second (gpuguard's Python bridge measures the frame layout),
     then a trim bait: GGV_CMD_BAIT_MIB of 1 MiB tensors, dropped (PyTorch's small
     pool keeps them cached; the leak, 8 MiB, is a large-pool block and never reuses
     them). Prints GGV_CMD_LEAKING pid=N.
  2. Training (a small MLP, as scripts/gpu/leaks/leak_torch.py: its temporaries stay
     in the small pool) and one GGV_LEAK_MIB tensor kept every GGV_LEAK_EVERY_S at the
     line marked GGV_LEAK_LINE. After GGV_CMD_READY_S of this: GGV_CMD_READY pid=N.
  3. The same until GGV_CMD_SECONDS have passed since the start; then a summary
     record, exit 0 (the exit report is written at exit).

GGV_COMMAND_WORKLOAD=stand-in runs the same phases on tests/python/fakefw's `torch`
(PYTHONPATH=tests/python/fakefw, LD_LIBRARY_PATH=<sim dir of tests/sim/build.sh>):
torch.empty(nbytes) over the simulated runtime; the leak is a cudaMalloc through ctypes
at the line marked GGV_STANDIN_LEAK_LINE. For checking the suite on a CPU machine only.

Output: GGV_LEAK_SITE file=... line=N, GGV_CMD_LEAKING pid=N, GGV_CMD_READY pid=N,
GGV_JSON records ("config", "summary"), RESULT line.
Knobs: GGV_CMD_SECONDS (75), GGV_CMD_READY_S (16), GGV_LEAK_MIB (8),
GGV_LEAK_EVERY_S (0.25), GGV_CMD_BAIT_MIB (512).
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
LEAK = []  # the leak: one tensor every GGV_LEAK_EVERY_S, never dropped
STANDIN = os.environ.get("GGV_COMMAND_WORKLOAD", "torch") == "stand-in"


def knobs():
    e = os.environ.get
    return (float(e("GGV_CMD_SECONDS", "75")), float(e("GGV_CMD_READY_S", "16")), int(e("GGV_LEAK_MIB", "8")),
            float(e("GGV_LEAK_EVERY_S", "0.25")), int(e("GGV_CMD_BAIT_MIB", "512")))


def run_standin(torch, leak_bytes, bait_mib, phase):
    """The fake torch of tests/python/fakefw: allocations only."""
    import ctypes

    import simrt  # tests/python/fakefw
    torch.cuda._lazy_init()
    bait = [torch.empty(MiB) for _ in range(bait_mib)]
    del bait  # cached by the stand-in's allocator, released by empty_cache()

    rt = simrt.rt()

    def step(i):
        tmp = [torch.empty(256 * 1024) for _ in range(4)]  # temporaries, reused from the cache
        del tmp
        # The runtime called from this line, as torch.full's C code is from run_torch's
        # leak line (the stand-in's torch.empty would add its own Python frames).
        p = ctypes.c_void_p(0)
        rc = rt.cudaMalloc(ctypes.byref(p), leak_bytes)  # GGV_STANDIN_LEAK_LINE
        if rc != 0:
            raise MemoryError("cudaMalloc(%d): %d" % (leak_bytes, rc))
        LEAK.append(p.value)
        return 0.0

    return phase(step, lambda: None, lambda: {"allocated": torch.cuda.memory_allocated(),
                                              "reserved": torch.cuda.memory_reserved()})


def run_torch(torch, leak_bytes, bait_mib, phase):
    import torch.nn as nn
    import torch.nn.functional as F

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1234)
    torch.zeros(1, device=dev)
    t0 = time.time()
    while time.time() - t0 < 1.0:  # start-up: the bridge runs at a bytecode boundary
        time.sleep(0.02)
    bait = [torch.empty(MiB, dtype=torch.uint8, device=dev) for _ in range(bait_mib)]
    del bait  # 1 MiB blocks: PyTorch's small pool keeps them cached until a trim
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    numel = leak_bytes // 4

    def step(i):
        x = torch.randn(256, 512, device=dev)
        loss = F.mse_loss(model(x), torch.tanh(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        LEAK.append(torch.full((numel,), float(i), device=dev))  # GGV_LEAK_LINE
        return loss.item()

    return phase(step, torch.cuda.synchronize, lambda: {"allocated": torch.cuda.memory_allocated(),
                                                         "reserved": torch.cuda.memory_reserved()})


def main():
    secs, ready_s, leak_mib, every, bait_mib = knobs()
    t_start = time.time()
    import torch

    pid = os.getpid()
    me = os.path.abspath(__file__)
    line = tl.marked_line(me, "# GGV_STANDIN_LEAK_LINE" if STANDIN else "# GGV_" + "LEAK_LINE")
    print("GGV_LEAK_SITE file=%s line=%s" % (me, line), flush=True)
    tl.emit("config", pid=pid, workload="stand-in" if STANDIN else "torch", seconds=secs, ready_s=ready_s,
            leak_bytes=leak_mib * MiB, leak_every_s=every, bait_mib=bait_mib, file=me, line=line,
            torch=getattr(torch, "__version__", "stand-in"),
            backend=torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else None,
            gpuguard=tl.guard().present)

    def phase(step, sync, mem):
        print("GGV_CMD_LEAKING pid=%d" % pid, flush=True)
        t_leak = time.time()
        ready = False
        losses = []
        i = 0
        next_leak = time.time()
        while time.time() - t_start < secs or not ready:
            now = time.time()
            if now >= next_leak:
                losses.append(step(i))
                i += 1
                next_leak = now + every
            else:
                time.sleep(min(0.01, next_leak - now))
            if not ready and time.time() - t_leak >= ready_s:
                sync()
                ready = True
                print("GGV_CMD_READY pid=%d leaked=%d" % (pid, len(LEAK)), flush=True)
        sync()
        return losses, mem()

    losses, m = (run_standin if STANDIN else run_torch)(torch, leak_mib * MiB, bait_mib, phase)
    tl.emit("summary", steps_done=len(losses), leaked=len(LEAK), leaked_bytes=len(LEAK) * leak_mib * MiB,
            elapsed_s=round(time.time() - t_start, 2), last_loss=losses[-1] if losses else None, **m)
    print("RESULT cmd_train leaked=%d x %d MiB in %.1f s" % (len(LEAK), leak_mib, time.time() - t_start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
