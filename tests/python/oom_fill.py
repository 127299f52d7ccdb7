"""gpuguard's out-of-memory test in Python: 16 MiB blocks through cudaMalloc (ctypes,
the simulated runtime) until the driver refuses one, then every block freed, then a
wait (bounded) for gpuguard's oom report in GPUGUARD_DIR before the program ends.

  oom_fill.py
"""
import ctypes
import os
import time

lib = ctypes.CDLL("libcudart.so.13")
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
lib.cudaFree.argtypes = [ctypes.c_void_p]
MiB = 1 << 20


def malloc(n):
    p = ctypes.c_void_p(0)
    rc = lib.cudaMalloc(ctypes.byref(p), n)  # MALLOC-LINE
    return p.value if rc == 0 else None


def fill():
    held = []
    while True:
        p = malloc(16 * MiB)  # FILL-LINE
        if p is None:
            return held
        held.append(p)


held = fill()
for p in held:
    lib.cudaFree(p)
d = os.environ["GPUGUARD_DIR"]
for _ in range(60000):
    if any(n.endswith(".oom.json") for n in os.listdir(d)):
        break
    time.sleep(0.001)
print("OK")
