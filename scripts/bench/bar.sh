#!/usr/bin/env bash
# The bar: what gpuguard adds to an allocation+free pair, as ONE line, on the simulated
# driver (no GPU), in well under a minute:
#
#   bash scripts/bench/bar.sh
#   bar: added ns/pair, median of 5 rounds [min-max]: stacks-off pool +.. [..-..] | default pool +.. [..-..] | every stack pool +.. [..-..] (<commit>)
#
# Each round runs three processes in rotating order, stacks off
# (GPUGUARD_STACK_DEPTH=0), default settings, and every allocation's stack
# (GPUGUARD_STACK_RATE=all: a tight loop allocates far past the default rate, so the
# default figure is mostly the sampler's decision, and this one keeps the capture's
# own cost in sight), of scripts/bench/microbench.c; each
# times every path in blocks next to blocks of the same pairs through the sim's own
# functions and prints the median in-process delta (hooked - raw). The line gives the
# median of those medians over the rounds, and their range.
#
# Knobs: ROUNDS (5), ITERS (2500), REPS (7), PATHS (pool; e.g. pool,link), LIB (the build to
# measure; target/release/libgpuguard.so), SKIP_BUILD=1 (use the
# library already in target/release), BASE_LIB=/path/to/another/libgpuguard.so (e.g. a
# build of main: its processes are interleaved with this build's in every round and a
# second line gives its figures, so a regression shows against the same moment's load),
# THREADS (1: microbench's --threads), BAR_ENV (settings for every process, e.g.
# BAR_ENV="SIMCUDA_DEVICES=2 GPUGUARD_CAP=1:1TiB": a cap on device 1 makes the books
# direct, so device 0's pairs take the direct path uncapped).
# Exits 1 if anything failed to build or run.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-2500}
REPS=${REPS:-7}
PATHS=${PATHS:-pool}
THREADS=${THREADS:-1}
read -r -a EXTRA_ENV <<<"${BAR_ENV:-}"
BUILD=${BENCH_BUILD:-$ROOT/target/bench/bar}
LIB=${LIB:-$ROOT/target/release/libgpuguard.so}
NAME=bar
. scripts/bench/microbench_build.sh
REPORTS=$(mktemp -d /tmp/gg-bar.XXXXXX)
trap 'rm -rf "$REPORTS"' EXIT
export SIMCUDA_MEM=$((1 << 40)) SIMCUDA_DEVICES=1 GPUGUARD_DIR=$REPORTS GPUGUARD_LOG=warn
RES=$BUILD/results.txt
: >"$RES"
LIBS=("$LIB")
[ -n "${BASE_LIB:-}" ] && LIBS+=("$BASE_LIB")
NV=$((3 * ${#LIBS[@]}))
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((NV - 1))); do
    v=$(((k + r) % NV))
    lib=${LIBS[$((v / 3))]}
    case $((v % 3)) in
      0) depth=0; rate=1000; name=s0 ;;
      1) depth=16; rate=1000; name=s16 ;;
      *) depth=16; rate=all; name=all ;;
    esac
    [ $((v / 3)) = 1 ] && name=base_$name
    env ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"} LD_PRELOAD="$lib" GPUGUARD_STACK_DEPTH=$depth GPUGUARD_STACK_RATE=$rate \
      timeout 120 "$BUILD/microbench" --paths "$PATHS" --threads "$THREADS" \
      --iters "$ITERS" --reps "$REPS" --live 0 2>>"$BUILD/stderr.txt" | sed -n "s/^PATH /$name /p" >>"$RES"
  done
done
python3 - "$RES" "$ROUNDS" "$(git rev-parse --short HEAD 2>/dev/null)" <<'PY'
import statistics, sys
res, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = {}
for line in open(res):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    d.setdefault((f[0], kv["path"]), []).append(float(kv["delta_med"]))
if not d or any(len(v) != rounds for v in d.values()):
    print(f"bar: incomplete results in {res}", file=sys.stderr)
    sys.exit(1)
def part(v):
    ps = [p for (vv, p) in d if vv == v]
    return " ".join(
        f"{p} +{statistics.median(d[(v, p)]):.0f} [{min(d[(v, p)]):.0f}-{max(d[(v, p)]):.0f}]"
        for p in ps
    )
print(f"bar: added ns/pair, median of {rounds} rounds [min-max]: stacks-off {part('s0')} | "
      f"default {part('s16')} | every stack {part('all')} ({rev})")
if any(v.startswith("base_") for (v, _) in d):
    print(f"base: added ns/pair, median of {rounds} rounds [min-max]: stacks-off "
          f"{part('base_s0')} | default {part('base_s16')} | every stack {part('base_all')} "
          "(BASE_LIB)")
PY
