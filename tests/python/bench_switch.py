"""The benchmark switch (gpuguard_bench_set_books, src/shim/bench_switch.rs) on the
simulated CUDA stack, through ctypes: run by tests/bench_switch.rs under LD_PRELOAD of
the shim. Checks itself and prints `BENCH_SWITCH OK` at the end; any mismatch raises
(exit status 1) with the counters that disagree.

- books on: driver, runtime and pool allocations are recorded;
- paused: none is recorded or counted, frees neither (nothing else changes);
- on again: recorded again; frees of what was allocated while paused are unknown
  frees; the real calls always happen (the sim's own books balance);
- two threads allocating and freeing while the main thread flips the switch: nothing
  crashes, every call reaches the driver, and gpuguard's counters stay consistent
  (live bytes are whole records, at most (allocs - frees) x size).
"""
import ctypes
import sys
import threading

MIB = 1 << 20
G = ctypes.CDLL(None)  # the preloaded shim's exports come first
cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL("libcudart.so", mode=ctypes.RTLD_GLOBAL)


class Counters(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int32), ("reserved0", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64) for n in ("total_bytes", "cap_bytes", "current_bytes", "peak_bytes",
                                       "allocs", "frees", "failed", "denied", "unknown_frees")]


def counters():
    c = Counters()
    assert G.gpuguard_device_counters(0, ctypes.byref(c)) == 0
    return {n: getattr(c, n) for n, _ in Counters._fields_[2:]}


switch = G.gpuguard_bench_set_books
switch.argtypes = [ctypes.c_int]
switch.restype = ctypes.c_int
U64 = ctypes.c_uint64
for f in (G.cuMemAlloc_v2, G.cuMemAllocAsync):
    f.restype = ctypes.c_int
G.cuMemFree_v2.argtypes = [U64]
G.cuMemFreeAsync.argtypes = [U64, ctypes.c_void_p]
G.cudaFree.argtypes = [ctypes.c_void_p]
cu.simcuda_live_bytes.restype = ctypes.c_ulonglong
cu.simcuda_live_count.restype = ctypes.c_int
cu.simcuda_pool_reserved.restype = ctypes.c_ulonglong
cu.simcuda_calls.restype = ctypes.c_ulonglong
cu.simcuda_calls.argtypes = [ctypes.c_char_p]
# (the runtime sim allocates through cuMemAlloc_v2: 2 driver + 2 runtime calls)
CALLS = [b"cuMemAlloc_v2", b"cuMemFree_v2", b"cuMemAllocAsync", b"cuMemFreeAsync"]


def sim_held():
    """Device bytes the sim holds outside its pools' reserves (the truth)."""
    return cu.simcuda_live_bytes(0) - cu.simcuda_pool_reserved(0)


def sim_calls():
    return [cu.simcuda_calls(n) for n in CALLS]


def ok(rc, what):
    if rc != 0:
        raise AssertionError("%s returned %d" % (what, rc))


def d_alloc(n):
    p = U64(0)
    ok(G.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc_v2")
    return p.value


def d_free(p):
    ok(G.cuMemFree_v2(U64(p)), "cuMemFree_v2")


def r_alloc(n):
    p = ctypes.c_void_p(0)
    ok(G.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)), "cudaMalloc")
    return p.value


def r_free(p):
    ok(G.cudaFree(ctypes.c_void_p(p)), "cudaFree")


def p_alloc(n):
    p = U64(0)
    ok(G.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(n), ctypes.c_void_p(0)), "cuMemAllocAsync")
    return p.value


def p_free(p):
    ok(G.cuMemFreeAsync(U64(p), ctypes.c_void_p(0)), "cuMemFreeAsync")


def expect(before, **delta):
    now = counters()
    got = {k: now[k] - before[k] for k in delta}
    if got != delta:
        raise AssertionError("counter deltas %s, expected %s (now %s)" % (got, delta, now))
    return now


