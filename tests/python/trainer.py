"""A training-loop stand-in for gpuguard's Python tests, on the simulated CUDA stack.

  trainer.py FRAMEWORK ACTION...

FRAMEWORK: torch, cupy, jax, torch+jax, none (Python without a framework), or nocuda.
Actions, run in order:
  cache:MiB     allocate that much in 1 MiB blocks and drop it (the framework caches it)
  leak:N        one step of the leak: keep N 1 MiB blocks in a global list
  small:N:MS    N training steps that each keep one 64 KiB tensor (MS ms a step);
                N = sK: steps until K more snapshot reports are in GPUGUARD_DIR;
                then prints KEPT <blocks kept in all>
  temps:N:MS    N such steps that keep nothing (temporaries only)
  userhook:US   (cupy) install a memory hook of the program's own beside gpuguard's,
                whose malloc and free methods each wait US microseconds with the GIL
                released (as one that writes a log does) and run a little Python
  dropleaks     let go of everything kept so far, on another thread (whose CuPy frees
                a memory hook of the main thread does not see)
  big:MiB       allocate one block of that size and keep it; prints BIG <MiB> ok|refused
  owned:N       keep N 1 MiB blocks in objects that free them in __del__ (so the
                interpreter's teardown frees them, as PyTorch's async backend does)
  raise:SIG     send SIG to this process, without waiting
  ignore:SIG    set SIG to be ignored (SIG_IGN)
  signal:SIG    send SIG to this process and wait (running Python) for a new report
  burst:SIG:N   send SIG N times at once, then wait for reports to settle
  state         print STATE reserved=<bytes> allocated=<bytes>
  ready:S       print READY, then run Python for S seconds (an outside signal may come)
  installed     run Python until gpuguard's Python side is set up (its exit hook, the
                last thing its setup registers, is in atexit): a handshake where a
                pause would guess; prints INSTALLED, or NOT INSTALLED and exits 1
                when it was not within 60 s
  capture       begin a CUDA graph capture (global mode) on a new stream and print
                CAPTURING; then run Python while reading stdin, one command a line:
                `end` ends the capture (prints CAPTURE rc=<code>, then ENDED), `quit`
                leaves the action
  sig-in-gpuguard:SIG  have SIG sent while gpuguard's Python side runs (the stand-in
                torch sends it when gpuguard asks it a question), ask for a report so
                that it runs, and run Python until it was sent (at most 20 s); prints
                NOT INTERRUPTED if the program goes on after it
  exec-in-gpuguard  from now on the stand-in torch runs code from a string whenever
                gpuguard's Python side asks it a question (at exit too)
  del-trim      at interpreter shutdown, ask for a trim from inside finalization
  watchthreads  from now on note each Python thread started (threading.Thread.start):
                at the end, before OK, prints STARTED <thread name> main|other (the
                thread that started it) for each
Prints REPORT <path> for every report the waits saw, and OK at the end. With
TRAINER_ECHO_SIGNALS=1 the program's own handlers print GOT <signum> for SIGUSR1 and
SIGUSR2 (installed before the first CUDA call, so gpuguard chains to them: the line
says gpuguard's handler has counted the request).

Waits sleep in short steps, as a training loop's main thread releases the GIL in
every framework call: gpuguard's Python work runs when the main thread takes the GIL
back (CPython notices pending calls then).
"""
import atexit
import glob
import os
import signal
import subprocess
import sys
import time

# Before any CUDA call (gpuguard is inactive until the first allocation): the exit
# hooks registered so far. gpuguard's Python side registers one more when it is set
# up (action `installed`).
ATEXIT_AT_START = atexit._ncallbacks()

FW = sys.argv[1]
LEAKS = []
STARTED = []  # (thread name, "main" or "other"), with watchthreads
DIR = os.environ.get("GPUGUARD_DIR", ".")

if os.environ.get("TRAINER_ECHO_SIGNALS") == "1":
    def _echo(signum, frame):
        print("GOT", signum, flush=True)

    signal.signal(signal.SIGUSR1, _echo)
    signal.signal(signal.SIGUSR2, _echo)

if FW.startswith("torch"):
    import torch

    alloc = torch.empty
    torch.cuda._lazy_init()
    if FW == "torch+jax":
        import jax  # noqa: F401
