"""Issue 12 on the GPU: a 64 KiB tensor kept each step, found in default mode.

  gpuguard run -- python3 leak_small.py [SECONDS]     (GPUGUARD_SNAPSHOT_EVERY=1s)

Prints each step's number every 100 steps, with what the kept tensors hold by
PyTorch's own counter (`kept <unix ms> <bytes>`: memory_allocated() over its value
after the first step); the leak line is marked SMALL-LEAK-LINE.
Afterwards, `gpuguard show $GPUGUARD_DIR/*.json` must list this line first among the
suspected leaks, as [pytorch-sampled blocks, Python]; and no report may contain
"(code no longer alive)". The history list is freed just before exit (a drop at
exit): the suspect must say it was judged before that drop.
"""
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train():
    history = []
    end = time.time() + seconds
    n = 0
    base = None
    while time.time() < end:
        x = torch.randn(64, 512, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if base is None:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
        history.append(torch.empty(16384, device="cuda"))  # SMALL-LEAK-LINE
        n += 1
        if n % 100 == 0:
            torch.cuda.synchronize()
            print("step", n, flush=True)
            print("kept %d %d" % (time.time() * 1000, torch.cuda.memory_allocated() - base), flush=True)
    return n


print("steps", train(), flush=True)
