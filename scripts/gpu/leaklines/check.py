"""Checks one leak_small.py run's reports (see run.sh): prints a JSON verdict."""
import glob
import json
import os
import sys

d = sys.argv[1]
reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "gpuguard.*.json")))]
reports.sort(key=lambda r: r["seq"])
show = open(os.path.join(d, "show.txt")).read()
line = next(i + 1 for i, l in enumerate(open("scripts/gpu/leaklines/leak_small.py")) if "SMALL-LEAK-LINE" in l)
want = "leak_small.py:%d in train" % line
section = show[show.find("suspected leaks in"):]
first = section.split("    rose in ")[1] if "    rose in " in section else ""
early = []
for r in reports[:1]:
    sites = {s["id"]: s for s in r["sites"]}
    for a in sorted(r["live"], key=lambda a: a["age_s"], reverse=True)[:5]:
        s = sites.get(a["site"])
        early.append(any(f.startswith("python: ") for f in (s or {}).get("frames", [])))
print(
    json.dumps(
        {
            "reports": len(reports),
            "a_first_allocations_have_python_frames": early,
            "b_first_suspect_is_the_line": want in first,
            "b_first_suspect": first.splitlines()[:14],
            "c_no_dead_code_frames": not any("no longer alive" in json.dumps(r) for r in reports),
            "segments_threads": sorted({a["thread"] for r in reports[-1:] for a in r["live"]}),
        },
        indent=1,
    )
)
