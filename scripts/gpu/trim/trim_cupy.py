#!/usr/bin/env python3
"""CuPy trim workload (issue 4): keeps 256 MiB of live arrays, caches ~4 GiB of
dropped arrays in CuPy's default memory pool (and 64 MiB in the pinned pool), prints
GGV_TRIM_READY pid=N, and waits (running Python, 50 ms poll) for the trim report the
runner's `kill -USR2` causes; measures before and after; then checks that the live
arrays still hold their values (exact int64 sums) and computes on.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh; by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/trim/trim_cupy.py &
  kill -USR2 <pid>          # after it prints GGV_TRIM_READY

Measurements (GGV_JSON {"record": "measure"}): pool total_bytes/used_bytes/
free_bytes, pinned pool n_free_blocks, gpuguard's device-0 counters and pinned
counters (C API), nvidia-smi per-process usage from outside, cudaMemGetInfo.
Knobs: GGV_CACHE_GIB (4), GGV_TRIM_WAIT_S (20).
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
CHUNKS_MIB = [1024, 1024, 768, 512, 384, 256, 100, 30, 10, 4]


def main():
    fill_mib = int(float(os.environ.get("GGV_CACHE_GIB", "4")) * 1024)
    wait_s = float(os.environ.get("GGV_TRIM_WAIT_S", "20"))
    rep_dir = os.environ.get("GPUGUARD_DIR")
    pid = os.getpid()
    g = tl.guard()
    if not g.present:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    import cupy as cp
    import cupyx

    pool = cp.get_default_memory_pool()
    pinned = cp.get_default_pinned_memory_pool()
    tl.emit("config", pid=pid, role="signal", cupy=cp.__version__, fill_mib=fill_mib, gpuguard=g.present,
            gpuguard_version=g.version)

    def measure(tag):
        cp.cuda.Device(0).synchronize()
        free, total = cp.cuda.runtime.memGetInfo()
        c = g.counters(0) or {}
        nv, how = tl.nvml_process_used(pid)
        m = {"tag": tag, "t": round(time.time(), 3), "pool_total": int(pool.total_bytes()),
             "pool_used": int(pool.used_bytes()), "pool_free": int(pool.free_bytes()),
             "pinned_free_blocks": int(pinned.n_free_blocks()), "gg_current": c.get("current_bytes"),
             "gg_host_pinned": (g.host_pinned() or {}).get("current_bytes"), "device_used": total - free,
             "nvml_used": nv, "nvml_how": how}
        tl.emit("measure", **m)
        return m

    n = 8 * MiB  # int64 elements: 64 MiB per array
    live = [cp.arange(n, dtype=cp.int64) + k for k in range(4)]
    want = [n * (n - 1) // 2 + k * n for k in range(4)]
    measure("live")
    bufs, total = [], 0
    for c in CHUNKS_MIB:
        if total >= fill_mib:
            break
        b = cp.empty(c * MiB // 4, dtype=cp.float32)
        b.fill(1.0)
        bufs.append(b)
        total += c
    hbufs = [cupyx.empty_pinned((16 * MiB,), dtype=cp.uint8) for _ in range(4)]
    for h in hbufs:
        h[:16] = 1
    del bufs, b, hbufs
    before = measure("before")
    tl.note("pool holds %s (%s used) after dropping %d MiB; gpuguard %s; nvml %s" % (
        tl.mib(before["pool_total"]), tl.mib(before["pool_used"]), total, tl.mib(before["gg_current"]),
        tl.mib(before["nvml_used"])))

    print("GGV_TRIM_READY pid=%d" % pid, flush=True)
    e, rep, waited = tl.wait_report(rep_dir, pid, "trim", -1, wait_s) if g.present else (None, None, 0.0)
    tl.emit("trim_seen", report=e["path"] if e else None, seq=e["seq"] if e else None, waited_s=round(waited, 3))
    measure("after")

    got = [int(a.sum()) for a in live]
    x = cp.ones((2048, 2048), dtype=cp.float32)
    y = float((x @ x).sum())
    tl.emit("after_trim_compute", live_sums_ok=got == want, got=got, want=want, matmul_sum=y,
            matmul_ok=y == 2048.0 ** 3)
    measure("end")
    print("RESULT trim_cupy live_sums_ok=%s" % (got == want), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
