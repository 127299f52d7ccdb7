#!/usr/bin/env python3
"""Shared helpers for the gpuguard cap workloads (scripts/gpu/caps/*_caps.py).

Reuses scripts/gpu/lib/ggv.py (Guard: the C API through ctypes; report files).
Standard library only (ctypes), so it also runs in a bare python3.

Output protocol on stdout (parsed by caps_check.py; one line each):
  PASS <check>: <text>      a check that held
  FAIL <check>: <text>      a check that did not
  INFO <check>: <text>      a measurement, not judged
  GGV_JSON {...}            structured data for a check ({"check": ..., ...})
  GGV_BASELINE pid=N t=T hold=H
        printed after CUDA init, before the first allocation; the workload then
        sleeps H seconds so the outside monitor samples the context's baseline
  GGV_MARK name=X pid=N t=T hold=H current=C charged=U
        a steady point (the workload sleeps H seconds after it): C is gpuguard's
        current_bytes (C API), U what gpuguard charges against the cap (in-process
        NVML "used", which gpuguard answers with its charge; C when NVML is
        unavailable)
  RESULT <workload> PASS|FAIL (...)
        the last line; the exit status is 0 on PASS, 1 on FAIL

Environment: GGV_CAP_BYTES (the cap the run set with GPUGUARD_CAP, in bytes;
default 4 GiB), GPUGUARD_DIR (where gpuguard writes its reports).

Run directly (no LD_PRELOAD) it prints the real device size the way gpuguard
resolves a fractional cap (cuDeviceTotalMem_v2):  python3 caps_common.py real-total
"""

import ctypes
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))

import ggv  # noqa: E402  (scripts/gpu/lib/ggv.py: Guard, the C API; report files)

MiB = 1 << 20
GiB = 1 << 30
CAP = int(os.environ.get("GGV_CAP_BYTES", str(4 * GiB)))
CUDA_ERROR_OUT_OF_MEMORY = 2
# Rounding a framework may add to a request (expandable segments map 20 MiB pages,
# stream-ordered pools grow in chunks): a refusal is "at the cap" when the headroom
# left was below the request plus this.
ROUNDING_SLACK = int(os.environ.get("GGV_ROUNDING_SLACK", str(64 * MiB)))


def mib(n):
    return "-" if n is None else "%.1f MiB" % (n / MiB)


def emit_json(obj):
    print("GGV_JSON " + json.dumps(obj, sort_keys=False, default=str), flush=True)


# ---- NVML inside the process (through the shim's dlsym hook) -------------------

class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlMemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


NVML_MEMORY_V2 = ctypes.sizeof(NvmlMemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)


