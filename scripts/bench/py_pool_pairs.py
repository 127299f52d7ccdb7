"""Pool alloc+free pairs made from Python, at a given Python depth: what a hook costs
when the allocating thread runs Python (PyTorch's cudaMallocAsync backend makes one
such pair a tensor), where the hook also reads the Python frames.

  LD_LIBRARY_PATH=<sim dir> [LD_PRELOAD=libgpuguard.so] python3 py_pool_pairs.py
  env: N pairs a block (20000), DEPTH Python frames above the loop (20), ROUNDS (20),
       MODE=ab (default: blocks with books on and paused, in ABBA order, through
       gpuguard_bench_set_books; prints the median added ns a pair) or MODE=cg (N
       pairs once, books on: for callgrind; difference two N to cancel start-up):

  valgrind --tool=callgrind --callgrind-out-file=cg.N python3 py_pool_pairs.py

Runs on the simulated driver (tests/sim; SIMCUDA_MEM=$((1<<40)) SIMCUDA_DEVICES=1).
Valgrind needs the interpreter itself, not a pyenv shim script.
"""
import ctypes, sys, time, os
G = ctypes.CDLL(None)
cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
U64 = ctypes.c_uint64
alloc = G.cuMemAllocAsync; alloc.restype = ctypes.c_int
alloc.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t, ctypes.c_void_p]
free = G.cuMemFreeAsync; free.argtypes = [U64, ctypes.c_void_p]; free.restype = ctypes.c_int
sw = getattr(G, "gpuguard_bench_set_books", None)
p = U64(0); bp = ctypes.byref(p)
N = int(os.environ.get("N", "20000")); DEPTH = int(os.environ.get("DEPTH", "20"))
def pairs(n):
    for _ in range(n):
        alloc(bp, 4096, None); free(p.value, None)
def deep(d, f, *a):
    if d == 0: return f(*a)
    return deep(d - 1, f, *a)
cu.cuInit(0)
ctx = ctypes.c_void_p(); dev = ctypes.c_int()
cu.cuDeviceGet(ctypes.byref(dev), 0); cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
deep(DEPTH, pairs, 1000)
mode = os.environ.get("MODE", "ab")
if mode == "cg":
    deep(DEPTH, pairs, N); sys.exit(0)
res = {1: [], 0: []}
for r in range(int(os.environ.get("ROUNDS", "20"))):
    for on in ((1, 0) if r % 2 == 0 else (0, 1)):
        if sw: sw(on)
        t = time.perf_counter_ns(); deep(DEPTH, pairs, N); res[on].append((time.perf_counter_ns() - t) / N)
import statistics as st
d = [a - b for a, b in zip(res[1], res[0])]
print("on %.0f off %.0f added %.0f ns/pair (min %.0f max %.0f)" % (st.median(res[1]), st.median(res[0]), st.median(d), min(d), max(d)))
