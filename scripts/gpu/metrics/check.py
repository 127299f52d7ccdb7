"""Judges the metrics run (run.sh): prints a JSON verdict.

  check.py RUNDIR

For each job (NAME.ready: its pid and framework counters): gpuguard_live_bytes of its
pid on device 0 in the scrape after its report (scrape2.txt) against the report's
current_bytes and the framework's counter, and NVML's figure (nvidia-smi, which adds
the CUDA context). PyTorch: the whole of current_bytes is memory_reserved(). JAX:
its pool is the report's VMM allocations (by_kind["vmm"]), equal to memory_stats()
pool_bytes; XLA also makes a few small cuMemAlloc_v2 allocations outside the pool,
shown as `outside_pool_bytes`. A job passes when the exporter equals its report and
the report's pool equals the framework's counter; the first scrape (before the
report) is shown too.
"""
import glob
import json
import os
import re
import sys

d = sys.argv[1]


def scrape(path):
    vals = {}
    for m in re.finditer(r'^(gpuguard_[a-z_]+)\{([^}]*)\} (\S+)$', open(path).read(), re.M):
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        vals[(m.group(1), labels.get("pid"), labels.get("device"))] = float(m.group(3))
    return vals


s1, s2 = scrape(os.path.join(d, "scrape1.txt")), scrape(os.path.join(d, "scrape2.txt"))
smi = {}
for ln in open(os.path.join(d, "nvidia_smi.txt")):
    p = [x.strip() for x in ln.split(",")]
    if len(p) == 2 and p[1].isdigit():
        smi[p[0]] = int(p[1]) << 20
jobs, ok = {}, True
for ready in sorted(glob.glob(os.path.join(d, "*.ready"))):
    name = os.path.basename(ready)[: -len(".ready")]
    fw = json.load(open(ready))
    pid = str(fw["pid"])
    reps = sorted((json.load(open(p)) for p in glob.glob(os.path.join(d, name, "gpuguard.*.signal.json"))), key=lambda r: r["seq"])
    rep = next((x for x in reps[-1]["devices"] if x["device"] == 0), {}) if reps else {}
    if "reserved" in fw:
        counter, what = fw["reserved"], "torch.cuda.memory_reserved()"
        pool = rep.get("current_bytes")
    else:
        counter, what = (fw.get("stats") or {}).get("pool_bytes"), "memory_stats()['pool_bytes']"
        pool = (rep.get("by_kind") or {}).get("vmm")
    j = {
        "pid": pid,
        "exporter_live_bytes_before_report": s1.get(("gpuguard_live_bytes", pid, "0")),
        "exporter_live_bytes": s2.get(("gpuguard_live_bytes", pid, "0")),
        "exporter_in_use_bytes": s2.get(("gpuguard_framework_in_use_bytes", pid, "0")),
        "exporter_cached_bytes": s2.get(("gpuguard_framework_cached_bytes", pid, "0")),
        "report_current_bytes": rep.get("current_bytes"),
        "report_in_use_bytes": rep.get("in_use_bytes"),
        "report_pool_bytes": pool,
        "outside_pool_bytes": (rep.get("current_bytes") or 0) - (pool or 0),
        "framework_counter": counter,
        "framework_counter_is": what,
        "framework": fw,
        "nvidia_smi_bytes": smi.get(pid),
    }
    j["match"] = (j["exporter_live_bytes"] is not None and j["exporter_live_bytes"] == j["report_current_bytes"]
                  and pool is not None and pool == counter)
    ok = ok and j["match"]
    jobs[name] = j
print(json.dumps({"jobs": jobs, "pass": ok and len(jobs) == 4,
                  "exporter_stderr": open(os.path.join(d, "exporter_stderr.txt")).read()[-2000:]}, indent=1))
