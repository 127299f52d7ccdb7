"""A stand-in for CuPy in gpuguard's tests: the default memory pool with used/total
bytes and free_all_blocks(), a pinned pool, cuda.Device and memory hooks, on the
simulated CUDA runtime. Not CuPy: only the interface gpuguard uses, and what its
default mode's sampling windows depend on:

- The pool, as CuPy's: sizes are rounded up to 512 bytes; a request is served from
  the smallest free chunk that holds it (split, the rest stays free); a freed chunk
  merges with free neighbours of the same driver allocation; cudaMalloc is called only
  when no free chunk holds the request. So a small array kept after a step's
  temporaries were freed takes one of their chunks, and the next step's temporaries
  make the pool grow: the driver sees another line than the one that keeps memory.
- Memory hooks are called as CuPy 14's compiled code calls them: the thread's hooks
  OrderedDict, if not empty, has its values view taken once for the pre and the post
  calls, with CuPy's keyword arguments (alloc_* only when the pool goes to the
  driver). The loops run in C here (deque over map(methodcaller)), so, as with CuPy's
  Cython loops, the interpreter runs no bytecode of theirs: a pending call can land
  only inside a hook's own methods, and a hook added or removed while a loop runs makes
  the loop raise RuntimeError, as CuPy's does."""
import bisect
import collections
import operator

import simrt  # tests/python/fakefw, on PYTHONPATH

from . import cuda
from .cuda import memory_hook

_UNIT = 512


def _call(hooks, name, **kw):
    collections.deque(map(operator.methodcaller(name, **kw), hooks), maxlen=0)


class _Pool:
    def __init__(self):
        self.mems = {}  # driver allocation -> its size
        self.chunks = {}  # chunk address -> [driver allocation, size, in use]
        self.ends = {}  # chunk end -> chunk address
        self.free = []  # sorted (size, address) of the free chunks
        self.used = 0
        self.total = 0

    def _hooks(self):
        if not memory_hook._has_memory_hooks():
            return None
        hooks = memory_hook.get_memory_hooks()
        return hooks.values() if hooks else None

    def _chunk(self, ptr, base, size, in_use):
        self.chunks[ptr] = [base, size, in_use]
        self.ends[ptr + size] = ptr
        if not in_use:
            bisect.insort(self.free, (size, ptr))

    def _unfree(self, ptr):
        base, size, _ = self.chunks.pop(ptr)
        del self.ends[ptr + size]
        self.free.remove((size, ptr))
        return size

    def malloc(self, size):
        mem_size = max(_UNIT, -(-size // _UNIT) * _UNIT)
        hooks = self._hooks()
        if hooks is None:
            return self._malloc(mem_size, None)
        _call(hooks, "malloc_preprocess", device_id=0, size=size, mem_size=mem_size)
        ptr = 0
        try:
            ptr = self._malloc(mem_size, hooks)
        finally:
            kw = dict(device_id=0, size=size, mem_size=mem_size, mem_ptr=ptr, pmem_id=ptr)
            _call(hooks, "malloc_postprocess", **kw)
        return ptr

    def _malloc(self, mem_size, hooks):
        i = bisect.bisect_left(self.free, (mem_size, 0))
        if i < len(self.free):
            csize, ptr = self.free[i]
            base = self.chunks[ptr][0]
            self._unfree(ptr)
            self._chunk(ptr, base, mem_size, True)
            if csize > mem_size:
                self._chunk(ptr + mem_size, base, csize - mem_size, False)
        else:
            if hooks is not None:
                _call(hooks, "alloc_preprocess", device_id=0, mem_size=mem_size)
            ptr = simrt.malloc(mem_size)
            if hooks is not None:
                _call(hooks, "alloc_postprocess", device_id=0, mem_size=mem_size, mem_ptr=ptr)
            self.mems[ptr] = mem_size
            self.total += mem_size
            self._chunk(ptr, ptr, mem_size, True)
        self.used += mem_size
        return ptr

    def release(self, ptr):
        size = self.chunks[ptr][1]
        hooks = self._hooks()
        if hooks is None:
            return self._free(ptr)
        _call(hooks, "free_preprocess", device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=ptr)
        try:
            self._free(ptr)
        finally:
            _call(hooks, "free_postprocess", device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=ptr)

    def _free(self, ptr):
        base, size, _ = self.chunks.pop(ptr)
        del self.ends[ptr + size]
        self.used -= size
        nxt = self.chunks.get(ptr + size)
        if nxt is not None and nxt[0] == base and not nxt[2]:
            size += self._unfree(ptr + size)
        prev = self.ends.get(ptr)
        if prev is not None and self.chunks[prev][0] == base and not self.chunks[prev][2]:
            size += self._unfree(prev)
            ptr = prev
        self._chunk(ptr, base, size, False)

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.total

    def free_all_blocks(self, stream=None):
        for size, ptr in list(self.free):
            if self.mems.get(ptr) == size:
                self._unfree(ptr)
                del self.mems[ptr]
                simrt.free(ptr)
                self.total -= size


class _PinnedPool:
    def n_free_blocks(self):
        return 0

    def free_all_blocks(self):
        pass


_pool = _Pool()
_pinned = _PinnedPool()


def get_default_memory_pool():
    return _pool


def get_default_pinned_memory_pool():
    return _pinned


class ndarray:
    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.ptr = _pool.malloc(nbytes)

    def __del__(self):
        try:
            _pool.release(self.ptr)
        except RuntimeError:
            # A hooks dict changed while a loop ran over it: CuPy reports it the same
            # way ("Exception ignored in ..."), and the block stays in use.
            raise
        except Exception:
            pass  # the interpreter's teardown: modules may be gone


def empty(nbytes):
    return ndarray(nbytes)
