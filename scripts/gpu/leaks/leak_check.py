#!/usr/bin/env python3
"""Judges the leak-report runs (issue 6) of scripts/gpu/validate_trim_leaks.sh.

Usage (the whole validation, from the repository root):
  OUT=/path/to/results bash scripts/gpu/validate_trim_leaks.sh

A RUNDIR holds stdout.log (GGV_LEAK_SITE and GGV_JSON lines of
scripts/gpu/leaks/leak_*.py), stderr.log, rc.txt (-1 = skipped for time) and
reports/ (GPUGUARD_DIR). The checker runs the gpuguard CLI itself
(`gpuguard diff <signal 1> <signal 2>`, `gpuguard show <exit>`, and `show` of the
whole series), saving diff.txt / show.txt / show_series.txt in RUNDIR.

  leak_check.py torch --mode default|expandable|cudaMallocAsync [--python on|lines] --dir D --cli CLI --summary S
  leak_check.py cupy  [--python on|lines] --dir D --cli CLI --summary S
  leak_check.py jax   --dir D --cli CLI --summary S

--python is the run's GPUGUARD_PYTHON: "on" (gpuguard's default: the frameworks'
recorders off, Python lines from the allocating thread's own stack, python_sites of
framework "python-stack") or "lines" (PyTorch's recorder / gpuguard's CuPy hook on:
block-exact python_sites of framework "pytorch" / "cupy").

PyTorch, default settings (workload "torch_<mode>"), all three modes judged:
  exit 0; 2 signal reports + an exit report; classification pytorch "classified";
  recorder_off: no python_sites of framework pytorch; stack_frames: a native site
  whose frames end with "python: " frames, one naming leak_torch.py:<GGV_LEAK_LINE>;
  diff_first_site: the first site `gpuguard diff <signal 1> <signal 2>` lists is a
  Python site ("[<framework> blocks, Python]") naming the line; show_suspected: the
  first suspected leak of `gpuguard show <signal 1> <signal 2> <exit>` likewise;
  current_bytes >= leaked. Native modes: in_use_bytes/cached_bytes present,
  in_use >= leaked; the python-stack site of the line is INFO (segment-level: it
  holds the segments the line made PyTorch grow, cached or not).
  cudaMallocAsync: python_stack_site: a python-stack site naming the line (in its
  first 3 frames) holds >= the leaked bytes in >= the leaked tensors (each tensor is
  one allocation); in_use/cached INFO.
PyTorch, GPUGUARD_PYTHON=lines ("torch_<mode>_lines", default and expandable):
  python_site_top: python_sites[0] is framework pytorch and frames[0] names the line;
  python_site_bytes: it holds the leaked bytes (WARN when short: blocks allocated
  before the recorder was on carry no stack); in_use/cached; diff_first_site and
  show_suspected: a [pytorch blocks, Python] site naming the line.
CuPy, default settings ("cupy"): classification, recorder_off, stack_frames,
  in_use/cached, current_bytes, diff_first_site and show_suspected (the pool
  cudaMallocs each leaked array once the small prewarm is used up: a python-stack
  site under cupy.full's frame); the python-stack site's bytes INFO.
CuPy, GPUGUARD_PYTHON=lines ("cupy_lines"): python_sites[0] framework cupy names the
  line in its first 3 frames, its bytes (WARN), in_use/cached; diff/show INFO.
JAX ("jax", default settings): exit 0, an exit report, classification jax
  "classified", python_site_jax: a python_sites entry of framework jax naming
  leak_jax.py:<line> (first 3 frames) holds >= the leaked bytes; in_use_bytes present
  and >= leaked; current_bytes >= leaked.
Standard library only.
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import ggv as tl  # noqa: E402  (scripts/gpu/lib/ggv.py)

MiB = tl.MiB
mib = tl.mib
# A site starts with its growth: '+<bytes>' (diff, and the suspected leaks of show:
# '+<bytes>[, <rate>/s]: rose in N of M intervals, ...').
SITE_START = re.compile(r"^\s*\+\s*\d")
LABEL_LINE = re.compile(r"^\s+(?:[AB]|#\d+)\s")
# A Python site's key header (src/cli/show.rs): a framework's blocks, or the
# allocating thread's Python stack (framework python-stack).
PY_HEADER = re.compile(r"^\[(?:(?P<fw>[^\]\s]+) blocks, Python|(?P<stack>allocations, Python stack))\]$")
PY_FRAME = "python: "
STACK = "python-stack"
SUSPECTED = "suspected leaks in"


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


def names_any(frames, base, line, n=None):
    return any(names_line(f, base, line) for f in (frames or [])[:n])


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


def growth_blocks(text, after=None):
    """The sites a `gpuguard diff` (or the suspected leaks of `gpuguard show`, with
    after=SUSPECTED) lists, in order: [{"grew", "labels", "frames", "python",
    "framework"}]. A site is a '+<bytes>' line, then indented label lines ('A ...',
    '#3 ...') and frame lines; a Python site's first frame line is its key header
    '[<framework> blocks, Python]' (src/main.rs). None when `after` is given and no
    line starts with it."""
    lines = text.splitlines()
    if after is not None:
        at = next((i for i, ln in enumerate(lines) if ln.strip().startswith(after)), None)
        if at is None:
            return None
        lines = lines[at + 1:]
    blocks, cur = [], None
    for ln in lines:
        if SITE_START.match(ln):
            cur = {"grew": ln.strip(), "labels": [], "frames": []}
            blocks.append(cur)
        elif cur is not None:
            s = ln.strip()
            if s and not ln.startswith(" "):
                cur = None  # a new section (another process, per rank, stderr)
            elif LABEL_LINE.match(ln):
                cur["labels"].append(s)
            elif s and not s.startswith("... "):
                cur["frames"].append(s)
    for b in blocks:
        m = PY_HEADER.match(b["frames"][0]) if b["frames"] else None
        b["python"] = m is not None
        b["framework"] = (m.group("fw") or STACK) if m else None
        if m:
            b["frames"] = b["frames"][1:]
    return blocks


def block_text(b):
    if not b:
        return "(none)"
    head = "%s %s" % (b["grew"], ("[%s blocks, Python]" % b["framework"]) if b["python"] else "(native)")
    labels = ", ".join(re.sub(r"\s+", " ", x) for x in b["labels"])
    return (head + (" (%s)" % labels if labels else "") + ": " + " | ".join(b["frames"][:2]))[:320]


def judge_first_block(J, check, blocks, rc, base, line, want_fw=None, what="", judged=True, R=None):
    """The first listed site is a Python site (of want_fw, when given) naming the line."""
    if blocks is None:
        ok, detail = False, "rc %s: no %r section in the output" % (rc, SUSPECTED)
    else:
        first = blocks[0] if blocks else None
        ok = (rc == 0 and first is not None and first["python"] and names_any(first["frames"], base, line)
              and (want_fw is None or first["framework"] == want_fw))
        where = next((i for i, b in enumerate(blocks) if names_any(b["frames"], base, line)), None)
        detail = "%src %s, %d sites listed; first: %s%s%s" % (
            what, rc, len(blocks), block_text(first),
            "" if want_fw is None else "; want a [%s blocks, Python] site" % want_fw,
            "" if ok else "; the leak line is %s" % (
                "site #%d (%s)" % (where, "Python" if blocks[where]["python"] else "native")
                if where is not None else "not listed"))
    if judged:
        return J(check, ok, detail)
    return R.info(check, ("ok " if ok else "not met ") + detail)


class Judge:
    """Rows that are checks when judged, INFO ('ok'/'not met') otherwise."""

    def __init__(self, rows, judged=True, why=""):
        self.R, self.judged, self.why = rows, judged, why

    def __call__(self, check, cond, detail, soft=False, judged=None, why=None, **data):
        if not (self.judged if judged is None else judged):
            return self.R.info(check, "%s (not judged: %s) %s" % ("ok" if cond else "not met", why or self.why,
                                                                  detail), **data)
        if soft and not cond:
            return self.R.warn(check, detail, **data)
        return self.R.check(check, cond, detail, **data)


class Ctx:
    pass


def start(R, a, script):
    """Common part: exit status, the reports, the exit report loaded. Returns a Ctx or
    None (rows for what is missing already written)."""
    c = Ctx()
    c.rc = tl.read_rc(a.dir)
    c.rec = tl.read_records(os.path.join(a.dir, "stdout.log"))
    if not tl.started(R, a.dir, c.rec, c.rc):
        return None
    R.check("exit_status", c.rc == 0, "rc %s" % c.rc)
    c.pid = tl.run_pid(a.dir, c.rec)
    c.base, c.line = leak_site(a.dir, script)
    c.cfg = tl.first(c.rec, "config") or {}
    c.summ = tl.first(c.rec, "summary") or {}
    c.leaked = tl.as_int(c.summ.get("leaked_bytes"))
    c.nleak = tl.as_int(c.summ.get("leaked"))
    rdir = os.path.join(a.dir, "reports")
    c.sigs = tl.list_reports(rdir, c.pid, "signal")
    c.exits = tl.list_reports(rdir, c.pid, "exit")
    want_sigs = len(c.cfg.get("signal_steps") or [])
    R.check("reports", len(c.sigs) >= want_sigs and len(c.exits) >= 1,
            "%d signal report(s) (want %d), %d exit report(s); leak at %s:%s, %s in %s tensors/arrays; "
            "GPUGUARD_PYTHON %s (config says %s), prewarm %s MiB" % (
                len(c.sigs), want_sigs, len(c.exits), c.base, c.line, mib(c.leaked), c.nleak,
                getattr(a, "python", "on"), c.cfg.get("python"), c.cfg.get("prewarm_mib")))
    if not c.exits:
        return None
    c.rep, err = tl.load_json(c.exits[-1]["path"])
    if c.rep is None:
        R.check("exit_report", False, "%s unreadable: %s" % (c.exits[-1]["name"], err))
        return None
    c.ps = [s for s in c.rep.get("python_sites") or [] if isinstance(s, dict)]
    c.d0 = tl.dev_entry(c.rep, 0) or {}
    return c


def chk_classification(J, c, framework):
    cls = [x for x in c.rep.get("classification") or [] if isinstance(x, dict)]
    mine = [x for x in cls if x.get("framework") == framework]
    J("classification", bool(mine) and mine[0].get("status") == "classified",
      "%s: %s" % (framework, ("status %s: %s" % (mine[0].get("status"), (mine[0].get("detail") or "")[:220]))
                  if mine else "no entry (entries: %s)" % [(x.get("framework"), x.get("status")) for x in cls]),
      classification=cls)


def sites_text(ps, n=3):
    return "; ".join("#%s %s %s in %s: %s" % (s.get("id"), s.get("framework"), mib(s.get("live_bytes")),
                                             s.get("live_count"), ((s.get("frames") or ["-"])[0] or "-")[-110:])
                     for s in ps[:n]) or "none"


def chk_recorder_off(J, c, framework):
    """Default settings: the framework's own recorder stays off, so no python site is
    of that framework (they are all python-stack)."""
    fws = {}
    for s in c.ps:
        fws[s.get("framework")] = fws.get(s.get("framework"), 0) + 1
    J("recorder_off", fws.get(framework, 0) == 0,
      "python_sites by framework %s (want none of %s with GPUGUARD_PYTHON unset); top: %s" % (
          fws or "{}", framework, sites_text(c.ps)), frameworks=fws)


def chk_stack_frames(J, c):
    """Native sites end with the allocating thread's Python frames ('python: ...'),
    one of them names the leak line."""
    with_py, bad, hit = 0, [], None
    for s in c.rep.get("sites") or []:
        if not isinstance(s, dict):
            continue
        fr = [f for f in s.get("frames") or [] if isinstance(f, str)]
        idx = [i for i, f in enumerate(fr) if f.startswith(PY_FRAME)]
        if not idx:
            continue
        with_py += 1
        if any(not f.startswith(PY_FRAME) for f in fr[idx[0]:]):
            bad.append(s.get("id"))
        if hit is None and any(names_line(f[len(PY_FRAME):], c.base, c.line) for f in fr[idx[0]:]):
            hit = s
    hf = [f for f in (hit or {}).get("frames") or [] if isinstance(f, str)]
    J("stack_frames", hit is not None and not bad,
      "%d of %d native sites end with Python frames%s; %s" % (
          with_py, len(c.rep.get("sites") or []),
          ("; sites %s have native frames after Python ones" % bad[:5]) if bad else "",
          ("site %s (%s in %s): %s ... %s" % (hit.get("id"), mib(hit.get("live_bytes")), hit.get("live_count"),
                                              (hf[0] if hf else "-")[:80],
                                              next((f for f in hf if names_line(f, c.base, c.line)), "-")[-120:]))
          if hit is not None else "no site's Python frames name %s:%s" % (c.base, c.line)))


def find_site(ps, framework, base, line, nframes=3):
    for i, s in enumerate(ps):
        if (framework is None or s.get("framework") == framework) and names_any(s.get("frames"), base, line, nframes):
            return i, s
    return None, None


def chk_site_bytes(J, check, c, framework, judged, why=""):
    """Some python site of `framework` naming the line (first 3 frames) holds >= the
    leaked bytes in >= the leaked count."""
    i, s = find_site(c.ps, framework, c.base, c.line)
    lb = tl.as_int((s or {}).get("live_bytes")) or 0
    lc = tl.as_int((s or {}).get("live_count")) or 0
    ok = s is not None and c.leaked is not None and lb >= c.leaked and lc >= (c.nleak or 0)
    J(check, ok, "%s; leaked %s in %s; python_sites (%d): %s" % (
        ("python_sites[%d] (%s) names %s:%s: %s in %d, frames[0] %s" % (
            i, framework, c.base, c.line, mib(lb), lc, ((s.get("frames") or ["-"])[0] or "-")[-120:]))
        if s is not None else "no %s site names %s:%s in its first 3 frames" % (framework, c.base, c.line),
        mib(c.leaked), c.nleak, len(c.ps), sites_text(c.ps)), judged=judged, why=why, site=s)


def chk_top(J, c, framework, top_frames):
    """GPUGUARD_PYTHON=lines: python_sites[0] is the framework's and names the line."""
    top = c.ps[0] if c.ps else {}
    frames = top.get("frames") or []
    hit = names_any(frames, c.base, c.line, top_frames)
    rank, _ = find_site(c.ps, None, c.base, c.line, None)
    J("python_site_top", hit and top.get("framework") == framework,
      "python_sites[0] (%d sites): framework %s, %s in %s, frames[0] %s%s" % (
          len(c.ps), top.get("framework"), mib(top.get("live_bytes")), top.get("live_count"),
          (frames[0] if frames else "(none)")[-160:],
          "" if hit else "; the leak line is %s" % ("site #%d" % rank if rank is not None else "in no python site")),
      top=top, n_sites=len(c.ps), want="%s:%s" % (c.base, c.line))
    if hit:
        lb, lc = tl.as_int(top.get("live_bytes")) or 0, tl.as_int(top.get("live_count")) or 0
        J("python_site_bytes", c.leaked is not None and lb >= c.leaked and lc >= (c.nleak or 0),
          "top site holds %s in %d blocks; leaked %s in %s" % (mib(lb), lc, mib(c.leaked), c.nleak), soft=True)


