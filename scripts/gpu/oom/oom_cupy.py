"""A CuPy program that runs out of memory (oom check, run.sh).

Keeps 2 GiB in use and 2 GiB cached in CuPy's pool, then takes 1 GiB arrays at
OOM-LINE until cupy.cuda.memory.OutOfMemoryError. Prints one JSON line: the pool's
counters at the error and the message.
"""
import json

import cupy

GIB = 1 << 30
keep = [cupy.empty(GIB // 4, dtype=cupy.uint8) for _ in range(8)]
tmp = [cupy.empty(GIB // 4, dtype=cupy.uint8) for _ in range(8)]
del tmp
held, msg = [], None
try:
    while len(held) < 1000:
        held.append(cupy.empty(GIB, dtype=cupy.uint8))  # OOM-LINE
except cupy.cuda.memory.OutOfMemoryError as e:
    msg = str(e)
pool = cupy.get_default_memory_pool()
print(json.dumps({"used": pool.used_bytes(), "total": pool.total_bytes(), "taken_gib": len(held),
                  "error": (msg or "")[:400]}), flush=True)