def cuda_uuid(device=0):
    """CUDA device's UUID in NVML's text form (GPU-8-4-4-4-12), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cuDeviceGetUuid_v2
    except (OSError, AttributeError):
        return None
    buf = (ctypes.c_ubyte * 16)()
    f.argtypes = [ctypes.c_void_p, ctypes.c_int]
    f.restype = ctypes.c_int
    if f(ctypes.cast(buf, ctypes.c_void_p), device) != 0:
        return None
    h = "".join("%02x" % b for b in buf)
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


class Nvml:
    """nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetMemoryInfo and _v2, for
    the NVML device whose UUID is CUDA device 0's (NVML and CUDA may number devices
    differently); index 0 when the UUID cannot be read."""

    def __init__(self, index=0):
        self.error = None
        self.note = ""
        self.handle = ctypes.c_void_p()
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            self.lib, self.error = None, "cannot load libnvidia-ml.so.1: %s" % e
            return
        init = self.lib.nvmlInit_v2
        init.restype = ctypes.c_int
        rc = init()
        if rc != 0:
            self.error = "nvmlInit_v2 returned %d" % rc
            return
        get = self.lib.nvmlDeviceGetHandleByIndex_v2
        get.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        get.restype = ctypes.c_int
        want = cuda_uuid(0)
        if want:
            self.note = "NVML device of CUDA device 0's UUID %s not found; index %d" % (want, index)
            try:
                cnt = ctypes.c_uint(0)
                self.lib.nvmlDeviceGetCount_v2.argtypes = [ctypes.POINTER(ctypes.c_uint)]
                self.lib.nvmlDeviceGetUUID.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
                if self.lib.nvmlDeviceGetCount_v2(ctypes.byref(cnt)) == 0:
                    for i in range(cnt.value):
                        h = ctypes.c_void_p()
                        ub = ctypes.create_string_buffer(96)
                        if get(i, ctypes.byref(h)) == 0 and self.lib.nvmlDeviceGetUUID(h, ub, 96) == 0 \
                                and ub.value.decode(errors="replace").lower() == want.lower():
                            index = i
                            self.note = "NVML index %d = CUDA device 0 (UUID %s)" % (i, want)
                            break
            except AttributeError:
                pass
        rc = get(index, ctypes.byref(self.handle))
        if rc != 0:
            self.error = "nvmlDeviceGetHandleByIndex_v2(%d) returned %d" % (index, rc)
            return
        self.v1 = self.lib.nvmlDeviceGetMemoryInfo
        self.v1.argtypes = [ctypes.c_void_p, ctypes.POINTER(NvmlMemory)]
        self.v1.restype = ctypes.c_int
        try:
            self.v2 = self.lib.nvmlDeviceGetMemoryInfo_v2
            self.v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(NvmlMemoryV2)]
            self.v2.restype = ctypes.c_int
        except AttributeError:
            self.v2 = None

    @property
    def ok(self):
        return self.error is None

    def memory(self):
        """{'v1': {...} or {'rc': n}, 'v2': ...}"""
        out = {}
        if not self.ok:
            return {"error": self.error}
        m = NvmlMemory()
        rc = self.v1(self.handle, ctypes.byref(m))
        out["v1"] = {"total": m.total, "free": m.free, "used": m.used} if rc == 0 else {"rc": rc}
        if self.v2 is not None:
            m2 = NvmlMemoryV2()
            m2.version = NVML_MEMORY_V2
            rc = self.v2(self.handle, ctypes.byref(m2))
            out["v2"] = ({"total": m2.total, "reserved": m2.reserved, "free": m2.free, "used": m2.used}
                         if rc == 0 else {"rc": rc})
        else:
            out["v2"] = {"rc": "symbol nvmlDeviceGetMemoryInfo_v2 not found"}
        return out

    def used(self):
        mem = self.memory()
        v1 = mem.get("v1") or {}
        return v1.get("used")


# ---- the CUDA driver through ctypes (dlsym on a libcuda handle: the shim's path 2) --

class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class MemAllocationProp(ctypes.Structure):  # CUmemAllocationProp, 32 bytes
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


_u64p = ctypes.POINTER(ctypes.c_uint64)
_szp = ctypes.POINTER(ctypes.c_size_t)
_vpp = ctypes.POINTER(ctypes.c_void_p)
DRIVER_SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuDeviceTotalMem_v2": [_szp, ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_vpp, ctypes.c_int],
    "cuCtxSetCurrent": [ctypes.c_void_p],
    "cuCtxPushCurrent_v2": [ctypes.c_void_p],
    "cuCtxPopCurrent_v2": [_vpp],
    "cuMemGetInfo_v2": [_szp, _szp],
    "cuMemAlloc_v2": [_u64p, ctypes.c_size_t],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemAllocPitch_v2": [_u64p, _szp, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint],
    "cuMemAllocManaged": [_u64p, ctypes.c_size_t, ctypes.c_uint],
    "cuMemAllocAsync": [_u64p, ctypes.c_size_t, ctypes.c_void_p],
    "cuMemFreeAsync": [ctypes.c_uint64, ctypes.c_void_p],
    "cuStreamSynchronize": [ctypes.c_void_p],
    "cuMemCreate": [_u64p, ctypes.c_size_t, ctypes.POINTER(MemAllocationProp), ctypes.c_ulonglong],
    "cuMemRelease": [ctypes.c_uint64],
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver:
    def __init__(self):
        self.error = None
        self.fns = {}
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            self.lib, self.error = None, "cannot load libcuda.so.1: %s" % e
            return
        for name, args in DRIVER_SIGNATURES.items():
            try:
                f = getattr(self.lib, name)
            except AttributeError:
                continue
            f.argtypes = args
            f.restype = ctypes.c_int
            self.fns[name] = f
        rc = self.call("cuInit", 0)
        if rc != 0:
            self.error = "cuInit returned %s" % self.err(rc)
        self._ctx = None

    @property
    def ok(self):
        return self.error is None

    def call(self, name, *args):
        f = self.fns.get(name)
        if f is None:
            return -1
        return f(*args)

    def err(self, rc):
        if rc == -1:
            return "-1 (symbol not found)"
        s = ctypes.c_char_p()
        if self.call("cuGetErrorName", rc, ctypes.byref(s)) == 0 and s.value:
            return "%d %s" % (rc, s.value.decode())
        return str(rc)

    def total_mem(self, dev=0):
        b = ctypes.c_size_t(0)
        rc = self.call("cuDeviceTotalMem_v2", ctypes.byref(b), dev)
        return rc, b.value

    def primary_ctx(self, dev=0):
        if self._ctx is None:
            d = ctypes.c_int(0)
            rc = self.call("cuDeviceGet", ctypes.byref(d), dev)
            if rc != 0:
                return rc, None
            ctx = ctypes.c_void_p()
            rc = self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d.value)
            if rc != 0:
                return rc, None
            self._ctx = ctx  # retained for the life of the process, never released
        return 0, self._ctx

    def mem_get_info(self):
        """cuMemGetInfo_v2 in device 0's primary context (pushed, then popped)."""
        rc, ctx = self.primary_ctx()
        if rc != 0:
            return rc, None, None
        rc = self.call("cuCtxPushCurrent_v2", ctx)
        if rc != 0:
            return rc, None, None
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        rc = self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        old = ctypes.c_void_p()
        self.call("cuCtxPopCurrent_v2", ctypes.byref(old))
        return rc, free.value, total.value