def chk_in_use(J, c, judged=True, why=""):
    iu, ca = c.d0.get("in_use_bytes"), c.d0.get("cached_bytes")
    present = tl.as_int(iu) is not None and tl.as_int(ca) is not None
    s = c.summ
    J("in_use_cached", present and c.leaked is not None and iu >= c.leaked,
      "devices[0] in_use %s cached %s current %s; leaked %s; the framework said in use %s, held %s" % (
          mib(iu), mib(ca), mib(c.d0.get("current_bytes")), mib(c.leaked),
          mib(s.get("allocated", s.get("pool_used", s.get("bytes_in_use")))),
          mib(s.get("reserved", s.get("pool_total", s.get("pool_bytes"))))),
      judged=judged, why=why,
      device0={k: c.d0.get(k) for k in ("current_bytes", "in_use_bytes", "cached_bytes", "peak_bytes")})


def chk_current(J, c):
    cur = tl.as_int(c.d0.get("current_bytes"))
    J("current_bytes", cur is not None and c.leaked is not None and cur >= c.leaked,
      "devices[0].current_bytes %s at exit (peak %s); leaked %s; gpuguard said %s at the end of main()" % (
          mib(cur), mib(c.d0.get("peak_bytes")), mib(c.leaked), mib(c.summ.get("gg_current"))))


