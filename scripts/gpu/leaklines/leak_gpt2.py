"""Issue 25 on the GPU: a real library's model with a planted leak, found in default
mode. GPT-2 built from a `transformers` config (no weights, nothing downloaded),
trained on random tokens; each step keeps its last position's logits (a list a
program might keep for logging), the line marked SMALL-LEAK-LINE.

  gpuguard run -- python3 leak_gpt2.py [SECONDS]     (GPUGUARD_SNAPSHOT_EVERY=1s)

Prints `step N` every 100 steps and what the kept logits hold by PyTorch's own counter
(`kept <unix ms> <bytes>`: memory_allocated() over its value after the first step).
Judged by check.py like the other leak_small*.py runs.
"""
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
torch.manual_seed(0)
cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=256, vocab_size=8192)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def train():
    history = []
    end = time.time() + seconds
    n = 0
    base = None
    while time.time() < end:
        ids = torch.randint(0, cfg.vocab_size, (4, 128), device="cuda")
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        keep = out.logits[:, -1, :].detach().clone()  # SMALL-LEAK-LINE
        del out
        if base is None:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated() - keep.numel() * keep.element_size()
        history.append(keep)
        n += 1
        if n % 100 == 0:
            torch.cuda.synchronize()
            print("step", n, flush=True)
            print("kept %d %d" % (time.time() * 1000, torch.cuda.memory_allocated() - base), flush=True)
    return n


print("steps", train(), flush=True)
