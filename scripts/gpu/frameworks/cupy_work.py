#!/usr/bin/env python3
"""CuPy workload for gpuguard validation: arrays of assorted sizes, elementwise
ops, reductions, a matmul, pinned host buffers, and (when available) a phase on
CuPy's stream-ordered MemoryAsyncPool.

Checkpoints print one JSON line comparing gpuguard's device-0 current_bytes with
  cupy.get_default_memory_pool().total_bytes()   (chunks the pool holds from the
  driver via cuMemAlloc_v2: what gpuguard should see)
  + the live bytes of the MemoryAsyncPool phase (stream-ordered blocks)
and print used_bytes()/free_bytes() next to it. A cuBLAS workspace that cuBLAS
allocates itself (outside CuPy's pool) shows as a constant extra ("explained").
Pinned memory: gpuguard_host_pinned() current vs the pinned pool's size (a
separate "pinned" line; delta from the baseline).
"""

import gc
import sys

import ggv_common as ggv

MiB = ggv.MiB


def main():
    import cupy as cp
    import numpy as np

    pool = cp.get_default_memory_pool()
    pinned_pool = cp.get_default_pinned_memory_pool()
    chk = ggv.Checker(
        "cupy", "default_pool", overhead_bound=512 * MiB,
        overhead_reason="allocations outside CuPy's memory pool (cuBLAS workspace/handle, CUDA runtime) "
                        "are visible to gpuguard, not to the pool")
    async_live = {"bytes": 0}

    def checkpoint(name, reference=True, **extra):
        cp.cuda.Device(0).synchronize()
        total = pool.total_bytes()
        info = {"pool_total_bytes": total, "pool_used_bytes": pool.used_bytes(),
                "pool_free_bytes": pool.free_bytes(), "async_pool_live_bytes": async_live["bytes"]}
        info.update(extra)
        metric = "pool.total_bytes" + ("+async_live" if async_live["bytes"] else "")
        return chk.check(name, metric, total + async_live["bytes"], info, reference=reference)

    def pinned_total():
        for attr in ("total_bytes",):
            f = getattr(pinned_pool, attr, None)
            if callable(f):
                try:
                    return int(f()), "pinned_pool." + attr
                except Exception:  # noqa: BLE001 - best effort across CuPy versions
                    pass
        return None, None

    pinned_base = chk.guard.host_pinned()
    pinned_expected = {"bytes": 0}  # own bookkeeping, rounded like CuPy (powers of two)

    def pinned_check(name):
        hp = chk.guard.host_pinned()
        pool_total, metric = pinned_total()
        expected = pool_total if pool_total is not None else pinned_expected["bytes"]
        metric = metric or "own bookkeeping (power-of-two rounding)"
        delta = None
        if hp and "current_bytes" in hp and pinned_base and "current_bytes" in pinned_base:
            delta = hp["current_bytes"] - pinned_base["current_bytes"]
        if delta is None:
            verdict, why = "no-gpuguard", "gpuguard_host_pinned unavailable"
        elif abs(delta - expected) <= ggv.TOL_BYTES:
            verdict, why = "agree", "pinned host bytes since baseline equal the pinned pool's"
        else:
            verdict, why = "mismatch", "pinned host bytes since baseline differ from the pinned pool's"
        ggv.emit({"check": name, "framework": "cupy", "mode": "pinned_pool", "framework_metric": metric,
                  "framework_bytes": expected, "gpuguard_current": delta, "diff": None if delta is None else delta - expected,
                  "gpuguard_host_pinned": hp, "own_bookkeeping": pinned_expected["bytes"],
                  "verdict": verdict, "explanation": why})

    tiny = cp.zeros(16, dtype=cp.float32)
    checkpoint("baseline", reference=False)

    # Assorted sizes: tiny, odd, just over powers of two, large.
    sizes = [1000, 4096, 65537, 1 << 20, 3 * (1 << 20) + 17, 10_000_000, 33 * (1 << 20) + 5, 128 * (1 << 20), 300_000_001]
    arrays = [cp.full(n, i % 251, dtype=cp.uint8) for i, n in enumerate(sizes)]
    floats = [cp.arange(n, dtype=cp.float32) for n in (777, 123_457, 4_000_001)]
    checkpoint("arrays", reference=False, n_arrays=len(arrays) + len(floats))

    # Free every other array (returns to the pool: total_bytes stays) and compute.
    for i in range(0, len(arrays), 2):
        arrays[i] = None
    a = cp.arange(2048 * 2048, dtype=cp.float32).reshape(2048, 2048) / 1e6
    b = cp.matmul(a, a.T)  # cuBLAS
    s = float(b.sum()) + float(cp.sort(floats[1])[-1])
    checkpoint("mid", checksum=round(s, 3))
    chk.midrun(pause_note="no CuPy work in flight while waiting")

    # Pinned host memory through CuPy's pinned pool (cudaHostAlloc underneath).
    pinned_bufs = []
    for n in (4096, 1 << 20, 16 * (1 << 20) + 3):
        pinned_bufs.append(cp.cuda.alloc_pinned_memory(n))
        # CuPy's pinned pool rounds each request up to a power of two (16 MiB + 3
        # bytes becomes one 32 MiB cudaHostAlloc), as seen on the GPU run.
        pinned_expected["bytes"] += 1 << (max(n, 1) - 1).bit_length()
    pinned_check("pinned")

    # Stream-ordered phase (cudaMallocAsync / FromPoolAsync underneath).
    async_note = None
    try:
        apool = cp.cuda.MemoryAsyncPool()
        cp.cuda.set_allocator(apool.malloc)
        async_arrays = [cp.ones(n, dtype=cp.uint8) for n in (5 * (1 << 20), 7 * (1 << 20) + 11, 64 * (1 << 20))]
        async_live["bytes"] = sum(x.nbytes for x in async_arrays)
        checkpoint("async_pool", note="MemoryAsyncPool: live stream-ordered blocks added to the framework side")
        del async_arrays
        cp.cuda.Device(0).synchronize()
        async_live["bytes"] = 0
        checkpoint("async_pool_freed")
    except Exception as e:  # noqa: BLE001 - the phase is optional
        async_note = "MemoryAsyncPool phase skipped: %r" % (e,)
        ggv.emit({"check": "async_pool", "framework": "cupy", "verdict": "info", "explanation": async_note})
    finally:
        cp.cuda.set_allocator(pool.malloc)

    checkpoint("end")
    chk.request_report()

    del arrays, floats, a, b, tiny, pinned_bufs
    gc.collect()
    pool.free_all_blocks()
    pinned_pool.free_all_blocks()
    pinned_expected["bytes"] = 0
    checkpoint("after_free_all_blocks", note="pool.free_all_blocks(): freed chunks must leave gpuguard too")
    pinned_check("pinned_after_free")

    ggv.emit({"check": "summary", "framework": "cupy", "mode": "default_pool", "verdict": "info",
              "cupy_version": cp.__version__, "numpy_version": np.__version__,
              "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "async_note": async_note,
              "gpuguard_peak": (chk.guard.counters(0) or {}).get("peak_bytes")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