def info_owners(R, c):
    owners = {}
    for e in c.rep.get("live") or []:
        if isinstance(e, dict):
            k = e.get("owner") or "null"
            o = owners.setdefault(k, [0, 0, 0])
            o[0] += 1
            o[1] += tl.as_int(e.get("bytes")) or 0
            o[2] += tl.as_int(e.get("in_use_bytes")) or 0
    R.info("live_owners", "; ".join("%s: %d allocations %s, in use %s" % (k, v[0], mib(v[1]), mib(v[2]))
                                    for k, v in sorted(owners.items())) or "no live entries", owners=owners)


def chk_diff_show(R, J, a, c, want_fw=None, judged=True):
    """`gpuguard diff <signal 1> <signal 2>` and the suspected leaks of `gpuguard show
    <signal 1> <signal 2> <exit>`: the first site listed is a Python site naming the
    line; `gpuguard show <exit>` renders."""
    if len(c.sigs) >= 2:
        drc, text = run_cli(a.cli, ["diff", c.sigs[0]["path"], c.sigs[1]["path"]], os.path.join(a.dir, "diff.txt"))
        judge_first_block(J, "diff_first_site", growth_blocks(text), drc, c.base, c.line, want_fw,
                          judged=judged, R=R)
        src, text = run_cli(a.cli, ["show", c.sigs[0]["path"], c.sigs[1]["path"], c.exits[-1]["path"]],
                            os.path.join(a.dir, "show_series.txt"))
        judge_first_block(J, "show_suspected", growth_blocks(text, SUSPECTED), src, c.base, c.line, want_fw,
                          what="signal reports #%d, #%d and exit #%d: " % (
                              c.sigs[0]["seq"], c.sigs[1]["seq"], c.exits[-1]["seq"]), judged=judged, R=R)
    else:
        J("diff_first_site", False, "fewer than 2 signal reports: no diff", judged=judged)
        J("show_suspected", False, "fewer than 2 signal reports: no series", judged=judged)
    src, text = run_cli(a.cli, ["show", c.exits[-1]["path"]], os.path.join(a.dir, "show.txt"))
    R.check("show_renders", src == 0 and bool(text.strip()),
            "`gpuguard show` of the exit report: rc %s, %d lines, names %s:%s: %s" % (
                src, len(text.splitlines()), c.base, c.line, any(names_line(ln.strip(), c.base, c.line)
                                                                 for ln in text.splitlines())))
    for s in c.rec.get("signal", []):
        R.info("signal_step_%s" % s.get("step"), "report %s: in_use %s cached %s, %s python sites, top %s %s" % (
            os.path.basename(s.get("report") or "-"), mib(s.get("report_in_use")), mib(s.get("report_cached")),
            s.get("python_sites"), s.get("top_framework") or "-", (s.get("top_frame") or "-")[-120:]))


