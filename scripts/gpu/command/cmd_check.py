#!/usr/bin/env python3
"""Judges the `command` suite's run (scripts/gpu/suites/command.sh): one row per check
into the suite's summary.jsonl (group "command", workload "torch_train").

  python3 scripts/gpu/command/cmd_check.py --dir RUN_DIR [--summary FILE]

RUN_DIR holds: stdout.log / stderr.log / rc.txt of `gpuguard run`, pid.txt, ps.json
(+ ps.rc), show_leaks.json / show_leaks.txt (+ .rc), trim.out / trim.err / trim.rc,
reports/, trace.json, mem.svg (+ plot.rc), leaks.html (+ flamegraph.rc).
Standard library only. `--selftest` checks the SVG/JSON parsers on small inputs.
"""

import argparse
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402

GiB = 1 << 30
CAP = 20 * GiB
SVG_NS = "{http://www.w3.org/2000/svg}"


def rc_of(d, name):
    t = tl.read_text(os.path.join(d, name)).strip()
    try:
        return int(t)
    except ValueError:
        return None


def site_re(path, line):
    """file:line as the command prints a Python frame (the basename is enough)."""
    return re.compile(r"%s:%d\b" % (re.escape(os.path.basename(path)), int(line)))


def ps_entry(text, pid):
    """(status of pid or None, why) from `gpuguard ps --json`."""
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, "not JSON: %s" % e
    if not isinstance(data, list):
        return None, "not a list"
    for s in data:
        if isinstance(s, dict) and s.get("pid") == pid:
            return s, "pid %d listed among %d" % (pid, len(data))
    return None, "pid %d not among %s" % (pid, [s.get("pid") for s in data if isinstance(s, dict)])


def first_suspect(text, pid):
    """(sites[0] of pid's suspected leaks, seqs) from `gpuguard show --leaks --json`."""
    data = json.loads(text)
    for s in data.get("suspected_leaks") or []:
        if s.get("pid") == pid:
            sites = s.get("sites") or []
            return (sites[0] if sites else None), s.get("seqs") or []
    return None, []


def svg_facts(text):
    """{"devices": live-line devices, "cap": cap-line devices, "marks": [classes], "root": tag}."""
    root = ET.fromstring(text)
    live, cap, marks = set(), set(), []
    for el in root.iter():
        cls = (el.get("class") or "").split()
        if el.tag in (SVG_NS + "path", "path") and "live" in cls:
            live.add(el.get("data-device"))
        if el.tag in (SVG_NS + "path", "path") and "cap" in cls:
            cap.add(el.get("data-device"))
        if el.tag in (SVG_NS + "g", "g") and "mark" in cls:
            marks.append(" ".join(c for c in cls if c != "mark"))
    return {"root": root.tag, "devices": sorted(d for d in live if d is not None), "cap": sorted(
        d for d in cap if d is not None), "marks": marks}


def trim_released(text):
    """trim.released_bytes of a trim report (0 when absent)."""
    t = (json.loads(text) or {}).get("trim") or {}
    v = t.get("released_bytes")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)\b")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def printed_release(text):
    """The largest "SIZE released" / "released SIZE" in trim's output (0: none)."""
    best = 0
    size = r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)\b"
    for m in re.finditer(size + r"\s+released|released\s+" + size, text):
        n, u = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        best = max(best, int(float(n) * UNITS[u]))
    return best


