#!/usr/bin/env bash
# `gpuguard metrics` at fleet scale: one scrape of /metrics with 200 guarded
# processes' status files (2 devices each, labels, a suspected leak, a 2 KB
# argv as a training job has), wall time per scrape over N scrapes, the
# exporter serving on loopback. The processes are 200 `sleep`s, so the liveness
# check reads a real /proc/PID/stat each. Release build.
#
#   bash scripts/bench/metrics_scrape.sh                  (~10 s after the build)
#   N=500 PROCS=1000 bash scripts/bench/metrics_scrape.sh
#
# Prints one line for docs/performance.md, e.g.
#   | metrics scrape, 200 processes | 4.1 ms [3.8-5.0] p50 [p10-p90], max 6.2 ms |
# and the body's size. Needs curl and python3.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
N=${N:-200}
PROCS=${PROCS:-200}
command -v curl >/dev/null || { echo "metrics_scrape.sh: curl is needed" >&2; exit 2; }
if [ -z "${GG:-}" ]; then
  [ "${SKIP_BUILD:-0}" = 1 ] || cargo build -q --release --bin gpuguard
  GG=$ROOT/target/release/gpuguard
fi
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -m 700 "$TMP/status"
for _ in $(seq "$PROCS"); do
  sleep 600 &
  PIDS+=("$!")
done
python3 - "$TMP/status" "${PIDS[@]}" <<'PY'
import json, os, sys, time
d, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
now = int(time.time() * 1000)
for i, pid in enumerate(pids):
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    s = {
        "schema": "gpuguard-status/1", "gpuguard_version": "bench", "pid": pid,
        "program": "train.py", "argv": ["python", "train.py", "--config", "x" * 2000],
        "start_ticks": ticks, "started_unix_ms": now - 60000,
        "report_dir": "/scratch/job/reports", "updated_unix_ms": now,
        "devices": [{"device": dev, "live_bytes": (i + 1) << 30, "peak_bytes": (i + 2) << 30,
                     "cap_bytes": 80 << 30, "pool_held_bytes": 1 << 20,
                     "uuid": f"GPU-{i:08x}-0000-0000-0000-00000000000{dev}", "refusals": i % 3,
                     "framework_in_use_bytes": i << 29, "framework_cached_bytes": i << 28}
                    for dev in (0, 1)],
        "rank": i % 8, "labels": {"job": str(1000 + i // 8), "team": "vision"},
        "reports": 12, "trims": 1, "trim_released_bytes": 1 << 30,
        "top_suspect": {"line": "train.py:42 in step", "bytes_per_second": 1024.0 * i},
    }
    tmp = os.path.join(d, f".{pid}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(s, f)
    os.chmod(tmp, 0o600)
    os.rename(tmp, os.path.join(d, f"{pid}.json"))
PY
"$GG" metrics --listen 127.0.0.1:0 --status-dir "$TMP/status" 2>"$TMP/err" &
PIDS+=("$!")
PORT=
for _ in $(seq 200); do
  PORT=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/err" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.05
done
[ -n "$PORT" ] || { echo "metrics_scrape.sh: the exporter did not start" >&2; cat "$TMP/err" >&2; exit 1; }
URL=http://127.0.0.1:$PORT/metrics
curl -sf "$URL" -o "$TMP/body"
grep -q "^gpuguard_exporter_processes $PROCS\$" "$TMP/body" || {
  echo "metrics_scrape.sh: the scrape does not show $PROCS processes" >&2; grep exporter "$TMP/body" >&2; exit 1; }
for _ in $(seq "$N"); do
  curl -sf -o /dev/null -w '%{time_total}\n' "$URL"
done >"$TMP/times"
python3 - "$TMP/times" "$PROCS" "$(wc -c <"$TMP/body")" <<'PY'
import sys
t = sorted(float(x) * 1000 for x in open(sys.argv[1]))
q = lambda p: t[min(len(t) - 1, int(p * len(t)))]
print(f"| metrics scrape, {sys.argv[2]} processes | {q(0.5):.1f} ms [{q(0.1):.1f}-{q(0.9):.1f}] "
      f"p50 [p10-p90], max {t[-1]:.1f} ms, {len(t)} scrapes | body {int(sys.argv[3]) // 1024} KiB |")
PY
