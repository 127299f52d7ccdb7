#!/usr/bin/env python3
"""JAX cap workload (run with GPUGUARD_CAP set; default cap 4 GiB).

Mode from the environment, as in frameworks/jax_work.py:
  (default)                             -> "prealloc": XLA preallocates 75% of what
                                           cuMemGetInfo says the device holds, which
                                           under the cap is 75% of the cap
  XLA_PYTHON_CLIENT_ALLOCATOR=platform  -> "platform": every buffer is its own driver
                                           allocation, so gpuguard's cap (not XLA's
                                           arena) is what refuses
  XLA_PYTHON_CLIENT_PREALLOCATE=false   -> "on_demand"

Steps (PASS/FAIL lines, see caps_common.py):
  1. Before JAX: the primary context through ctypes (so the baseline holds the
     context), cuDeviceTotalMem_v2 / cuMemGetInfo_v2 == cap; GGV_BASELINE.
  2. import jax; jax.devices(): JAX starts; memory_stats()["bytes_limit"] <= cap
     (required in prealloc mode); NVML inside the process total == cap; gpuguard
     current <= cap. GGV_MARK started.
  3. A matmul; then one array larger than the cap: JAX's own OOM
     (XlaRuntimeError/JaxRuntimeError, RESOURCE_EXHAUSTED or "out of memory").
  4. 256 MiB arrays until JAX runs out (prealloc: its arena; platform: the cap,
     where the refusal must be at the cap and a cap report must appear). GGV_MARK filled.
  5. Free them; JAX keeps working (new arrays, a matmul); NVML and C API again.
"""

import gc
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import caps_common as cc  # noqa: E402

MiB, GiB, CAP = cc.MiB, cc.GiB, cc.CAP


def mode_name():
    alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower()
    if alloc == "platform":
        return "platform"
    pre = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").strip().lower()
    m = "on_demand" if pre in ("false", "0", "no") else "prealloc"
    if alloc:
        m += "+" + alloc
    return m


def first_line(e, n=300):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:n]


