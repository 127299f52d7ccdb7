"""torch.cuda stand-in: one device and a small caching allocator over the simulated
runtime, in PyTorch's shapes. Tensors under 1 MiB are carved from 2 MiB segments
(PyTorch's small pool: a small tensor a step costs the driver one segment every
32 steps, the rest comes from the cache); larger ones are a block each (PyTorch's
small pool takes sizes up to 1 MiB inclusive; here 1 MiB tensors stay blocks of their
own, which keeps the older tests' arithmetic simple). Freed blocks are cached and
given back by empty_cache()."""
import sys

import simrt  # tests/python/fakefw, on PYTHONPATH

from . import memory  # noqa: F401

SMALL = 1 << 20  # below this: the small pool
SEGMENT = 2 << 20  # a small pool segment
ROUND = 512

_initialized = False
_cache = {}  # size -> [ptr]: large blocks freed by the program, kept by the allocator
_blocks = {}  # ptr -> [size, in_use, frames, segment base or None]
_segments = {}  # base -> [used bytes (bump), unused]
_free_small = {}  # size -> [ptr]: small blocks freed by the program, kept cached
_bump = None  # the segment new small blocks are carved from
_reserved = 0
_allocated = 0
_nallocs = 0  # tensor allocations so far (memory_stats' allocation.all.allocated)
# A signal to send this process at the next is_initialized() (only gpuguard's Python
# side asks it): a Ctrl-C landing while gpuguard's code runs. Set by the test program.
signal_in_query = None
# Whether is_initialized() runs code from a string, as the first import of a module
# that defines a namedtuple does (CPython then forgets an unhandled KeyboardInterrupt).
exec_in_query = False


def _lazy_init():
    global _initialized
    if not _initialized:
        simrt.rt()
        _initialized = True


def is_initialized():
    global signal_in_query
    if signal_in_query is not None:
        import os

        sig, signal_in_query = signal_in_query, None
        os.kill(os.getpid(), sig)
    if exec_in_query:
        exec("pass")
    return _initialized


def get_allocator_backend():
    return "native"


def memory_reserved(device=None):
    return _reserved


def memory_allocated(device=None):
    return _allocated


def memory_stats(device=None):
    return {
        "allocation.all.allocated": _nallocs,
        "allocated_bytes.all.current": _allocated,
        "reserved_bytes.all.current": _reserved,
    }


def _frames():
    out = []
    f = sys._getframe(4)  # the caller of torch.empty
    while f is not None:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
    return out


def _small(nbytes):
    global _reserved, _bump
    size = max(ROUND, (nbytes + ROUND - 1) // ROUND * ROUND)
    free = _free_small.get(size)
    if free:
        ptr = free.pop()
        return ptr, _blocks[ptr][3]
    if _bump is None or _segments[_bump][0] + size > SEGMENT:
        _bump = simrt.malloc(SEGMENT)
        _reserved += SEGMENT
        _segments[_bump] = [0, None]
    seg = _segments[_bump]
    seg[0] += size
    return _bump + seg[0] - size, _bump


def _alloc(nbytes):
    global _reserved, _allocated, _nallocs
    _lazy_init()
    _nallocs += 1
    if nbytes < SMALL:
        ptr, seg = _small(nbytes)
        size = max(ROUND, (nbytes + ROUND - 1) // ROUND * ROUND)
    else:
        seg, size = None, nbytes
        cached = _cache.get(nbytes)
        if cached:
            ptr = cached.pop()
        else:
            ptr = simrt.malloc(nbytes)
            _reserved += nbytes
    _allocated += size
    # The recorder keeps the allocating stack of each block allocated while it is on
    # (context "alloc" or "state"); the block keeps it after recording stops.
    _blocks[ptr] = [size, True, _frames() if memory._recording else [], seg]
    return ptr


def _free(ptr):
    global _allocated
    b = _blocks[ptr]
    b[1] = False
    b[2] = []
    _allocated -= b[0]
    if b[3] is not None:
        _free_small.setdefault(b[0], []).append(ptr)
    else:
        _cache.setdefault(b[0], []).append(ptr)


def empty_cache():
    global _reserved
    # As PyTorch's: the device is synchronized before cached blocks are freed (a
    # synchronizing call, which a CUDA graph capture in progress forbids).
    if _initialized:
        simrt.synchronize()
    for size, ptrs in _cache.items():
        for p in ptrs:
            simrt.free(p)
            del _blocks[p]
            _reserved -= size
    _cache.clear()
    global _bump
    busy = {b[3] for b in _blocks.values() if b[1] and b[3] is not None}
    for base in [b for b in _segments if b not in busy]:
        for p in [p for p, b in _blocks.items() if b[3] == base]:
            del _blocks[p]
        del _segments[base]
        simrt.free(base)
        _reserved -= SEGMENT
        if _bump == base:
            _bump = None
    for size in list(_free_small):
        _free_small[size] = [p for p in _free_small[size] if p in _blocks]
