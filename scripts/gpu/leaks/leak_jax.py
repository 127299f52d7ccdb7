#!/usr/bin/env python3
"""JAX leak workload (issue 6), informational: jitted steps that keep one 8 MiB
array per step in a global list (line marked GGV_LEAK_LINE). gpuguard cannot see
inside XLA's arena, so this records what the exit report says (classification
entries, in_use/cached, python_sites) without judging it.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh; by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/leaks/leak_jax.py

Knobs: GGV_STEPS (40), GGV_LEAK_MIB (8), GGV_ALLOW_CPU=1 (try it without a GPU).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "trim"))
import tl_common as tl  # noqa: E402

MiB = tl.MiB
LEAK = []


def leak_line():
    marker = "# GGV_" + "LEAK_LINE"
    with open(os.path.abspath(__file__)) as f:
        for i, ln in enumerate(f, 1):
            if ln.rstrip().endswith(marker):
                return i
    return None


def main():
    steps = int(os.environ.get("GGV_STEPS", "40"))
    leak_numel = int(float(os.environ.get("GGV_LEAK_MIB", "8")) * MiB) // 4

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
            file=os.path.abspath(__file__), line=leak_line(), jax=jax.__version__, gpuguard=g.present,
            gpuguard_version=g.version)
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
