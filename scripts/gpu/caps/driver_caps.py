#!/usr/bin/env python3
"""Cap workload on the bare CUDA driver (ctypes on libcuda.so.1: the dlsym path),
exact to the byte: no framework between the program and the cap.

  1. cuDeviceTotalMem_v2 and cuMemGetInfo_v2 before any allocation: total == cap,
     free <= cap.
  2. GGV_BASELINE; fills device 0 to exactly the cap with cuMemAlloc_v2 (1 GiB
     pieces and a remainder): every call succeeds, gpuguard current == cap;
     cuMemGetInfo_v2 answers free == 0, total == cap; NVML inside the process
     (v1, v2) total == cap, used == cap. GGV_MARK at_cap.
  3. At the cap, 2 MiB through each allocation path (cuMemAlloc_v2,
     cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync on the legacy stream,
     cuMemCreate): each returns CUDA_ERROR_OUT_OF_MEMORY (2); denied grows by 5,
     failed (driver refusals) does not (refused before the real call); the cap
     report names the first refusal.
  4. Frees one piece: cuMemGetInfo_v2 free == that piece; half of it allocated
     again succeeds (the program goes on); frees everything: current == 0.
  5. 8 threads allocate 64 MiB pieces at once until each is refused: together
     they never pass the cap (sum <= cap, and cap - sum < 64 MiB). GGV_MARK.

GGV_CAP_BYTES must equal the cap GPUGUARD_CAP resolves to (the runner computes it
for the fraction form from the real cuDeviceTotalMem_v2).
"""

import ctypes
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import caps_common as cc  # noqa: E402

MiB, GiB, CAP = cc.MiB, cc.GiB, cc.CAP
OOM = cc.CUDA_ERROR_OUT_OF_MEMORY


