#!/usr/bin/env python3
"""gpuguard's C API from Python, through ctypes.

Run under gpuguard (`gpuguard run -- python ctypes_api.py`, or
`LD_PRELOAD=$(gpuguard lib) python ctypes_api.py`). Without gpuguard the wrapper
says so and every call is a no-op, so a training script can keep these calls.

In a training loop:

    gg = GpuGuard()
    with gg.tag("eval"):          # allocations made here are labelled "eval"
        evaluate(model)
    gg.set_cap(0, 20 << 30)       # cap device 0 at 20 GiB from now on (0 lifts it)
    gg.trim()                     # hand cached memory back; returns the report path

The demo at the bottom allocates through PyTorch when it is installed, else through
the CUDA driver directly (libcuda.so.1).
"""
import contextlib
import ctypes
import sys


class Counters(ctypes.Structure):
    """struct gpuguard_device_counters (include/gpuguard.h)."""

    _fields_ = [
        ("device", ctypes.c_int32),
        ("reserved0", ctypes.c_uint32),
        ("total_bytes", ctypes.c_uint64),
        ("cap_bytes", ctypes.c_uint64),
        ("current_bytes", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("allocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("denied", ctypes.c_uint64),
        ("unknown_frees", ctypes.c_uint64),
    ]


class GpuGuard:
    def __init__(self):
        # CDLL (not PyDLL): calls release the GIL, so a trim's Python part can run.
        lib = ctypes.CDLL(None)
        self.present = hasattr(lib, "gpuguard_version")
        if not self.present:
            return
        lib.gpuguard_version.restype = ctypes.c_char_p
        lib.gpuguard_device_counters.argtypes = [ctypes.c_int, ctypes.POINTER(Counters)]
        lib.gpuguard_trim.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        lib.gpuguard_set_cap.argtypes = [ctypes.c_int, ctypes.c_uint64]
        lib.gpuguard_push_tag.argtypes = [ctypes.c_char_p]
        self.lib = lib

    def version(self):
        return self.lib.gpuguard_version().decode() if self.present else None

    def counters(self, device=0):
        c = Counters()
        if not self.present or self.lib.gpuguard_device_counters(device, ctypes.byref(c)) != 0:
            return None
        return {name: getattr(c, name) for name, _ in Counters._fields_}

    def set_cap(self, device, nbytes):
        """0: set; 1: set, but usage is already above it; -1: refused."""
        return self.lib.gpuguard_set_cap(device, nbytes) if self.present else -1

    def trim(self, timeout_ms=10_000):
        """The trim report's path ('' when it went to stderr); None on timeout."""
        if not self.present:
            return None
        buf = ctypes.create_string_buffer(4096)
        rc = self.lib.gpuguard_trim(timeout_ms, buf, len(buf))
        return buf.value.decode() if rc == 0 else None

    @contextlib.contextmanager
    def tag(self, label):
        pushed = self.present and self.lib.gpuguard_push_tag(label.encode()) == 0
        try:
            yield
        finally:
            if pushed:
                self.lib.gpuguard_pop_tag()


def allocator():
    """alloc(nbytes) -> handle, through PyTorch if present, else the driver."""
    try:
        import torch

        if torch.cuda.is_available():
            return lambda n: torch.empty(n, dtype=torch.uint8, device="cuda")
    except ImportError:
        pass
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0

    def alloc(n):
        p = ctypes.c_uint64()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return p.value if rc == 0 else None

    return alloc


def main():
    gg = GpuGuard()
    if not gg.present:
        print("gpuguard is not loaded: run under `gpuguard run --`", file=sys.stderr)
        return 1
    print(f"gpuguard {gg.version()}")
    alloc = allocator()
    MiB = 1 << 20
    kept = [alloc(4 * MiB)]
    with gg.tag("eval"):
        kept.append(alloc(6 * MiB))
    print(f"set_cap {gg.set_cap(0, 16 * MiB)}")
    print(f"over_cap {'refused' if alloc(32 * MiB) is None else 'allowed'}")
    print(f"set_cap {gg.set_cap(0, 0)}")
    print(f"trim {gg.trim()}")
    c = gg.counters(0)
    print(f"current {c['current_bytes']} denied {c['denied']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
