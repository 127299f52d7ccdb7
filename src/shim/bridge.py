# gpuguard's Python side. The shim runs this file once in a private namespace, on
# the interpreter's main thread (through Py_AddPendingCall, so with the GIL held at a
# bytecode boundary, never inside an allocation hook), and then calls its functions
# the same way. Each call hands its answer back through _gg_submit(tag + "\n" + json).
# Frameworks are only looked at when the program has imported them: this file never
# imports torch, cupy, jax or tensorflow itself. _gg_submit, _gg_devices,
# _gg_pending_pairs, _gg_capturing and _gg_keeping_status are gpuguard's own
# functions, put in this namespace by the shim.

import heapq
import json
import sys
import time

_gg_state = {"atexit": False, "torch_recorder": None, "cupy_hook": None}
# When gpuguard's Python side started: CuPy's sampled lines are scaled over the time
# since (see _GGCupyWindow.scale).
_GG_STARTED = time.monotonic()
# "frames": the frame layout handed to the hooks (or why there is none), once.


def _gg_answer(tag, value):
    _gg_submit(tag + "\n" + json.dumps(value, separators=(",", ":")))


def _gg_err(e):
    return "%s: %s" % (type(e).__name__, e)


def _gg_torch():
    t = sys.modules.get("torch")
    if t is None or getattr(t, "cuda", None) is None:
        return None
    try:
        if not t.cuda.is_initialized():
            return None
    except Exception:
        return None
    return t


def _gg_torch_backend(t):
    try:
        return t.cuda.get_allocator_backend()
    except Exception:
        return "native"


def _gg_cupy():
    return sys.modules.get("cupy")


# ---- recorders: where each block was allocated ----------------------------------


class _GGCupyHook:
    """A CuPy memory hook that keeps the Python stack of each live pool block.
    CuPy's hooks are per thread; this one is installed on the main thread. Mixed in
    with CuPy's MemoryHook, whose no-op methods serve the hook points not used here."""

    name = "gpuguard"

    def __init__(self, depth):
        self.depth = depth
        self.live = {}
        self.skip = ()

    def _frames(self):
        out = []
        f = sys._getframe(2)
        while f is not None and len(out) < self.depth:
            code = f.f_code
            fn = code.co_filename
            if not fn.startswith(self.skip):
                out.append("%s:%d in %s" % (fn, f.f_lineno, code.co_name))
            f = f.f_back
        return tuple(out)

    def malloc_postprocess(self, **kw):
        ptr = kw.get("mem_ptr")
        if ptr:
            self.live[ptr] = (kw.get("device_id", 0), kw.get("mem_size", 0), self._frames())

    def free_preprocess(self, **kw):
        self.live.pop(kw.get("mem_ptr"), None)


# ---- the calling thread's Python stack, read by the hooks without the GIL ------------
#
# A hook may read its own thread's frame chain without the GIL: only that thread
# changes it, and it is inside the hook. What it needs is the layout of CPython's
# thread state and frames for this interpreter, found here once by looking at live
# objects whose addresses are known (id()), then checked on a deeper chain. The hook
# keeps (code object address, bytecode offset) per frame; _gg_resolve turns those
# into file:line later, while the code objects are alive.


def _gg_word(addr):
    import ctypes

    return ctypes.c_void_p.from_address(addr).value or 0


def _gg_find(base, span, want, step=8):
    for off in range(0, span, step):
        if _gg_word(base + off) == want:
            return off
    return None


def _gg_calibrate():
    """The frame layout as a dict for the hooks, or {"error": why}."""
    import ctypes

    ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
    tstate = ctypes.pythonapi.PyThreadState_Get()
    return _gg_calibrate_in(tstate, sys._getframe(0))


def _gg_calibrate_in(tstate, me):
    parent, grand = me.f_back, me.f_back.f_back
    if grand is None:
        return {"error": "calibration needs three Python frames"}
    if sys.version_info >= (3, 11):
        # PyFrameObject: head (16), f_back, f_frame (the interpreter frame).
        iframe = _gg_word(id(me) + 24)
        iparent = _gg_word(id(parent) + 24)
        igrand = _gg_word(id(grand) + 24)
        code_off = _gg_find(iframe, 96, id(me.f_code))
        prev_off = _gg_find(iframe, 96, iparent)
        if code_off is None or prev_off is None:
            return {"error": "interpreter frame layout not recognized"}
        # tstate -> current frame: directly (3.13) or through a _PyCFrame (3.11, 3.12).
        lay = _gg_scan_tstate(tstate)
        if lay is not None and not _gg_check_tstate(tstate, lay):
            return {"error": "thread state check failed"}
        if lay is None:
            return {"error": "thread state layout not recognized"}
        # The instruction pointer of a suspended frame (the parent, inside its call)
        # points into its own code object's bytecode.
        pcode = id(parent.f_code)
        pend = pcode + parent.f_code.__sizeof__()
        instr_off = None
        for off in range(0, 96, 8):
            w = _gg_word(iparent + off)
            if pcode < w < pend and off != code_off:
                instr_off = off
                break
        if instr_off is None:
            return {"error": "instruction pointer not found"}
        base = _gg_word(iparent + instr_off) - pcode - parent.f_lasti
        owner_off = _gg_owner(iframe, prev_off, code_off, me)
        if owner_off is None:
            return {"error": "entry frames not recognized"}
        lay.update(mode=1, code_off=code_off, prev_off=prev_off, instr_off=instr_off, base=base,
                   owner_off=owner_off)
        # Check: the grandparent read through the layout agrees with Python.
        if _gg_word(igrand + code_off) != id(grand.f_code):
            return {"error": "frame chain check failed"}
        if _gg_word(igrand + instr_off) - id(grand.f_code) - base != grand.f_lasti:
            return {"error": "bytecode offset check failed"}
        if _gg_word(iparent + prev_off) != igrand:
            return {"error": "frame link check failed"}
        return lay
    # 3.10: the thread state points at frame objects, which hold code, back, lasti;
    # the current one is this function's own while only C is called (a call of a
    # Python function would push its frame).
    import ctypes

    here = id(sys._getframe(0))
    ts_off = None
    for off in range(0, 512, 8):
        if ctypes.c_void_p.from_address(tstate + off).value == here:
            ts_off = off
            break
    code_off = _gg_find(id(me), 128, id(me.f_code))
    back_off = _gg_find(id(me), 128, id(parent))
    if None in (ts_off, code_off, back_off):
        return {"error": "frame object layout not recognized"}
    lasti_off = None
    for off in range(0, 160, 4):
        v = ctypes.c_int.from_address(id(parent) + off).value
        w = ctypes.c_int.from_address(id(grand) + off).value
        if v * 2 == parent.f_lasti and v > 0 and w * 2 == grand.f_lasti:
            lasti_off = off
            break
    if lasti_off is None:
        return {"error": "f_lasti not found"}
    return {"mode": 2, "ts_off": ts_off, "ts_deref": -1, "code_off": code_off, "prev_off": back_off,
            "instr_off": lasti_off, "base": 0}


