#!/usr/bin/env python3
"""Training-style workloads for the gpuguard overhead benchmark (run by run_train.sh).

  train_bench.py torch  [--warmup 20] [--steps 100]
      6-layer transformer encoder (d_model 512, 8 heads, ff 2048), batch 32, sequence
      length drawn per step from 64..255 (same seed every run), bf16 autocast, AdamW.
      The allocator is PyTorch's default unless PYTORCH_CUDA_ALLOC_CONF says otherwise
      (the workload is then named torch-async for backend:cudaMallocAsync).
  train_bench.py jax    [--warmup 20] [--steps 300]
      jit'd MLP training step (1024-4096-4096-1024, SGD), batch size cycling over
      256/384/512/768/1024, so several shapes are compiled and alternated.
  train_bench.py cupy   [--warmup 20] [--steps 300]
      element-wise, reduction, scan and matrix-product steps on arrays whose size
      changes every step (CuPy's default memory pool).

Prints (stdout):
  RESULT workload=W steps=N seconds=S steps_s=X step_ms=Y loss=L
  CALLS workload=W steps=N allocs=A frees=F step_ms=Y     (only under gpuguard)
CALLS counts what gpuguard intercepted on device 0 during the timed steps, read through
its C API (ctypes.CDLL(None).gpuguard_device_counters) before and after them.
"""
import argparse
import ctypes
import os
import random
import sys
import time


class GGCounters(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int32),
        ("reserved0", ctypes.c_uint32),
        ("total_bytes", ctypes.c_uint64),
        ("cap_bytes", ctypes.c_uint64),
        ("current_bytes", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("allocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("denied", ctypes.c_uint64),
        ("unknown_frees", ctypes.c_uint64),
    ]


def gg_reader():
    """A function returning (allocs, frees) of device 0, or None without gpuguard."""
    try:
        fn = ctypes.CDLL(None).gpuguard_device_counters
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(GGCounters)]
    fn.restype = ctypes.c_int

    def read():
        c = GGCounters()
        if fn(0, ctypes.byref(c)) != 0:
            return None
        return c.allocs, c.frees

    return read


def report(name, steps, seconds, loss, before, after):
    sps = steps / seconds
    print(f"RESULT workload={name} steps={steps} seconds={seconds:.4f} steps_s={sps:.4f} "
          f"step_ms={1e3 / sps:.4f} loss={loss:.5f}", flush=True)
    if before is not None and after is not None:
        print(f"CALLS workload={name} steps={steps} allocs={after[0] - before[0]} "
              f"frees={after[1] - before[1]} step_ms={1e3 / sps:.4f}", flush=True)


# ---------------------------------------------------------------------------------------
def run_torch(args, gg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    name = "torch-async" if "cudaMallocAsync" in conf else "torch-default"
    torch.manual_seed(0)
    dev = torch.device("cuda")
    vocab, d, batch = 8192, 512, 32

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(256, d)
            layer = nn.TransformerEncoderLayer(d, 8, 2048, dropout=0.1, batch_first=True,
                                               norm_first=True)
            self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            t = x.shape[1]
            h = self.emb(x) + self.pos(torch.arange(t, device=x.device))
            return self.head(self.enc(h))

    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(1234)
    lens = [rng.randint(64, 255) for _ in range(args.warmup + args.steps)]

    def step(t):
        x = torch.randint(0, vocab, (batch, t), device=dev)
        y = torch.randint(0, vocab, (batch, t), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for t in lens[:args.warmup]:
        step(t)
    torch.cuda.synchronize()
    before = gg() if gg else None
    t0 = time.perf_counter()
    for t in lens[args.warmup:]:
        loss = step(t)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    after = gg() if gg else None
    lv = float(loss.item())
    if lv != lv:
        print("ERROR loss is NaN", file=sys.stderr)
        sys.exit(1)
    report(name, args.steps, dt, lv, before, after)


# ---------------------------------------------------------------------------------------
def run_jax(args, gg):
    import jax
    import jax.numpy as jnp

    sizes = [1024, 4096, 4096, 1024]
    key = jax.random.PRNGKey(0)
    params = []
    for i in range(len(sizes) - 1):
        key, k1 = jax.random.split(key)
        w = jax.random.normal(k1, (sizes[i], sizes[i + 1]), jnp.float32) / jnp.sqrt(sizes[i])
        params.append((w, jnp.zeros((sizes[i + 1],), jnp.float32)))

    def loss_fn(p, x, y):
        h = x
        for i, (w, b) in enumerate(p):
            h = h @ w + b
            if i < len(p) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def step(p, x, y):
        l, g = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g), l

    batches = [256, 384, 512, 768, 1024]
    data = {}
    for b in batches:
        key, k1, k2 = jax.random.split(key, 3)
        data[b] = (jax.random.normal(k1, (b, sizes[0]), jnp.float32),
                   jax.random.normal(k2, (b, sizes[-1]), jnp.float32))
    order = [batches[i % len(batches)] for i in range(args.warmup + args.steps)]
    random.Random(1234).shuffle(order)
    order = batches + order  # every shape compiled during the warm-up
    warm = len(batches) + args.warmup
    loss = None
    for b in order[:warm]:
        params, loss = step(params, *data[b])
    loss.block_until_ready()
    before = gg() if gg else None
    t0 = time.perf_counter()
    for b in order[warm:]:
        params, loss = step(params, *data[b])
    loss.block_until_ready()
    dt = time.perf_counter() - t0
    after = gg() if gg else None
    report("jax", args.steps, dt, float(loss), before, after)


# ---------------------------------------------------------------------------------------
def run_cupy(args, gg):
    import cupy as cp

    rng = random.Random(1234)
    vec = [rng.choice([1 << 18, 3 << 17, 1 << 20, 5 << 19, 1 << 22, 3 << 21])
           for _ in range(args.warmup + args.steps)]
    mat = [rng.choice([256, 384, 512, 768, 1024]) for _ in range(args.warmup + args.steps)]
    cp.random.seed(0)

    def step(i):
        n, k = vec[i], mat[i]
        a = cp.random.random(n, dtype=cp.float32)
        b = cp.sin(a) * 2.0 + a * a
        c = cp.cumsum(b)
        m = cp.random.random((k, k), dtype=cp.float32)
        p = m @ m.T
        return c[-1] + p.sum() + b.max()

    s = None
    for i in range(args.warmup):
        s = step(i)
    cp.cuda.Device().synchronize()
    before = gg() if gg else None
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        s = step(i)
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    after = gg() if gg else None
    report("cupy", args.steps, dt, float(s), before, after)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["torch", "jax", "cupy"])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    if args.steps is None:
        args.steps = 100 if args.workload == "torch" else 300
    gg = gg_reader()
    print(f"INFO workload={args.workload} gpuguard={'yes' if gg else 'no'} "
          f"warmup={args.warmup} steps={args.steps} "
          f"alloc_conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '-') or '-'}", flush=True)
    {"torch": run_torch, "jax": run_jax, "cupy": run_cupy}[args.workload](args, gg)


if __name__ == "__main__":
    main()