def is_jax_oom(e):
    if e is None:
        return False
    name = type(e).__name__
    text = str(e)
    return name in ("XlaRuntimeError", "JaxRuntimeError") and (
        "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower())


def body(ck):
    mode = mode_name()
    drv = cc.Driver()
    if drv.ok:
        rc, _ = drv.primary_ctx(0)  # the context JAX will use (XLA retains the primary context)
        ck.ok("primary_context", rc == 0, "cuDevicePrimaryCtxRetain before JAX: %s" % drv.err(rc))
    ck.check_driver_view(drv, "driver_view")
    ck.baseline()

    import jax
    import jax.numpy as jnp

    devs = jax.devices()
    dev = devs[0]
    if not ck.ok("jax_started", dev.platform == "gpu", "jax %s, mode %s, devices %s (XLA_PYTHON_CLIENT_* %s)" % (
            jax.__version__, mode, devs,
            {k: v for k, v in os.environ.items() if k.startswith("XLA_PYTHON_CLIENT")})):
        return
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit")
    keys = ("bytes_limit", "bytes_in_use", "pool_bytes", "bytes_reserved", "peak_bytes_in_use")
    text = "memory_stats: %s" % (", ".join("%s %s" % (k, cc.mib(stats.get(k))) for k in keys if k in stats)
                                  or "no values")
    if mode == "prealloc" or limit is not None:
        ck.ok("bytes_limit_within_cap", limit is not None and limit <= CAP,
              "%s; cap %s (want bytes_limit <= cap)" % (text, cc.mib(CAP)), memory_stats=stats)
    else:
        ck.info("memory_stats", text + " (no bytes_limit: nothing to compare with the cap)", memory_stats=stats)
    ck.open_nvml()
    ck.check_nvml("nvml_after_start")
    c = ck.counters()
    ck.ok("started_within_cap", c.get("cap_bytes") == CAP and (c.get("current_bytes") or 0) <= CAP,
          "after JAX started: gpuguard cap_bytes %s current %s (XLA pool_bytes %s)" % (
              c.get("cap_bytes"), cc.mib(c.get("current_bytes")), cc.mib(stats.get("pool_bytes"))))
    ck.mark("started", hold=0.6)

    a = jnp.ones((2048, 2048), jnp.float32)
    v = float((a @ a)[0, 0])
    ck.ok("compute", v == 2048.0, "ones(2048,2048) @ itself: [0,0] = %s (want 2048)" % v)

    # ---- one array larger than the cap -------------------------------------------------------
    err, err_text = None, ""
    try:
        big = jnp.ones(((CAP + GiB) // 4,), jnp.float32)
        big.block_until_ready()
        big = None
    except Exception as e:  # noqa: BLE001
        err = e
        err_text = "%s: %s" % (type(e).__name__, first_line(e))
    ck.ok("oom_larger_than_cap", is_jax_oom(err),
          "jnp.ones of %s -> %s" % (cc.mib(CAP + GiB), err_text if err is not None else "NO ERROR"))
    err = None

    # ---- fill with 256 MiB arrays until JAX runs out -------------------------------------------------
    arrs, stop, stop_text = [], None, ""
    for i in range(CAP // (256 * MiB) + 8):
        try:
            arrs.append(jnp.full((64 * MiB,), float(i), jnp.float32))  # 256 MiB
            arrs[-1].block_until_ready()
        except Exception as e:  # noqa: BLE001
            stop = e
            stop_text = "%s: %s" % (type(e).__name__, first_line(e))
            break
    n_ok = len(arrs)
    if stop is not None and arrs:
        try:
            arrs[-1].block_until_ready()
        except Exception:  # noqa: BLE001  (the one that failed at execution is in the list)
            arrs.pop()
            n_ok -= 1
    charged = ck.charged()
    headroom = None if charged is None else CAP - charged
    c = ck.counters()
    good = is_jax_oom(stop)
    if mode == "platform":
        good = good and cc.refusal_at_cap(headroom, 256 * MiB)
    ck.ok("fill_oom", good, "%d x 256 MiB arrays, then %s; gpuguard charged %s (headroom %s), denied %s%s" % (
        n_ok, stop_text or "NO ERROR", cc.mib(charged), cc.mib(headroom), c.get("denied"),
        "" if mode == "platform" else " (the arena refuses inside XLA here; the cap is not reached)"))
    stop = None
    ck.mark("filled", hold=0.8)
    if mode == "platform" or (c.get("denied") or 0) > 0:
        ck.check_cap_report()
    else:
        ck.info("cap_report", "none expected: gpuguard refused nothing (denied %s); XLA's arena (bytes_limit %s) "
                "sits inside the cap" % (c.get("denied"), cc.mib(limit)))

    # ---- free and go on ------------------------------------------------------------------------------
    arrs.clear()
    gc.collect()
    err_text = None
    try:
        y = jnp.full((64 * MiB,), 2.0, jnp.float32)
        s = float(y[:1024].sum())
        z = float(jnp.tanh(a @ a / 2048.0).mean())
        ok = s == 2048.0 and math.isfinite(z)
        y = None
    except Exception as e:  # noqa: BLE001
        ok, err_text = False, "%s: %s" % (type(e).__name__, first_line(e))
    ck.ok("continues_after_oom", ok, "after freeing: a new 256 MiB array and a matmul work%s" % (
        (" -- ERROR " + err_text) if err_text else ""))
    ck.check_nvml("nvml_end")
    ck.check_capi("capi_end", min_denied=1 if mode == "platform" else 0)
    stats = dev.memory_stats() or {}
    c = ck.counters()
    ck.info("end", "memory_stats %s; gpuguard %s" % (
        {k: stats.get(k) for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use", "pool_bytes",
                                   "num_allocs") if k in stats},
        {k: c.get(k) for k in ("cap_bytes", "current_bytes", "peak_bytes", "allocs", "frees", "failed", "denied")}))


if __name__ == "__main__":
    sys.exit(cc.Checks(os.environ.get("GGV_WORKLOAD", "jax_" + mode_name())).run(body))