def cmd_torch(a):
    lines = a.python == "lines"
    R = tl.Rows(a.summary, "leaks", "torch_%s%s" % (a.mode, "_lines" if lines else ""))
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    J = Judge(R)
    c = start(R, a, os.path.join(HERE, "leak_torch.py"))
    if c is None:
        return 0
    native = a.mode != "cudaMallocAsync"
    chk_classification(J, c, "pytorch")
    if lines:
        # PyTorch's recorder: block-exact lines (native and expandable modes).
        chk_top(J, c, "pytorch", 1)
        chk_in_use(J, c)
        chk_current(J, c)
        info_owners(R, c)
        chk_diff_show(R, J, a, c, want_fw="pytorch")
        return 0
    chk_recorder_off(J, c, "pytorch")
    chk_stack_frames(J, c)
    if native:
        chk_site_bytes(J, "python_stack_site", c, STACK, judged=False,
                       why="segment-level: the line that made PyTorch grow its cache, cached segments included")
        chk_in_use(J, c)
    else:
        chk_site_bytes(J, "python_stack_site", c, STACK, judged=True)
        chk_in_use(J, c, judged=False, why="cudaMallocAsync: judged by the python-stack site and current_bytes")
    chk_current(J, c)
    info_owners(R, c)
    chk_diff_show(R, J, a, c)
    return 0


