#!/usr/bin/env bash
# Issue 14's 2-thread target on the simulated driver: what gpuguard adds to a pool
# pair per thread with 2 threads on 1 device and on 2 devices (stacks off), as the
# in-process delta (hooked - raw) of scripts/bench/microbench.c, ROUNDS (9) rounds of
# bare and gpuguard processes alternated; each library in LIBS (default: this build)
# is one more process per round. Prints the median [min-max] per (devices, library).
#   LIBS="/tmp/old.so target/release/libgpuguard.so" bash scripts/bench/two_threads.sh
# Needs the microbench that scripts/bench/bar.sh builds (target/bench/bar/microbench).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${BENCH_BUILD:-$ROOT/target/bench/bar}
[ -x "$B/microbench" ] || { echo "two_threads: run scripts/bench/bar.sh first (builds $B/microbench)" >&2; exit 1; }
LIBS=${LIBS:-$ROOT/target/release/libgpuguard.so}
ROUNDS=${ROUNDS:-9}
REPORTS=$(mktemp -d /tmp/gg-two.XXXXXX)
trap 'rm -rf "$REPORTS"' EXIT
export SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=2 GPUGUARD_DIR=$REPORTS GPUGUARD_LOG=warn GPUGUARD_STACK_DEPTH=0
out=$(for r in $(seq 1 "$ROUNDS"); do
  for d in 1 2; do
    for v in bare $LIBS; do
      pre=$v
      [ "$v" = bare ] && pre=
      x=$(LD_PRELOAD=$pre "$B/microbench" --threads 2 --devices "$d" --paths pool --reps 3 --iters 20000 2>/dev/null |
        sed -n 's/^PATH .*delta_med=\([-0-9.]*\).*/\1/p')
      echo "$d $v ${x:-nan}"
    done
  done
done)
echo "$out" | python3 -c '
import collections, statistics, sys
d = collections.defaultdict(list)
for line in sys.stdin:
    dev, lib, x = line.split()
    if x != "nan":
        d[(dev, lib)].append(float(x))
for (dev, lib), v in sorted(d.items()):
    print("two_threads: devices=%s %s: %+.0f ns [%.0f..%.0f] (%d rounds)" % (dev, lib, statistics.median(v), min(v), max(v), len(v)))
'
