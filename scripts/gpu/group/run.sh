#!/usr/bin/env bash
# The GPU check of issue 27: one budget for a group of processes.
#   scripts/gpu/group/run.sh OUTDIR
# Four PyTorch members (default allocator twice, expandable_segments,
# backend:cudaMallocAsync) in one group of BUDGET (40GiB) each take 1 GiB tensors up
# to 14 GiB (56 GiB asked in all); then: member e is SIGKILLed and b asks for more
# (it should get e's share); a drops 4 GiB of tensors into PyTorch's cache and c asks
# for more (the squeeze should have a trim it back); b releases 8 GiB (tensors and
# cache) and a JAX member joins (default preallocation: 75% of the memory it is
# shown, which should be what the group has left) and reports what it could take. A sampler records `gpuguard ps
# --json` and nvidia-smi's per-process memory every 0.25 s. check.py judges.
# Uses target/release/gpuguard and libgpuguard.so (GGV_CLI), built elsewhere.
set -uo pipefail
cd "$(dirname "$0")/../../.."
d=${1:-target/group-check}
rm -rf "$d" && mkdir -p "$d"
gg=${GGV_CLI:-$PWD/target/release/gpuguard}
here=scripts/gpu/group
mkdir -m 700 "$d/rt"
# The members' status files and the group's file in one private directory.
export GPUGUARD_STATUS_DIR=$PWD/$d/rt GPUGUARD_GROUP=gpucheck GPUGUARD_GROUP_CAP=${BUDGET:-40GiB}
[ "${d:0:1}" = / ] && export GPUGUARD_STATUS_DIR=$d/rt
(
    while [ ! -e "$d/stop.sampler" ]; do
        t=$(date +%s.%N)
        "$gg" ps --json 2>/dev/null | python3 -c "import sys,json;print(json.dumps({'t':$t,'ps':json.load(sys.stdin)}))" >>"$d/ps.jsonl" 2>/dev/null
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            sed "s/^/$t, /" >>"$d/smi.csv"
        sleep 0.25
    done
) &
sampler=$!
declare -A pid
start() { # NAME KIND TARGET [ENV...]
    local n=$1 k=$2 tg=$3
    shift 3
    mkdir -p "$d/$n"
    env "$@" GPUGUARD_DIR="$d/$n" "$gg" run -- python3 $here/member.py "$k" "$n" "$d" "$tg" \
        >"$d/$n/stdout.txt" 2>"$d/$n/stderr.txt" &
}
waitfile() { # polls for a member's answer (60 s at most); no answer ends the check
    for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done
    echo "group check: no $1 within 60 s" >&2
    touch "$d/stop.sampler"
    exit 1
}
start a torch 14 PYTORCH_CUDA_ALLOC_CONF=
start b torch 14 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
start c torch 14 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
start e torch 14 PYTORCH_CUDA_ALLOC_CONF=
for n in a b c e; do waitfile "$d/$n.ready"; done
"$gg" group gpucheck --json >"$d/group1.json" 2>&1
epid=$(python3 -c "import json;print(json.load(open('$d/e.ready'))['pid'])")
date +%s.%N >"$d/kill_time"
kill -9 "$epid"
echo more >>"$d/b.cmd"
waitfile "$d/b.more.1"
echo "drop 4" >>"$d/a.cmd"
waitfile "$d/a.drop.1"
echo more >>"$d/c.cmd"
waitfile "$d/c.more.1"
echo "release 8" >>"$d/b.cmd"
waitfile "$d/b.release.1"
"$gg" group gpucheck --json >"$d/group2.json" 2>&1
start j jax 8
waitfile "$d/j.ready"
"$gg" group gpucheck --json >"$d/group3.json" 2>&1
for n in a b c j; do echo stop >>"$d/$n.cmd"; done
wait $(jobs -p | grep -v "^$sampler$") 2>/dev/null
touch "$d/stop.sampler"
wait
python3 $here/check.py "$d" | tee "$d/check.json"
