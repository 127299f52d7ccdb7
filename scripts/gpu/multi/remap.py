#!/usr/bin/env python3
"""Run 2: remapped devices. `remap.py physical` (no shim, every device visible) records
each ordinal's UUID (= the machine's physical order) and NVML's list; `remap.py check`
(under the shim, with CUDA_VISIBLE_DEVICES=1 or 1,0 and per-device caps) records what the
process sees and fills ordinal 0 until PyTorch refuses.

Records (GGV_JSON; multi_check.py remap judges them against the physical run):
  config     pid, visible (CUDA_VISIBLE_DEVICES), caps
  dev/nvml   what each ordinal and each NVML device shows (mg.views)
  oom        ordinal 0 filled in 256 MiB tensors until torch.OutOfMemoryError
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mg  # noqa: E402


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    mg.emit("config", pid=os.getpid(), what=what, visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            caps=mg.caps_of())
    if what == "physical":
        mg.views()
        mg.emit("done")
        return 0
    import torch

    for d in range(torch.cuda.device_count()):
        torch.empty(1, device=d)
    mg.views(torch)
    held, msg = [], None
    try:
        for _ in range(4096):
            held.append(torch.empty(256 * mg.MiB, dtype=torch.uint8, device=0))
    except torch.OutOfMemoryError as e:
        msg = str(e)
    mg.emit("oom", device=0, refused=msg is not None, message=(msg or "")[:600],
            reserved_at_refusal=torch.cuda.memory_reserved(0), filled=len(held) * 256 * mg.MiB)
    mg.emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
