"""A stand-in for JAX in gpuguard's tests: a preallocated arena on the simulated
runtime (as XLA's BFC allocator takes one), buffers carved from it, memory_stats(),
and profiler.device_memory_profile() in pprof form with each buffer's Python frames.
Not JAX: only the interface gpuguard uses. Importing it starts nothing; init() does."""
import sys

from . import profiler  # noqa: F401
from ._src import xla_bridge

ARENA = 64 << 20
_arena = None
_buffers = {}  # id -> (bytes, frames)


class _Device:
    id = 0
    local_hardware_id = 0
    platform = "gpu"

    def memory_stats(self):
        used = sum(b for b, _ in _buffers.values())
        return {"bytes_in_use": used, "pool_bytes": ARENA, "bytes_limit": ARENA}


def init():
    """The backend starts: the arena is taken from the driver in one piece."""
    global _arena
    import simrt

    if _arena is None:
        _arena = simrt.malloc(ARENA)
        xla_bridge._backends["cuda"] = object()


def local_devices():
    return [_Device()]


class Array:
    def __init__(self, nbytes):
        frames = []
        f = sys._getframe(2)  # the caller of jax.empty
        while f is not None:
            frames.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        _buffers[id(self)] = (nbytes, frames)

    def __del__(self):
        _buffers.pop(id(self), None)


def empty(nbytes):
    init()
    return Array(nbytes)
