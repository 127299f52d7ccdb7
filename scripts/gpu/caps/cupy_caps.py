#!/usr/bin/env python3
"""CuPy cap workload (run with GPUGUARD_CAP set; default cap 4 GiB). CuPy's static
CUDA runtime reaches the driver through cuGetProcAddress (path 3).

Steps (PASS/FAIL lines, see caps_common.py):
  1. cupy.cuda.runtime.memGetInfo() before any allocation: total == cap, free <= cap;
     cuDeviceTotalMem_v2 / cuMemGetInfo_v2 through ctypes: the cap. GGV_BASELINE.
  2. A warm-up matmul (cuBLAS handle); GGV_MARK warm.
  3. Fill with cupy.empty of 256, then 64, then 16 MiB until each size raises
     cupy.cuda.memory.OutOfMemoryError, each refusal at the cap (headroom below the
     request + 64 MiB slack).
  4. At the cap: memGetInfo total == cap, free <= cap - charge; NVML inside the
     process; C API; the cap report. GGV_MARK at_cap.
  5. Free the arrays (the pool keeps its chunks) and go on: an array of 3/4 of the
     cap, filled and summed; free_all_blocks; GGV_MARK after_free.
  6. One array larger than the cap: OutOfMemoryError; matmuls go on.
"""

import gc
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import caps_common as cc  # noqa: E402

MiB, GiB, CAP = cc.MiB, cc.GiB, cc.CAP


def first_line(e, n=300):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:n]


