#!/usr/bin/env python3
"""PyTorch trim workload (issue 4): a deterministic float32 MLP training loop that,
mid-run, fills PyTorch's cache with GiBs of dropped temporaries, then has them
trimmed by gpuguard from OUTSIDE (the runner's `kill -USR2` or `gpuguard trim PID`).

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

Run by scripts/gpu/validate_trim_leaks.sh (which also judges it, with
scripts/gpu/trim/trim_check.py); by hand, from the repository root:

  LD_PRELOAD=$PWD/target/release/libgpuguard.so GPUGUARD_DIR=/tmp/r GGV_TRIM_ROLE=signal \
      python3 scripts/gpu/trim/trim_torch.py &      # then: kill -USR2 <pid> after GGV_TRIM_READY

The allocator mode comes from the environment only (PYTORCH_CUDA_ALLOC_CONF unset,
expandable_segments:True, or backend:cudaMallocAsync), as in frameworks/torch_train.py.

Roles (GGV_TRIM_ROLE):
  nosignal  the reference: the same steps and the same cache fill, no trim. Its
            per-step losses are compared with the signal run's.
  signal    after step GGV_TRIM_STEP it fills the cache, measures ("before"), prints
            GGV_TRIM_READY pid=N and waits, running Python (a 50 ms poll), for its
            trim report in GPUGUARD_DIR; then measures ("after") and trains on.
  hold      for the CLI and the burst: after GGV_TRIM_READY it waits for the file
            $GGV_RUN_DIR/go_burst (the runner runs `gpuguard trim PID` meanwhile),
            measures ("after_cli"), refills the cache (2 GiB), measures
            ("burst_before"), prints GGV_BURST_READY pid=N, waits for
            $GGV_RUN_DIR/burst_sent (the runner sent 5 SIGUSR2 at once) and for the
            trim reports to settle (3 s without a new one), measures ("burst_after"),
            then trains on: the process must keep running.

A measurement (GGV_JSON {"record": "measure", ...}): torch.cuda.memory_allocated()
(live tensors), memory_reserved() (what the allocator holds; with cudaMallocAsync
the pool's reserve), gpuguard's device-0 counters (C API through ctypes), the
driver's per-process usage from outside (nvidia-smi --query-compute-apps) and the
device's used memory (cudaMemGetInfo).

Knobs: GGV_STEPS (30), GGV_TRIM_STEP (15), GGV_CACHE_GIB (4), GGV_TRIM_WAIT_S (20),
GGV_HOLD_WAIT_S (45), GGV_SEED (1234).
"""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
# Temporaries that fill the cache (MiB): several sizes, each its own segment.
CHUNKS_MIB = [1024, 1024, 768, 512, 384, 256, 100, 30, 10, 4]


alloc_mode = tl.torch_alloc_mode


