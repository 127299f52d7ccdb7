# ---- gpuguard's threads: the timer thread and calls queued for the main thread ----


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


