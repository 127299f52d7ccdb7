#!/usr/bin/env python3
"""PyTorch workload for gpuguard validation: a small transformer LM training loop
with variable sequence lengths (many allocation sizes), bf16 autocast, AdamW.

The allocator mode comes from the environment only (no code change between
modes):
  (unset)                                          -> mode "default"  (caching allocator, cudaMalloc)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -> mode "expandable" (cuMemCreate/cuMemMap)
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync  -> mode "cudaMallocAsync" (stream-ordered pool)

At each checkpoint (baseline, warmup, mid, end, after_free) it synchronizes and
prints one JSON line comparing gpuguard's device-0 current_bytes with:
  default / expandable: torch.cuda.memory_reserved()  (bytes the caching allocator
                        holds from the driver: exactly what gpuguard should see)
  cudaMallocAsync:      torch.cuda.memory_allocated() (= the pool's UsedMemCurrent,
                        the live blocks). memory_reserved() is then the pool's
                        ReservedMemCurrent, which also holds freed blocks the pool
                        keeps; gpuguard counts live blocks only, so reserved -
                        gpuguard ("pool_slack") is printed, not judged.
Mid-run it prints GGV_MIDRUN and waits for gpuguard's signal report (see
ggv_common.py). The last line ("check": "summary") carries steps/s and the loss
curve, so a later run (e.g. with trimming enabled) can be compared.

Knobs: GGV_TORCH_STEPS (timed steps, default 160), GGV_TORCH_WARMUP (20),
GGV_TORCH_SEED (1234), GGV_TORCH_BATCH (32), GGV_TORCH_LAYERS (6).
"""

import gc
import os
import random
import sys
import time

import ggv_common as ggv

import torch
import torch.nn as nn
import torch.nn.functional as F

MiB = ggv.MiB


alloc_mode = ggv.torch_alloc_mode


class TinyLM(nn.Module):
    def __init__(self, vocab, d_model, layers, heads, ff, max_len):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x):
        t = x.shape[1]
        h = self.emb(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.enc(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def selected_stats():
    s = torch.cuda.memory_stats()
    keys = [
        "allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
        "requested_bytes.all.current", "segment.all.current", "num_device_alloc", "num_device_free",
        "num_alloc_retries", "num_ooms", "num_sync_all_streams",
    ]
    return {k: s[k] for k in keys if k in s}, sorted({k.split(".")[0] for k in s})


def main():
    mode = alloc_mode()
    steps = int(os.environ.get("GGV_TORCH_STEPS", "160"))
    warm = int(os.environ.get("GGV_TORCH_WARMUP", "20"))
    seed = int(os.environ.get("GGV_TORCH_SEED", "1234"))
    batch = int(os.environ.get("GGV_TORCH_BATCH", "32"))
    layers = int(os.environ.get("GGV_TORCH_LAYERS", "6"))
    vocab, d_model, heads, ff, min_len, max_len = 8192, 512, 8, 2048, 64, 255

    if not torch.cuda.is_available():
        print("torch.cuda is not available", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    backend = torch.cuda.memory.get_allocator_backend()

    if mode == "cudaMallocAsync":
        metric = "torch.cuda.memory_allocated"
        prefix = ("backend:cudaMallocAsync: memory_reserved() is the driver pool's ReservedMemCurrent "
                  "(includes freed blocks the pool keeps); gpuguard counts live stream-ordered blocks, "
                  "so it is compared with memory_allocated() (pool UsedMemCurrent). ")
        under = 0.02
        under_reason = "the pool rounds each block up; UsedMemCurrent counts rounded sizes, gpuguard requested sizes"
    else:
        metric = "torch.cuda.memory_reserved"
        prefix = ""
        under, under_reason = 0.0, ""
    chk = ggv.Checker(
        "torch", mode, overhead_bound=512 * MiB,
        overhead_reason="device memory allocated outside the caching allocator (cuBLAS/cuBLASLt/cuDNN "
                        "internals, CUDA runtime) is visible to gpuguard, not to torch",
        under_frac=under, under_reason=under_reason)

    def checkpoint(name, reference=True, **extra):
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved()
        allocated = torch.cuda.memory_allocated()
        stats, _ = selected_stats()
        fw = allocated if mode == "cudaMallocAsync" else reserved
        info = {
            "allocator_backend": backend,
            "memory_reserved": reserved,
            "memory_allocated": allocated,
            "torch_stats": stats,
        }
        c = chk.guard.counters(0)
        if mode == "cudaMallocAsync" and c and "current_bytes" in c:
            info["pool_slack"] = reserved - c["current_bytes"]
        info.update(extra)
        return chk.check(name, metric, fw, info, explanation_prefix=prefix, reference=reference)

    torch.manual_seed(seed)
    rng = random.Random(seed)
    lengths = [rng.randint(min_len, max_len) for _ in range(warm + steps)]
    g = torch.Generator(device=dev)
    g.manual_seed(seed)

    _tiny = torch.zeros(16, device=dev)
    checkpoint("baseline", reference=False)

    model = TinyLM(vocab, d_model, layers, heads, ff, max_len + 1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)

    def batch_for(t):
        start = torch.randint(0, vocab, (batch, 1), generator=g, device=dev)
        stride = torch.randint(1, 8, (batch, 1), generator=g, device=dev)
        seq = (start + stride * torch.arange(t + 1, device=dev)) % vocab
        return seq[:, :-1], seq[:, 1:]

    losses = []

    def train_step(i):
        x, y = batch_for(lengths[i])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    for i in range(warm):
        train_step(i)
    checkpoint("warmup", step=warm)

    timed = 0.0
    half = warm + steps // 2
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(warm, half):
        train_step(i)
    torch.cuda.synchronize()
    timed += time.perf_counter() - t0
    checkpoint("mid", step=half)
    chk.midrun(pause_note="training paused while waiting; the pause is excluded from steps/s")

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(half, warm + steps):
        train_step(i)
    torch.cuda.synchronize()
    timed += time.perf_counter() - t0
    checkpoint("end", step=warm + steps)

    loss_values = [round(float(v), 4) for v in torch.stack(losses).tolist()]
    _, families = selected_stats()
    chk.request_report()

    # Drop every tensor (the closures above hold these names, so rebind, not del).
    model = opt = None
    del _tiny
    losses.clear()
    gc.collect()
    torch.cuda.empty_cache()
    checkpoint("after_free", note="model/optimizer deleted, empty_cache(): freed segments must leave gpuguard too")

    ggv.emit({
        "check": "summary",
        "framework": "torch",
        "mode": mode,
        "verdict": "info",
        "allocator_backend": backend,
        "torch_version": torch.__version__,
        "steps_timed": steps,
        "warmup_steps": warm,
        "steps_per_s": round(steps / timed, 3) if timed > 0 else None,
        "timed_s": round(timed, 3),
        "loss_first": loss_values[0] if loss_values else None,
        "loss_last": loss_values[-1] if loss_values else None,
        "losses": loss_values,
        "seq_lengths_distinct": len(set(lengths)),
        "memory_stats_families": families,
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "gpuguard_peak": (chk.guard.counters(0) or {}).get("peak_bytes"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
