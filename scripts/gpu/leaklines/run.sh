#!/usr/bin/env bash
# Issue 12's GPU checks (the CPU parts are tested on the simulator). Needs PyTorch
# with CUDA; JAX and CuPy runs are in the older scripts/gpu/leaks scripts.
#   scripts/gpu/leaklines/run.sh OUTDIR
# For each PyTorch allocator mode: leak_small.py under gpuguard in default mode with
# snapshots every second, then gpuguard show over the series; checks (a) the first
# allocations carry Python frames, (b) the 64 KiB-a-step line is the first suspect,
# (c) no "(code no longer alive)" frame, and records (d) the step cost.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-target/leaklines}
mkdir -p "$out"
cargo build --release --quiet
gg=target/release/gpuguard
for mode in native "expandable_segments:True" "backend:cudaMallocAsync"; do
    d="$out/${mode//[:]/_}"
    rm -rf "$d" && mkdir -p "$d"
    PYTORCH_CUDA_ALLOC_CONF=$([ "$mode" = native ] || echo "$mode") GPUGUARD_DIR="$d" \
        GPUGUARD_SNAPSHOT_EVERY=1s "$gg" run -- python3 scripts/gpu/leaklines/leak_small.py 8 \
        >"$d/stdout.txt" 2>"$d/stderr.txt"
    "$gg" show "$d"/gpuguard.*.json >"$d/show.txt"
    python3 scripts/gpu/leaklines/check.py "$d" | tee "$d/check.json"
done
# (d) step cost: the recorder's own cost, and the process under gpuguard with and
# without the sampling windows (snapshots every second vs none).
python3 scripts/gpu/leaklines/step_cost.py >"$out/cost_recorder.json"
GPUGUARD_DIR="$out" GPUGUARD_SNAPSHOT_EVERY=1s "$gg" run -- python3 scripts/gpu/leaklines/step_cost.py >"$out/cost_sampling.json"
GPUGUARD_DIR="$out" "$gg" run -- python3 scripts/gpu/leaklines/step_cost.py >"$out/cost_default.json"
cat "$out"/cost_*.json
