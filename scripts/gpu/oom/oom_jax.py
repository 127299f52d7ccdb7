"""A JAX program that runs out of memory (oom check, run.sh).

Takes 1 GiB arrays at OOM-LINE until XLA raises RESOURCE_EXHAUSTED. Prints one JSON
line: the device's memory_stats() at the error and the message.
"""
import json

import jax
import jax.numpy as jnp

held, msg = [], None
try:
    while len(held) < 1000:
        a = jnp.ones((1 << 28,), dtype=jnp.float32)  # OOM-LINE
        a.block_until_ready()
        held.append(a)
except Exception as e:  # XlaRuntimeError / JaxRuntimeError
    msg = "%s: %s" % (type(e).__name__, e)
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"stats": stats, "taken_gib": len(held), "error": (msg or "")[:400]}), flush=True)
