#!/usr/bin/env python3
"""Checks the layers of the shim (docs/architecture.md): every module of `src/shim`
belongs to one layer, and imports only from the layers its layer may use (and, inside
its own layer, from the modules listed before it). Also checks that the safe core
(`crates/core`) never imports the shim.

Reads `use super::…`, `use crate::shim::…` and inline `super::x::…` /
`crate::shim::x::…` paths of every file (test modules skipped). Exits 1 listing each
import that goes the wrong way, or a module no layer lists; 0 when all is in order.
Standard library only.

Usage: python3 scripts/check-layers.py [repository root]
"""

import re
import sys
from pathlib import Path

# The layers, lowest first: (name, modules in the order they may use each other,
# the layers this one may use). A module may also use the modules listed before it
# in its own layer.
LAYERS = [
    ("ffi", ["hot", "fault", "sys", "cuda", "wake", "endings", "capture", "real", "table"], []),
    ("base", ["line", "events", "control", "tags", "settings", "unwind", "python::api", "python::layout",
              "python::exit_status", "python::frames", "python::names", "bench_switch"], ["ffi"]),
    ("books", ["books", "group", "caps"], ["ffi", "base"]),
    ("state", ["state"], ["ffi", "base", "books"]),
    ("track", ["track", "track::stash", "track::memo", "track::stack", "track::thread", "track::runtime",
               "track::admission"], ["ffi", "base", "books", "state"]),
    ("hooks", ["hooks"], ["ffi", "base", "books", "state", "track"]),
    # The service reads the books from the side: it never reaches into the hot path.
    ("service", ["symbolize", "oom", "report", "python", "trim", "observe", "worker", "lifecycle"],
     ["ffi", "base", "books", "state"]),
    ("capi", ["capi"], ["ffi", "base", "books", "state", "track", "hooks", "service"]),
]

SHIM = Path("src/shim")


def module_of(path: Path) -> str:
    """`src/shim/python/api.rs` -> `python::api`; `src/shim/hooks.rs` -> `hooks`."""
    rel = path.relative_to(SHIM).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    return "::".join(parts)


def strip(text: str) -> str:
    """The code without comments, string and char literals, and `#[cfg(test)]`
    modules."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            i = text.index('"', i) + 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "r" and re.match(r'r#*"', text[i:]) and not re.match(r"\w", text[i - 1] if i else " "):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            j = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if j < 0 else j + 1 + len(hashes)
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # Test modules: `#[cfg(test)] mod name { … }`, to the matching brace.
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[:m.start()] + code[j:]


def expand(tree: str):
    """`super::{a, b::{c, d}}` -> [`super::a`, `super::b::c`, `super::b::d`]."""
    tree = re.sub(r"\s+", "", tree)
    m = re.search(r"\{", tree)
    if not m:
        return [tree]
    prefix = tree[:m.start()]
    depth, parts, cur = 0, [], ""
    for ch in tree[m.end():-1]:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand(prefix + part)]


def resolve(module: str, path: str, known):
    """The shim module a path names, seen from `module`; None when it names none."""
    segs = [s for s in path.split("::") if s]
    here = module.split("::") if module else []
    if segs[:2] == ["crate", "shim"]:
        base, segs = [], segs[2:]
    elif segs and segs[0] == "super":
        # A file's module is its own path, so `super` is its parent module.
        base = here[:-1]
        segs = segs[1:]
        while segs and segs[0] == "super":
            if not base:
                return None  # above the shim
            base, segs = base[:-1], segs[1:]
    else:
        return None
    full = base + [re.sub(r"\W.*", "", s) for s in segs]
    for k in range(len(full), 0, -1):
        name = "::".join(full[:k])
        if name in known:
            return name
    return None


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    layer_of, rank_in_layer, may_use = {}, {}, {}
    for name, modules, uses in LAYERS:
        may_use[name] = set(uses)
        for i, m in enumerate(modules):
            layer_of[m], rank_in_layer[m] = name, i
    problems = []
    files = sorted((root / SHIM).rglob("*.rs"))
    for f in files:
        mod = module_of(f.relative_to(root))
        if mod and mod not in layer_of:
            problems.append(f"{f.relative_to(root)}: module `{mod}` is in no layer (add it to LAYERS)")
    for f in files:
        mod = module_of(f.relative_to(root))
        if not mod:
            continue  # mod.rs declares the modules
        code = strip(f.read_text())
        paths = []
        for m in re.finditer(r"\buse\s+([^;]*);", code):
            paths += expand(m.group(1))
        code = re.sub(r"\buse\s+[^;]*;", "", code)
        paths += re.findall(r"\b((?:super::)+[A-Za-z_][\w:]*|crate::shim::[A-Za-z_][\w:]*)", code)
        for p in sorted(set(paths)):
            target = resolve(mod, p, layer_of)
            if target is None or target == mod or target.startswith(mod + "::"):
                continue  # outside the shim, itself, or its own submodule
            if mod.startswith(target + "::"):
                continue  # a submodule naming its parent's path (e.g. `super::api`)
            a, b = layer_of.get(mod), layer_of.get(target)
            if a is None or b is None:
                continue
            ok = b in may_use[a] or (a == b and rank_in_layer[target] < rank_in_layer[mod])
            if not ok:
                problems.append(
                    f"{f.relative_to(root)}: `{mod}` ({a}) imports `{target}` ({b}) via `{p}`"
                )
    for f in sorted((root / "crates/core").rglob("*.rs")):
        code = strip(f.read_text())
        if re.search(r"\b(crate::shim|gpuguard::|shim::)", code):
            problems.append(f"{f.relative_to(root)}: the core imports the shim")
    cargo = root / "crates/core/Cargo.toml"
    if cargo.exists() and re.search(r"^\s*gpuguard\s*=", cargo.read_text(), re.M):
        problems.append("crates/core/Cargo.toml: the core depends on the gpuguard crate")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} import(s) against the layers (see docs/architecture.md)")
        return 1
    print("layers: every import goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
