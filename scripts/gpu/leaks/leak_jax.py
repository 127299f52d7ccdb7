#!/usr/bin/env python3
"""JAX leak workload (issue 6): jitted steps that keep one 8 MiB array per step in
a global list (line marked GGV_LEAK_LINE), under JAX's defaults (preallocated arena).

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh (judged by scripts/gpu/leaks/leak_check.py);
by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/leaks/leak_jax.py

Expected in the exit report (taken at Python's atexit, while the arrays are alive):
classification jax "classified" (totals from JAX's memory_stats()); a python_sites
entry of framework "jax" (from jax.profiler.device_memory_profile()) naming this
file's GGV_LEAK_LINE line with at least the leaked bytes; devices[0].in_use_bytes
(JAX's bytes_in_use) at least the leaked bytes, cached_bytes the rest of its arena.

Knobs: GGV_STEPS (40), GGV_LEAK_MIB (8), GGV_STARTUP_S (1.0: Python run between JAX's start
and the loop), GGV_ALLOW_CPU=1 (try it without a GPU).
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
LEAK = []


def leak_line():
    return tl.marked_line(os.path.abspath(__file__))


def main():
    steps = int(os.environ.get("GGV_STEPS", "40"))
    leak_numel = int(float(os.environ.get("GGV_LEAK_MIB", "8")) * MiB) // 4
    startup_s = float(os.environ.get("GGV_STARTUP_S", "1.0"))

    import jax
    import jax.numpy as jnp

    pid = os.getpid()
    g = tl.guard()
    dev = jax.devices()[0]
    if dev.platform != "gpu" and os.environ.get("GGV_ALLOW_CPU") != "1":
        print("jax default device is %s, not a GPU" % dev.platform, file=sys.stderr)
        return 2
    print("GGV_LEAK_SITE file=%s line=%s" % (os.path.abspath(__file__), leak_line()), flush=True)
    tl.emit("config", pid=pid, mode="default", steps=steps, leak_bytes_per_step=leak_numel * 4,
            file=os.path.abspath(__file__), line=leak_line(), python=os.environ.get("GPUGUARD_PYTHON", "on"),
            jax=jax.__version__, gpuguard=g.present, gpuguard_version=g.version)
    # JAX's GPU backend is up (jax.devices() started it: the first CUDA calls). A
    # start-up phase (data loading, in a real run): about a second of Python, in which
    # gpuguard's bridge runs at a bytecode boundary and registers its atexit hook, which
    # writes the exit report while the leaked arrays are still alive.
    t0 = time.time()
    while time.time() - t0 < startup_s:
        time.sleep(0.02)
    w = jnp.full((512, 512), 0.001, jnp.float32)
    f = jax.jit(lambda x: jnp.tanh(x @ w).sum())
    vals = []
    for i in range(steps):
        x = jnp.arange(256 * 512, dtype=jnp.float32).reshape(256, 512) / (256 * 512)
        vals.append(float(f(x)))
        LEAK.append(jnp.full((leak_numel,), i, dtype=jnp.float32))  # GGV_LEAK_LINE
    jax.block_until_ready(LEAK)
    try:
        st = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001
        st = {}
    c = g.counters(0) or {}
    tl.emit("summary", steps_done=len(vals), leaked=len(LEAK), leaked_bytes=len(LEAK) * leak_numel * 4,
            bytes_in_use=st.get("bytes_in_use"), pool_bytes=st.get("pool_bytes"), gg_current=c.get("current_bytes"))
    print("RESULT leak_jax leaked=%d x %d MiB" % (len(LEAK), leak_numel * 4 // MiB), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