def _gg_owner(iframe, prev_off, code_off, me):
    """Where an interpreter frame says who owns it (3.12+), -1 where the chain has
    only frames of code (3.11), None if neither holds. The chain from here runs
    through the interpreter's own entry frame of this pending call (owned by the C
    stack: 3) on its way to the program's frames; skipping the frames so marked must
    leave exactly the code of Python's own f_back chain."""
    import ctypes

    want = []
    f = me
    while f is not None and len(want) < 48:
        want.append(id(f.f_code))
        f = f.f_back
    chain = []
    p = iframe
    while p and len(chain) < 64:
        chain.append(p)
        p = _gg_word(p + prev_off)
    codes = [_gg_word(p + code_off) for p in chain]
    if sys.version_info < (3, 12):
        return -1 if codes[: len(want)] == want else None
    for off in range(64, 80):
        owners = [ctypes.c_ubyte.from_address(p + off).value for p in chain]
        if 3 not in owners or any(o > 3 for o in owners):
            continue
        kept = [c for c, o in zip(codes, owners) if o != 3]
        if kept[: len(want)] == want:
            return off
    return None


def _gg_scan_tstate(tstate):
    """Where the thread state keeps the current interpreter frame. The current frame
    is this function's own while it reads memory through ctypes (C calls push no
    Python frame), so nothing here may call a Python function."""
    import bisect
    import ctypes

    # Only addresses inside readable mappings are followed: a field that is not a
    # pointer must not crash the program.
    starts, ends = [], []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].startswith("r"):
                lo, hi = parts[0].split("-")
                starts.append(int(lo, 16))
                ends.append(int(hi, 16))
    V = ctypes.c_void_p
    find = bisect.bisect_right
    here = V.from_address(id(sys._getframe(0)) + 24).value
    for off in range(0, 512, 8):
        if V.from_address(tstate + off).value == here:
            return {"ts_off": off, "ts_deref": -1}
    for off in range(0, 512, 8):
        p = V.from_address(tstate + off).value
        if not p or p % 8:
            continue
        i = find(starts, p) - 1
        if i < 0 or p + 16 > ends[i]:
            continue
        for k in (0, 8):
            if V.from_address(p + k).value == here:
                return {"ts_off": off, "ts_deref": k}
    return None


def _gg_check_tstate(tstate, lay):
    """Reads the current frame through the layout from another depth; as above,
    only C calls here."""
    import ctypes

    V = ctypes.c_void_p
    here = V.from_address(id(sys._getframe(0)) + 24).value
    p = V.from_address(tstate + lay["ts_off"]).value or 0
    if lay["ts_deref"] >= 0 and p:
        p = V.from_address(p + lay["ts_deref"]).value or 0
    return p == here


def _gg_line(code, off):
    for start, end, line in code.co_lines():
        if start <= off < end:
            return line
    return code.co_firstlineno


def _gg_resolve(pairs):
    """[[code address, bytecode offset], ...] -> [[address, offset, text or None]]:
    code objects are found in every thread's frames, then among live functions."""
    want = {p[0] for p in pairs}
    codes = {}

    def add(c):
        if id(c) in want and id(c) not in codes:
            codes[id(c)] = c
        for k in c.co_consts:
            if type(k) is type(c):
                add(k)

    for f in sys._current_frames().values():
        while f is not None:
            add(f.f_code)
            f = f.f_back
    if len(codes) < len(want):
        import gc
        import types

        for o in gc.get_objects():
            if type(o) is types.FunctionType:
                add(o.__code__)
    out = []
    for addr, off in pairs:
        c = codes.get(addr)
        if c is None:
            out.append([addr, off, None])
        else:
            name = getattr(c, "co_qualname", c.co_name)
            out.append([addr, off, "%s:%d in %s" % (c.co_filename, _gg_line(c, off), name)])
    return out


def _gg_resolve_now(args):
    _gg_answer("resolved", _gg_resolve(args.get("pairs", [])))


def _gg_install(args):
    """Registers the exit hook and turns the framework recorders on (idempotent)."""
    _gg_answer("reply", _gg_setup(args))


def _gg_setup(args):
    st = _gg_state
    out = {}
    if "frames" not in st and int(args.get("depth", 0)) > 0:
        try:
            # Called here, there are Python frames above to check the layout on.
            st["frames"] = _gg_calibrate()
        except Exception as e:
            st["frames"] = {"error": _gg_err(e)}
        _gg_submit("frames\n" + json.dumps(st["frames"]))
    pairs = args.get("pairs")
    if pairs:
        _gg_submit("resolved\n" + json.dumps(_gg_resolve(pairs)))
    if not st["atexit"]:
        import atexit

        # Through gpuguard's C function, which keeps the program's exit status (an
        # unhandled KeyboardInterrupt's SIGINT) whatever this hook imports.
        atexit.register(_gg_keeping_status, _gg_at_exit)
        st["atexit"] = True
    # The frameworks' own recorders cost them time on every allocation: only when
    # asked for (GPUGUARD_PYTHON=lines), with stacks on.
    depth = int(args.get("depth", 0)) if args.get("recorders") else 0
    t = _gg_torch()
    if t is not None and depth > 0 and st["torch_recorder"] is None:
        if _gg_torch_backend(t) != "native":
            st["torch_recorder"] = "unsupported"
        else:
            try:
                # Only the state of live blocks and their Python stacks: no history.
                t.cuda.memory._record_memory_history(
                    enabled="state", context="state", stacks="python"
                )
                st["torch_recorder"] = "on"
            except Exception as e:
                st["torch_recorder"] = "error: " + _gg_err(e)
        out["pytorch"] = st["torch_recorder"]
    cp = _gg_cupy()
    if cp is not None and depth > 0 and st["cupy_hook"] is None:
        try:
            from cupy.cuda import memory_hook

            class Hook(_GGCupyHook, memory_hook.MemoryHook):
                pass

            h = Hook(depth)
            import os

            h.skip = (os.path.dirname(cp.__file__), __file__ if "__file__" in globals() else "<gpuguard>")
            h.__enter__()
            st["cupy_hook"] = h
            out["cupy"] = "on"
        except Exception as e:
            st["cupy_hook"] = "error: " + _gg_err(e)
            out["cupy"] = st["cupy_hook"]
    return out


# ---- trim ---------------------------------------------------------------------------


def _gg_capture_began(name):
    """The mechanism entry of a framework trim left out because a stream of the
    process is in CUDA graph capture (one began while this trim ran: the shim only
    starts a trim while none is): empty_cache() and free_all_blocks() synchronize,
    which would break the capture. None when no stream captures."""
    if int(_gg_capturing()) == 0:
        return None
    return {"name": name, "status": "skipped", "released_bytes": 0,
            "detail": "deferred: a CUDA graph capture began while the trim ran; not called"}


