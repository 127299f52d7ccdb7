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


