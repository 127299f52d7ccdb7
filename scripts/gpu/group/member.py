"""A member of the group check (run.sh): PyTorch or JAX, driven by files in DIR.

  python3 member.py torch|jax NAME DIR TARGET_GIB

Takes 1 GiB tensors (arrays) at a time until TARGET_GIB or out of memory, then writes
DIR/NAME.ready (JSON: what it holds, mem_get_info, its framework's counters, its
pid) and obeys DIR/NAME.cmd lines as they come: `more` (take 1 GiB tensors until
out of memory again, 3 tries 1 s apart, then DIR/NAME.more.<n>), `drop K` (delete K
tensors, keeping PyTorch's cache; then DIR/NAME.drop.<n>), `release K` (delete K
tensors and empty PyTorch's cache; then DIR/NAME.release.<n>), `stop` (exit). Each
answer file carries the time it was written (`t_done`, seconds since the epoch).
"""
import json
import os
import sys
import time

kind, name, d, target = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
GIB = 1 << 30
held = []
if kind == "torch":
    import torch

    def take():
        held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))

    def counters():
        f, t = torch.cuda.mem_get_info()
        return {"mem_get_info": [f, t], "allocated": torch.cuda.memory_allocated(),
                "reserved": torch.cuda.memory_reserved()}
    oom = torch.OutOfMemoryError
else:
    import jax
    import jax.numpy as jnp

    def take():
        a = jnp.ones((GIB // 4,), dtype=jnp.float32)
        a.block_until_ready()
        held.append(a)

    def counters():
        return {"memory_stats": jax.devices()[0].memory_stats()}
    oom = Exception


def fill(limit):
    while len(held) < limit:
        try:
            take()
        except oom as e:  # noqa: PERF203
            return str(e)[:300]
    return None


def write(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


err = fill(target)
write(os.path.join(d, name + ".ready"), {"pid": os.getpid(), "held_gib": len(held), "error": err, **counters()})
seen, n, answered = 0, 0, {}
end = time.time() + 240
while time.time() < end:
    path = os.path.join(d, name + ".cmd")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    for c in lines[seen:]:
        seen += 1
        if c == "stop":
            sys.exit(0)
        if c.startswith("drop") or c.startswith("release"):
            word, k = c.split()
            for _ in range(int(k)):
                held.pop()
            if word == "release" and kind == "torch":
                torch.cuda.empty_cache()
            answered[word] = answered.get(word, 0) + 1
            write(os.path.join(d, "%s.%s.%d" % (name, word, answered[word])),
                  {"held_gib": len(held), "t_done": time.time(), **counters()})
        if c == "more":
            n += 1
            t0, before, tries = time.time(), len(held), []
            for _ in range(3):
                e = fill(10_000)
                tries.append({"held_gib": len(held), "error": e, "t": round(time.time() - t0, 3)})
                if len(held) > before:
                    break
                time.sleep(1)
            write(os.path.join(d, "%s.more.%d" % (name, n)),
                  {"tries": tries, "held_gib": len(held), "t_done": time.time(), **counters()})
    time.sleep(0.05)
