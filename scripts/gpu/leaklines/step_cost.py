"""Step cost of gpuguard's default-mode sampling of PyTorch's recorder (issue 12).

  python3 step_cost.py [--steps N] [--warmup N] [--ms-per-step X]

A training-like loop: each step makes a few tensors (matmul-sized and small
temporaries), keeps one 64 KiB tensor (the leak), and synchronizes. Prints, as JSON:
  recorder_off_us / recorder_on_us: mean step time with PyTorch's recorder off and
    on all the time (state, alloc context, Python stacks), measured here without
    gpuguard's help: the recorder's own cost per step;
  window_share: the share of time gpuguard keeps it on where allocations are dense
    (a fiftieth of the snapshot interval; a window also closes once it has seen 256
    tensor allocations, so sparse allocations cost 256 recorded allocations a report);
  estimated_cost_pct: (on - off) / off * window_share * 100, the sampling's cost
    (an upper bound for dense allocation);
  under_gpuguard_us: mean step time of this process as it runs (run it under
    `gpuguard run` with and without GPUGUARD_SNAPSHOT_EVERY to compare directly).
Works on real PyTorch (GPU) and on the stand-in of tests/python/fakefw (simulator).
"""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--warmup", type=int, default=200)
a = p.parse_args()

real = hasattr(torch, "randn")
KEEP = []


def step():
    if real:
        x = torch.randn(256, 256, device="cuda")
        y = x @ x
        t = [torch.empty(16384, device="cuda") for _ in range(3)]
        KEEP.append(torch.empty(16384, device="cuda"))  # the leak: 64 KiB a step
        del x, y, t
        torch.cuda.synchronize()
    else:
        t = [torch.empty(64 << 10) for _ in range(3)]
        KEEP.append(torch.empty(64 << 10))
        del t


def timed(n):
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n * 1e6


if real:
    torch.cuda.init()
timed(a.warmup)
mem = torch.cuda.memory
mem._record_memory_history(enabled=None)
off = timed(a.steps)
mem._record_memory_history(enabled="state", context="alloc", stacks="python")
on = timed(a.steps)
mem._record_memory_history(enabled=None)
share = 1.0 / 50
under = timed(a.steps)
print(
    json.dumps(
        {
            "torch": getattr(torch, "__version__", "stand-in"),
            "recorder_off_us": round(off, 2),
            "recorder_on_us": round(on, 2),
            "window_share": share,
            "estimated_cost_pct": round((on - off) / off * share * 100, 3),
            "under_gpuguard_us": round(under, 2),
        }
    )
)
