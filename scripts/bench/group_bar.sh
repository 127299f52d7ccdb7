#!/usr/bin/env bash
# What a group (GPUGUARD_GROUP) adds to an allocation+free pair, on the simulated
# driver (no GPU), with 1, 2 and 4 processes in the group at once:
#
#   bash scripts/bench/group_bar.sh
#   group: added ns/pair beside no group, median of 5 rounds [min-max]: 1 process +.. [..] | 2 +.. [..] | 4 +.. [..]
#
# Each round runs, for N = 1, 2, 4, N processes of scripts/bench/microbench.c at once
# under default settings, once in one group (a budget they never reach: the hot path
# reserves against its lease) and once without, in alternating order; each process
# prints its median in-process delta (hooked - raw, ns per pool pair). A round's
# figure for N is the median over its group processes less the median over its
# no-group ones; the line gives the median of those over the rounds and their range.
# The bar: at most 150 ns, flat from 1 to 4 processes.
#
# Knobs: ROUNDS (5), ITERS (2500), REPS (7), PATHS (pool), LIB (the build to measure;
# target/release/libgpuguard.so), SKIP_BUILD=1 (the library already built). Exits 1
# if anything failed to build or run.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-2500}
REPS=${REPS:-7}
PATHS=${PATHS:-pool}
BUILD=${BENCH_BUILD:-$ROOT/target/bench/group}
LIB=${LIB:-$ROOT/target/release/libgpuguard.so}
NAME=group_bar
. scripts/bench/microbench_build.sh
TMP=$(mktemp -d /tmp/gg-group-bar.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -m 700 "$TMP/run"
export SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=1 GPUGUARD_DIR=$TMP GPUGUARD_LOG=warn GPUGUARD_STATUS_DIR=$TMP/run
RES=$BUILD/results.txt
: >"$RES"
batch() { # N, with-group (0/1), round
  local n=$1 g=$2 r=$3 i pids=()
  for i in $(seq 1 "$n"); do
    if [ "$g" = 1 ]; then
      GPUGUARD_GROUP=bar-$r-$n GPUGUARD_GROUP_CAP=512GiB LD_PRELOAD=$LIB timeout 120 "$BUILD/microbench" \
        --paths "$PATHS" --iters "$ITERS" --reps "$REPS" --live 0 >"$TMP/out.$i" 2>>"$BUILD/stderr.txt" &
    else
      LD_PRELOAD=$LIB timeout 120 "$BUILD/microbench" --paths "$PATHS" --iters "$ITERS" --reps "$REPS" \
        --live 0 >"$TMP/out.$i" 2>>"$BUILD/stderr.txt" &
    fi
    pids+=($!)
  done
  local p rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" = 0 ] || return 1
  for i in $(seq 1 "$n"); do
    sed -n "s/^PATH /$r $n $g /p" "$TMP/out.$i" >>"$RES"
  done
}
for r in $(seq 1 "$ROUNDS"); do
  for n in 1 2 4; do
    if [ $((r % 2)) = 1 ]; then order="1 0"; else order="0 1"; fi
    for g in $order; do
      batch "$n" "$g" "$r" || { echo "group_bar: a run failed (see $BUILD/stderr.txt)" >&2; exit 1; }
    done
  done
done
python3 - "$RES" "$ROUNDS" "$(git rev-parse --short HEAD 2>/dev/null)" <<'PY'
import statistics, sys
res, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = {}
for line in open(res):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
    d.setdefault((int(f[0]), int(f[1]), int(f[2])), []).append(float(kv["delta_med"]))
parts = []
for n in (1, 2, 4):
    diffs = []
    for r in range(1, rounds + 1):
        if any(len(d.get((r, n, g), [])) != n for g in (0, 1)):
            print(f"group_bar: incomplete results in {res}", file=sys.stderr)
            sys.exit(1)
        diffs.append(statistics.median(d[(r, n, 1)]) - statistics.median(d[(r, n, 0)]))
    parts.append(f"{n} process{'es' if n > 1 else ''} {statistics.median(diffs):+.0f} [{min(diffs):+.0f}..{max(diffs):+.0f}]")
print(f"group: added ns/pair beside no group, median of {rounds} rounds [min..max]: " + " | ".join(parts) + f" ({rev})")
PY