def _gg_trim(args):
    _gg_setup(args)
    devices = args.get("devices", [])
    mechs = []
    t = _gg_torch()
    skip = _gg_capture_began("pytorch") if t is not None else None
    if skip is not None:
        mechs.append(skip)
    elif t is not None:
        m = {"name": "pytorch", "status": "released", "released_bytes": 0}
        try:
            backend = _gg_torch_backend(t)
            before = sum(t.cuda.memory_reserved(d) for d in devices)
            t.cuda.empty_cache()
            after = sum(t.cuda.memory_reserved(d) for d in devices)
            m["released_bytes"] = max(0, before - after)
            m["detail"] = "torch.cuda.empty_cache() (%s allocator): reserved %d -> %d bytes" % (
                backend,
                before,
                after,
            )
        except Exception as e:
            m["status"] = "error"
            m["detail"] = _gg_err(e)
        mechs.append(m)
    cp = _gg_cupy()
    skip = _gg_capture_began("cupy") if cp is not None else None
    if skip is not None:
        mechs.append(skip)
    elif cp is not None:
        m = {"name": "cupy", "status": "released", "released_bytes": 0}
        try:
            pool = cp.get_default_memory_pool()
            released = 0
            notes = []
            for d in devices:
                with cp.cuda.Device(d):
                    before = pool.total_bytes()
                    pool.free_all_blocks()
                    after = pool.total_bytes()
                released += max(0, before - after)
                notes.append("device %d: pool %d -> %d bytes" % (d, before, after))
            pinned = cp.get_default_pinned_memory_pool()
            nfree = pinned.n_free_blocks()
            pinned.free_all_blocks()
            notes.append("pinned pool: %d free blocks released" % nfree)
            m["released_bytes"] = released
            m["detail"] = "free_all_blocks(): " + "; ".join(notes)
        except Exception as e:
            m["status"] = "error"
            m["detail"] = _gg_err(e)
        mechs.append(m)
    if "jax" in sys.modules or "jaxlib" in sys.modules:
        import os

        pre = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
        alloc = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "")
        if alloc == "platform":
            detail = (
                "XLA_PYTHON_CLIENT_ALLOCATOR=platform: JAX already frees each buffer "
                "when it dies; nothing is cached to release"
            )
        else:
            detail = (
                "JAX/XLA keeps its memory in an arena it never gives back "
                "(preallocated unless XLA_PYTHON_CLIENT_PREALLOCATE=false%s); run with "
                "XLA_PYTHON_CLIENT_ALLOCATOR=platform to make it releasable"
                % (", now %r" % pre if pre else "")
            )
        mechs.append(
            {"name": "jax", "status": "not_releasable", "released_bytes": 0, "detail": detail}
        )
    if "tensorflow" in sys.modules:
        mechs.append(
            {
                "name": "tensorflow",
                "status": "not_releasable",
                "released_bytes": 0,
                "detail": "TensorFlow's BFC allocator never gives memory back; memory "
                "growth (TF_FORCE_GPU_ALLOW_GROWTH=true) at least keeps it from "
                "taking the whole device",
            }
        )
    _gg_answer("reply", mechs)


# ---- classification: cache or leak, and Python lines -------------------------------


def _gg_sites(blocks, out_sites, scale=None):
    """Python sites from blocks (framework, size, frames[, count]). A framework in
    `scale` saw only some of its blocks (a sampled recorder's windows): its sites'
    figures are scaled by the factor, estimates, and say how many blocks were seen."""
    scale = scale or {}
    by = {}
    index = {}
    for b in blocks:
        fw, size, frames = b[0], b[1], b[2]
        n = b[3] if len(b) > 3 else 1
        k = (fw, frames)
        e = by.get(k)
        if e is None:
            by[k] = [size, n]
        else:
            e[0] += size
            e[1] += n
    for (fw, frames), (size, n) in by.items():
        index[(fw, frames)] = len(out_sites)
        f = scale.get(fw)
        if f is None:
            out_sites.append({"framework": fw, "frames": list(frames), "bytes": size, "count": n})
        else:
            out_sites.append(
                {
                    "framework": fw,
                    "frames": list(frames),
                    "bytes": int(round(size * f)),
                    "count": max(n, int(round(n * f))),
                    "captured": n,
                }
            )
    return index


def _gg_classify_now(args, at_exit=False):
    devices = args.get("devices", [])
    res = {"frameworks": [], "devices": [], "blocks": [], "sites": []}
    blocks = []
    scale = {}
    # Listed blocks with a line: (the block's list, its line's key); the line's index
    # is appended once the sites are made, so the report credits each segment to the
    # lines whose blocks fill it.
    lined = []
    t = _gg_torch()
    if t is not None:
        fw = {"framework": "pytorch", "status": "classified"}
        try:
            backend = _gg_torch_backend(t)
            for d in devices:
                res["devices"].append(
                    {
                        "framework": "pytorch",
                        "device": d,
                        "in_use": int(t.cuda.memory_allocated(d)),
                        "reserved": int(t.cuda.memory_reserved(d)),
                    }
                )
            if backend == "native":
                import os

                # A site starts at the program's code: PyTorch's own frames (a
                # module's forward, say) are trimmed off the top.
                tdir = os.path.dirname(t.__file__) + os.sep
                sampled = _gg_state["torch_recorder"] == "sampling"
                fw_name = "pytorch-sampled" if sampled else "pytorch"
                snap = t.cuda.memory._snapshot()
                for seg in snap.get("segments", []):
                    dev = seg.get("device", 0)
                    addr = seg.get("address", 0)
                    for b in seg.get("blocks", []):
                        size = b.get("size", 0)
                        active = b.get("state", "").startswith("active")
                        listed = [dev, b.get("address", addr), size, 1 if active else 0, "pytorch"]
                        res["blocks"].append(listed)
                        if active:
                            fs = b.get("frames", [])
                            first = 0
                            while first < len(fs) - 1 and str(fs[first].get("filename", "")).startswith(tdir):
                                first += 1
                            frames = tuple(
                                "%s:%s in %s" % (f.get("filename"), f.get("line"), f.get("name"))
                                for f in fs[first:]
                            )
                            if frames:
                                blocks.append((fw_name, size, frames))
                                lined.append((listed, (fw_name, frames)))
                        addr += size
                if _gg_state["torch_recorder"] == "on":
                    how = "Python lines from its recorder"
                elif sampled:
                    how = (
                        "recorder off but for a window after each report (the last %.0f ms): Python lines "
                        "(pytorch-sampled) of the blocks allocated in those windows that "
                        "still live (GPUGUARD_PYTHON=lines records every block)"
                        % _gg_state.get("window_ms", 0)
                    )
                    f = _gg_torch_scale(t)
                    if f is not None:
                        scale[fw_name] = f
                        how += "; their figures are estimates, scaled by %.1f: the windows saw 1 in %.1f of its allocations" % (f, f)
                else:
                    how = "recorder off (GPUGUARD_PYTHON=lines turns it on)"
                fw["detail"] = "%s allocator; blocks from PyTorch's memory snapshot; %s" % (backend, how)
            else:
                fw["detail"] = (
                    "%s allocator: totals from PyTorch; each tensor is one stream-ordered "
                    "allocation, named by the allocating thread's Python stack" % backend
                )
        except Exception as e:
            fw = {"framework": "pytorch", "status": "unavailable", "detail": _gg_err(e)}
        res["frameworks"].append(fw)
    cp = _gg_cupy()
    if cp is not None:
        fw = {"framework": "cupy", "status": "classified"}
        try:
            pool = cp.get_default_memory_pool()
            for d in devices:
                with cp.cuda.Device(d):
                    res["devices"].append(
                        {
                            "framework": "cupy",
                            "device": d,
                            "in_use": int(pool.used_bytes()),
                            "reserved": int(pool.total_bytes()),
                        }
                    )
            h = _gg_state["cupy_hook"]
            if isinstance(h, _GGCupyHook):
                for ptr, (dev, size, frames) in list(h.live.items()):
                    listed = [dev, ptr, size, 1, "cupy"]
                    res["blocks"].append(listed)
                    if frames:
                        blocks.append(("cupy", size, frames))
                        lined.append((listed, ("cupy", frames)))
                fw["detail"] = "default memory pool; blocks from gpuguard's CuPy hook (main thread)"
            else:
                # The sampled blocks are only some of the pool's: they give Python sites
                # but are not listed in res["blocks"], which would make each driver
                # allocation that holds one CuPy's with only those blocks in use (the
                # in-use split per allocation would be wrong where it is now absent).
                sampled = _gg_cupy_sampled(cp, pool, devices, blocks, at_exit, scale)
                if sampled is not None:
                    fw["detail"] = "default memory pool totals; " + sampled
                else:
                    fw["detail"] = "default memory pool totals; hook %s" % (
                        h or "off (GPUGUARD_PYTHON=lines turns it on)"
                    )
        except Exception as e:
            fw = {"framework": "cupy", "status": "unavailable", "detail": _gg_err(e)}
        res["frameworks"].append(fw)
    if "jax" in sys.modules or "jaxlib" in sys.modules:
        res["frameworks"].append(_gg_jax(devices, res, blocks))
    index = _gg_sites(blocks, res["sites"], scale)
    for listed, key in lined:
        i = index.get(key)
        if i is not None:
            listed.append(i)
    return res


