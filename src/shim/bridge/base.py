# gpuguard's Python side, one concern a file in src/shim/bridge/: the shim joins the
# files in the order src/shim/python.rs lists them (this one first: imports and the
# shared state) and runs them once as one source in a private namespace, on
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


