"""gpuguard's Python frame tests: the program's FIRST CUDA call is a cudaMalloc
(through ctypes on the simulated runtime), in a module-level loop; then a list
comprehension and a method allocate; then the program ends at once, so nothing but
what the hooks kept at capture can name these frames.

  first_alloc.py [hold:S]   (hold: run Python S seconds before exiting)
"""
import ctypes
import sys
import time

lib = ctypes.CDLL("libcudart.so.13")
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
KEEP = []
MiB = 1 << 20


def malloc(n):
    p = ctypes.c_void_p(0)
    if lib.cudaMalloc(ctypes.byref(p), n) != 0:  # MALLOC-LINE
        raise MemoryError(n)
    return p.value


for i in range(4):
    KEEP.append(malloc(MiB))  # LOOP-LINE
KEEP += [malloc(2 * MiB) for _ in range(2)]  # COMP-LINE


class Model:
    def forward(self):
        return malloc(3 * MiB)  # METHOD-LINE


KEEP.append(Model().forward())


class Holder:
    def __init__(self):
        self.p = malloc(4 * MiB)  # INIT-LINE


for i in range(4):
    KEEP.append(Holder())  # INIT-CALL-LINE
for a in sys.argv[1:]:
    if a.startswith("hold:"):
        end = time.time() + float(a[5:])
        while time.time() < end:
            time.sleep(0.002)
print("OK", flush=True)
