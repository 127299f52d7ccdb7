"""A stand-in for PyTorch in gpuguard's tests: the few calls gpuguard's Python side
makes (torch.cuda.is_initialized, memory_allocated/reserved, empty_cache,
get_allocator_backend, memory._record_memory_history, memory._snapshot) over a tiny
caching allocator on the simulated CUDA runtime. Not PyTorch: only its interface."""
from . import cuda  # noqa: F401


class Tensor:
    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.ptr = cuda._alloc(nbytes)

    def __del__(self):
        try:
            cuda._free(self.ptr)
        except Exception:
            pass


def empty(nbytes):
    return Tensor(nbytes)
