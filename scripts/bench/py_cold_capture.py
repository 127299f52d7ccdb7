"""What the stack capture costs per allocation when the program does other work between
its allocations, as PyTorch's backend:cudaMallocAsync does inside a training step: the
capture then finds the Python frames, the stack and its own memos out of the near
caches. On the simulated driver, with a diagnostic build of gpuguard (built with
`--features hook-timing`), which times the phases of its hooks.

  CARGO_TARGET_DIR=target/timing cargo build --release --features hook-timing
  SIMCUDA_MEM=$((1<<40)) SIMCUDA_DEVICES=1 LD_LIBRARY_PATH=<sim dir> \\
    LD_PRELOAD=target/timing/release/libgpuguard.so python3 scripts/bench/py_cold_capture.py

Each pair is made LEVELS module calls deep (each level three Python frames, as
`nn.Module.__call__` -> `_call_impl` -> `forward`), from SITES places in turn (a step
allocates from many lines), with WORK_KB of memory written between pairs. Prints one
line: ns per capture answered by a memo (the check), per walked capture, and the
record's stamp and entry, each the median over ROUNDS blocks of N pairs [min-max].

  env: N (2000), ROUNDS (9), LEVELS (5), SITES (8), WORK_KB (1024)
"""
import ctypes, os, statistics as st, sys

G = ctypes.CDLL(None)
cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
U64 = ctypes.c_uint64
alloc = G.cuMemAllocAsync
alloc.restype = ctypes.c_int
alloc.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t, ctypes.c_void_p]
free = G.cuMemFreeAsync
free.argtypes = [U64, ctypes.c_void_p]
free.restype = ctypes.c_int
try:
    times = G.gpuguard_bench_hook_times
except AttributeError:
    sys.exit("py_cold_capture: needs a build of gpuguard with --features hook-timing, preloaded")
times.restype = ctypes.c_size_t
times.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t]
PHASES = 15
REC_SITE, REC_BOOK, REC_MEMO, REC_PY, REC_NATIVE = 12, 13, 14, 10, 11

N = int(os.environ.get("N", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
LEVELS = int(os.environ.get("LEVELS", "5"))
SITES = int(os.environ.get("SITES", "8"))
WORK = int(os.environ.get("WORK_KB", "1024")) * 1024
work = (ctypes.c_char * max(WORK, 1))()
p = U64(0)
bp = ctypes.byref(p)


def pair(i):
    # One line per site: each a place of its own in the Python stack.
    if i == 0:
        alloc(bp, 4096, None)
    elif i == 1:
        alloc(bp, 4096, None)
    elif i == 2:
        alloc(bp, 4096, None)
    elif i == 3:
        alloc(bp, 4096, None)
    elif i == 4:
        alloc(bp, 4096, None)
    elif i == 5:
        alloc(bp, 4096, None)
    elif i == 6:
        alloc(bp, 4096, None)
    else:
        alloc(bp, 4096, None)
    free(p.value, None)


class Module:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, *a):
        return self._call_impl(*a)

    def _call_impl(self, *a):
        return self.forward(*a)

    def forward(self, n, fill):
        if self.inner is not None:
            return self.inner(n, fill)
        for k in range(n):
            if WORK:
                ctypes.memset(work, fill + k, WORK)
            pair(k % SITES)


model = None
for _ in range(LEVELS):
    model = Module(model)

cu.cuInit(0)
ctx = ctypes.c_void_p()
dev = ctypes.c_int()
cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
total = times(None, 0)
buf = (U64 * total)()


def snap():
    times(buf, total)
    return list(buf)


model(200, 0)  # warm: sites made, memos made
per = {"memo": [], "walk": [], "site": [], "book": []}
counts = {"memo": 0, "walk": 0}
for r in range(ROUNDS):
    a = snap()
    model(N, r)
    b = snap()
    tpn = b[-1] / 1e6

    def ph(i):
        return b[i * 2] - a[i * 2], b[i * 2 + 1] - a[i * 2 + 1]

    (mc, mn), (pc, pn), (nc, nn) = ph(REC_MEMO), ph(REC_PY), ph(REC_NATIVE)
    (sc, sn), (kc, kn) = ph(REC_SITE), ph(REC_BOOK)
    counts["memo"] += mn
    counts["walk"] += pn
    if mn:
        per["memo"].append(mc / tpn / mn)
    if pn:
        per["walk"].append((pc + nc + sc) / tpn / pn)
    if kn:
        per["book"].append(kc / tpn / kn)


def fmt(k):
    v = per[k]
    if not v:
        return f"{k} -"
    return f"{k} {st.median(v):.0f} [{min(v):.0f}-{max(v):.0f}]"


print(
    "cold capture ns: %s | %s | %s (captures: %d by memo, %d walked; levels %d, sites %d, work %d KiB)"
    % (fmt("memo"), fmt("walk"), fmt("book"), counts["memo"], counts["walk"], LEVELS, SITES, WORK >> 10)
)
