#!/usr/bin/env python3
"""Run 4: a soak on both GPUs in one process: a model split over cuda:0 and cuda:1
(activations copied between the devices every step, forward and backward), fixed seeds,
deterministic algorithms. The runner starts it twice at once, under gpuguard and bare,
and sends the guarded one SIGUSR1/SIGUSR2 every few seconds.

Prints GGV_SOAK_READY pid=N after warm-up and GGV_SOAK_STEPS_DONE at the end of the
loop. Writes every step's loss (float.hex) to <GGV_RUN>/losses.txt.
Records (GGV_JSON): config; end (steps, per device memory_reserved/allocated and
gpuguard's counters, after synchronize + empty_cache, so the books can be compared).
Env: GGV_SOAK_S (seconds of steps, default 540), GGV_RUN.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mg  # noqa: E402

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

G = mg.ggv.guard()


def main():
    dur = float(os.environ.get("GGV_SOAK_S", "540"))
    run = os.environ.get("GGV_RUN", ".")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(7)
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    a = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.GELU()).to(d0)
    b = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 256)).to(d1)
    opt = torch.optim.AdamW(list(a.parameters()) + list(b.parameters()), lr=1e-4)
    g = torch.Generator(device=d0).manual_seed(11)
    mg.emit("config", pid=os.getpid(), duration_s=dur, torch=torch.__version__, gpuguard=G.version,
            mode=mg.ggv.torch_alloc_mode())
    losses = open(os.path.join(run, "losses.txt"), "w")
    t0, s = time.time(), 0
    while True:
        x = torch.randn(512, 2048, device=d0, generator=g)
        h = a(x).to(d1)                   # peer copy forward, and back in backward
        out = b(h)
        loss = out.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.write(float(loss).hex() + "\n")
        s += 1
        if s == 5:
            print("GGV_SOAK_READY pid=%d" % os.getpid(), flush=True)
        if time.time() - t0 >= dur and s >= 10:
            break
    losses.close()
    print("GGV_SOAK_STEPS_DONE", flush=True)
    for d in (0, 1):
        torch.cuda.synchronize(d)
    torch.cuda.empty_cache()
    mg.emit("end", steps=s, devices=[{"device": d, "reserved": torch.cuda.memory_reserved(d),
                                      "allocated": torch.cuda.memory_allocated(d), "gg": G.counters(d)}
                                     for d in (0, 1)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
