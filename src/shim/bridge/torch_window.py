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
    if st.get("torch_window_open"):
        # The last window is still open (a report came within its span): a second
        # would turn the recorder off under it and count its allocations twice.
        return
    step, longest = _gg_window_span(args)
    mem = t.cuda.memory
    devices = list(args.get("devices") or [])

    def allocations():
        return _gg_torch_allocations(t, devices)

    def open_window():
        try:
            mem._record_memory_history(enabled="state", context="alloc", stacks="python")
        except Exception as e:
            st["torch_recorder"] = "error: " + _gg_err(e)
            st["torch_window_open"] = False
            return
        st["torch_recorder"] = "sampling"
        opened[0], first[0] = time.monotonic(), allocations()
        if first[0] is not None:
            # From the program's first allocation: the blocks kept before the first
            # window (a whole snapshot interval) are estimated too. A counter that went
            # back (reset_accumulated_memory_stats) starts the count again.
            w = st.get("torch_windows")
            if w is None or first[0] < w.get("last", 0):
                w = st["torch_windows"] = {"from": 0 if w is None else first[0], "seen": 0}
            w["open_at"] = first[0]
            w["last"] = first[0]
            w["devices"] = devices
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
            if n is not None:
                tw["last"] = n
        st["torch_window_open"] = False

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
    st["torch_window_open"] = True
    try:
        _gg_timer(0, open_window)
    except Exception:
        st["torch_window_open"] = False
        raise


def _gg_torch_allocations(t, devices):
    """PyTorch's tensor allocations so far, over the devices gpuguard saw (each asked by
    its ordinal: memory_stats() alone reads the calling thread's current device, and
    the windows are counted on gpuguard's timer thread); None if PyTorch cannot say."""
    try:
        ms = t.cuda.memory_stats
        return sum(int(ms(d).get("allocation.all.allocated", 0)) for d in (devices or [None]))
    except Exception:
        return None


