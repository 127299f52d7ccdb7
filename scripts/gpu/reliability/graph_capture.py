#!/usr/bin/env python3
"""PyTorch CUDA-graph capture of a training step (forward, backward, SGD step) with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, replayed GGV_GRAPH_REPLAYS times
(default 40) with new data copied into the static inputs; judged by rel_check.py graph.

With GGV_SEND_SIGNALS=1 (the run under gpuguard) a thread started right after
capture_begin() sends this process SIGUSR1 (report) and then SIGUSR2 (trim); the main
thread waits until both are sent, notes that its stream is still capturing, and stays
in the capture for 1.5 s running Python (so a pending Python call of gpuguard's could
run now) before it records the step and ends the capture. gpuguard writes the signal
report during the capture without any CUDA call a capture forbids (the report's
`capture` says so) and holds the trim until the capture ended (`trim.deferred`,
outcome `ran`). After the replays it waits (20 s at most) for this process's signal
and trim reports. The run without gpuguard
sends nothing. Fixed seeds, deterministic algorithms: the replay losses and the final
parameters must be bit-identical in both runs.

Prints GGV_JSON records: config, capture (times, capturing_at_send, reports seen
during the capture, error), replays (loss hex strings), params (sha256), reports.
"""

import hashlib
import os
import signal
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SEED = int(os.environ.get("GGV_REL_SEED", "20261201"))
REPLAYS = int(os.environ.get("GGV_GRAPH_REPLAYS", "40"))
SEND = os.environ.get("GGV_SEND_SIGNALS") == "1"
RDIR = os.environ.get("GPUGUARD_DIR")


def main():
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    pid = os.getpid()
    guard = ggv.Guard()
    ggv.emit("config", pid=pid, send_signals=SEND, gpuguard=guard.present, replays=REPLAYS,
             alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), torch=torch.__version__,
             backend=torch.cuda.get_allocator_backend())
    if SEND and not guard.present:
        # Nothing would handle the signals: ignore them, so the checks report the
        # missing gpuguard instead of a killed process.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                          nn.Linear(2048, 512)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator(device=dev)
    gen.manual_seed(SEED)
    static_x = torch.randn(256, 512, generator=gen, device=dev)
    static_y = torch.randn(256, 512, generator=gen, device=dev)

    # Warm-up on a side stream (as PyTorch's whole-network capture recipe asks).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    sent = {}
    done = threading.Event()

    def send():
        for name, sig in (("usr1", signal.SIGUSR1), ("usr2", signal.SIGUSR2)):
            try:
                os.kill(pid, sig)
                sent[name] = time.time()
            except OSError as e:
                sent[name + "_error"] = str(e)
            time.sleep(0.05)
        done.set()

    cap = {"error": None, "capturing_at_send": None, "reports_during_capture": []}
    static_loss = None
    try:
        with torch.cuda.stream(s):
            g.capture_begin()
            cap["t_begin"] = time.time()
            if SEND:
                threading.Thread(target=send, daemon=True).start()
                done.wait(5.0)
                cap["capturing_at_send"] = bool(torch.cuda.is_current_stream_capturing())
                w0 = time.time()
                while time.time() - w0 < 1.5:
                    time.sleep(0.02)
                cap["reports_during_capture"] = [e["reason"] for e in ggv.list_reports(RDIR, pid)]
            static_loss = F.mse_loss(model(static_x), static_y)
            static_loss.backward()
            opt.step()
            cap["capturing_before_end"] = bool(torch.cuda.is_current_stream_capturing())
            g.capture_end()
            cap["t_end"] = time.time()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        cap["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
        cap["t_end"] = time.time()
    cap["sent"] = dict(sent)
    ggv.emit("capture", **cap)
    if cap["error"]:
        return 1

    losses = []
    try:
        for _ in range(REPLAYS):
            static_x.copy_(torch.randn(256, 512, generator=gen, device=dev))
            static_y.copy_(torch.randn(256, 512, generator=gen, device=dev))
            g.replay()
            losses.append(float(static_loss.item()).hex())
        torch.cuda.synchronize()
        err = None
    except Exception as e:  # noqa: BLE001
        err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
    ggv.emit("replays", n=len(losses), losses=losses, error=err)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    ggv.emit("params", sha256=h.hexdigest())

    found = {}
    if SEND and guard.present:
        for reason in ("signal", "trim"):
            e, rep, waited = ggv.wait_report(RDIR, pid, reason, timeout_s=20.0)
            found[reason] = {"name": e["name"] if e else None, "waited_s": round(waited, 2),
                             "trim": ggv.mech_text(rep) if reason == "trim" and rep else None,
                             "deferred": (ggv.trim_obj(rep) or {}).get("deferred") if rep else None,
                             "capture": rep.get("capture") if rep else None}
    ggv.emit("reports", found=found, all=[e["name"] for e in ggv.list_reports(RDIR, pid)])
    return 0 if err is None else 1


if __name__ == "__main__":
    sys.exit(main())
