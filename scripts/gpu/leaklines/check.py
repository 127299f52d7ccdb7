"""Checks one leak_small*.py run's reports (see run.sh): prints a JSON verdict.

  check.py RUNDIR SCRIPT CLI

(a) the oldest live allocations of the first report carry Python frames; (b) the first
suspected leak of `CLI show --json` over all the run's reports names SCRIPT's
SMALL-LEAK-LINE; (c) no report contains "(code no longer alive)"; (d) that suspect's
figure in the last report before exit is within 30% of what the kept objects held then
by the framework's own counter (the script's `kept <unix ms> <bytes>` lines); (e) the
run's stderr has no line that is not gpuguard's and that its bare twin
(RUNDIR/bare_stderr.txt, the same script without gpuguard) did not print.
"""
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import ggv  # noqa: E402  (scripts/gpu/lib/ggv.py)

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
# (d) The first suspect's figure in the last report before exit, against the kept
# objects' bytes by the framework's counter at the last line printed before it.
kept = [(int(t), int(b)) for t, b in re.findall(r"^kept (\d+) (\d+)$", open(os.path.join(d, "stdout.txt")).read(), re.M)]
before_exit = [r for r in reports if r.get("reason") != "exit"]
figure = truth = None
if first and before_exit and kept:
    last = before_exit[-1]
    fw, head = first.get("python_framework"), (first.get("frames") or [None])[0]
    pool = last.get("python_sites", []) if fw else last.get("sites", [])
    for site in pool:
        if (not fw or site.get("framework") == fw) and site.get("frames") and head and site["frames"][0].endswith(head.split("python: ")[-1]):
            figure = (figure or 0) + site.get("live_bytes", 0)
    at = [b for t, b in kept if t <= last.get("time_unix_ms", 0)]
    truth = at[-1] if at else None
within = figure is not None and bool(truth) and abs(figure / truth - 1) < 0.3
# (e) stderr lines a bare run lacks.
bare_path = os.path.join(d, "bare_stderr.txt")
foreign = None
if os.path.exists(bare_path):
    foreign = ggv.foreign_stderr(
        open(os.path.join(d, "stderr.txt"), errors="replace").read().splitlines(),
        open(bare_path, errors="replace").read().splitlines(),
    )
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
            "d_figure_within_30pct": within,
            "d_figure_bytes": figure,
            "d_kept_bytes_by_framework": truth,
            "e_no_foreign_stderr": foreign == [] if foreign is not None else None,
            "e_foreign_lines": (foreign or [])[:5],
        },
        indent=1,
    )
)