def main():
    role = os.environ.get("GGV_TRIM_ROLE", "signal")
    steps = int(os.environ.get("GGV_STEPS", "30"))
    trim_step = int(os.environ.get("GGV_TRIM_STEP", "15"))
    fill_mib = int(float(os.environ.get("GGV_CACHE_GIB", "4")) * 1024)
    wait_s = float(os.environ.get("GGV_TRIM_WAIT_S", "20"))
    hold_wait_s = float(os.environ.get("GGV_HOLD_WAIT_S", "45"))
    seed = int(os.environ.get("GGV_SEED", "1234"))
    run_dir = os.environ.get("GGV_RUN_DIR", ".")
    rep_dir = os.environ.get("GPUGUARD_DIR")
    # Deterministic cuBLAS (use_deterministic_algorithms below); read at handle creation.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    pid = os.getpid()
    g = tl.guard()
    if not g.present:
        # Without the shim nothing handles SIGUSR2: ignore it so a bare run survives.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if not torch.cuda.is_available():
        print("torch.cuda is not available", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(seed)
    # warn_only: an op without a deterministic kernel warns instead of stopping the
    # run; the loss comparison then shows whether the two runs still agree.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    mode = alloc_mode()
    backend = torch.cuda.memory.get_allocator_backend()
    tl.emit("config", pid=pid, role=role, mode=mode, backend=backend, steps=steps, trim_step=trim_step,
            fill_mib=fill_mib, torch=torch.__version__, cuda=torch.version.cuda, gpuguard=g.present,
            gpuguard_version=g.version, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

    D, H, L = 1024, 4096, 4
    layers = []
    for i in range(L):
        layers += [nn.Linear(D if i == 0 else H, H), nn.LayerNorm(H), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(H, D)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    w_teacher = torch.randn(D, D, generator=gen, device=dev) / (D ** 0.5)
    sizes = [128, 192, 256, 320, 384, 512]
    batch = [sizes[(i * 7 + 3) % len(sizes)] for i in range(steps)]

    def train_step(i):
        x = torch.randn(batch[i], D, generator=gen, device=dev)
        with torch.no_grad():
            y = torch.tanh(x @ w_teacher)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    def fill_cache(target_mib):
        bufs, total = [], 0
        for c in CHUNKS_MIB:
            if total >= target_mib:
                break
            t = torch.empty(c * MiB // 4, dtype=torch.float32, device=dev)
            t.fill_(1.0)
            bufs.append(t)
            total += c
        touched = sum(float(b[:8].sum()) for b in bufs)
        del bufs, t
        torch.cuda.synchronize()
        return total, touched

    def measure(tag):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        c = g.counters(0) or {}
        nv, how = tl.nvml_process_used(pid)
        m = {"tag": tag, "t": round(time.time(), 3), "allocated": torch.cuda.memory_allocated(),
             "reserved": torch.cuda.memory_reserved(), "gg_current": c.get("current_bytes"),
             "gg_peak": c.get("peak_bytes"), "device_used": total - free, "device_total": total,
             "nvml_used": nv, "nvml_how": how}
        tl.emit("measure", **m)
        return m

    losses = []
    for i in range(min(trim_step, steps)):
        losses.append(train_step(i))
    measure("trained")
    filled, _ = fill_cache(fill_mib)
    before = measure("before")
    tl.note("cache filled with %d MiB of dropped temporaries: allocated %s reserved %s gpuguard %s nvml %s" % (
        filled, tl.mib(before["allocated"]), tl.mib(before["reserved"]), tl.mib(before["gg_current"]),
        tl.mib(before["nvml_used"])))

    if role == "signal":
        print("GGV_TRIM_READY pid=%d" % pid, flush=True)
        e, rep, waited = tl.wait_report(rep_dir, pid, "trim", -1, wait_s) if g.present else (None, None, 0.0)
        tl.emit("trim_seen", report=e["path"] if e else None, seq=e["seq"] if e else None,
                waited_s=round(waited, 3))
        measure("after")
    elif role == "nosignal":
        print("GGV_TRIM_POINT pid=%d (reference run: no signal)" % pid, flush=True)
        time.sleep(0.3)
        measure("after")
    elif role == "hold":
        print("GGV_TRIM_READY pid=%d" % pid, flush=True)
        go = os.path.join(run_dir, "go_burst")
        t0 = time.time()
        while not os.path.exists(go) and time.time() - t0 < hold_wait_s:
            time.sleep(0.05)
        cli = tl.list_reports(rep_dir, pid, "trim")
        tl.emit("cli_phase", go_burst=os.path.exists(go), waited_s=round(time.time() - t0, 3),
                reports=[r["name"] for r in cli])
        measure("after_cli")
        last = max([r["seq"] for r in cli] or [-1])
        fill_cache(2048)
        measure("burst_before")
        print("GGV_BURST_READY pid=%d" % pid, flush=True)
        sent = os.path.join(run_dir, "burst_sent")
        t0 = time.time()
        while not os.path.exists(sent) and time.time() - t0 < 20:
            time.sleep(0.05)
        got = tl.wait_settled(rep_dir, pid, "trim", after_seq=last, first_timeout_s=10, quiet_s=3, max_s=15)
        tl.emit("burst", sent_seen=os.path.exists(sent), after_seq=last,
                reports=[{"name": e["name"], "seq": e["seq"], "trim": tl.trim_obj(r)} for e, r in got])
        measure("burst_after")
    else:
        print("unknown GGV_TRIM_ROLE %r" % role, file=sys.stderr)
        return 2

    for i in range(trim_step, steps):
        losses.append(train_step(i))
    end = measure("end")
    tl.emit("summary", role=role, mode=mode, backend=backend, steps_done=len(losses), steps=steps, losses=losses,
            filled_mib=filled, max_reserved=torch.cuda.max_memory_reserved(),
            max_allocated=torch.cuda.max_memory_allocated(), end_allocated=end["allocated"])
    print("RESULT trim_torch role=%s mode=%s steps=%d loss_last=%r" % (role, mode, len(losses),
                                                                      losses[-1] if losses else None), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