def judge(d, summary):
    R = tl.Rows(summary, "command", "torch_train")
    recs = tl.read_records(os.path.join(d, "stdout.log"))
    rc = tl.read_rc(d)
    if rc == -1:
        R.skip("run", "skipped: time budget spent")
        return 0
    if not tl.started(R, d, recs, rc):
        return 1
    cfg = tl.first(recs, "config")
    file_, line = cfg.get("file"), cfg.get("line")
    R.info("workload", "%s, leak at %s:%s, %s, backend %s" % (cfg.get("workload"), os.path.basename(file_ or "?"),
                                                             line, cfg.get("torch"), cfg.get("backend")))
    if not line:
        R.check("leak_line", False, "no GGV_LEAK_LINE marker found in the workload")
        return 1
    where = site_re(file_, line)
    label = "%s:%s" % (os.path.basename(file_), line)
    summ = tl.first(recs, "summary")
    R.check("exit_status", rc == 0 and summ is not None,
            "gpuguard run exited %s (the workload's status passed through), summary record %s; %s"
            % (rc, "present" if summ else "MISSING", tl.read_text(os.path.join(d, "elapsed.txt")).strip() + " s"),
            rc=rc, summary=summ and {k: v for k, v in summ.items() if k != "record"})

    pid_t = tl.read_text(os.path.join(d, "pid.txt")).strip()
    pid = int(pid_t) if pid_t.isdigit() else None
    R.check("ready", pid is not None and pid == cfg.get("pid"),
            "GGV_CMD_READY seen, pid %s (config pid %s)" % (pid, cfg.get("pid")))
    if pid is None:
        pid = cfg.get("pid")

    # gpuguard ps --json, while it ran
    prc = rc_of(d, "ps.rc")
    ent, why = ps_entry(tl.read_text(os.path.join(d, "ps.json")), pid) if prc == 0 else (None, "rc %s: %s" % (
        prc, tl.read_text(os.path.join(d, "ps.err"))[:200]))
    devs = (ent or {}).get("devices") or []
    d0 = next((x for x in devs if x.get("device") == 0), None) or {}
    R.check("ps_lists_pid", ent is not None, why)
    R.check("ps_live", (d0.get("live_bytes") or 0) > 0, "device 0 live %s, peak %s, pools %s" % (
        tl.mib(d0.get("live_bytes")), tl.mib(d0.get("peak_bytes")), tl.mib(d0.get("pool_held_bytes"))),
        device=d0)
    R.check("ps_cap", d0.get("cap_bytes") == CAP, "device 0 cap_bytes %s (want %d = 20 GiB)" % (
        d0.get("cap_bytes"), CAP))

    # gpuguard show --leaks over the snapshots so far
    snaps = [s for s in tl.read_text(os.path.join(d, "snapshots_live.txt")).splitlines() if s.strip()]
    src = rc_of(d, "show_leaks_json.rc")
    site, seqs, frames = None, [], []
    if src == 0:
        try:
            site, seqs = first_suspect(tl.read_text(os.path.join(d, "show_leaks.json")), pid)
        except ValueError as e:
            R.check("show_leaks_json", False, "not JSON: %s" % e)
    frames = (site or {}).get("frames") or []
    hit = next((f for f in frames if where.search(f)), None)
    R.check("show_leaks_first", hit is not None,
            "%d snapshots (seqs %s); first suspect %s +%s: %s" % (
                len(snaps), seqs, (site or {}).get("python_framework") or "native",
                tl.mib((site or {}).get("change_bytes")), (hit or (frames[:1] or ["none"])[0])[:160]),
            rc=src, site=site, snapshots=len(snaps))
    txt = tl.read_text(os.path.join(d, "show_leaks.txt"))
    R.check("show_leaks_text", rc_of(d, "show_leaks.rc") == 0 and bool(where.search(txt)),
            "text view rc %s, names %s: %s" % (rc_of(d, "show_leaks.rc"), label, bool(where.search(txt))))

    # gpuguard trim PID
    trc = rc_of(d, "trim.rc")
    trims = sorted(glob.glob(os.path.join(d, "reports", "gpuguard.*.%d.*.trim.json" % pid)))
    released = 0
    for t in trims:
        try:
            released = max(released, trim_released(tl.read_text(t)))
        except ValueError:
            pass
    out = tl.read_text(os.path.join(d, "trim.out")) + tl.read_text(os.path.join(d, "trim.err"))
    shown = printed_release(out)
    R.check("trim_rc", trc == 0, "gpuguard trim %s: rc %s" % (pid, trc))
    R.check("trim_report", bool(trims), "%d trim report(s) of pid %s, released %s in the report" % (
        len(trims), pid, tl.mib(released)), reports=[os.path.basename(t) for t in trims])
    R.check("trim_released", shown > 0, "printed release %s (report %s): %s" % (
        tl.mib(shown), tl.mib(released), " | ".join(out.strip().splitlines()[:3])[:200]))

    # gpuguard run's own summary
    err = "\n".join(ln for ln in tl.read_text(os.path.join(d, "stderr.log")).splitlines()
                    if not re.match(r"gpuguard\[\d+\]", ln))
    R.check("run_summary_leak", bool(where.search(err)), "run's summary on stderr names %s: %s" % (
        label, bool(where.search(err))))

    # the trace and its plot
    try:
        tr = json.loads(tl.read_text(os.path.join(d, "trace.json")))
        ev = tr.get("traceEvents") if isinstance(tr, dict) else tr
        R.check("trace", isinstance(ev, list) and len(ev) > 0, "trace.json: %d events" % len(ev or []))
    except ValueError as e:
        R.check("trace", False, "trace.json is not JSON (%s)" % str(e)[:100])
    svg = tl.read_text(os.path.join(d, "mem.svg"))
    try:
        f = svg_facts(svg)
        R.check("plot_svg", rc_of(d, "plot.rc") == 0 and f["root"] in (SVG_NS + "svg", "svg"),
                "plot rc %s, %d bytes, root %s" % (rc_of(d, "plot.rc"), len(svg), f["root"]))
        R.check("plot_device_line", f["devices"] == ["0"], "live lines for devices %s" % f["devices"])
        R.check("plot_cap_line", "0" in f["cap"] and "20.0 GiB" in svg, "cap lines %s, '20.0 GiB' in the legend: %s"
                % (f["cap"], "20.0 GiB" in svg))
        R.info("plot_marks", "%d marks: %s" % (len(f["marks"]), sorted(set(f["marks"]))))
    except ET.ParseError as e:
        R.check("plot_svg", False, "plot rc %s, not XML: %s" % (rc_of(d, "plot.rc"), e))

    # the flame graph of the exit report
    html = tl.read_text(os.path.join(d, "leaks.html"))
    exitrep = tl.read_text(os.path.join(d, "exit_report.txt")).strip()
    R.check("flamegraph", rc_of(d, "flamegraph.rc") == 0 and "<html" in html.lower() and bool(where.search(html)),
            "of %s: rc %s, %d bytes, names %s: %s" % (os.path.basename(exitrep) or "no exit report",
                                                    rc_of(d, "flamegraph.rc"), len(html), label,
                                                    bool(where.search(html))))
    return 1 if "FAIL" in R.statuses() else 0


