"""Another process holding most of the GPU, for the oom check (run.sh).

  python3 hog.py GIB DIR

Allocates GIB GiB with PyTorch, writes DIR/hog.ready, and holds it until DIR/hog.stop
exists (or 300 s pass).
"""
import os
import sys
import time

import torch

gib, d = float(sys.argv[1]), sys.argv[2]
held = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(os.path.join(d, "hog.ready"), "w").write("%d\n" % torch.cuda.memory_reserved())
end = time.time() + 300
while not os.path.exists(os.path.join(d, "hog.stop")) and time.time() < end:
    time.sleep(0.1)