def main():
    ok(cu.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p(0)
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    sim0, calls0 = sim_held(), sim_calls()
    assert switch(-1) == 1, "books are on by default"

    # Books on: all three paths recorded.
    c0 = counters()
    a, r, p = d_alloc(1 * MIB), r_alloc(2 * MIB), p_alloc(3 * MIB)
    c1 = expect(c0, allocs=3, frees=0, current_bytes=6 * MIB)

    # Paused: nothing recorded, counted or taken out of the books.
    assert switch(0) == 1 and switch(-1) == 0
    b, r2, p2 = d_alloc(4 * MIB), r_alloc(5 * MIB), p_alloc(6 * MIB)
    d_free(a)  # recorded while on, freed while paused: stays in the books
    c2 = expect(c1, allocs=0, frees=0, unknown_frees=0, current_bytes=0)
    # r, b, r2 are held (a was freed), pools aside
    assert sim_held() == sim0 + 11 * MIB, ("the real calls were made", sim_held() - sim0)
    calls = [b - a for a, b in zip(calls0, sim_calls())]
    assert calls[:4] == [4, 1, 2, 0], ("every real call was made", calls)

    # On again: recorded again; what was allocated while paused is unknown.
    assert switch(1) == 0
    c = d_alloc(7 * MIB)
    c3 = expect(c2, allocs=1, current_bytes=7 * MIB)
    d_free(c)
    r_free(r)
    p_free(p)
    c4 = expect(c3, frees=3, unknown_frees=0, current_bytes=-12 * MIB)
    d_free(b)
    r_free(r2)
    p_free(p2)
    expect(c4, frees=0, unknown_frees=3, current_bytes=0)
    assert sim_held() == sim0, ("the sim's books balance", sim_held() - sim0)

    # Blocks of pairs, the switch flipped between blocks (as the benchmark does):
    # only the pairs of on-blocks count, and they balance.
    c5 = counters()
    on_pairs = 0
    for blk in range(20):
        on = blk % 2 == 0 if blk % 4 < 2 else blk % 2 == 1  # ABBA order
        switch(1 if on else 0)
        for _ in range(10):
            for al, fr in ((d_alloc, d_free), (r_alloc, r_free), (p_alloc, p_free)):
                fr(al(MIB))
                on_pairs += on
    switch(1)
    expect(c5, allocs=on_pairs, frees=on_pairs, unknown_frees=0)
    # `a` (freed while paused) stayed in the books until the driver handed its address
    # out again: the ledger then dropped the stale record.
    assert counters()["current_bytes"] in (c5["current_bytes"], c5["current_bytes"] - MIB), counters()

    # Threads allocating while the switch flips under them.
    c6 = counters()
    errors = []

    def worker():
        try:
            ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            for _ in range(1500):
                d_free(d_alloc(MIB))
                p_free(p_alloc(MIB))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(2)]
    for t in ts:
        t.start()
    flips = 0
    while any(t.is_alive() for t in ts):
        switch(flips % 2)
        flips += 1
    for t in ts:
        t.join()
    switch(1)
    assert not errors, errors
    c7 = counters()
    # Records left by a flip between an allocation and its free stay live until the
    # driver hands their address out again (the ledger then drops them): what is
    # live is whole records, never more than recorded-but-not-freed. Counted over the
    # whole run, not from c6: the stale record of `a` (dropped from the bytes above)
    # has its late free counted on either side of c6, as the helper's drain falls.
    live = c7["allocs"] - c7["frees"]
    cur = c7["current_bytes"]
    assert live >= 0 and cur % MIB == 0 and 0 <= cur <= live * MIB, (c6, c7)
    assert sim_held() == sim0, ("every real free was made", sim_held() - sim0)
    print("BENCH_SWITCH OK on_pairs=%d flips=%d stale=%d counters=%s" % (on_pairs, flips, live, c7))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("BENCH_SWITCH FAIL %s" % e)
        sys.exit(1)
