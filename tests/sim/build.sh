#!/bin/sh
# Builds the simulated CUDA stack (driver, runtime, NVML) and the test programs into OUTDIR
# (default: target/simcuda/manual). The Rust harness (tests/common/mod.rs)
# runs the same commands itself; this script is for trying things by hand:
#   sh tests/sim/build.sh /tmp/sim && LD_LIBRARY_PATH=/tmp/sim /tmp/sim/gg link
set -eu
here=$(cd "$(dirname "$0")" && pwd)
progs="$here/../progs"
out=${1:-"$here/../../target/simcuda/manual"}
cc=${CC:-cc}
mkdir -p "$out"
cflags="-O1 -g -Wall -Wextra -fno-omit-frame-pointer -I$here"
# $ORIGIN: libraries and programs find each other wherever the folder goes.
$cc $cflags -fPIC -shared -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$here/cuda_sim.c" -lpthread
ln -sf libcuda.so.1 "$out/libcuda.so"
$cc $cflags -fPIC -shared -Wl,-soname,libcudart.so.13 -Wl,-rpath,'$ORIGIN' \
    -o "$out/libcudart.so.13" "$here/cudart_sim.c" -ldl -lpthread
ln -sf libcudart.so.13 "$out/libcudart.so"
$cc $cflags -fPIC -shared -Wl,-soname,libnvidia-ml.so.1 -o "$out/libnvidia-ml.so.1" "$here/nvml_sim.c" -ldl -lpthread
ln -sf libnvidia-ml.so.1 "$out/libnvidia-ml.so"
link="-rdynamic -L$out -Wl,-rpath,\$ORIGIN"
$cc $cflags $link -o "$out/gg" "$progs/gg.c" -lcuda -lcudart -ldl -lpthread
$cc $cflags $link -o "$out/gg_dl" "$progs/gg_dl.c" -ldl -lpthread
$cc $cflags $link -o "$out/gg_rt" "$progs/gg_rt.c" -lcudart -ldl -lpthread
$cc $cflags $link -o "$out/hello_gpu" "$progs/hello_gpu.c" -lcudart
$cc $cflags $link -o "$out/gg_cap" "$progs/gg_cap.c" -lcuda -lcudart -lnvidia-ml -ldl -lpthread
$cc $cflags $link -o "$out/gg_nvml" "$progs/gg_nvml.c" -lnvidia-ml -ldl
$cc $cflags $link -o "$out/gg_multi" "$progs/gg_multi.c" -lcuda -lcudart -lnvidia-ml -ldl -lpthread
$cc $cflags $link -o "$out/gg_graph" "$progs/gg_graph.c" -lcuda -ldl -lpthread
$cc $cflags $link -o "$out/gg_group" "$progs/gg_group.c" -lcuda -lcudart -ldl -lpthread
# Built -O2 (tests/symbols.rs does the same): a function there is always inlined.
$cc $cflags -O2 $link -o "$out/gg_inline" "$progs/gg_inline.c" -lcuda -ldl
echo "$out"
