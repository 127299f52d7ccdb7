#!/usr/bin/env python3
"""Run 1 (JAX): one process, two devices, GPUGUARD_CAP=0:4GiB,1:8GiB, XLA's default
preallocation (75% of what each device reports: its cap).

Records (GGV_JSON; multi_check.py judges them):
  config     pid, device_count, caps
  dev/nvml   what each ordinal and each NVML device shows (mg.views)
  stats      per device: memory_stats() (bytes_limit, bytes_in_use, pool_bytes, ...) and
             gpuguard's counters, at a label (start, before_peer, after_peer)
  peer       a 256 MiB array put on device 0, then on device 1 (device_put), then back:
             equal
  oom        per device: arrays of 256 MiB kept until XLA refuses (RESOURCE_EXHAUSTED)
  done       the end
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mg  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

G = mg.ggv.guard()
CHUNK = 256 * mg.MiB


def stats(label, devs):
    for d, dev in enumerate(devs):
        s = dev.memory_stats() or {}
        mg.emit("stats", label=label, device=d, memory_stats={k: s.get(k) for k in
                ("bytes_limit", "bytes_in_use", "pool_bytes", "bytes_reserved", "peak_bytes_in_use")},
                gg=G.counters(d))


def fill(d, dev):
    held, msg = [], None
    try:
        for i in range(4096):
            x = jax.device_put(jnp.zeros(CHUNK // 4, dtype=jnp.float32), dev)
            x.block_until_ready()
            held.append(x)
    except Exception as e:  # noqa: BLE001 (XlaRuntimeError / JaxRuntimeError)
        msg = "%s: %s" % (type(e).__name__, e)
    mg.emit("oom", device=d, message=(msg or "")[:600], refused=msg is not None, filled=len(held) * CHUNK,
            gg=G.counters(d))
    del held


def main():
    devs = [d for d in jax.devices() if d.platform == "gpu"]
    mg.emit("config", pid=os.getpid(), device_count=len(devs), caps=mg.caps_of(), jax=jax.__version__,
            gpuguard=G.version)
    if len(devs) < 2:
        mg.emit("skip", reason="%d GPU device(s) in JAX: run 1 needs two" % len(devs))
        return 0
    mg.views()
    stats("start", devs)
    x = jax.device_put(jnp.arange(CHUNK // 4, dtype=jnp.float32), devs[0])
    x.block_until_ready()
    stats("before_peer", devs)
    y = jax.device_put(x, devs[1])
    z = jax.device_put(y, devs[0])
    z.block_until_ready()
    mg.emit("peer", equal=bool(jnp.array_equal(x, z)), on=[str(list(y.devices())[0]), str(list(z.devices())[0])])
    stats("after_peer", devs)
    del x, y, z
    fill(0, devs[0])
    fill(1, devs[1])
    mg.emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
