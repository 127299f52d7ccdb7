#!/usr/bin/env bash
# `gpuguard show` at scale: wall time and peak memory, median of N runs, on
# two generated reports: 1,000,000 live allocations over 40 sites (~128 MB), and
# 200,000 distinct call sites (~33 MB). Release build.
#
#   bash scripts/bench/cli_scale.sh            (~1 minute after the build)
#   N=9 GG=/path/to/other/gpuguard bash scripts/bench/cli_scale.sh   (another build)
#
# Prints one line per input for docs/performance.md:
#   | show, 1M live (128 MB) | 0.45 s [0.43-0.47] | 4 MB |
# Wall time and peak RSS from /usr/bin/time (Debian: `apt-get install time`), whose
# own small size is what a child's peak starts from (a child's ru_maxrss counts its
# parent's resident memory as it was spawned: a Python parent that generated the
# input would add its own). Output goes to /dev/null.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
N=${N:-5}
[ -x /usr/bin/time ] || { echo "cli_scale.sh: /usr/bin/time is needed (apt-get install time)" >&2; exit 2; }
if [ -z "${GG:-}" ]; then
  [ "${SKIP_BUILD:-0}" = 1 ] || cargo build -q --release --bin gpuguard
  GG=$ROOT/target/release/gpuguard
fi
# TMP_DIR keeps the generated reports between runs (to compare builds).
TMP=${TMP_DIR:-$(mktemp -d)}
[ -n "${TMP_DIR:-}" ] || trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP" <<'EOF'
import json, os, sys

tmp = sys.argv[1]

def report(path, live, sites):
    """A report of `live` allocations (largest first) and `sites` distinct sites."""
    if os.path.exists(path):
        return
    site_list = [{"id": i,
                  "frames": [f"alloc_{i}+0x1d (libapp.so+0x{0x1000 + i:x})",
                             f"layer_{i % 97}+0x40 (libapp.so+0x2000)",
                             "main+0x1d (prog+0x8105d)"],
                  "live_bytes": (sites - i) * 4096, "live_count": 1} for i in range(sites)]
    shell = {"schema": "gpuguard-report/1", "gpuguard_version": "bench", "reason": "exit",
             "seq": 1, "pid": 41, "program": "bench", "argv": ["bench"],
             "time_unix_ms": 0, "uptime_s": 1.0,
             "devices": [{"device": 0, "total_bytes": 80 << 30, "cap_bytes": None,
                          "current_bytes": live * 4096, "peak_bytes": live * 4096,
                          "allocs": live, "frees": 0, "failed": 0, "live_count": live}],
             "host_pinned": {"current_bytes": 0, "peak_bytes": 0},
             "live": [], "live_omitted": 0, "sites": site_list}
    head, tail = json.dumps(shell, separators=(",", ":")).split('"live":[]')
    with open(path, "w") as f:
        f.write(head + '"live":[')
        for start in range(0, live, 10000):
            chunk = ('{"address":"0x%x","bytes":%d,"device":0,"kind":"device",'
                     '"api":"cuMemAlloc_v2","thread":7,"age_s":1.5,"site":%d}'
                     % (0x7f0000000000 + (i << 12), (live - i) * 64 + 4096, i % sites)
                     for i in range(start, min(live, start + 10000)))
            f.write(("," if start else "") + ",".join(chunk))
        f.write("]" + tail)

for name, live, sites in [("1M_live", 1_000_000, 40), ("200k_sites", 10, 200_000)]:
    report(os.path.join(tmp, name + ".json"), live, sites)
EOF
for name in 1M_live 200k_sites; do
  f=$TMP/$name.json
  : >"$TMP/runs"
  for _ in $(seq "$N"); do
    /usr/bin/time -f "%e %M" -o "$TMP/t" "$GG" show "$f" >/dev/null
    cat "$TMP/t" >>"$TMP/runs"
  done
  mid=$(((N + 1) / 2))
  t=$(sort -n -k1 "$TMP/runs" | awk '{ printf "%s ", $1 }')
  m=$(sort -n -k2 "$TMP/runs" | awk -v mid="$mid" 'NR == mid { print $2 }')
  set -- $t
  eval "median=\${$mid}"
  eval "last=\${$N}"
  printf '| show, %s (%d MB) | %.2f s [%.2f-%.2f] | %d MB |\n' "${name/_/ }" \
    "$(($(stat -c %s "$f") / 1000000))" "$median" "$1" "$last" "$((m / 1024))"
done
