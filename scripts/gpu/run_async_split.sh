#!/usr/bin/env bash
# Issue 14, backend:cudaMallocAsync: the training overhead with default stacks and with
# stacks off (GPUGUARD_STACK_DEPTH=0), and the diagnostic timing build's per-phase
# split of the hooks (HOOKTIMES), in one device call. Everything lands in
# $OUT/async_split.tar.gz. Needs target/release/libgpuguard.so and
# target/timing/release/libgpuguard.so (cargo build --release --features hook-timing
# with CARGO_TARGET_DIR=target/timing).
#   NO_MEMOS_TOO=1 adds the timing build with its capture memos off; SKIP_STACKS_OFF=1
#   leaves out the stacks-off runs, SKIP_TIMING_STACKS_OFF=1 only the timing build's,
#   SKIP_TIMING=1 the timing build altogether.
#   AB_S (60) seconds of A/B blocks for each full build's run (OFF_S, default AB_S, for
#   its stacks-off run); TM_S (30) for the timing build's; TIMING_ENV: settings for the
#   timing build's first run (e.g. GPUGUARD_LOG=debug, which logs the capture counts).
#   ALSO_ENV=<settings>: one more run of this build with those settings (named "also"),
#   right after its default run (e.g. GPUGUARD_STACK_RATE=250).
#   BASE_LIB=<another build's libgpuguard.so, carried too>: its own default run right
#   after this build's, so two builds compare within one call (calls differ by more
#   than most changes are worth).
set -u
cd "$(dirname "$0")/../.." || exit 2
O=${OUT:-/tmp/ggv-out}/split
mkdir -p "$O"
AB_S=${AB_S:-60}
TM_S=${TM_S:-30}
run() { # name, ab seconds, extra env...
  local name=$1 ab=$2
  shift 2
  env "$@" GGV_BENCH_TRAIN_BLOCK_STEPS=1 GGV_ONLY=torch_async GGV_BENCH_TRAIN_AB_S="$ab" \
    GGV_BUDGET_S=$((ab + 50)) OUT="$O/$name" bash scripts/gpu/validate.sh bench-train >"$O/$name.log" 2>&1
  (cd "$O/$name" && tar xzf runs.tar.gz 2>/dev/null)
  grep -h "^ABR\|HOOKTIMES" "$O/$name"/bench_train.txt "$O/$name"/bench-train/runs/torch_async/stdout 2>/dev/null |
    sed "s/^/$name: /" | cut -c1-3000
}
TL=$PWD/target/timing/release/libgpuguard.so
run default "$AB_S"
[ -z "${ALSO_ENV:-}" ] || run also "$AB_S" GGV_BENCH_TRAIN_ENV="$ALSO_ENV"
[ -z "${BASE_LIB:-}" ] || run base_default "$AB_S" GGV_LIB="$BASE_LIB"
[ -n "${SKIP_STACKS_OFF:-}" ] || run stacks_off "${OFF_S:-$AB_S}" GGV_BENCH_TRAIN_ENV=GPUGUARD_STACK_DEPTH=0
[ -n "${SKIP_TIMING:-}" ] || run timing "$TM_S" GGV_LIB="$TL" ${TIMING_ENV:+GGV_BENCH_TRAIN_ENV="$TIMING_ENV"}
grep -rh "stack captures" "$O/timing" 2>/dev/null | head -1 | sed "s/^/timing: /"
[ -n "${SKIP_STACKS_OFF:-}${SKIP_TIMING_STACKS_OFF:-}${SKIP_TIMING:-}" ] || run timing_stacks_off "$((TM_S * 2 / 3))" GGV_LIB="$TL" GGV_BENCH_TRAIN_ENV=GPUGUARD_STACK_DEPTH=0
# The same timing build with the capture memos off (a diagnostic switch of that build).
[ -z "${NO_MEMOS_TOO:-}" ] || run timing_no_memos "$TM_S" GGV_LIB="$TL" GGV_BENCH_TRAIN_ENV=GPUGUARD_BENCH_NO_MEMOS=1
tar czf "${OUT:-/tmp/ggv-out}/async_split.tar.gz" -C "$O/.." split
