#!/usr/bin/env python3
"""Training-style workloads for the gpuguard overhead benchmark (run by run_train.sh).

  train_bench.py torch  [--warmup 20] [--steps 100]
      6-layer transformer encoder (d_model 512, 8 heads, ff 2048), batch 32, sequence
      length drawn per step from 16 lengths in 64..255 (same seed every run; the
      warm-up runs each length at least twice), bf16 autocast, AdamW.
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

In-process A/B mode (docs/performance.md, "Training overhead to ±0.5%: method"):
  train_bench.py W --ab-blocks N [--block-steps K | --block-ms 150] [--ab-seconds S]
      after the warm-up, up to N blocks (N/2 pairs, stopping early after S seconds) of
      K identical steps (the same fixed shape sequence every block), alternately with
      gpuguard's books on and paused (gpuguard_bench_set_books, a benchmark aid), in
      ABBA order (pair p is on,off for even p, off,on for odd p); with
      GPUGUARD_PYTHON=lines PyTorch's memory recorder is switched with the books.
      Every block is CUDA-synchronized at both ends and written as one line
        AB {"record": "ab_block", "workload", "pair", "mode": "on"|"off", "steps",
            "wall_s", "cpu_s" (process CPU time), "thread_cpu_s" (this thread's),
            "cycles", "instructions" (user space, all threads: CpuCounters; absent
            where perf_event_open is refused),
            "allocs", "frees", "unknown_frees", "failed" (gpuguard's counter deltas)}
      after one AB {"record": "ab_meta", ...} line; ab_analyze.py reads them. Without
      gpuguard (or without the switch) both halves are identical: an A/A control.
      K defaults to whole passes of the shape sequence lasting >= --block-ms.
      --ab-gc 1 (default): Python's cyclic collector is off during the blocks and runs
      between pairs, outside the timed intervals, at most once a second (its pauses
      otherwise land in random blocks); --ab-gc 0 leaves it on. Both halves of a pair
      run the same steps, and successive pairs go on through the shape sequence, so
      --block-steps 1 pairs adjacent identical steps (host noise that comes in spells
      of seconds then cancels within a pair).

Diagnostics, printed after RESULT (so a failure in them never loses the result):
  FW workload=W before=S after=S [wait_s=X extra_steps=N]
      the framework recorder gpuguard turns on with GPUGUARD_PYTHON=lines, as seen by
      the program: torch-default: PyTorch's memory recorder (on/off, probed through a
      fresh block's frames in torch.cuda.memory._snapshot()); cupy: the memory hooks on
      the main thread. With GPUGUARD_PYTHON=lines the warm-up is extended (at most
      GG_BENCH_WAIT_S, 15 s) until the recorder is on, so the timed steps measure the
      steady state; at default settings the recorders stay off.
  FWCALLS workload=W steps=N allocs=A frees=F
      framework-level allocations per timed step: torch: memory_stats()
      allocation.all.allocated/freed; cupy: pool mallocs/frees counted by a hook over
      100 extra steps after the timing.
"""
import argparse
import ctypes
import gc
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu", "lib"))
import ggv  # noqa: E402  (scripts/gpu/lib/ggv.py: gpuguard's C API through ctypes)

WAIT_S = float(os.environ.get("GG_BENCH_WAIT_S", "15"))


def diag(fn, *a):
    """Runs a diagnostic; an error in it is printed, never raised."""
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001
        print(f"DIAG_ERROR {fn.__name__}: {type(e).__name__}: {e}", flush=True)
        return None


def gg_reader():
    """A function returning (allocs, frees) of device 0, or None without gpuguard."""
    g = ggv.Guard()
    if not g.present:
        return None

    def read():
        c = g.counters(0)
        if not c or "error" in c:
            return None
        return c["allocs"], c["frees"]

    return read


