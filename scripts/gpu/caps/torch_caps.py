#!/usr/bin/env python3
"""PyTorch cap workload (run with GPUGUARD_CAP set; default cap 4 GiB).

The allocator mode comes from the environment only, as in frameworks/torch_train.py:
  (unset)                                          -> "default"    (caching allocator, cudaMalloc)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -> "expandable" (cuMemCreate/cuMemMap)
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync  -> "cudaMallocAsync" (stream-ordered pool)

Steps (each check prints PASS/FAIL, see caps_common.py):
  1. torch.cuda.mem_get_info() before any allocation: total == cap, free <= cap;
     cuDeviceTotalMem_v2 / cuMemGetInfo_v2 through ctypes: the cap.
  2. GGV_BASELINE; a warm-up matmul (cuBLAS handle, kernels); GGV_MARK warm.
  3. Fill: torch.empty of 256 MiB, then 64 MiB, then 16 MiB pieces until each size
     raises torch.OutOfMemoryError. Each refusal must be at the cap: the headroom
     left (cap - gpuguard's charge) is below the request (+ 64 MiB rounding slack).
  4. At the cap: mem_get_info total == cap and free <= cap - charge; NVML inside
     the process total == cap; C API cap_bytes/denied; the cap report. GGV_MARK at_cap.
  5. Catch, free the tensors (no empty_cache; a C API "request" report shows
     pool_reserved_bytes then) and go on: a tensor of 3/4 of the cap, filled and
     summed. Then empty_cache, GGV_MARK after_free.
  6. One tensor larger than the cap: torch.OutOfMemoryError; then matmuls go on.
  7. mem_get_info at the end; allocator statistics (num_ooms ...) as INFO; for
     cudaMallocAsync the pool's holdings that gpuguard charges (NVML used minus
     current_bytes) as INFO.
"""

import gc
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import caps_common as cc  # noqa: E402

MiB, GiB, CAP = cc.MiB, cc.GiB, cc.CAP


alloc_mode = cc.ggv.torch_alloc_mode


def first_line(e, n=300):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:n]


