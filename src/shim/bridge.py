# gpuguard's Python side. The shim runs this file once in a private namespace, on
# the interpreter's main thread (through Py_AddPendingCall, so with the GIL held at a
# bytecode boundary, never inside an allocation hook), and then calls its functions
# the same way. Each call hands its answer back through _gg_submit(tag + "\n" + json).
# Frameworks are only looked at when the program has imported them: this file never
# imports torch, cupy, jax or tensorflow itself.

import json
import sys

_gg_state = {"atexit": False, "torch_recorder": None, "cupy_hook": None}


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
    CuPy's hooks are per thread; this one is installed on the main thread."""

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

    def alloc_preprocess(self, **kw):
        pass

    def alloc_postprocess(self, **kw):
        pass

    def malloc_preprocess(self, **kw):
        pass

    def malloc_postprocess(self, **kw):
        ptr = kw.get("mem_ptr")
        if ptr:
            self.live[ptr] = (kw.get("device_id", 0), kw.get("mem_size", 0), self._frames())

    def free_preprocess(self, **kw):
        self.live.pop(kw.get("mem_ptr"), None)

    def free_postprocess(self, **kw):
        pass


def _gg_install(args):
    """Registers the exit hook and turns the framework recorders on (idempotent)."""
    _gg_answer("reply", _gg_setup(args))


def _gg_setup(args):
    st = _gg_state
    out = {}
    if not st["atexit"]:
        import atexit

        atexit.register(_gg_at_exit)
        st["atexit"] = True
    depth = int(args.get("depth", 0))
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


def _gg_trim(args):
    _gg_setup(args)
    devices = args.get("devices", [])
    mechs = []
    t = _gg_torch()
    if t is not None:
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
    if cp is not None:
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


def _gg_sites(blocks, out_sites):
    by = {}
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
        out_sites.append({"framework": fw, "frames": list(frames), "bytes": size, "count": n})


def _gg_classify_now(args):
    devices = args.get("devices", [])
    res = {"frameworks": [], "devices": [], "blocks": [], "sites": []}
    blocks = []
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
            if _gg_state["torch_recorder"] == "on":
                import os

                # A site starts at the program's code: PyTorch's own frames (a
                # module's forward, say) are trimmed off the top.
                tdir = os.path.dirname(t.__file__) + os.sep
                snap = t.cuda.memory._snapshot()
                for seg in snap.get("segments", []):
                    dev = seg.get("device", 0)
                    addr = seg.get("address", 0)
                    for b in seg.get("blocks", []):
                        size = b.get("size", 0)
                        active = b.get("state", "").startswith("active")
                        res["blocks"].append([dev, b.get("address", addr), size, 1 if active else 0, "pytorch"])
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
                                blocks.append(("pytorch", size, frames))
                        addr += size
                fw["detail"] = "%s allocator; blocks from PyTorch's memory snapshot" % backend
            elif backend != "native":
                fw["detail"] = (
                    "%s allocator: totals from PyTorch; no Python lines (PyTorch's "
                    "recorder does not support this backend)" % backend
                )
            else:
                fw["detail"] = "totals from PyTorch; recorder %s" % (
                    _gg_state["torch_recorder"] or "off (stacks off)"
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
                    res["blocks"].append([dev, ptr, size, 1, "cupy"])
                    if frames:
                        blocks.append(("cupy", size, frames))
                fw["detail"] = "default memory pool; blocks from gpuguard's CuPy hook (main thread)"
            else:
                fw["detail"] = "default memory pool totals; hook %s" % (h or "off (stacks off)")
        except Exception as e:
            fw = {"framework": "cupy", "status": "unavailable", "detail": _gg_err(e)}
        res["frameworks"].append(fw)
    if "jax" in sys.modules or "jaxlib" in sys.modules:
        res["frameworks"].append(_gg_jax(devices, res, blocks))
    _gg_sites(blocks, res["sites"])
    return res


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


def _gg_classify(args):
    _gg_setup(args)
    _gg_answer("reply", _gg_classify_now(args))


def _gg_at_exit():
    # Python's atexit runs while the interpreter is still whole: the exit report's
    # classification is taken here, before the C-level exit report is written.
    try:
        _gg_answer("exit", _gg_classify_now({"devices": json.loads(_gg_devices())}))
    except Exception:
        pass