elif FW == "jax":
    import jax

    jax.init()
    alloc = jax.empty
elif FW == "cupy":
    import cupy

    import simrt

    alloc = cupy.empty
    simrt.rt()  # the first CUDA call
elif FW == "none":
    import simrt

    def alloc(n):
        return simrt.malloc(n)
else:
    alloc = None

if alloc is not None:
    # A first allocation, outside any framework: gpuguard activates here (CUDA's
    # queries alone do not activate it), so its Python side is set up before the
    # actions run. Freed at once; no framework cache holds it.
    import simrt

    simrt.free(simrt.malloc(4096))

MiB = 1 << 20


def reports():
    return set(glob.glob(os.path.join(DIR, "gpuguard.*.json")))


def snapshots():
    return len(glob.glob(os.path.join(DIR, "gpuguard.*.snapshot.json")))


def wait_new(before, want=1, timeout=20.0):
    """Runs Python (so pending calls run) until `want` new reports appear."""
    end = time.time() + timeout
    while time.time() < end:
        new = reports() - before
        if len(new) >= want:
            time.sleep(0.2)  # let a report being renamed into place settle
            return sorted(reports() - before)
        time.sleep(0.002)
    return sorted(reports() - before)


def state():
    if FW.startswith("torch"):
        r, a = torch.cuda.memory_reserved(0), torch.cuda.memory_allocated(0)
    elif FW == "cupy":
        p = cupy.get_default_memory_pool()
        r, a = p.total_bytes(), p.used_bytes()
    else:
        r = a = 0
    print("STATE reserved=%d allocated=%d" % (r, a), flush=True)


class Owned:
    def __init__(self, n):
        import simrt

        self.ptr = simrt.malloc(n)
        # Held here: modules may be gone when teardown runs __del__.
        self.free = simrt.free

    def __del__(self):
        self.free(self.ptr)


class TrimAtShutdown:
    def __del__(self):
        # Module teardown, after Python's atexit: the interpreter is finalizing.
        before = reports()
        os.kill(os.getpid(), signal.SIGUSR2)
        end = time.time() + 3
        while time.time() < end and not (reports() - before):
            time.sleep(0.002)


