"""Issue 12 on the GPU, CuPy: a 64 KiB array kept each step, found in default mode.

  gpuguard run -- python3 leak_small_cupy.py [SECONDS]     (GPUGUARD_SNAPSHOT_EVERY=1s)

CuPy's default memory pool. Each step does a little matrix work and keeps one
16,384-float32 array (the line marked SMALL-LEAK-LINE); the history is freed just
before exit (a drop at exit). `gpuguard show --json` over the reports must list this
line first among the suspected leaks, and no report may contain "(code no longer
alive)". Judged by check.py.
"""
import sys
import time

import cupy as cp

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
w = cp.random.standard_normal((512, 512), dtype=cp.float32) * 0.01


def train():
    global w
    history = []
    end = time.time() + seconds
    n = 0
    pool = cp.get_default_memory_pool()
    base = None
    while time.time() < end:
        x = cp.random.standard_normal((64, 512), dtype=cp.float32)
        y = cp.maximum(x @ w, 0)
        w = w - 0.001 * (x.T @ y) / 64
        if base is None:
            del x, y
            base = pool.used_bytes()
        history.append(cp.empty(16384, dtype=cp.float32))  # SMALL-LEAK-LINE
        n += 1
        if n % 100 == 0:
            cp.cuda.Device().synchronize()
            print("step", n, flush=True)
            # What the kept arrays hold by CuPy's own counter (the pool's bytes in use
            # over its value after the first step).
            print("kept %d %d" % (time.time() * 1000, pool.used_bytes() - base), flush=True)
        time.sleep(0.002)
    return n


print("steps", train(), flush=True)
