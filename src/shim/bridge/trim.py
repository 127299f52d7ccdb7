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


