"""Judges one oom run (run.sh): prints a JSON verdict.

  check.py RUNDIR SCRIPT

(a) an `oom` report exists and its refused call's Python line is SCRIPT's OOM-LINE;
(b) it splits this process's memory into in use and cached (PyTorch, CuPy, JAX);
(c) the hog (RUNDIR/hog) is among `others`, with NVML's figure, guarded, its program
named; (d) stderr has gpuguard's `out of memory on device` line; (e) no stderr line
the bare twin lacks but gpuguard's. Also shows the line, the suggestion and the
framework's own figures (the script's JSON line) beside the report's.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ggv  # noqa: E402  (scripts/gpu/lib/ggv.py)

d, script = sys.argv[1], sys.argv[2]
line = next(i + 1 for i, l in enumerate(open(script)) if "# OOM-LINE" in l)
want = "%s:%d" % (os.path.basename(script), line)
reps = sorted((json.load(open(p)) for p in glob.glob(os.path.join(d, "gpuguard.*.oom.json"))), key=lambda r: r["seq"])
hogs = [json.load(open(p)) for p in glob.glob(os.path.join(d, "hog", "gpuguard.*.json"))]
hog_pid = hogs[0]["pid"] if hogs else None
oom = reps[0]["oom"] if reps else {}
stderr = open(os.path.join(d, "stderr.txt"), errors="replace").read().splitlines()
bare = open(os.path.join(d, "bare_stderr.txt"), errors="replace").read().splitlines()
lines = [l for l in stderr if "out of memory on device" in l and l.startswith("gpuguard[")]
hog = next((o for o in oom.get("others", []) if o.get("pid") == hog_pid), None)
try:
    fw = json.loads(open(os.path.join(d, "stdout.txt")).read().strip().splitlines()[-1])
except (ValueError, IndexError):
    fw = None
verdict = {
    "oom_reports": len(reps),
    "refusals": oom.get("refusals"),
    "a_names_the_line": want in (oom.get("python_line") or ""),
    "python_line": oom.get("python_line"),
    "refused": {"api": oom.get("api"), "bytes": oom.get("bytes"), "live_bytes": oom.get("live_bytes"),
                "held_bytes": oom.get("held_bytes"), "total_bytes": oom.get("total_bytes")},
    "b_split": oom.get("in_use_bytes") is not None and oom.get("cached_bytes") is not None,
    "split": {"in_use": oom.get("in_use_bytes"), "cached": oom.get("cached_bytes"),
              "frameworks": oom.get("frameworks"), "at_writing": oom.get("at_writing")},
    "c_hog_named": bool(hog and hog.get("nvml_used_bytes") and hog.get("guarded") and hog.get("program")),
    "hog": hog,
    "others_source": oom.get("others_source"),
    "suggestion": oom.get("suggestion"),
    "d_stderr_line": len(lines) >= 1,
    "line": lines[0] if lines else None,
    "e_foreign_lines": ggv.foreign_stderr(stderr, bare),
    "framework": fw,
}
verdict["e_no_foreign_stderr"] = not verdict["e_foreign_lines"]
verdict["pass"] = all(verdict[k] for k in ("a_names_the_line", "b_split", "c_hog_named", "d_stderr_line", "e_no_foreign_stderr"))
print(json.dumps(verdict, indent=1))
