#!/usr/bin/env python3
"""JAX trim workload (issue 4): a small jitted computation under the shim (default
JAX settings: XLA preallocates its arena), prints GGV_TRIM_READY pid=N, waits
(running Python) for the trim report the runner's `kill -USR2` causes, measures
before and after, then computes again. gpuguard cannot release JAX's arena: the
trim report must list "jax" as "not_releasable" with advice naming
XLA_PYTHON_CLIENT_PREALLOCATE (and XLA_PYTHON_CLIENT_ALLOCATOR=platform).

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh; by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r python3 scripts/gpu/trim/trim_jax.py &
  kill -USR2 <pid>          # after it prints GGV_TRIM_READY

Knobs: GGV_TRIM_WAIT_S (20), GGV_ALLOW_CPU=1 (try the script without a GPU).
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB


def main():
    wait_s = float(os.environ.get("GGV_TRIM_WAIT_S", "20"))
    rep_dir = os.environ.get("GPUGUARD_DIR")
    pid = os.getpid()
    g = tl.guard()
    if not g.present:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    if dev.platform != "gpu" and os.environ.get("GGV_ALLOW_CPU") != "1":
        print("jax default device is %s, not a GPU" % dev.platform, file=sys.stderr)
        return 2
    tl.emit("config", pid=pid, role="signal", jax=jax.__version__, device=str(dev), gpuguard=g.present,
            gpuguard_version=g.version,
            xla_env={k: v for k, v in os.environ.items() if k.startswith("XLA_PYTHON_CLIENT")})

    def measure(tag):
        c = g.counters(0) or {}
        try:
            st = dev.memory_stats() or {}
        except Exception as e:  # noqa: BLE001
            st = {"error": str(e)}
        nv, how = tl.nvml_process_used(pid)
        m = {"tag": tag, "t": round(time.time(), 3), "gg_current": c.get("current_bytes"),
             "bytes_in_use": st.get("bytes_in_use"), "pool_bytes": st.get("pool_bytes"),
             "bytes_limit": st.get("bytes_limit"), "nvml_used": nv, "nvml_how": how}
        tl.emit("measure", **m)
        return m

    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (2048, 2048), dtype=jnp.float32)
    f = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())
    v1 = float(f(x))
    tmp = [jnp.ones((64 * MiB // 4,), jnp.float32) + i for i in range(8)]
    jax.block_until_ready(tmp)
    del tmp
    before = measure("before")
    tl.note("jax ready: gpuguard %s, bytes_in_use %s, pool_bytes %s, nvml %s" % (
        tl.mib(before["gg_current"]), tl.mib(before["bytes_in_use"]), tl.mib(before["pool_bytes"]),
        tl.mib(before["nvml_used"])))

    print("GGV_TRIM_READY pid=%d" % pid, flush=True)
    e, rep, waited = tl.wait_report(rep_dir, pid, "trim", -1, wait_s) if g.present else (None, None, 0.0)
    tl.emit("trim_seen", report=e["path"] if e else None, seq=e["seq"] if e else None, waited_s=round(waited, 3))
    measure("after")
    v2 = float(f(x))
    tl.emit("after_trim_compute", before=v1, after=v2, same=tl.rel_close(v1, v2, 1e-6))
    print("RESULT trim_jax same=%s" % tl.rel_close(v1, v2, 1e-6), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