# ---- cap reports -------------------------------------------------------------------

REPORT_RE = ggv.REPORT_RE
reports_of = ggv.reports_of
load = ggv.load
dev_entry = ggv.dev_entry


def denial_text(rep, frames=4):
    d = (rep or {}).get("denial")
    if not isinstance(d, dict):
        return "no denial object"
    fr = d.get("frames") or []
    return "denial: device %s, %s (%s) refused with %s charged of cap %s; frames: %s" % (
        d.get("device"), mib(d.get("bytes")), d.get("api"), mib(d.get("charged_bytes")), mib(d.get("cap_bytes")),
        " <- ".join(str(f) for f in fr[:frames]) or "(none)")


def validate_cap_report(rep, cap):
    """Problems with a cap report ([] when it is as specified)."""
    probs = []
    if not isinstance(rep, dict):
        return ["unreadable"]
    if rep.get("reason") != "cap":
        probs.append("reason %r" % rep.get("reason"))
    d = rep.get("denial")
    if not isinstance(d, dict):
        probs.append("no denial object")
    else:
        for k in ("device", "bytes", "api", "charged_bytes", "cap_bytes", "frames"):
            if k not in d:
                probs.append("denial.%s missing" % k)
        if d.get("device") != 0:
            probs.append("denial.device %r" % d.get("device"))
        if d.get("cap_bytes") != cap:
            probs.append("denial.cap_bytes %r != %d" % (d.get("cap_bytes"), cap))
        b, c = d.get("bytes"), d.get("charged_bytes")
        if isinstance(b, int) and isinstance(c, int) and b + c <= (d.get("cap_bytes") or cap):
            probs.append("refusal not justified: bytes + charged_bytes = %d <= cap" % (b + c))
        if not d.get("api"):
            probs.append("denial.api empty")
    e = dev_entry(rep, 0)
    if e is None:
        probs.append("no devices[] entry for device 0")
    else:
        if e.get("cap_bytes") != cap:
            probs.append("devices[0].cap_bytes %r" % e.get("cap_bytes"))
        if not e.get("denied"):
            probs.append("devices[0].denied %r" % e.get("denied"))
        if "pool_reserved_bytes" not in e:
            probs.append("devices[0].pool_reserved_bytes missing")
    return probs


# ---- the checks a workload prints -----------------------------------------------

