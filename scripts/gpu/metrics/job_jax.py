"""A JAX job for the metrics check (run.sh): holds GIB GiB of arrays.

  python3 job_jax.py GIB DIR NAME

Writes DIR/NAME.ready (JSON: the device's memory_stats()) once settled, holds until
DIR/stop.
"""
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

gib, d, name = float(sys.argv[1]), sys.argv[2], sys.argv[3]
keep = [jnp.ones((1 << 24,), dtype=jnp.float32) for _ in range(int(gib * 16))]
for a in keep:
    a.block_until_ready()
fw = {"pid": os.getpid(), "stats": jax.devices()[0].memory_stats()}
with open(os.path.join(d, name + ".ready.tmp"), "w") as f:
    json.dump(fw, f)
os.rename(os.path.join(d, name + ".ready.tmp"), os.path.join(d, name + ".ready"))
end = time.time() + 300
while not os.path.exists(os.path.join(d, "stop")) and time.time() < end:
    time.sleep(0.1)