def body(ck):
    import torch

    mode = alloc_mode()
    OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if not ck.ok("cuda_available", torch.cuda.is_available(), "torch.cuda.is_available()"):
        return
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    ck.info("torch", "torch %s (CUDA %s), allocator backend %s, mode %s, PYTORCH_CUDA_ALLOC_CONF=%r" % (
        torch.__version__, torch.version.cuda, torch.cuda.memory.get_allocator_backend(), mode,
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))

    free0, total0 = torch.cuda.mem_get_info(0)  # creates the context; no allocation
    ck.ok("mem_get_info_before_alloc", total0 == CAP and free0 <= CAP,
          "torch.cuda.mem_get_info() before any allocation: free %s total %s (want total == cap %s, free <= cap)" % (
              cc.mib(free0), cc.mib(total0), cc.mib(CAP)), free=free0, total=total0)
    props = torch.cuda.get_device_properties(0)
    ck.info("device_properties", "%s total_memory %s (cudaGetDeviceProperties; informational)" % (
        props.name, cc.mib(props.total_memory)))
    ck.check_driver_view(cc.Driver(), "driver_view")
    ck.baseline()

    # ---- warm-up: cuBLAS handle and kernels, before the fill -----------------------------------
    a = torch.randn(2048, 2048, device=dev)
    b = a @ a
    warm_ok = math.isfinite(float(b.float().abs().mean()))
    del a, b
    torch.cuda.synchronize()
    ck.open_nvml()
    ck.ok("warmup", warm_ok, "2048x2048 matmul before the fill; gpuguard current %s charged %s, torch reserved %s" % (
        cc.mib(ck.counters().get("current_bytes")), cc.mib(ck.charged()), cc.mib(torch.cuda.memory_reserved())))
    ck.mark("warm", hold=0.5)

    # ---- fill to the cap --------------------------------------------------------------------
    chunks = []
    stages = []
    other_error = None
    for size in (256 * MiB, 64 * MiB, 16 * MiB):
        n, caught = 0, None
        limit = CAP // size + 8  # a cap that does not hold stops here, not at the real 141 GiB
        while n < limit:
            try:
                chunks.append(torch.empty(size, dtype=torch.uint8, device=dev))
                n += 1
            except OOM as e:
                caught = ("OutOfMemoryError", first_line(e))
                break
            except RuntimeError as e:  # an error other than the OOM torch documents
                caught = (type(e).__name__, first_line(e))
                other_error = caught
                break
        torch.cuda.synchronize()
        charged = ck.charged()
        stages.append({"request": size, "allocated": n, "error": caught, "charged_after": charged,
                       "headroom": None if charged is None else CAP - charged})
        if caught is None or other_error:
            break
    tensor_bytes = sum(t.numel() for t in chunks)
    oom_ok = (len(stages) == 3 and all(s["error"] and s["error"][0] == "OutOfMemoryError" for s in stages)
              and all(cc.refusal_at_cap(s["headroom"], s["request"]) for s in stages))
    ck.ok("oom_at_cap", oom_ok,
          "fill: " + "; ".join("%d x %s then %s (headroom left %s)" % (
              s["allocated"], cc.mib(s["request"]), s["error"][0] if s["error"] else "NO ERROR",
              cc.mib(s["headroom"])) for s in stages)
          + "; %s in tensors (want torch.OutOfMemoryError at each size, headroom < request + %s)" % (
              cc.mib(tensor_bytes), cc.mib(cc.ROUNDING_SLACK)),
          stages=stages, tensor_bytes=tensor_bytes)
    if stages and stages[0]["error"]:
        ck.info("oom_message", stages[0]["error"][1])

    # ---- what the process sees at the cap -------------------------------------------------------
    free1, total1 = torch.cuda.mem_get_info(0)
    charged = ck.charged() or 0
    ck.ok("mem_get_info_at_cap", total1 == CAP and free1 <= CAP and free1 <= CAP - charged + 2 * MiB,
          "torch.cuda.mem_get_info() at the cap: free %s total %s; gpuguard charged %s (want total == cap, "
          "free <= cap - charged)" % (cc.mib(free1), cc.mib(total1), cc.mib(charged)), free=free1, total=total1,
          charged=charged)
    ck.check_nvml("nvml_at_cap")
    ck.check_capi("capi_at_cap", min_denied=1)
    ck.check_cap_report()
    if mode == "cudaMallocAsync":
        ck.info("pool_at_cap", "pool: memory_reserved %s memory_allocated %s; gpuguard charged %s current %s "
                "(charged - current = pool holdings beyond live blocks: %s)" % (
                    cc.mib(torch.cuda.memory_reserved()), cc.mib(torch.cuda.memory_allocated()), cc.mib(charged),
                    cc.mib(ck.counters().get("current_bytes")),
                    cc.mib(charged - (ck.counters().get("current_bytes") or 0))))
    ck.mark("at_cap", hold=0.8)

    # ---- catch, free, go on -------------------------------------------------------------------
    n_chunks = len(chunks)
    chunks.clear()
    gc.collect()
    torch.cuda.synchronize()
    c0 = ck.counters()
    ck.info("freed_cached", "%d tensors freed (no empty_cache): torch reserved %s allocated %s; gpuguard current "
            "%s charged %s" % (n_chunks, cc.mib(torch.cuda.memory_reserved()),
                               cc.mib(torch.cuda.memory_allocated()), cc.mib(c0.get("current_bytes")),
                               cc.mib(ck.charged())))
    ck.report_now("report_after_free")
    again = CAP * 3 // 4
    err, total, x = None, None, None
    try:
        x = torch.empty(again, dtype=torch.uint8, device=dev)
        x.fill_(3)
        total = int(x[: 1 << 20].sum())
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        err = "%s: %s" % (type(e).__name__, first_line(e))
    finally:
        x = None
    c1 = ck.counters()
    ck.ok("alloc_after_oom", err is None and total == 3 * (1 << 20),
          "after catching the OOM and freeing: torch.empty(%s) + fill + sum -> %s%s; gpuguard denied +%d meanwhile "
          "(a refusal the allocator absorbed by releasing its cache, or a pool trimmed by gpuguard, is expected)" % (
              cc.mib(again), total, (" ERROR " + err) if err else "",
              (c1.get("denied") or 0) - (c0.get("denied") or 0)))
    if mode == "cudaMallocAsync":
        ch = ck.charged() or 0
        ck.info("pool_after_free", "pool: memory_reserved %s allocated %s; gpuguard charged %s current %s "
                "(pool holdings charged beyond live blocks: %s)" % (
                    cc.mib(torch.cuda.memory_reserved()), cc.mib(torch.cuda.memory_allocated()), cc.mib(ch),
                    cc.mib(ck.counters().get("current_bytes")), cc.mib(ch - (ck.counters().get("current_bytes") or 0))))
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    c2 = ck.counters()
    ck.info("after_empty_cache", "torch reserved %s; gpuguard current %s charged %s" % (
        cc.mib(torch.cuda.memory_reserved()), cc.mib(c2.get("current_bytes")), cc.mib(ck.charged())))
    if mode == "cudaMallocAsync":
        ck.report_now("report_after_empty_cache")
    ck.mark("after_free", hold=0.5)

    # ---- larger than the cap, then go on ------------------------------------------------------------
    raised = None
    try:
        torch.empty(CAP + GiB, dtype=torch.uint8, device=dev)  # dropped at once if it were ever made
    except OOM as e:
        raised = ("OutOfMemoryError", first_line(e))
    except Exception as e:  # noqa: BLE001
        raised = (type(e).__name__, first_line(e))
    ck.ok("oom_larger_than_cap", raised is not None and raised[0] == "OutOfMemoryError",
          "torch.empty(cap + 1 GiB) -> %s" % (("%s: %s" % raised) if raised else "NO ERROR (allocated past the cap)"))
    err, m = None, None
    try:
        m = torch.randn(4096, 4096, device=dev)
        for _ in range(10):
            m = torch.tanh(m @ m / 64.0)
        v = float(m.abs().mean())
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        err, v = "%s: %s" % (type(e).__name__, first_line(e)), float("nan")
    finally:
        m = None
    ck.ok("continues_after_oom", err is None and math.isfinite(v),
          "10 matmuls 4096x4096 after the OOMs: mean |m| = %.4f%s" % (v, (" ERROR " + err) if err else ""))

    free2, total2 = torch.cuda.mem_get_info(0)
    charged = ck.charged() or 0
    ck.ok("mem_get_info_end", total2 == CAP and free2 <= CAP - charged + 2 * MiB,
          "torch.cuda.mem_get_info() at the end: free %s total %s; gpuguard charged %s" % (
              cc.mib(free2), cc.mib(total2), cc.mib(charged)))
    st = torch.cuda.memory_stats()
    keep = ("num_ooms", "num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")
    c = ck.counters()
    ck.info("end", "torch stats %s; max_memory_reserved %s; gpuguard %s" % (
        {k: st.get(k) for k in keep if k in st}, cc.mib(torch.cuda.max_memory_reserved()),
        {k: c.get(k) for k in ("cap_bytes", "current_bytes", "peak_bytes", "allocs", "frees", "failed", "denied",
                               "unknown_frees")}))


if __name__ == "__main__":
    sys.exit(cc.Checks(os.environ.get("GGV_WORKLOAD", "torch_" + alloc_mode())).run(body))
