"""A stand-in for CuPy in gpuguard's tests: a default memory pool with
used/total bytes and free_all_blocks(), a pinned pool, cuda.Device and memory hooks,
on the simulated CUDA runtime. Not CuPy: only the interface gpuguard uses."""
import simrt  # tests/python/fakefw, on PYTHONPATH

from . import cuda


class _Pool:
    def __init__(self):
        self.free = {}
        self.used = 0
        self.total = 0

    def malloc(self, size):
        lst = self.free.get(size)
        if lst:
            ptr = lst.pop()
        else:
            ptr = simrt.malloc(size)
            self.total += size
        self.used += size
        for h in cuda.memory_hook._hooks():
            h.malloc_postprocess(device_id=0, size=size, mem_size=size, mem_ptr=ptr, pmem_id=ptr)
        return ptr

    def release(self, ptr, size):
        for h in cuda.memory_hook._hooks():
            h.free_preprocess(device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=ptr)
        self.used -= size
        self.free.setdefault(size, []).append(ptr)

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.total

    def free_all_blocks(self, stream=None):
        for size, ptrs in self.free.items():
            for p in ptrs:
                simrt.free(p)
                self.total -= size
        self.free.clear()


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
            _pool.release(self.ptr, self.nbytes)
        except Exception:
            pass


def empty(nbytes):
    return ndarray(nbytes)
