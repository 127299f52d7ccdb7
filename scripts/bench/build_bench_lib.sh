#!/usr/bin/env bash
# The benchmark build of the library: the release library plus the switch the
# in-process A/B training measurement pauses the books with (`gpuguard_bench_set_books`,
# cargo feature `bench`), which the release library users preload does not have.
#
#   bash scripts/bench/build_bench_lib.sh      -> target/bench-lib/release/libgpuguard.so
#
# It differs from target/release/libgpuguard.so by the switch alone: one relaxed load
# of the hot line in each driver hook (`bench_switch::paused`) and the sampler's check
# for a resumption. Carry it to the GPU machine beside the release build for the
# `bench-train` suite and MICROBENCH_PAUSE=1.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
CARGO_TARGET_DIR=$ROOT/target/bench-lib cargo build --release --lib --features bench
echo "$ROOT/target/bench-lib/release/libgpuguard.so"
