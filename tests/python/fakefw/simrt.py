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
        lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaStreamBeginCapture.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.cudaStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaGraphDestroy.argtypes = [ctypes.c_void_p]
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


def synchronize():
    rc = rt().cudaDeviceSynchronize()
    if rc != 0:
        raise RuntimeError("cudaDeviceSynchronize failed: %d" % rc)


def stream():
    s = ctypes.c_void_p(0)
    rc = rt().cudaStreamCreate(ctypes.byref(s))
    if rc != 0:
        raise RuntimeError("cudaStreamCreate failed: %d" % rc)
    return s.value


def begin_capture(stream, mode=0):
    """cudaStreamBeginCapture (mode 0: global); returns its code."""
    return rt().cudaStreamBeginCapture(ctypes.c_void_p(stream), mode)


def end_capture(stream):
    """cudaStreamEndCapture, the graph destroyed at once; returns its code."""
    g = ctypes.c_void_p(0)
    rc = rt().cudaStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(g))
    if g.value:
        rt().cudaGraphDestroy(g)
    return rc