def _gg_torch_scale(t):
    """The factor that scales the windows' blocks up to an estimate of all: PyTorch's
    allocations over those made while a window was open (a block kept per step is
    allocated in a window as often as any allocation is). None before a window has
    seen an allocation."""
    w = _gg_state.get("torch_windows")
    if not w:
        return None
    try:
        now = int(t.cuda.memory_stats().get("allocation.all.allocated", 0))
    except Exception:
        return None
    seen = w["seen"]
    if w.get("open_at") is not None:
        seen += max(0, now - w["open_at"])
    total = now - w["from"]
    if seen <= 0 or total <= 0:
        return None
    return max(1.0, total / float(seen))


def _gg_jax_backend_up():
    """Whether JAX has started its GPU backend (asking for devices would start it,
    and starting it preallocates most of the device)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(xb, "_backends", None) if xb is not None else None
    return bool(backends) and any(k in backends for k in ("cuda", "gpu", "rocm"))


def _gg_jax(devices, res, blocks):
    if not _gg_jax_backend_up():
        return {"framework": "jax", "status": "unavailable", "detail": "JAX's GPU backend is not started"}
    try:
        import jax

        gpus = [d for d in jax.local_devices() if d.platform in ("gpu", "cuda", "rocm")]
        for d in gpus:
            ordinal = getattr(d, "local_hardware_id", None)
            if ordinal is None:
                ordinal = d.id
            if ordinal not in devices:
                continue
            st = d.memory_stats() or {}
            in_use = int(st.get("bytes_in_use", 0))
            reserved = int(st.get("pool_bytes", st.get("bytes_reserved", in_use)))
            res["devices"].append(
                {"framework": "jax", "device": ordinal, "in_use": in_use, "reserved": max(reserved, in_use)}
            )
        detail = "totals from JAX's memory_stats() (its arena: in use vs held)"
        try:
            for size, frames, count in _gg_jax_profile(jax):
                blocks.append(("jax", size, frames, count))
            detail += "; Python lines from JAX's device memory profile"
        except Exception as e:
            detail += "; no Python lines (%s)" % _gg_err(e)
        return {"framework": "jax", "status": "classified", "detail": detail}
    except Exception as e:
        return {"framework": "jax", "status": "unavailable", "detail": _gg_err(e)}


def _gg_pb(buf):
    """Fields of one protobuf message: (field number, wire type, value)."""
    i, n = 0, len(buf)

    def varint():
        nonlocal i
        shift = v = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                return v
            shift += 7

    while i < n:
        key = varint()
        f, wt = key >> 3, key & 7
        if wt == 0:
            yield f, wt, varint()
        elif wt == 2:
            ln = varint()
            yield f, wt, buf[i : i + ln]
            i += ln
        elif wt == 1:
            yield f, wt, int.from_bytes(buf[i : i + 8], "little")
            i += 8
        elif wt == 5:
            yield f, wt, int.from_bytes(buf[i : i + 4], "little")
            i += 4
        else:
            raise ValueError("protobuf wire type %d" % wt)


def _gg_pb_ints(wt, v):
    """A repeated integer field's values, packed (wire type 2) or not."""
    return [v] if wt == 0 else _gg_unpack(v)


def _gg_unpack(buf):
    vals, i = [], 0
    while i < len(buf):
        shift = v = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        vals.append(v)
    return vals


def _gg_jax_profile(jax):
    """(bytes, frames) of each live buffer group in JAX's device memory profile (a
    gzipped pprof; each sample's locations are the Python frames that made it)."""
    import gzip

    prof = jax.profiler.device_memory_profile()
    if prof[:2] == b"\x1f\x8b":
        prof = gzip.decompress(prof)
    strings, samples, locations, functions = [], [], {}, {}
    for f, wt, v in _gg_pb(prof):
        if f == 6:
            strings.append(v.decode("utf-8", "replace"))
        elif f == 2:
            samples.append(v)
        elif f == 4:
            lid, lines = 0, []
            for g, gwt, gv in _gg_pb(v):
                if g == 1:
                    lid = gv
                elif g == 4:
                    fn, ln = 0, 0
                    for h, _, hv in _gg_pb(gv):
                        if h == 1:
                            fn = hv
                        elif h == 2:
                            ln = hv
                    lines.append((fn, ln))
            locations[lid] = lines
        elif f == 5:
            fid, name, fname = 0, 0, 0
            for g, _, gv in _gg_pb(v):
                if g == 1:
                    fid = gv
                elif g == 2:
                    name = gv
                elif g == 4:
                    fname = gv
            functions[fid] = (name, fname)
    out = []
    import os

    jdir = os.path.dirname(jax.__file__) + os.sep
    for raw in samples:
        locs, vals, labels = [], [], {}
        for g, gwt, gv in _gg_pb(raw):
            if g == 1:
                locs.extend(_gg_pb_ints(gwt, gv))
            elif g == 2:
                vals.extend(_gg_pb_ints(gwt, gv))
            elif g == 3:
                key = sv = 0
                for h, _, hv in _gg_pb(gv):
                    if h == 1:
                        key = hv
                    elif h == 2:
                        sv = hv
                if key < len(strings) and sv < len(strings):
                    labels[strings[key]] = strings[sv]
        if labels.get("kind", "buffer") != "buffer" or len(vals) < 2:
            continue
        frames = []
        for lid in locs:
            for fid, line in locations.get(lid, []):
                name, fname = functions.get(fid, (0, 0))
                file = strings[fname] if fname < len(strings) else "?"
                frames.append("%s:%d in %s" % (file, line, strings[name] if name < len(strings) else "?"))
        while len(frames) > 1 and frames[0].startswith(jdir):
            frames.pop(0)
        if frames:
            out.append((int(vals[1]), tuple(frames), int(vals[0])))
    return out