def cmd_cupy(a):
    lines = a.python == "lines"
    R = tl.Rows(a.summary, "leaks", "cupy_lines" if lines else "cupy")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    J = Judge(R)
    c = start(R, a, os.path.join(HERE, "leak_cupy.py"))
    if c is None:
        return 0
    chk_classification(J, c, "cupy")
    if lines:
        # gpuguard's CuPy memory hook; cupy.full's own frames are skipped by the hook.
        chk_top(J, c, "cupy", 3)
        chk_in_use(J, c)
        chk_current(J, c)
        info_owners(R, c)
        chk_diff_show(R, J, a, c, want_fw="cupy", judged=False)
        return 0
    chk_recorder_off(J, c, "cupy")
    chk_stack_frames(J, c)
    chk_site_bytes(J, "python_stack_site", c, STACK, judged=False,
                   why="the first leaked arrays come out of the prewarm chunk, which its own line holds")
    chk_in_use(J, c)
    chk_current(J, c)
    info_owners(R, c)
    chk_diff_show(R, J, a, c)
    return 0


def cmd_jax(a):
    R = tl.Rows(a.summary, "leaks", "jax")
    if tl.skipped(a.dir):
        R.skip("run", "skipped: time budget spent")
        return 0
    J = Judge(R)
    c = start(R, a, os.path.join(HERE, "leak_jax.py"))
    if c is None:
        return 0
    chk_classification(J, c, "jax")
    chk_site_bytes(J, "python_site_jax", c, "jax", judged=True)
    chk_in_use(J, c)
    chk_current(J, c)
    R.info("jax_stats", "JAX at the end of main(): bytes_in_use %s pool_bytes %s; gpuguard current %s" % (
        mib(c.summ.get("bytes_in_use")), mib(c.summ.get("pool_bytes")), mib(c.summ.get("gg_current"))))
    info_owners(R, c)
    src, text = run_cli(a.cli, ["show", c.exits[-1]["path"]], os.path.join(a.dir, "show.txt"))
    R.check("show_renders", src == 0 and bool(text.strip()),
            "`gpuguard show` of the exit report: rc %s, %d lines, names %s:%s: %s" % (
                src, len(text.splitlines()), c.base, c.line, any(names_line(ln.strip(), c.base, c.line)
                                                                 for ln in text.splitlines())))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("torch", "cupy", "jax"):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--cli", required=True)
        p.add_argument("--summary")
        p.add_argument("--python", choices=("on", "lines"), default="on",
                       help="the run's GPUGUARD_PYTHON (default on: gpuguard's default)")
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
