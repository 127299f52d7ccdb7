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
_segments = {}  # base -> [used bytes (bump), {size: [free ptrs]}]
_reserved = 0
_allocated = 0


def _lazy_init():
    global _initialized
    if not _initialized:
        simrt.rt()
        _initialized = True


def is_initialized():
    return _initialized


def get_allocator_backend():
    return "native"


def memory_reserved(device=None):
    return _reserved


def memory_allocated(device=None):
    return _allocated


def _frames():
    out = []
    f = sys._getframe(4)  # the caller of torch.empty
    while f is not None:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
    return out


def _small(nbytes):
    global _reserved
    size = max(ROUND, (nbytes + ROUND - 1) // ROUND * ROUND)
    for base, seg in _segments.items():
        free = seg[1].get(size)
        if free:
            return free.pop(), base
    for base, seg in _segments.items():
        if seg[0] + size <= SEGMENT:
            seg[0] += size
            return base + seg[0] - size, base
    base = simrt.malloc(SEGMENT)
    _reserved += SEGMENT
    _segments[base] = [size, {}]
    return base, base


def _alloc(nbytes):
    global _reserved, _allocated
    _lazy_init()
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
        _segments[b[3]][1].setdefault(b[0], []).append(ptr)
    else:
        _cache.setdefault(b[0], []).append(ptr)


def empty_cache():
    global _reserved
    for size, ptrs in _cache.items():
        for p in ptrs:
            simrt.free(p)
            del _blocks[p]
            _reserved -= size
    _cache.clear()
    for base in list(_segments):
        mine = [p for p, b in _blocks.items() if b[3] == base]
        if not any(_blocks[p][1] for p in mine):
            for p in mine:
                del _blocks[p]
            del _segments[base]
            simrt.free(base)
            _reserved -= SEGMENT
