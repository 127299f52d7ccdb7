#!/usr/bin/env python3
"""Checks that the documents stay true to the tree (run by .ci/run, no build needed).

    python3 scripts/check-docs.py

Over README.md and docs/*.md:

1. Every repository path they cite exists: paths in backticks or code blocks that
   start with src/, scripts/, tests/, crates/, docs/, include/, examples/ or .ci/
   (a `<placeholder>` segment, `*`, `?` and `{a,b}` are read as patterns; a trailing
   `...` is dropped), and every markdown link or image to a local file, with its
   `#anchor` when it names one (GitHub's heading slugs, or an explicit `<a id=...>`).
2. README.md has at most 300 lines, each docs/*.md at most 800.
3. Each performance figure README.md quotes, between `<!-- perf-figures` and
   `<!-- /perf-figures -->`, appears verbatim in the table under "## Current figures"
   in docs/performance.md: every number with a unit (ns, µs, ms, s, B, KiB, MiB, GiB,
   MB, GB, %), ranges included, and every throughput ratio (0.9914, 1.0010).

Prints one line per problem (FILE:LINE: what) and exits 1 if there is any.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX = 300
DOC_MAX = 800
PREFIXES = ("src", "scripts", "tests", "crates", "docs", "include", "examples", ".ci")

PATH_RE = re.compile(
    r"(?<![\w./$~-])((?:%s)/[\w./<>*?{},+-]*)" % "|".join(re.escape(p) for p in PREFIXES)
)
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR_RE = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FIGURE_RE = re.compile(
    r"(?<![\w.])[+−-]?\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?"
    r"\s?(?:ns|µs|us|ms|s|B|KiB|MiB|GiB|MB|GB|%)(?![\w])"
)
RATIO_RE = re.compile(r"(?<![\w.])[01]\.\d{3,4}(?![\w.])")

problems = []


def problem(path, line, what):
    problems.append("%s:%d: %s" % (os.path.relpath(path, ROOT), line, what))


def documents():
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [f for f in files if os.path.isfile(f)]


def as_pattern(p):
    """A cited path as a glob: placeholders and braces become wildcards."""
    p = re.sub(r"\.\.\.+$", "", p)
    p = re.sub(r"<[^>/]*>", "*", p)
    return p


def expand_braces(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(p[: m.start()] + alt + p[m.end():])
    return out


def path_exists(cited):
    cited = cited.rstrip(".,;:)")
    if not cited or cited.endswith("/") and cited.count("/") == 1 and cited[:-1] in PREFIXES:
        return True
    # Every alternative of {a,b} must exist; a pattern must match something.
    for alt in expand_braces(as_pattern(cited)):
        alt = alt.rstrip("/") or alt
        if any(c in alt for c in "*?["):
            if not glob.glob(os.path.join(ROOT, alt)):
                return False
        elif not os.path.exists(os.path.join(ROOT, alt)):
            return False
    return True


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        found, seen = set(), {}
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    in_code = not in_code
                    continue
                if in_code:
                    continue
                m = HEADING_RE.match(line)
                if m:
                    s = slug(m.group(2))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    found.add(s if n == 0 else "%s-%d" % (s, n))
                found.update(ANCHOR_RE.findall(line))
        _anchor_cache[path] = found
    return _anchor_cache[path]


def check_paths_and_links(path, lines):
    in_code = False
    for no, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        indented = line.startswith("    ") and not line.lstrip().startswith(("-", "|", "*"))
        spans = [line] if (in_code or indented) else CODE_SPAN_RE.findall(line)
        for span in spans:
            for cited in PATH_RE.findall(span):
                if not path_exists(cited):
                    problem(path, no, "cites %s, which is not in the tree" % cited)
        if in_code:
            continue
        for target in LINK_RE.findall(CODE_SPAN_RE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:, file:
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                problem(path, no, "links to %s, which does not exist" % target)
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problem(path, no, "links to %s: no heading or anchor #%s in %s"
                        % (target, anchor, os.path.relpath(dest, ROOT)))


def check_lengths(path, lines):
    limit = README_MAX if os.path.basename(path) == "README.md" and \
        os.path.dirname(path) == ROOT else DOC_MAX
    if len(lines) > limit:
        problem(path, len(lines), "%d lines, more than %d" % (len(lines), limit))


def figures_table(perf_lines):
    """The lines of the first table under '## Current figures' in performance.md."""
    out, inside = [], False
    for line in perf_lines:
        if line.startswith("## "):
            if inside:
                break
            inside = line.strip() == "## Current figures"
            continue
        if inside and line.startswith("|"):
            out.append(line)
        elif inside and out and not line.startswith("|"):
            break
    return out


def check_figures(readme, lines):
    perf = os.path.join(ROOT, "docs", "performance.md")
    start = next((i for i, l in enumerate(lines) if "<!-- perf-figures" in l), None)
    end = next((i for i, l in enumerate(lines) if "<!-- /perf-figures -->" in l), None)
    if start is None or end is None or end < start:
        problem(readme, 1, "no <!-- perf-figures --> ... <!-- /perf-figures --> block "
                "around the performance figures")
        return
    if not os.path.isfile(perf):
        problem(readme, start + 1, "docs/performance.md is missing")
        return
    with open(perf, encoding="utf-8") as f:
        table = figures_table(f.read().splitlines())
    if not table:
        problem(perf, 1, "no table under '## Current figures'")
        return
    text = "\n".join(table)
    norm = lambda s: s.replace("−", "-").replace("\u00a0", " ")
    for no in range(start + 1, end):
        line = CODE_SPAN_RE.sub("", lines[no])
        for fig in FIGURE_RE.findall(line) + RATIO_RE.findall(line):
            if norm(fig) not in norm(text):
                problem(readme, no + 1, "quotes %r, which is not in docs/performance.md's "
                        "Current figures table" % fig)


def main():
    for path in documents():
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        check_lengths(path, lines)
        check_paths_and_links(path, lines)
        if path == os.path.join(ROOT, "README.md"):
            check_figures(path, lines)
    for p in problems:
        print(p)
    if problems:
        return 1
    print("check-docs: %d documents, paths, links, lengths and figures OK" % len(documents()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
