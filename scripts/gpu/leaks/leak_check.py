#!/usr/bin/env python3
"""Judges the leak-report runs (issue 6) of scripts/gpu/validate_trim_leaks.sh.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

A RUNDIR holds stdout.log (GGV_LEAK_SITE and GGV_JSON lines of
scripts/gpu/leaks/leak_*.py), stderr.log, rc.txt (-1 = skipped for time) and
reports/ (GPUGUARD_DIR). The checker runs the gpuguard CLI itself
(`gpuguard diff <signal 1> <signal 2>`, `gpuguard show <exit>`, and `show` of the
whole series), saving diff.txt / show.txt / show_series.txt in RUNDIR.

  leak_check.py torch --mode default|expandable|cudaMallocAsync --dir D --cli CLI --summary S
  leak_check.py cupy  --dir D --cli CLI --summary S
  leak_check.py jax   --dir D --cli CLI --summary S

PyTorch default/expandable (judged): exit 0; 2 signal reports + an exit report;
classification pytorch "classified"; exit report python_sites[0].frames[0] names
leak_torch.py:<GGV_LEAK_LINE>; devices[0].in_use_bytes and cached_bytes present,
in_use_bytes >= the leaked bytes; the first site `gpuguard diff` lists names the
line; `gpuguard show` renders the exit report. The top site's live bytes >= the
leaked bytes is a WARN when short (blocks allocated before PyTorch's recorder was
turned on carry no Python stack). cudaMallocAsync: the same, recorded as INFO
(PyTorch's recorder does not support that backend). CuPy: python_sites[0] names
leak_cupy.py:<line> (in its first frames), in_use/cached present; diff recorded.
JAX: recorded only. Standard library only.
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "trim"))
import tl_common as tl  # noqa: E402

MiB = tl.MiB
mib = tl.mib
SITE_START = re.compile(r"^\s*\+\s*\d")


def leak_site(run_dir, script):
    """(basename, line) of the leaking line: the workload's GGV_LEAK_SITE line, else
    the marker in the script."""
    m = re.search(r"GGV_LEAK_SITE file=(\S+) line=(\d+)", tl.read_text(os.path.join(run_dir, "stdout.log")))
    if m:
        return os.path.basename(m.group(1)), int(m.group(2))
    marker = "# GGV_" + "LEAK_LINE"
    for i, ln in enumerate(tl.read_text(script).splitlines(), 1):
        if ln.rstrip().endswith(marker):
            return os.path.basename(script), i
    return os.path.basename(script), None


def names_line(frame, base, line):
    if not isinstance(frame, str) or line is None:
        return False
    return re.search(r"(^|[/\\\s(\[])%s:%d\b" % (re.escape(base), line), frame) is not None


def run_cli(cli, args, out_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        r = subprocess.run([cli] + args, capture_output=True, text=True, timeout=30, env=env)
        rc, text = r.returncode, r.stdout + (("\n[stderr]\n" + r.stderr) if r.stderr.strip() else "")
    except (OSError, subprocess.SubprocessError) as e:
        rc, text = None, "could not run %s: %s" % (cli, e)
    try:
        with open(out_path, "w") as f:
            f.write("$ gpuguard %s\n%s\n(exit status %s)\n" % (" ".join(args), text, rc))
    except OSError:
        pass
    return rc, text


def diff_sites(text):
    """Blocks of `gpuguard diff` output, one per listed site (a '+<bytes>' line and
    the indented lines under it), in the order listed."""
    blocks, cur = [], None
    for ln in text.splitlines():
        if SITE_START.match(ln):
            cur = [ln]
            blocks.append(cur)
        elif cur is not None:
            if ln.strip() and not ln.startswith(" "):
                cur = None  # a new section
            else:
                cur.append(ln)
    return blocks


class Judge:
    """Rows that are checks when judged, INFO ('would pass/fail') otherwise."""

    def __init__(self, rows, judged, why=""):
        self.R, self.judged, self.why = rows, judged, why

    def __call__(self, check, cond, detail, soft=False, **data):
        if not self.judged:
            return self.R.info(check, "%s (not judged: %s) %s" % ("ok" if cond else "not met", self.why, detail),
                               **data)
        if soft and not cond:
            return self.R.warn(check, detail, **data)
        return self.R.check(check, cond, detail, **data)


def analyse(R, J, a, framework, script, top_frames=1, judge_diff=True):
    rc = tl.read_rc(a.dir)
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, rec, rc):
        return None
    R.check("exit_status", rc == 0, "rc %s" % rc)
    pid = tl.run_pid(a.dir, rec)
    base, line = leak_site(a.dir, script)
    summ = tl.first(rec, "summary") or {}
    leaked = tl.as_int(summ.get("leaked_bytes"))
    nleak = tl.as_int(summ.get("leaked"))
    rdir = os.path.join(a.dir, "reports")
    sigs = tl.list_reports(rdir, pid, "signal")
    exits = tl.list_reports(rdir, pid, "exit")
    want_sigs = len((tl.first(rec, "config") or {}).get("signal_steps") or [])
    R.check("reports", len(sigs) >= want_sigs and len(exits) >= 1,
            "%d signal report(s) (want %d), %d exit report(s); leak at %s:%s, %s in %s tensors" % (
                len(sigs), want_sigs, len(exits), base, line, mib(leaked), nleak))
    if not exits:
        return None
    rep, err = tl.load_json(exits[-1]["path"])
    if rep is None:
        R.check("exit_report", False, "%s unreadable: %s" % (exits[-1]["name"], err))
        return None

    cls = [c for c in rep.get("classification") or [] if isinstance(c, dict)]
    mine = [c for c in cls if c.get("framework") == framework]
    J("classification", bool(mine) and mine[0].get("status") == "classified",
      "%s: %s" % (framework, ("status %s: %s" % (mine[0].get("status"), (mine[0].get("detail") or "")[:200]))
                  if mine else "no entry (entries: %s)" % [(c.get("framework"), c.get("status")) for c in cls]),
      classification=cls)

    ps = [s for s in rep.get("python_sites") or [] if isinstance(s, dict)]
    top = ps[0] if ps else {}
    frames = top.get("frames") or []
    hit = any(names_line(f, base, line) for f in frames[:top_frames])
    rank = next((i for i, s in enumerate(ps) if any(names_line(f, base, line) for f in (s.get("frames") or []))), None)
    J("python_site_top", hit and top.get("framework") == framework,
      "python_sites[0] (%d sites): framework %s, %s in %s, frames[0] %s%s" % (
          len(ps), top.get("framework"), mib(top.get("live_bytes")), top.get("live_count"),
          (frames[0] if frames else "(none)")[-160:],
          "" if hit else "; the leak line is %s" % ("site #%d" % rank if rank is not None else "in no python site")),
      top=top, n_sites=len(ps), want="%s:%s" % (base, line))
    if hit:
        lb, lc = tl.as_int(top.get("live_bytes")) or 0, tl.as_int(top.get("live_count")) or 0
        J("python_site_bytes", leaked is not None and lb >= leaked and lc >= (nleak or 0),
          "top site holds %s in %d blocks; leaked %s in %s" % (mib(lb), lc, mib(leaked), nleak), soft=True)

    d0 = tl.dev_entry(rep, 0) or {}
    iu, ca = d0.get("in_use_bytes"), d0.get("cached_bytes")
    present = isinstance(iu, int) and not isinstance(iu, bool) and isinstance(ca, int) and not isinstance(ca, bool)
    J("in_use_cached", present and leaked is not None and iu >= leaked,
      "devices[0] in_use %s cached %s current %s; leaked %s; the framework said in use %s, held %s" % (
          mib(iu), mib(ca), mib(d0.get("current_bytes")), mib(leaked),
          mib(summ.get("allocated", summ.get("pool_used"))), mib(summ.get("reserved", summ.get("pool_total")))),
      device0={k: d0.get(k) for k in ("current_bytes", "in_use_bytes", "cached_bytes", "peak_bytes")})
    owners = {}
    for e in rep.get("live") or []:
        if isinstance(e, dict):
            k = e.get("owner") or "null"
            o = owners.setdefault(k, [0, 0, 0])
            o[0] += 1
            o[1] += tl.as_int(e.get("bytes")) or 0
            o[2] += tl.as_int(e.get("in_use_bytes")) or 0
    R.info("live_owners", "; ".join("%s: %d allocations %s, in use %s" % (k, v[0], mib(v[1]), mib(v[2]))
                                    for k, v in sorted(owners.items())) or "no live entries", owners=owners)

    # gpuguard diff of the two signal reports.
    if len(sigs) >= 2:
        drc, text = run_cli(a.cli, ["diff", sigs[0]["path"], sigs[1]["path"]], os.path.join(a.dir, "diff.txt"))
        blocks = diff_sites(text)
        first = blocks[0] if blocks else []
        ok = drc == 0 and any(names_line(ln.strip(), base, line) for ln in first)
        where = next((i for i, b in enumerate(blocks) if any(names_line(ln.strip(), base, line) for ln in b)), None)
        frames = [ln.strip() for ln in first[1:] if ln.strip() and not re.match(r"^\s+[AB]\s", ln)]
        detail = "rc %s, %d sites listed; first: %s%s" % (
            drc, len(blocks), (" | ".join([s.strip() for s in first[:1]] + frames[:2]))[:220] or "(none)",
            "" if ok else "; the leak line is %s" % ("site #%d" % where if where is not None else "not listed"))
        if judge_diff:
            J("diff_first_site", ok, detail)
        else:
            R.info("diff_first_site", ("ok " if ok else "not met ") + detail)
    else:
        J("diff_first_site", False, "fewer than 2 signal reports: no diff")

    src, text = run_cli(a.cli, ["show", exits[-1]["path"]], os.path.join(a.dir, "show.txt"))
    R.check("show_renders", src == 0 and bool(text.strip()),
            "`gpuguard show` of the exit report: rc %s, %d lines, names %s:%s: %s" % (
                src, len(text.splitlines()), base, line, any(names_line(ln.strip(), base, line)
                                                             for ln in text.splitlines())))
    if sigs:
        run_cli(a.cli, ["show"] + [s["path"] for s in sigs] + [exits[-1]["path"]],
                os.path.join(a.dir, "show_series.txt"))
    for s in rec.get("signal", []):
        R.info("signal_step_%s" % s.get("step"), "report %s: in_use %s cached %s, %s python sites, top %s" % (
            os.path.basename(s.get("report") or "-"), mib(s.get("report_in_use")), mib(s.get("report_cached")),
            s.get("python_sites"), (s.get("top_frame") or "-")[-120:]))
    return rep


def cmd_torch(a):
    R = tl.Rows(a.summary, "leaks", "torch_" + a.mode)
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    judged = a.mode != "cudaMallocAsync"
    J = Judge(R, judged, "backend:cudaMallocAsync has no PyTorch recorder")
    analyse(R, J, a, "pytorch", os.path.join(HERE, "leak_torch.py"), top_frames=1)
    return 0


def cmd_cupy(a):
    R = tl.Rows(a.summary, "leaks", "cupy")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    J = Judge(R, True)
    analyse(R, J, a, "cupy", os.path.join(HERE, "leak_cupy.py"), top_frames=3, judge_diff=False)
    return 0


def cmd_jax(a):
    R = tl.Rows(a.summary, "leaks", "jax")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    rc = tl.read_rc(a.dir)
    rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, rec, rc):
        return 0
    R.check("exit_status", rc == 0, "rc %s" % rc)
    pid = tl.run_pid(a.dir, rec)
    exits = tl.list_reports(os.path.join(a.dir, "reports"), pid, "exit")
    R.check("exit_report", bool(exits), "%d exit report(s)" % len(exits))
    if not exits:
        return 0
    rep, _ = tl.load_json(exits[-1]["path"])
    rep = rep or {}
    cls = [c for c in rep.get("classification") or [] if isinstance(c, dict)]
    R.info("classification", "; ".join("%s: %s (%s)" % (c.get("framework"), c.get("status"),
                                                        (c.get("detail") or "")[:150]) for c in cls) or "none",
           classification=cls)
    d0 = tl.dev_entry(rep, 0) or {}
    summ = tl.first(rec, "summary") or {}
    R.info("in_use_cached", "devices[0] in_use %s cached %s current %s; jax bytes_in_use %s pool_bytes %s; leaked %s"
           % (mib(d0.get("in_use_bytes")), mib(d0.get("cached_bytes")), mib(d0.get("current_bytes")),
              mib(summ.get("bytes_in_use")), mib(summ.get("pool_bytes")), mib(summ.get("leaked_bytes"))))
    ps = rep.get("python_sites") or []
    R.info("python_sites", "%d python sites%s" % (len(ps), ("; top %s" % ((ps[0].get("frames") or ["-"])[0]))
                                                  if ps else ""))
    run_cli(a.cli, ["show", exits[-1]["path"]], os.path.join(a.dir, "show.txt"))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("torch", "cupy", "jax"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--cli", required=True)
        p.add_argument("--summary")
        if name == "torch":
            p.add_argument("--mode", required=True)
    a = ap.parse_args()
    try:
        return {"torch": cmd_torch, "cupy": cmd_cupy, "jax": cmd_jax}[a.cmd](a)
    except Exception as e:  # noqa: BLE001 - a checker bug must not stop the runner
        import traceback

        traceback.print_exc()
        tl.Rows(a.summary, "leaks", a.cmd).check("checker", False, "checker error: %s: %s" % (type(e).__name__, e))
        return 0


if __name__ == "__main__":
    sys.exit(main())
