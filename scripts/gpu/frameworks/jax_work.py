#!/usr/bin/env python3
"""JAX workload for gpuguard validation: jit'd matmuls of several sizes and MLP
training steps.

At each checkpoint (baseline, warmup, mid, end, after_delete) it blocks on all
results and prints one JSON line comparing gpuguard's device-0 current_bytes
with jax.devices()[0].memory_stats():
  compared:  pool_bytes (what XLA's BFC allocator holds from the driver; with the
             default preallocation this is ~75% of the device, physically backed
             through cuMemCreate), falling back to bytes_reserved, then
             bytes_in_use when a key is absent.
  printed:   bytes_in_use, peak_bytes_in_use, bytes_limit, bytes_reserved,
             pool_bytes, peak_pool_bytes, largest_free_block_bytes (where present)
Small cuMemAlloc_v2 allocations XLA makes outside the BFC pool are visible to
gpuguard only: they must show as a constant extra ("explained").

Mode comes from the environment: XLA_PYTHON_CLIENT_PREALLOCATE=false gives mode
"on_demand" (the pool grows as needed); XLA_PYTHON_CLIENT_ALLOCATOR, if set, is
appended to the mode name. Knobs: GGV_JAX_STEPS (default 200), GGV_JAX_MAX_N
(largest matmul size, default 8192), GGV_ALLOW_CPU=1 (test the script on CPU).
"""

import gc
import os
import sys
import time

import ggv_common as ggv

MiB = ggv.MiB


def mode_name():
    pre = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").strip().lower()
    m = "on_demand" if pre in ("false", "0", "no") else "prealloc"
    alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    if alloc:
        m += "+" + alloc
    frac = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if frac:
        m += "+frac" + frac
    return m


def main():
    import jax
    import jax.numpy as jnp

    steps = int(os.environ.get("GGV_JAX_STEPS", "200"))
    mode = mode_name()
    devs = jax.devices()
    dev = devs[0]
    if dev.platform != "gpu" and os.environ.get("GGV_ALLOW_CPU") != "1":  # GGV_ALLOW_CPU: test the script on CPU
        print("jax default device is %s, not a GPU" % dev.platform, file=sys.stderr)
        return 2

    chk = ggv.Checker(
        "jax", mode, overhead_bound=512 * MiB,
        overhead_reason="driver allocations outside XLA's BFC pool (small cuMemAlloc_v2 for "
                        "runtime/library scratch) are visible to gpuguard, not to memory_stats")

    keys = ["bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved", "peak_bytes_reserved",
            "pool_bytes", "peak_pool_bytes", "largest_free_block_bytes", "num_allocs"]

    def checkpoint(name, live, reference=True, **extra):
        for x in live:
            jax.block_until_ready(x)
        s = dev.memory_stats() or {}
        if s.get("pool_bytes") is not None:
            metric, fw = "memory_stats.pool_bytes", s["pool_bytes"]
        elif s.get("bytes_reserved"):
            metric, fw = "memory_stats.bytes_reserved", s["bytes_reserved"]
        else:
            metric, fw = "memory_stats.bytes_in_use", s.get("bytes_in_use")
        info = {"jax_stats": {k: s[k] for k in keys if k in s}, "stats_keys": sorted(s)}
        info.update(extra)
        return chk.check(name, metric, fw, info, reference=reference)

    key = jax.random.PRNGKey(0)
    tiny = jax.device_put(jnp.zeros((16,), jnp.float32), dev)
    checkpoint("baseline", [tiny], reference=False)

    # --- MLP with an SGD step --------------------------------------------------
    widths = [1024, 4096, 4096, 2048, 1024]
    params = []
    for i in range(len(widths) - 1):
        key, k1 = jax.random.split(key)
        w = jax.random.normal(k1, (widths[i], widths[i + 1]), jnp.float32) / jnp.sqrt(widths[i])
        params.append((w, jnp.zeros((widths[i + 1],), jnp.float32)))

    def mlp(ps, x):
        for j, (w, b) in enumerate(ps):
            x = x @ w + b
            if j < len(ps) - 1:
                x = jax.nn.gelu(x)
        return x

    def loss_fn(ps, x, y):
        return jnp.mean((mlp(ps, x) - y) ** 2)

    @jax.jit
    def sgd_step(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        ps = jax.tree_util.tree_map(lambda p, g: p - 1e-2 * g, ps, grads)
        return ps, loss

    @jax.jit
    def mm(a, b):
        return jnp.tanh(a @ b).astype(a.dtype)

    max_n = int(os.environ.get("GGV_JAX_MAX_N", "8192"))
    sizes = [n for n in (512, 1536, 3000, 4096, 8192) if n <= max_n]  # several shapes -> buffer sizes
    mats = []
    for n in sizes:
        key, k1, k2 = jax.random.split(key, 3)
        mats.append((jax.random.normal(k1, (n, n), jnp.bfloat16), jax.random.normal(k2, (n, n), jnp.bfloat16)))

    batch = 2048
    key, kx = jax.random.split(key)
    x = jax.random.normal(kx, (batch, widths[0]), jnp.float32)
    y = jnp.sin(x[:, : widths[-1]])

    losses = []
    outs = []

    def step(i):
        nonlocal params
        params, loss = sgd_step(params, x, y)
        a, b = mats[i % len(mats)]
        outs.append(mm(a, b))
        if len(outs) > 3:
            outs.pop(0)
        losses.append(loss)

    t0 = time.perf_counter()
    for i in range(len(sizes)):
        step(i)
    checkpoint("warmup", [params, losses[-1]] + outs, compile_and_warmup_s=round(time.perf_counter() - t0, 3))

    half = steps // 2
    t0 = time.perf_counter()
    for i in range(half):
        step(i)
    checkpoint("mid", [params, losses[-1]] + outs)
    t_half = time.perf_counter() - t0
    chk.midrun(pause_note="no JAX work in flight while waiting")

    t0 = time.perf_counter()
    for i in range(half, steps):
        step(i)
    jax.block_until_ready(params)
    t_rest = time.perf_counter() - t0
    checkpoint("end", [params, losses[-1]] + outs)
    chk.request_report()

    loss_values = [round(float(v), 5) for v in losses]
    # Drop the arrays (the step closure holds these names, so clear/rebind, not del).
    mats.clear()
    outs.clear()
    losses.clear()
    x = y = None
    gc.collect()
    checkpoint("after_delete", [params],
               note="arrays deleted: XLA returns them to its pool, which keeps its memory; "
                    "gpuguard should still equal pool_bytes")

    ggv.emit({
        "check": "summary",
        "framework": "jax",
        "mode": mode,
        "verdict": "info",
        "jax_version": jax.__version__,
        "devices": [str(d) for d in devs],
        "steps": steps,
        "steps_per_s": round(steps / (t_half + t_rest), 3) if (t_half + t_rest) > 0 else None,
        "loss_first": loss_values[0] if loss_values else None,
        "loss_last": loss_values[-1] if loss_values else None,
        "gpuguard_peak": (chk.guard.counters(0) or {}).get("peak_bytes"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
