#!/usr/bin/env bash
# The GPU check of issue 28: two PyTorch jobs (default allocator and
# expandable_segments) and one JAX job (XLA_PYTHON_CLIENT_PREALLOCATE=false, and one
# with JAX's default preallocation) under gpuguard, scraped by `gpuguard metrics`.
#   scripts/gpu/metrics/run.sh OUTDIR
# Each job settles (its framework's counters in NAME.ready), then: a scrape, a report
# by SIGUSR1 to each job, a second scrape; check.py compares each process's
# gpuguard_live_bytes with its report's live bytes and its framework's counter.
set -uo pipefail
cd "$(dirname "$0")/../../.."
d=${1:-target/metrics}
rm -rf "$d" && mkdir -p "$d"
gg=${GGV_CLI:-$PWD/target/release/gpuguard}
here=scripts/gpu/metrics
port=${METRICS_PORT:-9464}
"$gg" metrics --listen 127.0.0.1:$port >"$d/exporter_stdout.txt" 2>"$d/exporter_stderr.txt" &
exporter=$!
pids=()
start() { # NAME SCRIPT GIB [ENV...]
    local name=$1 script=$2 gib=$3
    shift 3
    mkdir -p "$d/$name"
    env "$@" GPUGUARD_DIR="$d/$name" "$gg" run -- python3 "$script" "$gib" "$d" "$name" \
        >"$d/$name/stdout.txt" 2>"$d/$name/stderr.txt" &
    pids+=($!)
}
start torch_a $here/job_torch.py 3 PYTORCH_CUDA_ALLOC_CONF=
start torch_b $here/job_torch.py 2 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
start jax $here/job_jax.py 2 XLA_PYTHON_CLIENT_PREALLOCATE=false
start jax_prealloc $here/job_jax.py 1
for _ in $(seq 900); do
    n=$(ls "$d"/*.ready 2>/dev/null | wc -l)
    [ "$n" -ge 4 ] && break
    sleep 0.1
done
sleep 2.5 # the status files are rewritten every second
scrape() { python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=10).read().decode())" >"$1"; }
scrape "$d/scrape1.txt"
for n in torch_a torch_b jax jax_prealloc; do
    kill -USR1 "$(python3 -c "import json;print(json.load(open('$d/$n.ready'))['pid'])")"
done
for _ in $(seq 100); do
    n=$(ls "$d"/*/gpuguard.*.signal.json 2>/dev/null | wc -l)
    [ "$n" -ge 4 ] && break
    sleep 0.1
done
sleep 2.5
scrape "$d/scrape2.txt"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$d/nvidia_smi.txt"
touch "$d/stop"
wait "${pids[@]}"
kill $exporter
wait $exporter 2>/dev/null
python3 $here/check.py "$d" | tee "$d/check.json"
