"""Checks one leak_small*.py run's reports (see run.sh): prints a JSON verdict.

  check.py RUNDIR SCRIPT CLI

(a) the oldest live allocations of the first report carry Python frames; (b) the first
suspected leak of `CLI show --json` over all the run's reports names SCRIPT's
SMALL-LEAK-LINE; (c) no report contains "(code no longer alive)".
"""
import glob
import json
import os
import subprocess
import sys

d, script, cli = sys.argv[1], sys.argv[2], sys.argv[3]
paths = sorted(glob.glob(os.path.join(d, "gpuguard.*.json")))
reports = sorted((json.load(open(p)) for p in paths), key=lambda r: r["seq"])
line = next(i + 1 for i, l in enumerate(open(script)) if "# SMALL-LEAK-LINE" in l)
want = "%s:%d in train" % (os.path.basename(script), line)
shown = json.loads(subprocess.run([cli, "show", "--json"] + paths, capture_output=True, text=True).stdout)
sites = [s for p in shown.get("suspected_leaks", []) for s in p["sites"]]
first = sites[0] if sites else {}
where = next((i for i, s in enumerate(sites) if any(want in f for f in s["frames"][:3])), None)
early = []
for r in reports[:1]:
    by_id = {s["id"]: s for s in r["sites"]}
    for a in sorted(r["live"], key=lambda a: a["age_s"], reverse=True)[:5]:
        s = by_id.get(a["site"])
        early.append(any(f.startswith("python: ") for f in (s or {}).get("frames", [])))
print(
    json.dumps(
        {
            "reports": len(reports),
            "a_first_allocations_have_python_frames": early,
            "b_first_suspect_is_the_line": where == 0,
            "b_line_rank": where,
            "b_first_suspect": {k: first.get(k) for k in ("python_framework", "change_bytes", "rose", "intervals")}
            | {"frames": first.get("frames", [])[:3]},
            "c_no_dead_code_frames": not any("no longer alive" in json.dumps(r) for r in reports),
        },
        indent=1,
    )
)
