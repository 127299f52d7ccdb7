"""The simulated CUDA runtime (tests/sim) through ctypes, as a framework would load
it: dlopen + dlsym, so gpuguard's dlsym answer is what these calls reach."""
import ctypes

_rt = None


def rt():
    global _rt
    if _rt is None:
        lib = ctypes.CDLL("libcudart.so.13")
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        n = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(n)) != 0 or n.value < 1:
            raise RuntimeError("no simulated device")
        _rt = lib
    return _rt


def malloc(size):
    p = ctypes.c_void_p(0)
    rc = rt().cudaMalloc(ctypes.byref(p), size)
    if rc != 0:
        raise MemoryError("cudaMalloc(%d) failed: %d" % (size, rc))
    return p.value


def free(ptr):
    rc = rt().cudaFree(ctypes.c_void_p(ptr))
    if rc != 0:
        raise RuntimeError("cudaFree failed: %d" % rc)