def report(name, steps, seconds, loss, before, after):
    sps = steps / seconds
    print(f"RESULT workload={name} steps={steps} seconds={seconds:.4f} steps_s={sps:.4f} "
          f"step_ms={1e3 / sps:.4f} loss={loss:.5f}", flush=True)
    if before is not None and after is not None:
        print(f"CALLS workload={name} steps={steps} allocs={after[0] - before[0]} "
              f"frees={after[1] - before[1]} step_ms={1e3 / sps:.4f}", flush=True)


# ---------------------------------------------------------------------------------------
# In-process A/B blocks.

def bench_switch():
    """gpuguard_bench_set_books (a benchmark aid) through ctypes, or None."""
    try:
        fn = ctypes.CDLL(None).gpuguard_bench_set_books
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


AB_COUNTERS = ("allocs", "frees", "unknown_frees", "failed")


class CpuCounters:
    """User-space CPU cycles and instructions of every thread of this process, from the
    kernel's hardware counters (perf_event_open; exclude_kernel, exclude_hv). Unlike
    wall and CPU time they do not count time the machine gives to others (a virtual
    CPU's steal) and cycles are independent of who else loads the host, so a block's
    count is its own work: the A/B difference of a CPU-bound step at a fraction of the
    noise of wall time (docs/performance.md). `available` is False, with `why`, where
    the kernel or the container refuses them; blocks then carry no counts."""

    TYPE, CYCLES, INSTRUCTIONS = 0, 0, 1  # PERF_TYPE_HARDWARE and its configs

    def __init__(self):
        self.fds = {}  # tid -> (cycles fd, instructions fd)
        self.available, self.why = False, ""
        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.libc.syscall.restype = ctypes.c_long
            self.scan()
            self.available = bool(self.fds)
            if not self.available and not self.why:
                self.why = "no thread could be counted"
        except Exception as e:  # a benchmark aid: never fatal
            self.why = "%s: %s" % (type(e).__name__, e)

    def _open(self, tid, config):
        attr = ctypes.create_string_buffer(128)
        ctypes.c_uint32.from_buffer(attr, 0).value = self.TYPE
        ctypes.c_uint32.from_buffer(attr, 4).value = 128  # size
        ctypes.c_uint64.from_buffer(attr, 8).value = config
        ctypes.c_uint64.from_buffer(attr, 40).value = (1 << 5) | (1 << 6)  # exclude_kernel, exclude_hv
        fd = self.libc.syscall(298, attr, tid, -1, -1, 0)  # perf_event_open, x86-64
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def scan(self):
        """Counters for threads started since the last scan (between blocks only)."""
        for t in os.listdir("/proc/self/task"):
            tid = int(t)
            if tid in self.fds:
                continue
            try:
                fds = (self._open(tid, self.CYCLES), self._open(tid, self.INSTRUCTIONS))
            except OSError as e:
                if not self.fds:
                    self.why = "perf_event_open: %s" % e.strerror
                    return
                continue  # the thread ended meanwhile
            self.fds[tid] = fds

    def read(self):
        """(cycles, instructions) summed over the counted threads, or None."""
        if not self.available:
            return None
        c = i = 0
        for fc, fi in self.fds.values():
            c += int.from_bytes(os.read(fc, 8), "little")
            i += int.from_bytes(os.read(fi, 8), "little")
        return c, i


HOOK_PHASES = ("rt_alloc_pre", "rt_alloc_post", "drv_alloc_pre", "drv_alloc_real",
               "drv_alloc_post", "rt_free_pre", "rt_free_post", "drv_free_pre",
               "drv_free_real", "drv_free_post", "rec_python", "rec_native", "rec_site",
               "rec_book", "rec_memo")


def hook_times():
    """A diagnostic build's per-phase hook times (gpuguard_bench_hook_times, built with
    --features hook-timing), as a list of counts (the last: ticks per ms), or None."""
    try:
        fn = ctypes.CDLL(None).gpuguard_bench_hook_times
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    n = fn(None, 0)
    if n != 2 * len(HOOK_PHASES) * 2 + 1:
        return None
    buf = (ctypes.c_uint64 * n)()
    return list(buf) if fn(buf, n) == n and buf[n - 1] else None


