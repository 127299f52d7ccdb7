#!/usr/bin/env python3
"""Samples GPU memory from OUTSIDE the workload process, through NVML (ctypes on
libnvidia-ml.so.1; pynvml not needed). Run it WITHOUT LD_PRELOAD: it then reads
the driver's real numbers (gpuguard would leave an NVML-only process alone anyway).

  caps_monitor.py --out FILE [--interval 0.05] [--index 0]

Every interval it writes one CSV line:
  t,dev_used,dev_total,procs
    t          time.time() of the sample (the workloads print the same clock)
    dev_used   nvmlDeviceGetMemoryInfo(...).used for the whole device, bytes
    procs      pid:used_bytes;pid:used_bytes... from
               nvmlDeviceGetComputeRunningProcesses (_v3, else _v2, else v1);
               "NA" for a value NVML does not give
Lines starting with '#' are comments: a header once NVML is up ("# ready ..."),
errors, and "# end samples=N" when it stops (SIGTERM or SIGINT).
"""

import argparse
import ctypes
import signal
import sys
import time

NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcV2(ctypes.Structure):  # nvmlProcessInfo_v2_t == nvmlProcessInfo_t (v3 calls)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


STOP = [False]


def on_signal(_sig, _frm):
    STOP[0] = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--index", type=int, default=0)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = open(a.out, "w", buffering=1)
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        out.write("# error cannot load libnvidia-ml.so.1: %s\n" % e)
        return 1
    nv.nvmlInit_v2.restype = ctypes.c_int
    rc = nv.nvmlInit_v2()
    if rc != 0:
        out.write("# error nvmlInit_v2 returned %d\n" % rc)
        return 1
    h = ctypes.c_void_p()
    nv.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
    rc = nv.nvmlDeviceGetHandleByIndex_v2(a.index, ctypes.byref(h))
    if rc != 0:
        out.write("# error nvmlDeviceGetHandleByIndex_v2 returned %d\n" % rc)
        return 1
    nv.nvmlDeviceGetMemoryInfo.argtypes = [ctypes.c_void_p, ctypes.POINTER(Memory)]
    procs_fn, struct, fn_name = None, None, None
    for name, st in (("nvmlDeviceGetComputeRunningProcesses_v3", ProcV2),
                     ("nvmlDeviceGetComputeRunningProcesses_v2", ProcV2),
                     ("nvmlDeviceGetComputeRunningProcesses", ProcV1)):
        try:
            f = getattr(nv, name)
        except AttributeError:
            continue
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
        f.restype = ctypes.c_int
        procs_fn, struct, fn_name = f, st, name
        break
    cap = 256
    buf = (struct * cap)() if struct else None
    name_buf = ctypes.create_string_buffer(96)
    try:
        nv.nvmlDeviceGetName.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
        nv.nvmlDeviceGetName(h, name_buf, 96)
    except AttributeError:
        pass
    m = Memory()
    nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
    out.write("# ready t=%.3f device=%d name=%s total=%d procs_fn=%s interval=%.3f\n" % (
        time.time(), a.index, name_buf.value.decode(errors="replace"), m.total,
        fn_name if procs_fn else "none", a.interval))
    out.write("t,dev_used,dev_total,procs\n")
    n = 0
    errors = 0
    nxt = time.time()
    while not STOP[0]:
        t = time.time()
        rc = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        used = str(m.used) if rc == 0 else "NA"
        procs = ""
        if procs_fn is not None:
            cnt = ctypes.c_uint(cap)
            rc2 = procs_fn(h, ctypes.byref(cnt), ctypes.cast(buf, ctypes.c_void_p))
            if rc2 == 0:
                procs = ";".join("%d:%s" % (buf[i].pid, "NA" if buf[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE
                                            else buf[i].usedGpuMemory) for i in range(cnt.value))
            else:
                errors += 1
                if errors <= 3:
                    out.write("# error %s returned %d\n" % (fn_name, rc2))
        out.write("%.3f,%s,%d,%s\n" % (t, used, m.total, procs))
        n += 1
        nxt += a.interval
        delay = nxt - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            nxt = time.time()
    out.write("# end t=%.3f samples=%d errors=%d\n" % (time.time(), n, errors))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