class Checks:
    def __init__(self, workload):
        self.workload = workload
        self.fails = []
        self.passes = 0
        self.guard = ggv.Guard()
        self.nvml = None  # opened after CUDA is in use (gpuguard virtualizes NVML only then)
        self.pid = os.getpid()
        print("INFO start: workload %s pid %d cap %d bytes (%s) gpuguard C API %s (version %s)" % (
            workload, self.pid, CAP, mib(CAP), "present" if self.guard.present else "ABSENT",
            self.guard.version), flush=True)
        self.ok("gpuguard_loaded", self.guard.present, "the gpuguard C API is reachable through ctypes.CDLL(None)")

    def ok(self, name, cond, text, **data):
        tag = "PASS" if cond else "FAIL"
        if cond:
            self.passes += 1
        else:
            self.fails.append(name)
        print("%s %s: %s" % (tag, name, text), flush=True)
        if data:
            emit_json(dict(check=name, status=tag, **data))
        return bool(cond)

    def info(self, name, text, **data):
        print("INFO %s: %s" % (name, text), flush=True)
        if data:
            emit_json(dict(check=name, status="INFO", **data))

    def counters(self):
        c = self.guard.counters(0)
        return c if c and "error" not in c else {}

    def charged(self):
        """What gpuguard charges against the cap: NVML 'used' inside the process."""
        if self.nvml is not None and self.nvml.ok:
            u = self.nvml.used()
            if u is not None:
                return u
        return self.counters().get("current_bytes")

    # -- markers for the outside monitor --
    def baseline(self, hold=0.6):
        print("GGV_BASELINE pid=%d t=%.3f hold=%.2f" % (self.pid, time.time(), hold), flush=True)
        time.sleep(hold)

    def mark(self, name, hold=0.6):
        c = self.counters()
        print("GGV_MARK name=%s pid=%d t=%.3f hold=%.2f current=%s charged=%s" % (
            name, self.pid, time.time(), hold, c.get("current_bytes"), self.charged()), flush=True)
        time.sleep(hold)

    # -- shared checks --
    def check_driver_view(self, drv, label):
        """cuDeviceTotalMem_v2 == cap; cuMemGetInfo_v2: total == cap, free <= cap - charged."""
        if not drv.ok:
            self.ok(label, False, "ctypes driver unavailable: %s" % drv.error)
            return
        rc, total = drv.total_mem(0)
        self.ok(label + "_cuDeviceTotalMem", rc == 0 and total == CAP,
                "cuDeviceTotalMem_v2 (dlsym path) answered %s (rc %s), cap %s" % (mib(total), drv.err(rc), mib(CAP)),
                total=total, rc=rc)
        rc, free, tot = drv.mem_get_info()
        charged = self.charged() or 0
        good = rc == 0 and tot == CAP and free is not None and free <= CAP and free <= CAP - charged + 2 * MiB
        self.ok(label + "_cuMemGetInfo", good,
                "cuMemGetInfo_v2 (dlsym path): free %s total %s (rc %s); cap %s, gpuguard charged %s" % (
                    mib(free), mib(tot), drv.err(rc), mib(CAP), mib(charged)),
                free=free, total=tot, rc=rc, charged=charged)

    def open_nvml(self):
        if self.nvml is None:
            self.nvml = Nvml(0)
        return self.nvml

    def check_nvml(self, label="nvml_inprocess", expect_used=None):
        """NVML inside the process: total == cap for v1 and v2; used == gpuguard's charge
        (compared with current_bytes, or expect_used when given, within 2 MiB; a pool's
        holdings can put the charge above current_bytes, so used >= current - 2 MiB)."""
        n = self.open_nvml()
        if not n.ok:
            self.ok(label, False, "NVML unavailable in the process: %s" % n.error)
            return None
        mem = n.memory()
        cur = self.counters().get("current_bytes")
        probs = []
        for v in ("v1", "v2"):
            m = mem.get(v) or {}
            if "total" not in m:
                probs.append("%s rc %s" % (v, m.get("rc")))
                continue
            if m["total"] != CAP:
                probs.append("%s total %d != cap" % (v, m["total"]))
            if m["used"] > CAP:
                probs.append("%s used above the cap" % v)
            if expect_used is not None and abs(m["used"] - expect_used) > 2 * MiB:
                probs.append("%s used %s != expected %s" % (v, mib(m["used"]), mib(expect_used)))
            if cur is not None and m["used"] + 2 * MiB < min(cur, CAP):
                probs.append("%s used %s below gpuguard current %s" % (v, mib(m["used"]), mib(cur)))
            if m["free"] > CAP - m["used"]:
                probs.append("%s free %s > cap - used" % (v, mib(m["free"])))
        v1, v2 = mem.get("v1") or {}, mem.get("v2") or {}
        self.ok(label, not probs,
                "nvmlDeviceGetMemoryInfo total %s used %s free %s; _v2 total %s used %s free %s; "
                "gpuguard current %s [%s]%s" % (
                    mib(v1.get("total")), mib(v1.get("used")), mib(v1.get("free")),
                    mib(v2.get("total")), mib(v2.get("used")), mib(v2.get("free")), mib(cur), n.note,
                    ("; problems: " + "; ".join(probs)) if probs else ""),
                nvml=mem, gpuguard_current=cur)
        return mem

    def check_capi(self, label="capi_counters", min_denied=1):
        c = self.counters()
        good = (c.get("cap_bytes") == CAP and (c.get("denied") or 0) >= min_denied
                and (c.get("current_bytes") or 0) <= CAP and (c.get("peak_bytes") or 0) <= CAP)
        self.ok(label, good, "gpuguard_device_counters: cap_bytes %s denied %s current %s peak %s failed %s "
                "(want cap_bytes == cap, denied >= %d, current and peak <= cap)" % (
                    c.get("cap_bytes"), c.get("denied"), mib(c.get("current_bytes")), mib(c.get("peak_bytes")),
                    c.get("failed"), min_denied), counters=c)
        return c

    def check_cap_report(self, label="cap_report", wait_s=5.0):
        """The cap report of this process: written at the first refusal."""
        t0 = time.time()
        found = []
        while time.time() - t0 < wait_s:
            found = reports_of(self.pid, "cap")
            if found:
                rep = load(found[0][1])
                if rep is not None:
                    break
            time.sleep(0.05)
        if not found:
            self.ok(label, False, "no gpuguard.*.%d.*.cap.json in %s within %.0f s of the refusal" % (
                self.pid, os.environ.get("GPUGUARD_DIR"), wait_s))
            return None
        rep = load(found[0][1])
        probs = validate_cap_report(rep, CAP)
        e = dev_entry(rep, 0) or {}
        self.ok(label, not probs, "%s (%d so far, after %.2f s): %s; devices[0] denied %s pool_reserved %s%s" % (
            os.path.basename(found[0][1]), len(found), time.time() - t0, denial_text(rep), e.get("denied"),
            mib(e.get("pool_reserved_bytes")), ("; problems: " + "; ".join(probs)) if probs else ""),
            report=found[0][1], denial=(rep or {}).get("denial"),
            device0={k: e.get(k) for k in ("cap_bytes", "current_bytes", "peak_bytes", "denied", "failed",
                                           "pool_reserved_bytes")})
        return rep

    def report_now(self, label):
        """A 'request' report through the C API; INFO with its device-0 cap fields."""
        r = self.guard.write_report("request")
        if r is None:
            self.info(label, "no C API")
            return None
        rc, path = r
        rep = load(path) if rc == 0 and path else None
        e = dev_entry(rep, 0) or {}
        self.info(label, "request report %s (rc %d): devices[0] cap_bytes %s current %s pool_reserved_bytes %s "
                  "denied %s by_kind %s" % (os.path.basename(path or "-"), rc, e.get("cap_bytes"),
                                            mib(e.get("current_bytes")), mib(e.get("pool_reserved_bytes")),
                                            e.get("denied"), e.get("by_kind")),
                  device0={k: e.get(k) for k in ("cap_bytes", "current_bytes", "peak_bytes", "denied",
                                                 "pool_reserved_bytes", "by_kind")}, report=path)
        return rep

    def finish(self):
        if self.fails:
            print("RESULT %s FAIL (%d passed, failed: %s)" % (self.workload, self.passes, ", ".join(self.fails)),
                  flush=True)
            return 1
        print("RESULT %s PASS (%d checks)" % (self.workload, self.passes), flush=True)
        return 0

    def run(self, body):
        """Runs body(self); an unexpected exception is a FAIL line, not a crash."""
        try:
            body(self)
        except Exception as e:  # noqa: BLE001
            self.ok("unexpected_exception", False, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:400]
                                                                if str(e) else ""))
            traceback.print_exc()
        return self.finish()


def refusal_at_cap(headroom, request):
    """A refusal is at the cap when what was left could not hold the request (plus
    the rounding a framework may add)."""
    return headroom is not None and headroom < request + ROUNDING_SLACK


def main(argv):
    if len(argv) > 1 and argv[1] == "real-total":
        if os.environ.get("LD_PRELOAD"):
            print("run without LD_PRELOAD", file=sys.stderr)
            return 2
        d = Driver()
        if not d.ok:
            print(d.error, file=sys.stderr)
            return 1
        rc, total = d.total_mem(0)
        if rc != 0:
            print("cuDeviceTotalMem_v2: %s" % d.err(rc), file=sys.stderr)
            return 1
        print(total)
        return 0
    print(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
