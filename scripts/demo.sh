#!/usr/bin/env bash
# gpuguard's main job on a machine without a GPU: build gpuguard and the bundled
# simulated CUDA driver, run a small "training loop" under gpuguard on it, ask for a
# report while it runs (kill -USR1), and read the leak report written at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet
sim=target/release/simcuda-demo
sh tests/sim/build.sh "$sim" >/dev/null
reports=target/demo-reports
rm -rf "$reports" && mkdir -p "$reports"

echo "== running hello_gpu under gpuguard (simulated driver, reports in $reports)"
LD_LIBRARY_PATH="$sim" GPUGUARD_DIR="$reports" \
    target/release/gpuguard run -- "$sim/hello_gpu" 10 &
pid=$!
sleep 0.5
echo "== kill -USR1 $pid (a report while it runs)"
kill -USR1 "$pid"
wait "$pid"

echo
echo "== gpuguard show $reports/*.exit.json"
target/release/gpuguard show "$reports"/*.exit.json