for action in sys.argv[2:]:
    name, _, arg = action.partition(":")
    if name == "cache":
        tmp = [alloc(MiB) for _ in range(int(arg))]
        del tmp
    elif name == "leak":
        for _ in range(int(arg)):
            LEAKS.append(alloc(MiB))  # LEAK-LINE
    elif name in ("small", "temps"):
        # A training loop that keeps one 64 KiB tensor a step (and makes three
        # temporaries): the cache absorbs it, the driver sees a 2 MiB segment every
        # 32 steps. small:STEPS:MS, MS of "compute" a step in six parts, so that
        # gpuguard's calls (which run when the main thread returns to Python) may come
        # anywhere in a step, mostly away from its allocations. CuPy's pool gives the
        # kept array a chunk the temporaries just freed, so the pool grows (the driver
        # sees a 64 KiB allocation) at the temporaries' line, each step.
        steps, _, ms = arg.partition(":")
        part = float(ms or 2) / 6000.0
        until = None
        if steps.startswith("s"):
            # A handshake with the snapshot thread: as many steps as K snapshot
            # intervals take, however fast or slow this machine runs them.
            until = snapshots() + int(steps[1:])
            steps = sys.maxsize
        for i in range(int(steps)):
            if until is not None and i % 16 == 0 and snapshots() >= until:
                break
            for _ in range(6):
                time.sleep(part)
            tmp = [alloc(64 << 10) for _ in range(3)]
            del tmp
            if name == "small":
                LEAKS.append(alloc(64 << 10))  # SMALL-LEAK-LINE
        if name == "small":
            print("KEPT %d" % len(LEAKS), flush=True)
    elif name == "userhook":
        from cupy.cuda import memory_hook

        class SlowHook(memory_hook.MemoryHook):
            """The program's own hook, in which gpuguard's pending calls land while
            CuPy's loop over the hooks runs: the main thread takes the GIL back in it
            (CPython notices a pending call queued by another thread then)."""

            name = "program"

            def __init__(self, us):
                self.s = us / 1e6
                self.calls = 0

            def spin(self):
                time.sleep(self.s)
                for _ in range(20):
                    self.calls += 1

            def malloc_preprocess(self, **kw):
                self.spin()

            def malloc_postprocess(self, **kw):
                self.spin()

            def free_preprocess(self, **kw):
                self.spin()

            def free_postprocess(self, **kw):
                self.spin()

        SlowHook(float(arg)).__enter__()
    elif name == "dropleaks":
        import threading

        t = threading.Thread(target=LEAKS.clear)
        t.start()
        t.join()
    elif name == "big":
        try:
            LEAKS.append(alloc(int(arg) * MiB))
            print("BIG", arg, "ok", flush=True)
        except MemoryError:
            print("BIG", arg, "refused", flush=True)
    elif name == "owned":
        for _ in range(int(arg)):
            LEAKS.append(Owned(MiB))
    elif name == "raise":
        os.kill(os.getpid(), getattr(signal, "SIG" + arg))
        time.sleep(0.002)
    elif name == "ignore":
        signal.signal(getattr(signal, "SIG" + arg), signal.SIG_IGN)
    elif name == "signal":
        before = reports()
        os.kill(os.getpid(), getattr(signal, "SIG" + arg))
        for p in wait_new(before):
            print("REPORT", p, flush=True)
    elif name == "burst":
        sig, n = arg.split(":")
        before = reports()
        # Sent by a shell while this thread waits for it: no bytecode runs here
        # meanwhile, so the first trim's Python part (queued for this thread) cannot
        # run before every signal has come, and each later one meets that trim.
        subprocess.run(
            ["sh", "-c", 'for i in $(seq "$1"); do kill -"$2" "$3"; done', "sh", n, sig, str(os.getpid())],
            check=True,
        )
        for p in wait_new(before, want=1):
            print("REPORT", p, flush=True)
        time.sleep(1.0)
        time.sleep(0.002)
    elif name == "state":
        state()
    elif name == "installed":
        end = time.time() + 60
        while atexit._ncallbacks() <= ATEXIT_AT_START and time.time() < end:
            time.sleep(0.002)
        if atexit._ncallbacks() <= ATEXIT_AT_START:
            print("NOT INSTALLED", flush=True)
            sys.exit("gpuguard's Python side was not set up within 60 s")
        print("INSTALLED", flush=True)
    elif name == "ready":
        print("READY", flush=True)
        end = time.time() + float(arg)
        while time.time() < end:
            time.sleep(0.002)
    elif name == "capture":
        import select

        import simrt

        s = simrt.stream()
        print("CAPTURE begin=%d" % simrt.begin_capture(s), flush=True)
        print("CAPTURING", flush=True)
        capturing = True
        while True:
            # Python runs between short waits: a pending call of gpuguard's could run.
            if not select.select([sys.stdin], [], [], 0.002)[0]:
                continue
            cmd = sys.stdin.readline().strip()
            if cmd == "end" and capturing:
                print("CAPTURE rc=%d" % simrt.end_capture(s), flush=True)
                print("ENDED", flush=True)
                capturing = False
            elif cmd in ("quit", ""):
                break
    elif name == "sig-in-gpuguard":
        torch.cuda.signal_in_query = getattr(signal, "SIG" + arg)
        os.kill(os.getpid(), signal.SIGUSR1)
        end = time.time() + 20
        while time.time() < end and torch.cuda.signal_in_query is not None:
            time.sleep(0.002)
        # Sent (or never) from inside gpuguard's call: a KeyboardInterrupt it raised
        # has reached this frame by now.
        print("NOT INTERRUPTED", flush=True)
    elif name == "exec-in-gpuguard":
        torch.cuda.exec_in_query = True
    elif name == "del-trim":
        sys.modules["__main__"].keeper = TrimAtShutdown()
    elif name == "watchthreads":
        import threading

        _start = threading.Thread.start

        def _watched(self):
            on_main = threading.current_thread() is threading.main_thread()
            STARTED.append((self.name, "main" if on_main else "other"))
            return _start(self)

        threading.Thread.start = _watched
    else:
        sys.exit("unknown action " + action)
for thread, by in STARTED:
    print("STARTED", thread, by, flush=True)
print("OK", flush=True)