def _gg_cost(t0):
    """The report's python_cost: the main thread's time here since t0, and each
    framework's last sampling window."""
    windows = [dict(w, framework=f) for f, w in sorted(_gg_state.get("windows", {}).items())]
    return {"main_thread_ms": (time.perf_counter() - t0) * 1e3, "windows": windows}


def _gg_classify(args):
    t0 = time.perf_counter()
    _gg_setup(args)
    res = _gg_classify_now(args)
    res["cost"] = _gg_cost(t0)
    _gg_answer("reply", res)
    # After the answer: nothing here may change it.
    _gg_sample_window(args)
    try:
        _gg_cupy_window(args)
    except Exception as e:
        _gg_state["cupy_window_error"] = _gg_err(e)


# ---- default mode: PyTorch's recorder in short windows --------------------------------
#
# With the recorder off (the default), a small tensor kept each step is invisible: the
# caching allocator serves it from a segment it already holds, and the hooks see the
# driver only once per segment, from whichever allocation happened to need it. So after
# each report PyTorch's recorder is turned on for a window and off again by a timer.
# A window lasts until it has seen _GG_WINDOW_ALLOCS tensor allocations (so a slow step
# is covered whole) and at least a fiftieth of the snapshot interval (20 ms to 2 s;
# 50 ms without snapshots), at most a fifth of the interval (0.5 s without). A block
# allocated in a window keeps its stack while it lives (PyTorch keeps a block's
# context_when_allocated after recording stops), so a line that keeps allocating and
# never frees shows in each report with more sampled blocks than the last: a steady
# grower in `gpuguard show`. Transient blocks die before the next report. The recorder
# costs per allocation recorded (about 2 us on the H200), so a window costs a few
# hundred allocations' worth, or a fiftieth of the time when allocations are dense.

_GG_WINDOW_ALLOCS = 256


def _gg_window_span(args, share=0.2):
    """(how long a window stays open at least, at most), in seconds: at least a
    fiftieth of the snapshot interval (20 ms to 2 s; 50 ms without snapshots), at most
    `share` of it (2.5 s times that without): a fifth for PyTorch's, see above; two
    fifths for CuPy's first half, see below."""
    every = args.get("every_ms")
    step = min(max(every / 50.0, 20.0), 2000.0) / 1000.0 if every else 0.05
    return step, max(step, every * share / 1000.0 if every else 2.5 * share)


def _gg_sample_window(args):
    st = _gg_state
    if args.get("recorders") or int(args.get("depth", 0)) <= 0:
        return
    if st["torch_recorder"] not in (None, "sampling"):
        return
    t = _gg_torch()
    if t is None or _gg_torch_backend(t) != "native":
        return
    step, longest = _gg_window_span(args)
    mem = t.cuda.memory

    def allocations():
        try:
            return int(t.cuda.memory_stats().get("allocation.all.allocated", 0))
        except Exception:
            return None

    def open_window():
        try:
            mem._record_memory_history(enabled="state", context="alloc", stacks="python")
        except Exception as e:
            st["torch_recorder"] = "error: " + _gg_err(e)
            return
        st["torch_recorder"] = "sampling"
        opened[0], first[0] = time.monotonic(), allocations()
        if first[0] is not None:
            # From the program's first allocation: the blocks kept before the first
            # window (a whole snapshot interval) are estimated too.
            w = st.setdefault("torch_windows", {"from": 0, "seen": 0})
            w["open_at"] = first[0]
        _gg_timer(step, check)

    opened, first = [0.0], [None]

    def close(n):
        try:
            mem._record_memory_history(enabled=None)
        except Exception:
            pass
        st["window_ms"] = (time.monotonic() - opened[0]) * 1000.0
        w = {"ms": st["window_ms"]}
        if n is not None and first[0] is not None:
            w["allocations"] = max(0, n - first[0])
        st.setdefault("windows", {})["pytorch"] = w
        tw = st.get("torch_windows")
        if tw is not None:
            tw["seen"] += w.get("allocations", 0)
            tw["open_at"] = None

    def check():
        n = allocations()
        enough = n is None or first[0] is None or n - first[0] >= _GG_WINDOW_ALLOCS
        if enough or time.monotonic() - opened[0] + step > longest:
            close(n)
        else:
            _gg_timer(step, check)

    # Opened and closed on the timer thread: PyTorch's recorder adds a callback to the
    # calling thread's own RecordFunction callbacks and removes it from the calling
    # thread's; closed on another thread, it is not found and PyTorch prints a warning
    # ("Requested callback is not found") on the program's stderr after every window.
    _gg_timer(0, open_window)


# ---- default mode: a CuPy memory hook in short windows --------------------------------
#
# CuPy's default pool hides a small array kept each step the same way: the array takes
# a chunk that the step's temporaries freed, and the pool grows (a cudaMalloc, which
# the hooks see with the Python stack of that moment) at whichever line next finds no
# free chunk, often the line before. A memory hook on every pool malloc and free
# (GPUGUARD_PYTHON=lines) names each block's line but costs Python calls on each. So
# after each report, with stacks on, a hook is installed on the main thread for a
# window of two halves. The first records each pool malloc's Python frames (code
# object and bytecode offset, CuPy's own frames trimmed off the top, up to the stack
# depth; never the frame objects, which would keep locals alive) and forgets a block
# when it is freed. Like PyTorch's window it lasts until it has seen _GG_WINDOW_ALLOCS
# pool mallocs (a CuPy step makes about as many as a PyTorch one: one per array), so
# that it covers whole steps however the main thread is scheduled, and at least a
# fiftieth of the snapshot interval. Only when the main thread makes fewer pool mallocs
# (slow steps, a starved thread, none at all) does it close on time: after two fifths
# of the interval (1 s without snapshots). A fifth, as PyTorch's, was too short where
# the count was not reached in it: a main thread kept off the CPU for that long, as on
# a loaded machine, left a window without a single step, and the kept array's line did
# not rise in that interval (and then ranked behind the stacks' line of the pool's
# growth). Two fifths still end both halves within the interval, so each report sees
# one window closed. The second half, as long again, only watches frees (and mallocs,
# whose address proves the block there before dead), so that the temporaries of the
# first half's last steps are seen to die. The first half's blocks still allocated then are kept, their frames named
# ("file:line in function"), and reported as Python sites of framework cupy-sampled
# (at exit, the open window's blocks still allocated too). They carry over from window
# to window until shown dead: a later window sees a free of their address, or a pool
# malloc returning it (freed and reused in between); and at each report, per device,
# the oldest go while the kept blocks add up to more than the pool has in use (freed
# between windows, the address not reused since). So a line that keeps allocating
# grows from report to report: a steady grower in `gpuguard show`, ranked above the
# stack's line of the pool's growth. Beyond _GG_CUPY_KEPT entries the oldest are
# folded into totals per line, which only the in-use check trims.
#
# CuPy calls a thread's hooks from loops over that thread's hooks dict, which must
# not change size while a loop runs (the program would get a RuntimeError). The loops
# are compiled code: Python runs during one only inside a hook's method. So the hook
# is added and removed on the main thread (the report's pending call opens the window;
# a timer thread queues the close with Py_AddPendingCall) only when no frame on the
# stack is a hook method; else a timer tries again a few ms later. The cost is the
# hook's Python calls, inside the window only: CuPy calls each hook before and after
# each pool malloc and free, four calls a block, plus the stack read in the first half
# (a micro-benchmark on a 2-core VM, Python 3.11, a block: 1.0 us watching, 2.8 us
# recording 3 frames, 4.3 us 16 frames; the lines-mode hook 5.4 and 15.7 us). A report
# costs the kept blocks' totals per line, kept up to date as blocks come and go. Once
# the main thread's hooks dict exists, CuPy's `_has_memory_hooks()` stays true on it,
# so each later pool call there looks the empty dict up: tens of ns.

