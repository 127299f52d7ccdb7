"""gpuguard's out-of-memory test with the PyTorch stand-in (tests/python/fakefw):
the simulated device (SIMCUDA_MEM) filled with 16 MiB tensors, half of them freed
(the allocator keeps their blocks cached), then a 32 MiB tensor the driver refuses;
then a wait (bounded) for gpuguard's oom report in GPUGUARD_DIR, the tensors and the
cache as they were.

  oom_torch.py
"""
import os
import time

import torch

MiB = 1 << 20
n = int(os.environ["SIMCUDA_MEM"]) // (16 * MiB)
tensors = [torch.empty(16 * MiB) for _ in range(n)]
del tensors[: n // 2]
try:
    big = torch.empty(32 * MiB)  # REFUSED-LINE
except MemoryError:
    pass
d = os.environ["GPUGUARD_DIR"]
for _ in range(60000):
    if any(f.endswith(".oom.json") for f in os.listdir(d)):
        break
    time.sleep(0.001)
print("OK")
