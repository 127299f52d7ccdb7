"""Issue 12 (d) on the GPU: what one report costs the steps of a training loop, in
process, with a 95% interval.

  LD_PRELOAD=libgpuguard.so python3 report_cost.py {torch,jax,cupy} [--seconds 100]
      [--block-s 1.0]

Default-mode leak lines cost time only around a report: gpuguard classifies the
framework's memory (PyTorch's snapshot, JAX's device memory profile, CuPy's pool) and
then opens a sampling window (PyTorch's recorder; CuPy's memory hook) for a short
while. So the loop runs blocks of identical steps (one 64 KiB array kept a step, as in
leak_small*.py) lasting about --block-s each, in ABBA pairs: an "on" block starts with a
report asked by SIGUSR1 to the process itself (the same report and window a snapshot
makes), an "off" block with none. The difference of a pair is what one report and its
window cost; at one snapshot a second (GPUGUARD_SNAPSHOT_EVERY=1s) and 1 s blocks, the
on/off ratio is the step cost at that rate. Run without GPUGUARD_SNAPSHOT_EVERY (no
other reports). Without a snapshot interval the window is sized by its defaults (at
least 50 ms, up to 0.5 s, until 256 allocations): longer than at 1 s snapshots (20 to
200 ms), so the figure is an upper bound for that rate.

Writes train_bench.py's `AB {json}` records (one ab_meta, then ab_block lines);
scripts/bench/ab_analyze.py gives the mean and median overhead with their intervals.
The leaked arrays are dropped between pairs (outside the timed blocks) so memory stays
flat; Python's collector runs before each block and is off inside it.
"""
import argparse
import gc
import json
import os
import signal
import time

ap = argparse.ArgumentParser()
ap.add_argument("workload", choices=["torch", "jax", "cupy"])
ap.add_argument("--seconds", type=float, default=100.0)
ap.add_argument("--block-s", type=float, default=1.0)
ap.add_argument("--warmup", type=int, default=200)
a = ap.parse_args()
keep = []
# Without gpuguard a SIGUSR1 would end the process: then no signal is sent (an A/A run).
preloaded = "libgpuguard" in os.environ.get("LD_PRELOAD", "")

if a.workload == "torch":
    import torch

    w = torch.randn(512, 512, device="cuda") * 0.01

    def step(n):
        global w
        x = torch.randn(64, 512, device="cuda")
        y = torch.relu(x @ w)
        w = w - 0.001 * (x.t() @ y) / 64
        keep.append(torch.empty(16384, device="cuda"))

    def sync():
        torch.cuda.synchronize()

elif a.workload == "jax":
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    w1 = jax.random.normal(key, (512, 512)) * 0.01
    w2 = jax.random.normal(key, (512, 10)) * 0.01

    @jax.jit
    def jstep(w1, w2, x):
        def loss(w1, w2):
            return jnp.square(jnp.maximum(x @ w1, 0) @ w2).mean()

        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.01 * g1, w2 - 0.01 * g2

    xs = [jax.random.normal(jax.random.PRNGKey(i), (64, 512)) for i in range(8)]

    def step(n):
        global w1, w2
        w1, w2 = jstep(w1, w2, xs[n % 8])
        keep.append(jnp.zeros(16384, dtype=jnp.float32) + n)

    def sync():
        w1.block_until_ready()
        if keep:
            keep[-1].block_until_ready()

else:
    import cupy as cp

    w = cp.random.standard_normal((512, 512), dtype=cp.float32) * 0.01

    def step(n):
        global w
        x = cp.random.standard_normal((64, 512), dtype=cp.float32)
        y = cp.maximum(x @ w, 0)
        w = w - 0.001 * (x.T @ y) / 64
        keep.append(cp.empty(16384, dtype=cp.float32))

    def sync():
        cp.cuda.Device().synchronize()


for i in range(a.warmup):
    step(i)
sync()
keep.clear()
t0 = time.perf_counter()
for i in range(50):
    step(i)
sync()
per = (time.perf_counter() - t0) / 50
k = max(10, int(a.block_s / per))
keep.clear()
print("AB " + json.dumps({"record": "ab_meta", "workload": "report-cost-" + a.workload,
                          "gpuguard": preloaded, "block_steps": k,
                          "what": "on: a SIGUSR1 report at the block's start; off: none",
                          "gc": "collected before each block, off inside it"}), flush=True)
start = time.perf_counter()
p = 0
while time.perf_counter() - start < a.seconds:
    for m in (("on", "off") if p % 2 == 0 else ("off", "on")):
        keep.clear()
        sync()
        gc.collect()
        gc.disable()
        w0 = time.perf_counter()
        c0 = time.process_time()
        if m == "on" and preloaded:
            os.kill(os.getpid(), signal.SIGUSR1)
        for i in range(k):
            step(i)
        sync()
        w1_, c1 = time.perf_counter(), time.process_time()
        gc.enable()
        print("AB " + json.dumps({"record": "ab_block", "workload": "report-cost-" + a.workload,
                                  "pair": p, "mode": m, "steps": k, "wall_s": round(w1_ - w0, 7),
                                  "cpu_s": round(c1 - c0, 7)}), flush=True)
    p += 1
print("REPORT_COST_DONE pairs=%d block_steps=%d" % (p, k), flush=True)