_GG_HOOK_METHODS = frozenset(
    (
        "alloc_preprocess",
        "alloc_postprocess",
        "malloc_preprocess",
        "malloc_postprocess",
        "free_preprocess",
        "free_postprocess",
    )
)
_GG_CUPY_KEPT = 32768
# The longest a CuPy window's first half stays open waiting for _GG_WINDOW_ALLOCS pool
# mallocs, as a share of the snapshot interval (see above).
_GG_CUPY_SHARE = 0.4
_GG_RETRY_S = 0.002


def _gg_in_hook():
    """Whether a memory hook's method is on this thread's stack: a CuPy loop over the
    hooks dict may be running below it."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name in _GG_HOOK_METHODS:
            return True
        f = f.f_back
    return False


def _gg_timer(delay, fn):
    """Runs fn on gpuguard's timer thread after delay seconds. Whatever it raises is
    dropped: gpuguard's own thread never prints a traceback into the program (at
    interpreter shutdown the modules it uses may already be gone).

    One thread for the process, started on the main thread: a Python thread started
    from another thread can race the interpreter's shutdown. Thread.start() waits for
    the new thread only once it runs Python; before that, the new OS thread first
    touches its thread state, which the interpreter allocated at start() and frees at
    shutdown with the other threads' states. On CPython 3.10 a timer thread that
    started the next one (a thread a tick) while the main thread ended let the new
    thread write into the freed interpreter: SIGSEGV after the program's last line
    (5 of 100 runs of trim::signal_trims_cupy_pools under load). Started on the main
    thread, start() returns only once the thread runs, so the main thread cannot be
    shutting down meanwhile; the timer thread then only waits (on a condition, with
    the GIL released), which a daemon thread may do at shutdown."""
    t = _gg_state.get("timers")
    if t is None or not t.usable():
        import threading

        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("gpuguard's timer thread starts on the main thread only")
        t = _gg_state["timers"] = _GGTimers()
    t.add(delay, fn)


class _GGTimers:
    """gpuguard's timer thread (see _gg_timer): runs queued functions when due."""

    def __init__(self):
        import os
        import threading

        self.pid = os.getpid()
        self.cv = threading.Condition(threading.Lock())
        self.due = []  # heap of (when, sequence, fn)
        self.seq = 0
        self.thread = threading.Thread(target=self.run, name="gpuguard-window", daemon=True)
        self.thread.start()

    def usable(self):
        """False in a forked child (the thread is the parent's, and its lock may have
        been held at the fork) or once the thread ended."""
        import os

        return self.pid == os.getpid() and self.thread.is_alive()

    def add(self, delay, fn):
        with self.cv:
            self.seq += 1
            heapq.heappush(self.due, (time.monotonic() + delay, self.seq, fn))
            self.cv.notify()

    def run(self):
        due, cv = self.due, self.cv
        while True:
            with cv:
                while True:
                    wait = due[0][0] - time.monotonic() if due else None
                    if wait is not None and wait <= 0:
                        fn = heapq.heappop(due)[2]
                        break
                    cv.wait(wait)
            if _gg_state.get("exiting"):
                # After Python's atexit ran gpuguard's exit hook: no window work in
                # the interpreter's teardown.
                continue
            try:
                fn()
            except BaseException:  # noqa: BLE001
                pass
            fn = None


def _gg_main_setup():
    """The pending call of _gg_on_main, made once on the main thread (before any
    timer thread could race to make it)."""
    st = _gg_state
    if "main_q" in st:
        return
    import collections
    import ctypes

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    # Kept for good: the interpreter may call it whenever it was queued.
    st["main_cb"] = proto(_gg_main_run)
    st["main_add"] = ctypes.PYFUNCTYPE(ctypes.c_int, proto, ctypes.c_void_p)(
        ("Py_AddPendingCall", ctypes.pythonapi)
    )
    st["main_q"] = collections.deque()


def _gg_on_main(fn):
    """Runs fn() on the main thread soon (from a timer thread: through a pending call,
    at the main thread's next bytecode boundary)."""
    _gg_state["main_q"].append(fn)
    _gg_queue_main()


def _gg_queue_main():
    st = _gg_state
    if st.get("exiting"):
        return
    try:
        ok = st["main_add"](st["main_cb"], None) == 0
    except Exception:
        ok = False
    if not ok:
        _gg_timer(_GG_RETRY_S, _gg_queue_main)  # the interpreter's queue is full


def _gg_main_run(_arg):
    """The pending call: runs what _gg_on_main queued. Returns 0 whatever happens
    (ctypes could not hand an exception on); the program's KeyboardInterrupt (a
    Ctrl-C whose handler ran in here) is raised again where the program runs."""
    q = _gg_state["main_q"]
    while True:
        try:
            if not q or _gg_state.get("exiting"):
                return 0
            q.popleft()()
        except KeyboardInterrupt:
            try:
                import _thread

                _thread.interrupt_main()
            except BaseException:
                pass
        except BaseException:
            pass


def _gg_nogc():
    """Collection off while gpuguard walks the window's dicts (a finalizer that frees a
    CuPy array would call the hook, which changes them). Returns the previous state."""
    import gc

    was = gc.isenabled()
    gc.disable()
    return was


def _gg_gc_back(was):
    if was:
        import gc

        gc.enable()


def _gg_frame_text(code, off):
    name = getattr(code, "co_qualname", code.co_name)
    return "%s:%d in %s" % (code.co_filename, _gg_line(code, off), name)


