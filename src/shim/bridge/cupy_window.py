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


