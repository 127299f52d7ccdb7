"""A PyTorch job for the metrics check (run.sh): holds GIB GiB in use and 1 GiB cached.

  python3 job_torch.py GIB DIR NAME

Writes DIR/NAME.ready (JSON: PyTorch's counters) once settled, holds until DIR/stop.
"""
import json
import os
import sys
import time

import torch

gib, d, name = float(sys.argv[1]), sys.argv[2], sys.argv[3]
MIB = 1 << 20
keep = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(int(gib * 16))]
tmp = [torch.empty(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(16)]
del tmp
torch.cuda.synchronize()
fw = {"pid": os.getpid(), "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
with open(os.path.join(d, name + ".ready.tmp"), "w") as f:
    json.dump(fw, f)
os.rename(os.path.join(d, name + ".ready.tmp"), os.path.join(d, name + ".ready"))
end = time.time() + 300
while not os.path.exists(os.path.join(d, "stop")) and time.time() < end:
    time.sleep(0.1)