def body(ck):
    import cupy as cp

    OOM = cp.cuda.memory.OutOfMemoryError
    pool = cp.get_default_memory_pool()
    free0, total0 = cp.cuda.runtime.memGetInfo()  # creates the context; no allocation
    ck.ok("memGetInfo_before_alloc", total0 == CAP and free0 <= CAP,
          "cupy.cuda.runtime.memGetInfo() before any allocation: free %s total %s (want total == cap %s)" % (
              cc.mib(free0), cc.mib(total0), cc.mib(CAP)), free=free0, total=total0)
    ck.info("cupy", "cupy %s, CUDA runtime %s, driver %s, Device(0).mem_info %s" % (
        cp.__version__, cp.cuda.runtime.runtimeGetVersion(), cp.cuda.runtime.driverGetVersion(),
        cp.cuda.Device(0).mem_info))
    ck.check_driver_view(cc.Driver(), "driver_view")
    ck.baseline()

    a = cp.random.rand(2048, 2048, dtype=cp.float32)
    b = a @ a
    warm_ok = math.isfinite(float(cp.abs(b).mean()))
    del a, b
    cp.cuda.Device(0).synchronize()
    ck.open_nvml()
    ck.ok("warmup", warm_ok, "2048x2048 matmul before the fill; gpuguard current %s, pool total %s" % (
        cc.mib(ck.counters().get("current_bytes")), cc.mib(pool.total_bytes())))
    ck.mark("warm", hold=0.5)

    # ---- fill to the cap ---------------------------------------------------------------------
    chunks, stages, other = [], [], None
    for size in (256 * MiB, 64 * MiB, 16 * MiB):
        n, caught = 0, None
        limit = CAP // size + 8
        while n < limit:
            try:
                chunks.append(cp.empty(size, dtype=cp.uint8))
                n += 1
            except OOM as e:
                caught = ("OutOfMemoryError", first_line(e))
                break
            except Exception as e:  # noqa: BLE001
                caught = other = (type(e).__name__, first_line(e))
                break
        charged = ck.charged()
        stages.append({"request": size, "allocated": n, "error": caught, "charged_after": charged,
                       "headroom": None if charged is None else CAP - charged})
        if caught is None or other:
            break
    arr_bytes = sum(int(x.nbytes) for x in chunks)
    oom_ok = (len(stages) == 3 and all(s["error"] and s["error"][0] == "OutOfMemoryError" for s in stages)
              and all(cc.refusal_at_cap(s["headroom"], s["request"]) for s in stages))
    ck.ok("oom_at_cap", oom_ok,
          "fill: " + "; ".join("%d x %s then %s (headroom left %s)" % (
              s["allocated"], cc.mib(s["request"]), s["error"][0] if s["error"] else "NO ERROR",
              cc.mib(s["headroom"])) for s in stages)
          + "; %s in arrays, pool total %s (want OutOfMemoryError at each size)" % (
              cc.mib(arr_bytes), cc.mib(pool.total_bytes())), stages=stages)
    if stages and stages[0]["error"]:
        ck.info("oom_message", stages[0]["error"][1])

    free1, total1 = cp.cuda.runtime.memGetInfo()
    charged = ck.charged() or 0
    ck.ok("memGetInfo_at_cap", total1 == CAP and free1 <= CAP - charged + 2 * MiB,
          "memGetInfo at the cap: free %s total %s; gpuguard charged %s" % (
              cc.mib(free1), cc.mib(total1), cc.mib(charged)), free=free1, total=total1, charged=charged)
    ck.check_nvml("nvml_at_cap")
    ck.check_capi("capi_at_cap", min_denied=1)
    ck.check_cap_report()
    ck.mark("at_cap", hold=0.8)

    # ---- free, go on ---------------------------------------------------------------------
    n_chunks = len(chunks)
    chunks.clear()
    gc.collect()
    c0 = ck.counters()
    ck.info("freed_cached", "%d arrays freed (the pool keeps its chunks): pool total %s used %s; gpuguard current %s"
            % (n_chunks, cc.mib(pool.total_bytes()), cc.mib(pool.used_bytes()), cc.mib(c0.get("current_bytes"))))
    again = CAP * 3 // 4
    err, total, x = None, None, None
    try:
        x = cp.empty(again, dtype=cp.uint8)
        x.fill(3)
        total = int(x[: 1 << 20].sum())
        cp.cuda.Device(0).synchronize()
    except Exception as e:  # noqa: BLE001
        err = "%s: %s" % (type(e).__name__, first_line(e))
    finally:
        x = None
    c1 = ck.counters()
    ck.ok("alloc_after_oom", err is None and total == 3 * (1 << 20),
          "after catching the OOM and freeing: cupy.empty(%s) + fill + sum -> %s%s; gpuguard denied +%d meanwhile "
          "(the pool absorbs a refusal by freeing its blocks and retrying)" % (
              cc.mib(again), total, (" ERROR " + err) if err else "",
              (c1.get("denied") or 0) - (c0.get("denied") or 0)))
    pool.free_all_blocks()
    c2 = ck.counters()
    ck.info("after_free_all_blocks", "pool total %s; gpuguard current %s" % (
        cc.mib(pool.total_bytes()), cc.mib(c2.get("current_bytes"))))
    ck.mark("after_free", hold=0.5)

    raised = None
    try:
        cp.empty(CAP + GiB, dtype=cp.uint8)
    except OOM as e:
        raised = ("OutOfMemoryError", first_line(e))
    except Exception as e:  # noqa: BLE001
        raised = (type(e).__name__, first_line(e))
    ck.ok("oom_larger_than_cap", raised is not None and raised[0] == "OutOfMemoryError",
          "cupy.empty(cap + 1 GiB) -> %s" % (("%s: %s" % raised) if raised else "NO ERROR (allocated past the cap)"))
    err, m = None, None
    try:
        m = cp.random.rand(4096, 4096, dtype=cp.float32)
        for _ in range(10):
            m = cp.tanh(m @ m / 64.0)
        v = float(cp.abs(m).mean())
    except Exception as e:  # noqa: BLE001
        err, v = "%s: %s" % (type(e).__name__, first_line(e)), float("nan")
    finally:
        m = None
    ck.ok("continues_after_oom", err is None and math.isfinite(v),
          "10 matmuls 4096x4096 after the OOMs: mean |m| = %.4f%s" % (v, (" ERROR " + err) if err else ""))
    free2, total2 = cp.cuda.runtime.memGetInfo()
    charged = ck.charged() or 0
    ck.ok("memGetInfo_end", total2 == CAP and free2 <= CAP - charged + 2 * MiB,
          "memGetInfo at the end: free %s total %s; gpuguard charged %s" % (
              cc.mib(free2), cc.mib(total2), cc.mib(charged)))
    c = ck.counters()
    ck.info("end", "gpuguard %s" % {k: c.get(k) for k in (
        "cap_bytes", "current_bytes", "peak_bytes", "allocs", "frees", "failed", "denied", "unknown_frees")})


if __name__ == "__main__":
    sys.exit(cc.Checks(os.environ.get("GGV_WORKLOAD", "cupy")).run(body))
