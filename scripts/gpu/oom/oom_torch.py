"""A PyTorch program that runs out of memory (oom check, run.sh).

Keeps 2 GiB of tensors in use and 2 GiB cached (freed tensors the caching allocator
keeps), then takes 1 GiB tensors at OOM-LINE until torch.OutOfMemoryError. Prints one
JSON line: PyTorch's counters at the error and its message.
"""
import json

import torch

GIB = 1 << 30
keep = [torch.empty(GIB // 4, dtype=torch.uint8, device="cuda") for _ in range(8)]
tmp = [torch.empty(GIB // 4, dtype=torch.uint8, device="cuda") for _ in range(8)]
del tmp
held, msg = [], None
try:
    while len(held) < 1000:
        held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))  # OOM-LINE
except torch.OutOfMemoryError as e:
    msg = str(e)
print(json.dumps({"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                  "taken_gib": len(held), "error": (msg or "")[:400]}), flush=True)
