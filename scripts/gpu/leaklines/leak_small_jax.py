"""Issue 12 on the GPU, JAX: a 64 KiB array kept each step, found in default mode.

  gpuguard run -- python3 leak_small_jax.py [SECONDS]     (GPUGUARD_SNAPSHOT_EVERY=1s)

JAX's defaults (a preallocated arena: the driver sees one allocation at start). A
jitted step trains a small MLP; each step keeps one 16,384-float32 array (the line
marked SMALL-LEAK-LINE). The history is freed just before exit (a drop at exit).
`gpuguard show --json` over the reports must list this line first among the suspected
leaks (JAX's device memory profile gives the arrays' Python lines), and no report may
contain "(code no longer alive)". Judged by check.py.
"""
import sys
import time

import jax
import jax.numpy as jnp

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
key = jax.random.PRNGKey(0)
w1 = jax.random.normal(key, (512, 512)) * 0.01
w2 = jax.random.normal(key, (512, 10)) * 0.01


@jax.jit
def step(w1, w2, x):
    def loss(w1, w2):
        return jnp.square(jnp.maximum(x @ w1, 0) @ w2).mean()

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.01 * g1, w2 - 0.01 * g2


def train():
    global w1, w2
    history = []
    end = time.time() + seconds
    n = 0
    dev = jax.local_devices()[0]
    base = None
    while time.time() < end:
        x = jax.random.normal(jax.random.PRNGKey(n), (64, 512))
        w1, w2 = step(w1, w2, x)
        if base is None:
            w2.block_until_ready()
            del x
            base = dev.memory_stats()["bytes_in_use"]
        history.append(jnp.zeros(16384, dtype=jnp.float32) + n)  # SMALL-LEAK-LINE
        n += 1
        if n % 100 == 0:
            history[-1].block_until_ready()
            print("step", n, flush=True)
            # What the kept arrays hold by JAX's own counter (bytes in use over its
            # value after the first step).
            print("kept %d %d" % (time.time() * 1000, dev.memory_stats()["bytes_in_use"] - base), flush=True)
        time.sleep(0.002)
    return n


print("steps", train(), flush=True)