def selftest():
    svg = ('<svg xmlns="http://www.w3.org/2000/svg"><path class="live" data-device="0" d="M0 0"/>'
           '<path class="held" data-device="0" d="M0 0"/><path class="cap" data-device="0" d="M0 0"/>'
           '<g class="mark trim"><line/></g></svg>')
    f = svg_facts(svg)
    assert f["devices"] == ["0"] and f["cap"] == ["0"] and f["marks"] == ["trim"], f
    assert ps_entry('[{"pid": 5, "devices": []}]', 5)[0] == {"pid": 5, "devices": []}
    assert ps_entry('[{"pid": 6}]', 5)[0] is None and ps_entry("x", 5)[0] is None
    s, seqs = first_suspect('{"suspected_leaks": [{"pid": 5, "seqs": [1, 2], "sites": [{"frames": ["a.py:7"]}]}]}', 5)
    assert s == {"frames": ["a.py:7"]} and seqs == [1, 2]
    assert site_re("/x/a.py", 7).search("python: /x/a.py:7 in step") and not site_re("/x/a.py", 7).search("a.py:70")
    assert trim_released('{"trim": {"released_bytes": 5, "mechanisms": [{"released_bytes": 5}]}}') == 5
    assert trim_released('{"pid": 1}') == 0
    assert printed_release("trim: 1.5 GiB released\n  device 0: 3 GiB -> 1 GiB") == 3 * (1 << 29)
    assert printed_release("pytorch  released   513.0 MiB  empty_cache: 841.0 MiB -> 328.0 MiB") == 513 << 20
    assert printed_release("nothing here 4 MiB") == 0
    print("cmd_check selftest: ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir")
    ap.add_argument("--summary")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    return judge(a.dir, a.summary)


if __name__ == "__main__":
    sys.exit(main())