class _GGCupyWindow:
    """The default mode's CuPy hook (see above). Its methods run on the main thread,
    inside CuPy's pool calls: they never raise and never change the hooks dict."""

    name = "gpuguard-window"

    def __init__(self, depth, skip):
        import collections

        self.depth = range(depth)
        self.skip = skip  # file name prefixes of the frames trimmed off the top
        self.mode = 0  # 1: first half (records), 2: second half (watches), 0: neither
        self.cur = {}  # address -> (device, size, ((code, offset), ...)): first half
        self.kept = collections.OrderedDict()  # address -> (device, size, frames), oldest first
        self.folded = {}  # (device, frames) -> [bytes, count]: kept entries beyond the bound
        # Totals kept as entries come and go, so that a report costs no walk of `kept`:
        self.lines = {}  # (device, frames) -> [bytes, count], of kept and folded
        self.per_dev = {}  # device -> bytes, of kept and folded
        self.seen = 0  # pool mallocs recorded in this window
        self.busy = False  # a window is open, or being opened or closed
        self.span = (0.05, 0.5)
        self.opened = 0.0
        self.first_ms = 0.0
        self.last_ms = None
        # The first halves' time (what the windows recorded, for scaling their lines
        # up: `scale`).
        self.recorded_s = 0.0
        self.deferred = 0  # changes of the hooks dict put off: a hook method ran
        self.gen = 0  # which window is (or was last) open
        self.closing = 0  # the window whose close is due (0: none)
        self.self_closed = 0  # windows the hook closed from inside its own call

    # The hook points used (mixed in with CuPy's MemoryHook, whose no-ops serve the
    # others: malloc_preprocess, and alloc_* when the pool goes to the driver).
    def malloc_postprocess(self, device_id=0, size=0, mem_size=0, mem_ptr=0, pmem_id=0, **kw):
        if self.closing:
            self._close_from_hook()
        if not mem_ptr:
            return
        # An address handed out again: what was there before is dead.
        gone = self.kept.pop(mem_ptr, None)
        if gone is not None:
            self._less(gone, gone[1], 1)
        if self.mode != 1:
            self.cur.pop(mem_ptr, None)
            return
        try:
            # CuPy's own Python frames (and gpuguard's) are trimmed off the top: the
            # rest, up to the depth, is the program's. Read as cheaply as Python can.
            f = sys._getframe(1)
            skip = self.skip
            while f is not None and f.f_code.co_filename.startswith(skip):
                f = f.f_back
            frames = []
            for _ in self.depth:
                if f is None:
                    break
                frames.append((f.f_code, f.f_lasti))
                f = f.f_back
            f = None
            if len(self.cur) < 2 * _GG_CUPY_KEPT:
                self.cur[mem_ptr] = (device_id, mem_size, tuple(frames))
                self.seen += 1
        except Exception:
            pass

    def free_preprocess(self, device_id=0, mem_size=0, mem_ptr=0, pmem_id=0, **kw):
        self.cur.pop(mem_ptr, None)
        gone = self.kept.pop(mem_ptr, None)
        if gone is not None:
            self._less(gone, gone[1], 1)

    def free_postprocess(self, **kw):
        if self.closing:
            self._close_from_hook()

    # The window, on the main thread but for check() (a timer thread).

    def open(self):
        from cupy.cuda import memory_hook

        if memory_hook.get_memory_hooks().get(self.name) is not self:
            self.__enter__()
        import time

        self.cur = {}
        self.seen = 0
        self.gen += 1
        self.closing = 0
        self.opened = time.monotonic()
        self.mode = 1
        try:
            _gg_timer(self.span[0], self.check)
        except Exception:
            self.mode = 0
            self.__exit__(None, None, None)
            raise

    def check(self):
        import time

        step, longest = self.span
        elapsed = time.monotonic() - self.opened
        # The count first: a window closes on time only when the main thread makes
        # fewer pool mallocs (slow steps, a starved thread, none at all).
        if self.seen >= _GG_WINDOW_ALLOCS or elapsed + step > longest:
            self.mode = 2
            self.first_ms = elapsed * 1000.0
            self.recorded_s += elapsed
            g = self.gen

            def due():
                # The hook closes itself at its next call where it safely can (see
                # _close_from_hook); the pending call is there for when it cannot, or
                # when no pool call comes.
                self.closing = g
                _gg_on_main(lambda: _gg_cupy_change(self, lambda: self.close_if(g)))

            _gg_timer(elapsed, due)
        else:
            _gg_timer(step, self.check)

    def close_if(self, g):
        """Closes window g if it is still the open one (a close queued for a window
        that already closed itself must not close the next)."""
        if g == self.gen and self.mode == 2:
            self.close()

    def _close_from_hook(self):
        """From inside one of this hook's calls: closes the window if this hook is the
        last in the thread's hooks dict. CPython's OrderedDict iterator, once it has
        handed out its last item, ends without checking the dict for changes; so the
        last hook may delete itself in its own call, while any other change during the
        loop raises in the program. Else the pending call (_gg_cupy_change) does it."""
        # A hook method further up (a hook that allocates, so that this loop runs
        # inside another one over the same dict): that outer loop would see the change.
        try:
            f = sys._getframe(2)
            while f is not None:
                if f.f_code.co_name in _GG_HOOK_METHODS:
                    return
                f = f.f_back
            from cupy.cuda import memory_hook

            hooks = memory_hook.get_memory_hooks()
            if hooks and next(reversed(hooks)) == self.name and hooks[self.name] is self:
                self.self_closed += 1
                self.close_if(self.closing)
        except Exception as e:
            # Never into CuPy's pool call (the interpreter's teardown, where imports
            # fail): the pending call closes the window, or no one needs it closed.
            _gg_state["cupy_window_error"] = _gg_err(e)

    def close(self):
        import time

        self.closing = 0
        was = _gg_nogc()
        try:
            cur, self.cur = self.cur, {}
            self.mode = 0
            self._keep(cur)
        finally:
            _gg_gc_back(was)
        from cupy.cuda import memory_hook

        if memory_hook.get_memory_hooks().get(self.name) is self:
            self.__exit__(None, None, None)
        self.last_ms = (time.monotonic() - self.opened) * 1000.0
        # For the next report's python_cost: how long the hook was in, and how many
        # pool mallocs its first half recorded.
        _gg_state.setdefault("windows", {})["cupy"] = {"ms": self.last_ms, "allocations": self.seen}
        self.busy = False

    def _named(self, cur):
        """(address, device, size, frame texts) of the first half's blocks in cur."""
        texts, tuples = {}, {}
        for ptr, (dev, size, frames) in list(cur.items()):
            if not frames:
                continue
            names = []
            for code, off in frames:
                k = (id(code), off)
                t = texts.get(k)
                if t is None:
                    t = texts[k] = _gg_frame_text(code, off)
                names.append(t)
            names = tuple(names)
            yield ptr, dev, size, tuples.setdefault(names, names)

    def _less(self, entry, size, n):
        """Takes `size` bytes and `n` blocks of an entry's line off the totals."""
        dev, frames = entry[0], entry[2]
        e = self.lines.get((dev, frames))
        if e is not None:
            e[0] -= size
            e[1] -= n
            if e[1] <= 0:
                del self.lines[(dev, frames)]
        self.per_dev[dev] = self.per_dev.get(dev, 0) - size

    def _keep(self, cur):
        kept, lines, per_dev = self.kept, self.lines, self.per_dev
        for ptr, dev, size, frames in self._named(cur):
            gone = kept.pop(ptr, None)
            if gone is not None:
                self._less(gone, gone[1], 1)
            kept[ptr] = (dev, size, frames)
            e = lines.setdefault((dev, frames), [0, 0])
            e[0] += size
            e[1] += 1
            per_dev[dev] = per_dev.get(dev, 0) + size
        while len(kept) > _GG_CUPY_KEPT:
            _, (dev, size, frames) = kept.popitem(last=False)
            e = self.folded.setdefault((dev, frames), [0, 0])
            e[0] += size
            e[1] += 1

    def blocks(self, used, at_exit):
        """The kept blocks as (framework, bytes, frames, count) per line, after dropping
        the oldest of a device while they add up to more than `used` (device -> pool
        bytes in use) says. At exit, the first half's blocks still live count too."""
        was = _gg_nogc()
        try:
            for dev, total in list(self.per_dev.items()):
                limit = used.get(dev)
                if limit is None or total <= limit:
                    continue
                # The folded totals are older than any kept entry.
                for key in [k for k in self.folded if k[0] == dev]:
                    if self.per_dev[dev] <= limit:
                        break
                    size, n = self.folded.pop(key)
                    self._less((dev, size, key[1]), size, n)
                if self.per_dev[dev] > limit:
                    for ptr in [p for p, v in self.kept.items() if v[0] == dev]:
                        if self.per_dev[dev] <= limit:
                            break
                        gone = self.kept.pop(ptr)
                        self._less(gone, gone[1], 1)
            fw = "cupy-sampled"
            out = [(fw, b, frames, n) for (_, frames), (b, n) in list(self.lines.items())]
            if at_exit and self.busy:
                out.extend((fw, size, frames) for _, _, size, frames in self._named(self.cur))
            return out
        finally:
            _gg_gc_back(was)

    def scale(self, sampled, used):
        """The factor that scales the lines' `sampled` bytes up to an estimate of all:
        the time since gpuguard's Python side started over the time the windows
        recorded (CuPy counts no pool mallocs outside a hook, so time stands for them:
        a block kept per step is made in a window as often as a step is), never past
        the pool's bytes in use (`used`). None before a window recorded."""
        now = time.monotonic()
        rec = self.recorded_s + (now - self.opened if self.mode == 1 else 0.0)
        if rec <= 0 or sampled <= 0:
            return None
        f = max(1.0, (now - _GG_STARTED) / rec)
        if sampled * f > used:
            f = max(1.0, used / float(sampled))
        return f

    def devices(self):
        return set(self.per_dev)

    def forked(self):
        # A child forked during a window has no timer to close it.
        if self.busy:
            self.mode = 2
            self.cur = {}
            _gg_timer(_GG_RETRY_S, lambda: _gg_on_main(lambda: _gg_cupy_change(self, self.close)))


