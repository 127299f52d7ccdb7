#!/usr/bin/env bash
# The GPU check of issue 29: out of memory, explained.
#   scripts/gpu/oom/run.sh OUTDIR [WORKLOAD...]
# WORKLOAD: torch_native torch_expandable torch_async jax jax_prealloc cupy (default: all).
# For each: a guarded PyTorch process (hog.py) holds HOG_GIB (default 110) GiB of the
# GPU; the workload's script runs bare (its twin, for stderr), then under `gpuguard run`
# and takes memory until its framework raises out-of-memory; check.py judges the `oom`
# report: (a) one exists and names the script's OOM-LINE, (b) this process's split
# (in use vs cached) is there, (c) the hog is among the others with NVML's figure and
# its status file (guarded, program), (d) the one stderr line is there, (e) no stderr
# line the bare twin lacks but gpuguard's. jax runs with XLA_PYTHON_CLIENT_PREALLOCATE=false
# (the pool grows, the driver refuses); jax_prealloc with JAX's default preallocation.
# Uses target/release/gpuguard and libgpuguard.so (GGV_CLI), built elsewhere with cargo.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-target/oom}
shift || true
mkdir -p "$out"
gg=${GGV_CLI:-$PWD/target/release/gpuguard}
[ -x "$gg" ] || { echo "no gpuguard at $gg: cargo build --release first" >&2; exit 2; }
here=scripts/gpu/oom
all=(torch_native torch_expandable torch_async jax jax_prealloc cupy)
[ $# -gt 0 ] && all=("$@")
one() { # NAME SCRIPT [ENV...]
    local name=$1 script=$2 d="$out/$1" hog
    shift 2
    rm -rf "$d" && mkdir -p "$d/hog"
    GPUGUARD_DIR="$d/hog" "$gg" run -- python3 $here/hog.py "${HOG_GIB:-110}" "$d" \
        >"$d/hog_stdout.txt" 2>"$d/hog_stderr.txt" &
    hog=$!
    for _ in $(seq 600); do [ -e "$d/hog.ready" ] && break; sleep 0.1; done
    env "$@" python3 "$script" >"$d/bare_stdout.txt" 2>"$d/bare_stderr.txt"
    env "$@" GPUGUARD_DIR="$d" "$gg" run -- python3 "$script" >"$d/stdout.txt" 2>"$d/stderr.txt"
    echo "$name: run exit $?"
    touch "$d/hog.stop"
    wait $hog
    "$gg" show "$d"/gpuguard.*.oom.json >"$d/show.txt" 2>&1
    python3 $here/check.py "$d" "$script" | tee "$d/check.json"
}
for w in "${all[@]}"; do
    case $w in
        torch_native) one "$w" $here/oom_torch.py PYTORCH_CUDA_ALLOC_CONF= ;;
        torch_expandable) one "$w" $here/oom_torch.py PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
        torch_async) one "$w" $here/oom_torch.py PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
        jax) one "$w" $here/oom_jax.py XLA_PYTHON_CLIENT_PREALLOCATE=false ;;
        jax_prealloc) one "$w" $here/oom_jax.py ;;
        cupy) one "$w" $here/oom_cupy.py ;;
        *) echo "unknown workload $w" >&2 ;;
    esac
done
