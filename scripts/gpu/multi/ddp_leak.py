#!/usr/bin/env python3
"""Run 3: torchrun --nproc_per_node=2, DDP training, one rank per GPU (LOCAL_RANK), a
leak planted on rank 1 only (a 4 MiB tensor kept every step, the line marked
GGV_LEAK_LINE). Fixed seeds. Halfway, rank 0 writes <GGV_RUN>/ready.rank0 (its pid) and
waits for <GGV_RUN>/trim.done: the runner runs `gpuguard trim PID` on it meanwhile (rank
1 waits in the next all-reduce).

Records (GGV_JSON, every rank; multi_check.py ranks judges them):
  config     pid, rank, local_rank, world_size, caps, steps
  meminfo    torch.cuda.mem_get_info(local_rank) (free, total): total must be the cap of
             the rank's device
  step       every 10 steps: loss, memory_reserved/allocated, gpuguard's current
  trim_wait  rank 0: how long it waited for the runner's trim
  end        memory_reserved/allocated and gpuguard's counters of the rank's device
Env: GGV_STEPS (default 200), GGV_STEP_S (sleep per step, default 0.05), GGV_RUN.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mg  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

G = mg.ggv.guard()
LEAKS = []


def main():
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    steps = int(os.environ.get("GGV_STEPS", "200"))
    step_s = float(os.environ.get("GGV_STEP_S", "0.05"))
    run = os.environ.get("GGV_RUN", ".")
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    mg.emit("config", pid=os.getpid(), rank=rank, local_rank=local, world_size=world, caps=mg.caps_of(),
            steps=steps, torch=torch.__version__, gpuguard=G.version)
    try:
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:  # torch before 2.3: no device_id
        dist.init_process_group("nccl")
    free, total = torch.cuda.mem_get_info(local)
    mg.emit("meminfo", rank=rank, device=local, free=free, total=total)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    for s in range(steps):
        x = torch.randn(256, 1024, device=dev, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 1:
            LEAKS.append(torch.empty(4 * mg.MiB, dtype=torch.uint8, device=dev))  # GGV_LEAK_LINE
        if s % 10 == 0 or s == steps - 1:
            mg.emit("step", rank=rank, step=s, loss=float(loss), reserved=torch.cuda.memory_reserved(local),
                    allocated=torch.cuda.memory_allocated(local), gg_current=G.current(local))
        if s == steps // 2 and rank == 0:
            with open(os.path.join(run, "ready.rank0.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(run, "ready.rank0.tmp"), os.path.join(run, "ready.rank0"))
            t0 = time.time()
            while not os.path.exists(os.path.join(run, "trim.done")) and time.time() - t0 < 90:
                time.sleep(0.01)  # Python runs between sleeps: gpuguard's trim can run here
            mg.emit("trim_wait", rank=rank, waited_s=round(time.time() - t0, 2),
                    released=os.path.exists(os.path.join(run, "trim.done")))
        time.sleep(step_s)
    torch.cuda.synchronize(local)
    dist.barrier()
    mg.emit("end", rank=rank, device=local, reserved=torch.cuda.memory_reserved(local),
            allocated=torch.cuda.memory_allocated(local), leaked=len(LEAKS) * 4 * mg.MiB, gg=G.counters(local))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
