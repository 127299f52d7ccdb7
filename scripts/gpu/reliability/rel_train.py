#!/usr/bin/env python3
"""Deterministic PyTorch training loop of the reliability suite (issue 11 item 8),
judged by rel_check.py.

  rel_train.py ending [--handle-term] [--max-s 120]
      Trains until a signal ends it. Prints GGV_READY pid=N after 20 steps (the runner
      then sends SIGTERM or SIGINT from outside) and "step N" lines. With --handle-term
      a SIGTERM handler (a graceful shutdown) ends the loop and the process exits 0.
  rel_train.py soak --role guarded|bare --dir RUNDIR --deadline EPOCH [--frac 0.9]
      The soak: the same loop, losses kept bit for bit (RUNDIR/losses_<role>.f32,
      float32, one per step). The guarded run (under gpuguard) times its first 200
      steps, then sizes the run to end by the deadline (minus a margin) and writes the
      step count to RUNDIR/target_steps, re-planned every 10 s (or when late) from its
      mean step time so that it ends near the deadline; at its end it writes
      RUNDIR/target_final. The bare run (no gpuguard, started at the same time) follows
      target_steps and stops at the guarded run's final count (it waits there until
      target_final exists), so both run the same number of steps.
      Guarded: prints GGV_SOAK_READY pid=N after the warm-up (the runner then sends
      SIGUSR1 / SIGUSR2 every 2-3 s) and GGV_SOAK_STEPS_DONE pid=N after the last step;
      then waits for RUNDIR/signals_stopped (at most 20 s), lets pending trims finish
      (3 s running Python) and compares gpuguard's device current_bytes with
      torch.cuda.memory_reserved() (ggv_common.Checker: the core suite's rule and
      tolerance; the reference extra is taken after the warm-up, before any signal).
      Both print GGV_JSON {"record": "result", ...}.

Fixed seeds, torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8,
float32 (no TF32), PyTorch's default caching allocator unless the environment says
otherwise. MLP 1024-4096-4096-1024 (25M parameters, AdamW), batch size cycling over
256/512/1024/2048 so that the cache grows, is trimmed and grows again: under 2 GiB.
"""

import argparse
import array
import os
import signal
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "frameworks"))
import ggv  # noqa: E402
import ggv_common  # noqa: E402  (Checker: the core suite's comparison rule)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SEED = int(os.environ.get("GGV_REL_SEED", "20261201"))
BATCHES = (256, 512, 1024, 2048)
CHUNK = 100  # steps between reads of the loss buffer


