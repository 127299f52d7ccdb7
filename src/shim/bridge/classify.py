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
                    "scale": f,
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
    now = _gg_torch_allocations(t, w.get("devices"))
    if now is None:
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


