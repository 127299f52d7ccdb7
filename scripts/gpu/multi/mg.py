"""Helpers of the two-GPU workloads (scripts/gpu/multi/*.py): NVML and the driver's
UUIDs through ctypes, GPUGUARD_CAP's per-device form, the GGV_JSON protocol (ggv.py).

Standard library only. A workload imports it with
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); import mg
"""

import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv  # noqa: E402

MiB = ggv.MiB
GiB = ggv.GiB
emit = ggv.emit
note = ggv.note

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB,
          "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("not a size: %r" % text)
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def caps_of(spec=None):
    """{device ordinal: bytes} of the per-device sizes in GPUGUARD_CAP (0:4GiB,1:8GiB);
    fractions and a bare default are left out (the workloads use sizes only)."""
    spec = os.environ.get("GPUGUARD_CAP", "") if spec is None else spec
    out = {}
    for part in spec.split(","):
        if ":" in part:
            d, v = part.split(":", 1)
            if "." not in v or re.search(r"[A-Za-z]", v):
                out[int(d)] = parse_size(v)
    return out


def uuid_text(raw):
    h = "".join("%02x" % b for b in raw)
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


class Driver:
    """The driver's own view (cuDeviceGetUuid_v2 per ordinal, cuDeviceTotalMem)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        rc = self.lib.cuInit(0)
        if rc != 0:
            raise RuntimeError("cuInit: %d" % rc)

    def count(self):
        n = ctypes.c_int(0)
        self.lib.cuDeviceGetCount(ctypes.byref(n))
        return n.value

    def uuid(self, ordinal):
        buf = (ctypes.c_ubyte * 16)()
        f = getattr(self.lib, "cuDeviceGetUuid_v2", None) or self.lib.cuDeviceGetUuid
        rc = f(buf, ctypes.c_int(ordinal))
        return uuid_text(bytes(buf)) if rc == 0 else None

    def total(self, ordinal):
        b = ctypes.c_size_t(0)
        rc = self.lib.cuDeviceTotalMem_v2(ctypes.byref(b), ctypes.c_int(ordinal))
        return b.value if rc == 0 else None


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_devices():
    """[{index, uuid, total, free, used, rc}] of every NVML device, as this process's
    NVML answers (under the shim: capped devices show their cap). [] without NVML."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        note("no NVML: %s" % e)
        return []
    if lib.nvmlInit_v2() != 0:
        return []
    out = []
    try:
        n = ctypes.c_uint(0)
        lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
        for i in range(n.value):
            h = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h)) != 0:
                continue
            buf = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetUUID(h, buf, ctypes.c_uint(96))
            m = NvmlMemory()
            rc = lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
            out.append({"index": i, "uuid": buf.value.decode(errors="replace"), "rc": rc,
                        "total": m.total, "free": m.free, "used": m.used})
    finally:
        lib.nvmlShutdown()
    return out


def views(torch=None):
    """GGV_JSON records of what this process sees: `dev` per CUDA ordinal (driver UUID,
    cuDeviceTotalMem, torch.cuda.mem_get_info when torch is given) and `nvml` per NVML
    device."""
    drv = Driver()
    n = drv.count()
    for d in range(n):
        rec = {"ordinal": d, "uuid": drv.uuid(d), "total_mem": drv.total(d)}
        if torch is not None:
            free, total = torch.cuda.mem_get_info(d)
            rec.update(torch_free=free, torch_total=total)
        emit("dev", **rec)
    for e in nvml_devices():
        emit("nvml", **e)
    return n


def report(guard, reason):
    """Asks the shim for a report now: (rc, path), or (None, None) without it."""
    got = guard.write_report(reason)
    return got if got else (None, None)
