"""train_bench.py's in-process A/B mode (run_ab) end to end on the simulated CUDA
stack, under LD_PRELOAD of the shim (run by tests/bench_switch.rs): a stand-in step
allocates and frees through the driver; the on-blocks count exactly those calls, the
paused blocks none, the order is ABBA, and ab_analyze.py reads the records back with
the right call count per step. Prints `AB_BLOCKS OK`; a mismatch raises (exit 1).
"""
import argparse
import contextlib
import ctypes
import gc
import io
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "bench"))
import ab_analyze  # noqa: E402
import train_bench  # noqa: E402

G = ctypes.CDLL(None)
cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
G.cuMemFree_v2.argtypes = [ctypes.c_uint64]


GC_SEEN = []


def step(n):
    """n driver alloc+free pairs of 1 MiB."""
    GC_SEEN.append(gc.isenabled())
    for _ in range(n):
        p = ctypes.c_uint64(0)
        assert G.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0
        assert G.cuMemFree_v2(p) == 0
    return 0.0


def main():
    assert cu.cuInit(0) == 0
    ctx = ctypes.c_void_p(0)
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    step(1)  # activates gpuguard
    sched = [3, 5, 2]
    args = argparse.Namespace(ab_blocks=12, block_steps=0, block_ms=2.0, ab_seconds=0.0, ab_gc=1)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        train_bench.run_ab(args, "sim", step, sched, lambda: None)
    # The collector is off inside every timed block (the pass that sizes the blocks
    # runs with it on) and on again afterwards.
    timed = GC_SEEN[-12 * len(sched):]
    assert not any(timed) and gc.isenabled(), GC_SEEN
    text = buf.getvalue()
    recs = [json.loads(ln[3:]) for ln in text.splitlines() if ln.startswith("AB ")]
    meta, blocks = recs[0], recs[1:]
    assert meta["record"] == "ab_meta" and meta["gpuguard"] and meta["switch"], meta
    k = meta["block_steps"]
    assert k % len(sched) == 0, k
    calls = sum(sched) * (k // len(sched))  # pairs per block
    assert len(blocks) == 12, len(blocks)
    modes = [b["mode"] for b in blocks]
    assert modes == ["on", "off", "off", "on"] * 3, modes
    for b in blocks:
        want = calls if b["mode"] == "on" else 0
        assert (b["allocs"], b["frees"], b["unknown_frees"]) == (want, want, 0), b
        assert b["wall_s"] > 0 and b["steps"] == k, b
    assert "AB_DONE workload=sim blocks=12" in text, text
    assert G.gpuguard_bench_set_books(-1) == 1, "books on again after the blocks"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    a = argparse.Namespace(boot=200, seed=1, pair_ns=1000.0, passthrough_ns=60.0, target=0.005)
    r = ab_analyze.analyze(ab_analyze.read_records([f.name])["sim"], "sim", a)
    os.unlink(f.name)
    assert r["pairs"] == 6, r
    assert abs(r["calls_per_step"] - 2.0 * calls / k) < 1e-9, r
    print(ab_analyze.line(r))
    print("AB_BLOCKS OK")


if __name__ == "__main__":
    main()
