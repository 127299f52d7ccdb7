"""torch.cuda stand-in: one device, blocks cached by size, freed by empty_cache()."""
import sys

import simrt  # tests/python/fakefw, on PYTHONPATH

from . import memory  # noqa: F401

_initialized = False
_cache = {}  # size -> [ptr] cached (freed by the program, kept by the allocator)
_blocks = {}  # ptr -> [size, in_use, frames]
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


def _alloc(nbytes):
    global _reserved, _allocated
    _lazy_init()
    cached = _cache.get(nbytes)
    if cached:
        ptr = cached.pop()
    else:
        ptr = simrt.malloc(nbytes)
        _reserved += nbytes
    _allocated += nbytes
    _blocks[ptr] = [nbytes, True, _frames() if memory._recording else []]
    return ptr


def _free(ptr):
    global _allocated
    b = _blocks[ptr]
    b[1] = False
    b[2] = []
    _allocated -= b[0]
    _cache.setdefault(b[0], []).append(ptr)


def empty_cache():
    global _reserved
    for size, ptrs in _cache.items():
        for p in ptrs:
            simrt.free(p)
            del _blocks[p]
            _reserved -= size
    _cache.clear()