class Trainer:
    def __init__(self, seed=SEED):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.dev = torch.device("cuda", 0)
        self.model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                                   nn.Linear(4096, 1024)).to(self.dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(seed)
        self.teacher = torch.randn(1024, 1024, generator=self.gen, device=self.dev) / 32
        self.buf = torch.zeros(CHUNK, device=self.dev)
        self.losses = array.array("f")
        self.step = 0

    def one(self):
        b = BATCHES[self.step % len(BATCHES)]
        x = torch.randn(b, 1024, generator=self.gen, device=self.dev)
        y = torch.tanh(x @ self.teacher)
        loss = F.mse_loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.buf[self.step % CHUNK].copy_(loss.detach())
        self.step += 1

    def chunk(self):
        """CHUNK steps; their losses appended (one device-to-host copy per chunk)."""
        for _ in range(CHUNK):
            self.one()
        self.losses.extend(self.buf.tolist())


def cmd_ending(a):
    t = Trainer()
    stop = {"term": False}
    if a.handle_term:
        def on_term(signum, frame):
            stop["term"] = True
            print("GGV_TERM_HANDLER ran (signal %d)" % signum, flush=True)
        signal.signal(signal.SIGTERM, on_term)
    ggv.emit("config", pid=os.getpid(), handle_term=a.handle_term, gpuguard=ggv.Guard().present)
    t0 = time.time()
    while time.time() - t0 < a.max_s and not stop["term"]:
        t.one()
        if t.step % 10 == 0:
            loss = t.buf[(t.step - 1) % CHUNK].item()
            print("step %d loss %.6f" % (t.step, loss), flush=True)
        if t.step == 20:
            print("GGV_READY pid=%d" % os.getpid(), flush=True)
        time.sleep(0.01)
    ggv.emit("result", steps=t.step, ended_by_handler=stop["term"], seconds=round(time.time() - t0, 2))
    return 0 if stop["term"] else 3  # 3: ran out of time, no signal came


def write_atomic(path, text):
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def cmd_soak(a):
    guarded = a.role == "guarded"
    target_file = os.path.join(a.dir, "target_steps")
    hard_end = a.deadline - a.margin
    t = Trainer()
    ggv.emit("config", pid=os.getpid(), role=a.role, deadline=a.deadline, hard_end=hard_end, frac=a.frac,
             chunk=CHUNK, seed=SEED, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
             cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch=torch.__version__)
    chk = None
    if guarded and not ggv.Guard().present:
        # Without gpuguard nothing handles the runner's signals: ignore them (the checks
        # then fail on the missing books and reports, not on a killed process).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if guarded:
        chk = ggv_common.Checker(
            "torch", "default", overhead_bound=512 * ggv.MiB,
            overhead_reason="device memory allocated outside the caching allocator (cuBLAS/cuBLASLt "
                            "internals, CUDA runtime) is visible to gpuguard, not to torch")
    t0 = time.time()
    t.chunk()
    t1 = time.time()
    t.chunk()
    torch.cuda.synchronize()
    t2 = time.time()
    step_s = (t2 - t1) / CHUNK
    history = []
    if guarded:
        chk.check("warmup", "memory_reserved", torch.cuda.memory_reserved())
        n = int(max(0.0, hard_end - time.time()) * a.frac / step_s) // CHUNK * CHUNK
        target = max(t.step + CHUNK, n + t.step)
        write_atomic(target_file, str(target))
        history.append([round(time.time(), 1), target])
        print("INFO warm-up %.2f ms/step (first chunk %.1f s): %d steps planned" % (
            step_s * 1e3, t1 - t0, target), flush=True)
        print("GGV_SOAK_READY pid=%d" % os.getpid(), flush=True)
    else:
        target = None
        w0 = time.time()
        while target is None and time.time() - w0 < 180:
            target = read_int(target_file)
            if target is None:
                time.sleep(0.2)
        if target is None:
            ggv.emit("result", role=a.role, error="no target_steps from the guarded run", steps=t.step)
            return 2
    loop_t0, loop_step0, last_plan = time.time(), t.step, time.time()
    final_file = os.path.join(a.dir, "target_final")
    while True:
        if t.step < target:
            t.chunk()
        elif guarded or os.path.exists(final_file) or time.time() > a.deadline + 10:
            break
        else:
            time.sleep(0.1)  # bare: at the count; the guarded run may still raise it
        now = time.time()
        if guarded:
            per = (now - loop_t0) / max(t.step - loop_step0, 1)  # the mean since the warm-up
            late = now + (target - t.step) * per > hard_end
            if late or now - last_plan >= 10:
                fit = int(max(0.0, hard_end - now) * a.frac / max(per, 1e-6)) // CHUNK * CHUNK
                if t.step + fit != target:
                    target = t.step + fit
                    write_atomic(target_file, str(target))
                    history.append([round(now, 1), target])
                last_plan = now
        else:
            newer = read_int(target_file)
            if newer is not None:
                target = newer
    if guarded:
        write_atomic(target_file, str(t.step))
        write_atomic(final_file, str(t.step))
    torch.cuda.synchronize()
    t_end = time.time()
    with open(os.path.join(a.dir, "losses_%s.f32" % a.role), "wb") as f:
        t.losses.tofile(f)
    res = {"role": a.role, "steps": t.step, "seconds": round(t_end - t0, 2),
           "steps_per_s": round(t.step / max(t_end - t0, 1e-6), 1), "warmup_ms_per_step": round(step_s * 1e3, 3),
           "target_history": history, "last_loss": t.losses[-1] if len(t.losses) else None,
           "memory_reserved": torch.cuda.memory_reserved(), "max_memory_reserved": torch.cuda.max_memory_reserved()}
    if guarded:
        print("GGV_SOAK_STEPS_DONE pid=%d" % os.getpid(), flush=True)
        w0 = time.time()
        while not os.path.exists(os.path.join(a.dir, "signals_stopped")) and time.time() - w0 < 20:
            time.sleep(0.05)
        w1 = time.time()
        while time.time() - w1 < 3.0:  # running Python: a pending trim finishes here
            time.sleep(0.05)
        torch.cuda.synchronize()
        end = chk.check("end", "memory_reserved", torch.cuda.memory_reserved())
        res.update(books_verdict=end["verdict"], books_diff=end["diff"], gpuguard_current=end["gpuguard_current"],
                   framework_bytes=end["framework_bytes"], books_explanation=end["explanation"])
    ggv.emit("result", **res)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("ending")
    e.add_argument("--handle-term", action="store_true")
    e.add_argument("--max-s", type=float, default=120.0)
    s = sub.add_parser("soak")
    s.add_argument("--role", choices=["guarded", "bare"], required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--deadline", type=float, required=True)
    s.add_argument("--margin", type=float, default=25.0)
    s.add_argument("--frac", type=float, default=0.9)
    a = ap.parse_args()
    return cmd_ending(a) if a.cmd == "ending" else cmd_soak(a)


if __name__ == "__main__":
    sys.exit(main())