def body(ck):
    drv = cc.Driver()
    if not ck.ok("driver_loaded", drv.ok, "libcuda.so.1 through ctypes, cuInit: %s" % (drv.error or "ok")):
        return
    rc, ctx = drv.primary_ctx(0)
    if not ck.ok("primary_context", rc == 0 and ctx, "cuDevicePrimaryCtxRetain: %s" % drv.err(rc)):
        return
    drv.call("cuCtxSetCurrent", ctx)
    ck.check_driver_view(drv, "before_alloc")
    ck.baseline()

    def alloc(n):
        p = ctypes.c_uint64(0)
        rc = drv.call("cuMemAlloc_v2", ctypes.byref(p), n)
        return rc, p.value

    # ---- fill to exactly the cap ---------------------------------------------------
    ptrs, left, last_rc = [], CAP, 0
    while left > 0:
        n = min(GiB, left)
        rc, p = alloc(n)
        if rc != 0:
            last_rc = rc
            break
        ptrs.append((p, n))
        left -= n
    c = ck.counters()
    ck.ok("fill_to_cap", left == 0 and c.get("current_bytes") == CAP,
          "%d cuMemAlloc_v2 calls filled %s of the cap %s (stopped with %s); gpuguard current %s" % (
              len(ptrs), cc.mib(CAP - left), cc.mib(CAP), drv.err(last_rc) if last_rc else "no refusal",
              cc.mib(c.get("current_bytes"))))
    ck.open_nvml()
    rc, free, total = drv.mem_get_info()
    ck.ok("cuMemGetInfo_at_cap", rc == 0 and total == CAP and free == 0,
          "cuMemGetInfo_v2 at the cap: free %s total %s (want 0 and the cap)" % (cc.mib(free), cc.mib(total)),
          free=free, total=total)
    ck.check_nvml("nvml_at_cap", expect_used=CAP)
    ck.mark("at_cap", hold=0.8)

    # ---- a refusal on every path -----------------------------------------------------
    before = ck.counters()
    small = 2 * MiB
    results = []

    p = ctypes.c_uint64(0)
    rc = drv.call("cuMemAlloc_v2", ctypes.byref(p), small)
    results.append(("cuMemAlloc_v2", rc))
    if rc == 0:
        drv.call("cuMemFree_v2", p.value)

    p, pitch = ctypes.c_uint64(0), ctypes.c_size_t(0)
    rc = drv.call("cuMemAllocPitch_v2", ctypes.byref(p), ctypes.byref(pitch), small, 1, 4)
    results.append(("cuMemAllocPitch_v2", rc))
    if rc == 0:
        drv.call("cuMemFree_v2", p.value)

    p = ctypes.c_uint64(0)
    rc = drv.call("cuMemAllocManaged", ctypes.byref(p), small, 1)  # CU_MEM_ATTACH_GLOBAL
    results.append(("cuMemAllocManaged", rc))
    if rc == 0:
        drv.call("cuMemFree_v2", p.value)

    p = ctypes.c_uint64(0)
    rc = drv.call("cuMemAllocAsync", ctypes.byref(p), small, None)
    results.append(("cuMemAllocAsync", rc))
    if rc == 0:
        drv.call("cuMemFreeAsync", p.value, None)
        drv.call("cuStreamSynchronize", None)

    prop = cc.MemAllocationProp()
    prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    h = ctypes.c_uint64(0)
    rc = drv.call("cuMemCreate", ctypes.byref(h), small, ctypes.byref(prop), 0)
    results.append(("cuMemCreate", rc))
    if rc == 0:
        drv.call("cuMemRelease", h.value)

    after = ck.counters()
    ck.ok("refused_on_every_path", all(rc == OOM for _, rc in results),
          "2 MiB at the cap: " + ", ".join("%s -> %s" % (n, drv.err(rc)) for n, rc in results)
          + " (want CUDA_ERROR_OUT_OF_MEMORY each)", results=results)
    dd = (after.get("denied") or 0) - (before.get("denied") or 0)
    df = (after.get("failed") or 0) - (before.get("failed") or 0)
    ck.ok("refused_before_real_call", dd == len(results) and df == 0 and after.get("current_bytes") == CAP,
          "denied +%d (want %d), failed +%d (want 0: the driver was never asked), current %s (want the cap)" % (
              dd, len(results), df, cc.mib(after.get("current_bytes"))))
    ck.check_cap_report()
    ck.check_capi(min_denied=len(results))

    # ---- free, and go on ----------------------------------------------------------------
    p0, n0 = ptrs.pop(0)
    drv.call("cuMemFree_v2", p0)
    rc, free, total = drv.mem_get_info()
    ck.ok("cuMemGetInfo_after_free", rc == 0 and total == CAP and free == n0,
          "after freeing %s: free %s total %s (want free = cap - used = %s)" % (
              cc.mib(n0), cc.mib(free), cc.mib(total), cc.mib(n0)))
    again = n0 // 2
    rc, p = alloc(again)
    ck.ok("alloc_after_refusal", rc == 0, "cuMemAlloc_v2(%s) after the refusals and a free: %s" % (
        cc.mib(again), drv.err(rc)))
    if rc == 0:
        drv.call("cuMemFree_v2", p)
    for p, _ in ptrs:
        drv.call("cuMemFree_v2", p)
    ptrs = []
    c = ck.counters()
    ck.ok("all_freed", c.get("current_bytes") == 0, "after freeing everything gpuguard current %s" % cc.mib(
        c.get("current_bytes")))
    ck.mark("freed", hold=0.4)

    # ---- threads racing for the last bytes ------------------------------------------------
    piece = 64 * MiB
    nthreads = 8
    got = [[] for _ in range(nthreads)]
    last = [None] * nthreads
    start = threading.Barrier(nthreads)

    def worker(i):
        drv.call("cuCtxSetCurrent", ctx)
        start.wait()
        while True:
            q = ctypes.c_uint64(0)
            r = drv.call("cuMemAlloc_v2", ctypes.byref(q), piece)  # ctypes releases the GIL
            if r != 0:
                last[i] = r
                return
            got[i].append(q.value)
            if len(got[i]) > 4096:
                last[i] = "runaway"
                return

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    held = sum(len(g) for g in got) * piece
    c = ck.counters()
    ck.ok("threads_never_pass_cap", held <= CAP and CAP - held < piece and all(r == OOM for r in last)
          and c.get("peak_bytes", 0) <= CAP,
          "%d threads x 64 MiB pieces at once: %d pieces = %s held (cap %s, left %s); last results %s; "
          "gpuguard peak %s" % (nthreads, sum(len(g) for g in got), cc.mib(held), cc.mib(CAP), cc.mib(CAP - held),
                                sorted(set(str(r) for r in last)), cc.mib(c.get("peak_bytes"))))
    ck.mark("threads_at_cap", hold=0.6)
    for g in got:
        for p in g:
            drv.call("cuMemFree_v2", p)
    c = ck.counters()
    ck.info("end", "gpuguard counters at the end: %s" % {k: c.get(k) for k in (
        "cap_bytes", "current_bytes", "peak_bytes", "allocs", "frees", "failed", "denied", "unknown_frees")})


if __name__ == "__main__":
    sys.exit(cc.Checks(os.environ.get("GGV_WORKLOAD", "driver")).run(body))