def print_hook_times(name, base, end):
    """One HOOKTIMES line: ns per call of each phase, books on and paused."""
    if not base or not end:
        return
    per_ns = end[-1] / 1e6
    np_ = len(HOOK_PHASES)
    out = {"record": "hook_times", "workload": name}
    for p, mode in enumerate(("on", "paused")):
        for i, ph in enumerate(HOOK_PHASES):
            c = end[(p * np_ + i) * 2] - base[(p * np_ + i) * 2]
            n = end[(p * np_ + i) * 2 + 1] - base[(p * np_ + i) * 2 + 1]
            out[f"{mode}.{ph}"] = round(c / per_ns / n, 1) if n else None
            out[f"{mode}.{ph}.calls"] = n
    print("HOOKTIMES " + json.dumps(out), flush=True)


def run_ab(args, name, step, sched, sync, toggle=None):
    """Blocks of the same steps, books on and paused in ABBA order (see the header).
    step(x) runs one step on schedule entry x; sync() waits for the device; toggle(on)
    switches whatever else belongs to the measured configuration (a recorder)."""
    switch = bench_switch()
    guard = ggv.Guard()
    hw = CpuCounters()

    def counters():
        c = guard.counters(0) if guard.present else None
        return c if c and "error" not in c else None

    def mode(on):
        if switch is not None:
            switch(1 if on else 0)
        if toggle is not None:
            toggle(on)

    k = args.block_steps
    if not k:
        # Whole passes of the schedule lasting at least --block-ms (one timed pass,
        # which also warms up once more).
        sync()
        t0 = time.perf_counter()
        for x in sched:
            step(x)
        sync()
        per_pass = max(time.perf_counter() - t0, 1e-6)
        k = len(sched) * max(1, int(-(-args.block_ms / 1e3 // per_pass)))
    meta = {"record": "ab_meta", "workload": name, "gpuguard": guard.present,
            "switch": switch is not None, "toggle": toggle is not None, "block_steps": k,
            "max_blocks": args.ab_blocks, "max_seconds": args.ab_seconds,
            "gc": "collected before each block, off inside it" if getattr(args, "ab_gc", 1) else "on",
            "cpu_counters": "user-space cycles and instructions, all threads" if hw.available else "unavailable: " + hw.why,
            "env": {v: os.environ.get(v) for v in ("GPUGUARD_PYTHON", "GPUGUARD_STACK_DEPTH",
                                                   "PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_ALLOCATOR")
                    if os.environ.get(v) is not None}}
    print("AB " + json.dumps(meta), flush=True)
    t_start = time.perf_counter()
    blocks = 0
    last = None
    # Python's cyclic collector, left on, lands its pauses (milliseconds with PyTorch's
    # object graph) in random blocks: it is off during the blocks and runs between two
    # pairs, outside the timed intervals, at most once a second (blocks may be a step).
    gc_off = getattr(args, "ab_gc", 1)
    collected = 0.0
    if gc_off:
        gc.disable()
    times0 = hook_times()
    for p in range(max(1, args.ab_blocks // 2)):
        if gc_off and time.perf_counter() - collected >= 1.0:
            gc.collect()
            collected = time.perf_counter()
        for m in (("on", "off") if p % 2 == 0 else ("off", "on")):
            mode(m == "on")
            sync()
            c0 = counters()
            if hw.available:
                hw.scan()
            k0 = hw.read()
            w0, p0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
            # Both halves of a pair run the same steps; successive pairs go on through
            # the schedule (the same as always starting it when k is whole passes).
            for i in range(k):
                last = step(sched[(p * k + i) % len(sched)])
            sync()
            w1, p1, h1 = time.perf_counter(), time.process_time(), time.thread_time()
            k1 = hw.read()
            c1 = counters()
            rec = {"record": "ab_block", "workload": name, "pair": p, "mode": m, "steps": k,
                   "wall_s": round(w1 - w0, 7), "cpu_s": round(p1 - p0, 7), "thread_cpu_s": round(h1 - h0, 7)}
            if c0 and c1:
                rec.update({c: c1[c] - c0[c] for c in AB_COUNTERS})
            if k0 and k1:
                rec.update({"cycles": k1[0] - k0[0], "instructions": k1[1] - k0[1]})
            print("AB " + json.dumps(rec), flush=True)
            blocks += 1
        if args.ab_seconds and time.perf_counter() - t_start >= args.ab_seconds:
            break
    if gc_off:
        gc.enable()
    mode(True)
    print_hook_times(name, times0, hook_times())
    print(f"AB_DONE workload={name} blocks={blocks} block_steps={k} "
          f"seconds={time.perf_counter() - t_start:.1f}", flush=True)
    return last


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
    # Sixteen sequence lengths (many allocation sizes), each seen in the warm-up, so
    # the timed steps measure steady-state training, not first-shape work (cuBLAS
    # and cuDNN heuristics, new cache segments), which made earlier runs' steps 6-8x
    # longer than steady state.
    shapes = list(range(64, 256, 12))
    rng = random.Random(1234)
    warm = shapes * max(2, -(-args.warmup // len(shapes)))
    rng.shuffle(warm)
    lens = warm + [rng.choice(shapes) for _ in range(args.steps)]
    args.warmup = len(warm)

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

    def recorder():
        """'on'/'off' for PyTorch's memory recorder, from a fresh block's frames."""
        try:
            if torch.cuda.get_allocator_backend() != "native":
                return "unsupported"
        except Exception:  # noqa: BLE001
            pass
        x = torch.empty(1 << 16, dtype=torch.uint8, device=dev)
        p = x.data_ptr()
        for seg in torch.cuda.memory._snapshot().get("segments", []):
            addr = seg.get("address", 0)
            for b in seg.get("blocks", []):
                if b.get("address", addr) == p:
                    return "on" if b.get("frames") else "off"
                addr += b.get("size", 0)
        return "unknown"

    for t in lens[:args.warmup]:
        step(t)
    torch.cuda.synchronize()
    state0 = diag(recorder)
    wait, extra = 0.0, 0
    if gg and state0 == "off" and os.environ.get("GPUGUARD_PYTHON") == "lines":
        # gpuguard turns the recorder on from its own thread a little after CUDA starts:
        # keep warming up until it is on, so the timed steps measure the steady state.
        w0 = time.perf_counter()
        while state0 == "off" and time.perf_counter() - w0 < WAIT_S:
            step(lens[extra % args.warmup])
            extra += 1
            torch.cuda.synchronize()
            state0 = diag(recorder)
        wait = time.perf_counter() - w0
    if args.ab_blocks:
        toggle = None
        if gg and state0 == "on" and os.environ.get("GPUGUARD_PYTHON") == "lines":
            # The recorder gpuguard turned on belongs to the measured configuration.
            def toggle(on):
                if on:
                    torch.cuda.memory._record_memory_history(enabled="state", context="state",
                                                             stacks="python")
                else:
                    torch.cuda.memory._record_memory_history(enabled=None)
        sched = list(shapes)
        random.Random(99).shuffle(sched)
        loss = run_ab(args, name, step, sched, torch.cuda.synchronize, toggle)
        print(f"FW workload={name} recorder={state0} toggled={toggle is not None}", flush=True)
        if float(loss.item()) != float(loss.item()):
            print("ERROR loss is NaN", file=sys.stderr)
            sys.exit(1)
        return
    stats0 = diag(torch.cuda.memory_stats)
    torch.cuda.synchronize()
    before = gg() if gg else None
    t0 = time.perf_counter()
    for t in lens[args.warmup:]:
        loss = step(t)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    after = gg() if gg else None
    stats1 = diag(torch.cuda.memory_stats)
    lv = float(loss.item())
    if lv != lv:
        print("ERROR loss is NaN", file=sys.stderr)
        sys.exit(1)
    report(name, args.steps, dt, lv, before, after)
    print(f"FW workload={name} before={state0} after={diag(recorder)} wait_s={wait:.2f} "
          f"extra_steps={extra}", flush=True)
    if stats0 and stats1:
        k_a, k_f = "allocation.all.allocated", "allocation.all.freed"
        print(f"FWCALLS workload={name} steps={args.steps} "
              f"allocs={stats1.get(k_a, -1) - stats0.get(k_a, 0)} "
              f"frees={stats1.get(k_f, -1) - stats0.get(k_f, 0)}", flush=True)


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
    if args.ab_blocks:
        state = {"p": params, "l": loss}

        def ab_step(b):
            state["p"], state["l"] = step(state["p"], *data[b])
            return state["l"]

        run_ab(args, "jax", ab_step, batches * 2, lambda: state["l"].block_until_ready())
        return
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

    from cupy.cuda import memory_hook

    def hooks():
        # get_memory_hooks() switches CuPy to its hooked path for the thread: ask
        # _has_memory_hooks() first, so a bare run stays on the plain path.
        has = getattr(memory_hook, "_has_memory_hooks", None)
        if has is not None and not has():
            return "none"
        tl = getattr(memory_hook, "thread_local", None)
        if has is None and tl is not None and getattr(tl, "memory_hooks", None) is None:
            return "none"
        return ",".join(memory_hook.get_memory_hooks()) or "none"

    s = None
    for i in range(args.warmup):
        s = step(i)
    cp.cuda.Device().synchronize()
    state0 = diag(hooks)
    wait, extra = 0.0, 0
    lines = os.environ.get("GPUGUARD_PYTHON") == "lines"
    if gg and lines and state0 is not None and "gpuguard" not in state0:
        w0 = time.perf_counter()
        while "gpuguard" not in (state0 or "") and time.perf_counter() - w0 < WAIT_S:
            for _ in range(10):
                step(extra % args.warmup)
                extra += 1
            cp.cuda.Device().synchronize()
            state0 = diag(hooks)
        wait = time.perf_counter() - w0
    if args.ab_blocks:
        run_ab(args, "cupy", step, list(range(min(10, args.warmup))), cp.cuda.Device().synchronize)
        return
    before = gg() if gg else None
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        s = step(i)
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    after = gg() if gg else None
    report("cupy", args.steps, dt, float(s), before, after)
    print(f"FW workload=cupy before={state0} after={diag(hooks)} wait_s={wait:.2f} "
          f"extra_steps={extra}", flush=True)

    def count():
        class Count(memory_hook.MemoryHook):
            name = "gg_bench_count"

            def __init__(self):
                self.m = 0
                self.f = 0

            def malloc_preprocess(self, **kw):
                self.m += 1

            def free_preprocess(self, **kw):
                self.f += 1

        n = min(100, args.steps)
        with Count() as h:
            for i in range(args.warmup, args.warmup + n):
                step(i)
            cp.cuda.Device().synchronize()
        print(f"FWCALLS workload=cupy steps={n} allocs={h.m} frees={h.f}", flush=True)

    diag(count)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["torch", "jax", "cupy"])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--ab-blocks", type=int, default=0,
                    help="in-process A/B mode: at most this many blocks (see the header)")
    ap.add_argument("--block-steps", type=int, default=0, help="steps per block (0: by --block-ms)")
    ap.add_argument("--block-ms", type=float, default=150.0, help="least block length when K is automatic")
    ap.add_argument("--ab-seconds", type=float, default=0.0, help="stop the A/B blocks after this long")
    ap.add_argument("--ab-gc", type=int, default=1,
                    help="1: the collector off during the A/B blocks, run between pairs (<= 1/s)")
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
