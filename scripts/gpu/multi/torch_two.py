#!/usr/bin/env python3
"""Run 1 (PyTorch): one process, two devices, GPUGUARD_CAP=0:4GiB,1:8GiB (any per-device
sizes), in the allocator mode PYTORCH_CUDA_ALLOC_CONF selects.

Records (GGV_JSON; multi_check.py judges them):
  config     pid, mode, device_count, caps
  dev/nvml   what each ordinal and each NVML device shows (mg.views)
  books      at a label: per device memory_reserved/allocated and the report written
             then (before_peer, after_peer, end)
  peer       a 256 MiB tensor copied 0 -> 1 -> 0: can_access, equal
  oom        per device: filled in 256 MiB tensors until torch.OutOfMemoryError; the
             message, memory_reserved at the refusal, the cap reports seen after it
  done       the end
No matmul or library call that takes a workspace: the books can be equal to the byte.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mg  # noqa: E402

import torch  # noqa: E402

ggv = mg.ggv
G = ggv.guard()
DIR = os.environ.get("GPUGUARD_DIR")
CHUNK = 256 * mg.MiB


def books(label):
    for d in range(2):
        torch.cuda.synchronize(d)
    rc, path = mg.report(G, label)
    for d in range(2):
        mg.emit("books", label=label, device=d, reserved=torch.cuda.memory_reserved(d),
                allocated=torch.cuda.memory_allocated(d), report=path, report_rc=rc,
                gg=G.counters(d))


def fill(d):
    held, msg = [], None
    after = max([e["seq"] for e in ggv.list_reports(DIR, os.getpid(), "cap")] or [-1])
    try:
        for _ in range(4096):
            held.append(torch.empty(CHUNK, dtype=torch.uint8, device=d))
    except torch.OutOfMemoryError as e:
        msg = str(e)
    reserved = torch.cuda.memory_reserved(d)
    # The cap report of this refusal (cap reports are at most one a second).
    e, rep, waited = ggv.wait_report(DIR, os.getpid(), "cap", after_seq=after, timeout_s=5.0)
    mg.emit("oom", device=d, message=(msg or "")[:600], refused=msg is not None, filled=len(held) * CHUNK,
            reserved_at_refusal=reserved, cap_report=e and e["path"],
            denial=(rep or {}).get("denial", {}) and {k: rep["denial"].get(k) for k in
                                                     ("device", "bytes", "api", "cap_bytes", "charged_bytes")},
            gg=G.counters(d))
    del held
    torch.cuda.empty_cache()


def main():
    n = torch.cuda.device_count()
    mg.emit("config", pid=os.getpid(), mode=ggv.torch_alloc_mode(), device_count=n, caps=mg.caps_of(),
            torch=torch.__version__, gpuguard=G.version)
    if n < 2:
        mg.emit("skip", reason="%d CUDA device(s): run 1 needs two" % n)
        return 0
    for d in range(2):
        torch.empty(1, device=d)  # contexts up
    mg.views(torch)
    keep = {d: [torch.empty(s, dtype=torch.uint8, device=d) for s in (64 * mg.MiB, 3 * mg.MiB + 17, 200 * mg.MiB)]
            for d in range(2)}
    del keep[0][1], keep[1][0]
    books("before_peer")
    a = torch.randn(64 * mg.MiB, device=0)
    can = torch.cuda.can_device_access_peer(0, 1)
    b = a.to(1)
    c = b.to(0)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    mg.emit("peer", can_access=can, equal=bool(torch.equal(a, c)), bytes=a.numel() * 4)
    del b, c
    books("after_peer")
    del a, keep
    fill(0)
    fill(1)
    books("end")
    mg.emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
