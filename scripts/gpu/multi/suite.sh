# Suites "multi" and "multi-soak" of scripts/gpu/validate.sh (sourced; runs with
# lib/common.sh): issue 15, two GPUs (machine kind nvidia-h200-x2). The workloads and
# their judges are in scripts/gpu/multi/ (multi_check.py's header lists every check).
#
#   multi        run 1: one process, two devices, GPUGUARD_CAP=0:4GiB,1:8GiB: PyTorch
#                in three allocator modes (torch_default, torch_expandable,
#                torch_cudaMallocAsync; a 0 -> 1 -> 0 peer copy in each) and JAX
#                (jax_prealloc);                                       (~4 x 40 s)
#                run 2: CUDA_VISIBLE_DEVICES=1 and =1,0 (remap)         (~40 s)
#                run 3: torchrun --nproc_per_node=2 DDP, a leak on rank 1, snapshots,
#                `gpuguard trim` of rank 0, a cap per rank (torchrun_ranks) (~90 s)
#   multi-soak   run 4: both GPUs for GGV_MULTI_SOAK_S (default 540, cut to the
#                budget) with report/trim signals, guarded next to bare
#
# Knobs: GGV_MULTI_BUDGET_S (default 520), GGV_MULTI_CAPS (run 1, default
# 0:4GiB,1:8GiB), GGV_MULTI_RANK_CAPS (run 3, default 0:20GiB,1:24GiB),
# GGV_MULTI_SNAPSHOT (run 3, default 2s), GGV_MULTI_SOAK_S, GGV_ONLY (torch_default
# torch_expandable torch_cudaMallocAsync jax_prealloc remap torchrun_ranks).
# torchrun runs with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink
# multicast stays off).

MULTI=$ROOT/scripts/gpu/multi

# multi_gpus: how many GPUs nvidia-smi lists.
multi_gpus() { timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU '; }

# multi_step NAME MAX_S ARGS...: multi_check.py ARGS with --dir, --summary, --timeout cut
# to the suite's budget; a SKIP row when too little is left.
multi_step() {
  local name=$1 max=$2 t
  shift 2
  wanted "$name" || return 0
  section "multi: $name"
  t=$(left_s)
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt 30 ]; then
    echo "$name: SKIPPED (time budget spent, ${t}s left)"
    printf '{"group": "multi", "workload": "%s", "check": "run", "status": "SKIP", "detail": "time budget spent"}\n' \
      "$name" >>"$SUMMARY"
    return 0
  fi
  timeout -k 10 $((t + 20)) "$PY" "$MULTI/multi_check.py" "$@" --dir "$SW/runs/$name" --lib "$LIB" --cli "$CLI" \
    --summary "$SUMMARY" --timeout "$t"
}

suite_multi() {
  suite_begin multi 520
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local n
  n=$(multi_gpus)
  echo "GPUs: $n (issue 15 needs 2; with fewer every workload says SKIP)"
  local m
  for m in default expandable cudaMallocAsync; do
    multi_step "torch_$m" 90 torch --mode "$m"
  done
  multi_step jax_prealloc 90 jax
  multi_step remap 120 remap
  multi_step torchrun_ranks 200 ranks
  section "multi: table"
  "$PY" "$GGV_PY" table --summary "$SUMMARY" --title "gpuguard on two GPUs (issue 15)"
  return 0
}

suite_multi_soak() {
  suite_begin multi-soak "${GGV_MULTI_SOAK_BUDGET_S:-580}"
  local dur=${GGV_MULTI_SOAK_S:-540} left
  left=$(($(left_s) - 40))
  [ "$dur" -gt "$left" ] && dur=$left
  if [ "$dur" -lt 60 ]; then
    echo "multi-soak: SKIPPED (only ${dur}s left)"
    printf '{"group": "multi", "workload": "soak", "check": "run", "status": "SKIP", "detail": "time budget spent"}\n' \
      >>"$SUMMARY"
    return 0
  fi
  section "multi-soak: ${dur}s on both GPUs, guarded and bare at once"
  timeout -k 10 $((dur + 150)) "$PY" "$MULTI/multi_check.py" soak --dir "$SW/runs/soak" --lib "$LIB" \
    --summary "$SUMMARY" --seconds "$dur"
  section "multi-soak: table"
  "$PY" "$GGV_PY" table --summary "$SUMMARY" --title "gpuguard two-GPU soak (issue 15)"
  return 0
}