def _gg_cupy_change(w, change):
    """change() (which adds or removes the hook) now, on the main thread, unless a
    hook method is on the stack; then again a little later."""
    try:
        if _gg_in_hook():
            w.deferred += 1
            _gg_timer(_GG_RETRY_S, lambda: _gg_on_main(lambda: _gg_cupy_change(w, change)))
            return
        change()
    except Exception as e:
        w.mode = 0
        w.busy = False
        _gg_state["cupy_window_error"] = _gg_err(e)


def _gg_cupy_window(args):
    """Opens a CuPy window after a report (default mode, stacks on, CuPy imported)."""
    st = _gg_state
    if args.get("recorders") or int(args.get("depth", 0)) <= 0 or st["cupy_hook"] is not None:
        return
    cp = _gg_cupy()
    if cp is None:
        return
    w = st.get("cupy_window")
    if w is None:
        try:
            import os

            from cupy.cuda import memory_hook

            class Hook(_GGCupyWindow, memory_hook.MemoryHook):
                pass

            _gg_main_setup()
            w = Hook(int(args["depth"]), (os.path.dirname(cp.__file__), "<gpuguard"))
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=w.forked)
        except Exception as e:
            w = "error: " + _gg_err(e)
        st["cupy_window"] = w
    if not isinstance(w, _GGCupyWindow) or w.busy:
        return
    w.busy = True
    w.span = _gg_window_span(args, _GG_CUPY_SHARE)
    _gg_cupy_change(w, w.open)


def _gg_cupy_sampled(cp, pool, devices, blocks, at_exit, scale):
    """The default mode's CuPy lines into `blocks` (and their factor into `scale`);
    the detail that says what they are, or None when no window ever opened."""
    w = _gg_state.get("cupy_window")
    if w is None:
        return None
    if not isinstance(w, _GGCupyWindow):
        return "hook windows %s" % w
    used = {}
    for d in set(devices) | w.devices():
        with cp.cuda.Device(d):
            used[d] = int(pool.used_bytes())
    mine = w.blocks(used, at_exit)
    blocks.extend(mine)
    f = w.scale(sum(b[1] for b in mine), sum(used.values()))
    if w.last_ms is None:
        last = "none closed yet"
    else:
        last = "the last %.0f ms, its first %.0f recording" % (w.last_ms, w.first_ms)
    detail = (
        "no memory hook but for a window after each report (%s): Python lines "
        "(cupy-sampled) of the pool blocks allocated in those windows that still live "
        "(GPUGUARD_PYTHON=lines hooks every block)" % last
    )
    if f is not None:
        scale["cupy-sampled"] = f
        detail += (
            "; their figures are estimates, scaled by %.1f: the windows recorded 1/%.1f of the time "
            "since gpuguard started (at most the pool's bytes in use)" % (f, f)
        )
    if w.deferred:
        detail += "; %d hook changes waited for a memory hook to return" % w.deferred
    if w.self_closed:
        detail += "; %d windows closed by the hook in its own last call" % w.self_closed
    err = _gg_state.get("cupy_window_error")
    if err:
        detail += "; last error: " + err
    return detail


def _gg_at_exit():
    # Python's atexit runs while the interpreter is still whole: the exit report's
    # classification is taken here, before the C-level exit report is written. From
    # here on the timer thread and the queued main-thread calls do nothing: the
    # interpreter's teardown runs no window work of gpuguard's.
    _gg_state["exiting"] = True
    try:
        t0 = time.perf_counter()
        pairs = json.loads(_gg_pending_pairs())
        if pairs:
            _gg_submit("resolved\n" + json.dumps(_gg_resolve(pairs)))
        res = _gg_classify_now({"devices": json.loads(_gg_devices())}, at_exit=True)
        res["cost"] = _gg_cost(t0)
        _gg_answer("exit", res)
    except Exception:
        pass
