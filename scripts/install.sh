#!/bin/sh
# Builds gpuguard in release mode and installs it under a prefix:
#   PREFIX/bin/gpuguard  and  PREFIX/lib/libgpuguard.so
# Usage: scripts/install.sh [PREFIX]    (default: ~/.local)
# The command finds the library in ../lib from its own folder, so the pair works
# wherever PREFIX is; `gpuguard lib` prints the library's path.
set -eu
prefix=${1:-"$HOME/.local"}
cd "$(dirname "$0")/.."
cargo build --release --bin gpuguard --lib
target=${CARGO_TARGET_DIR:-target}/release
install -d "$prefix/bin" "$prefix/lib"
install -m 0755 "$target/gpuguard" "$prefix/bin/gpuguard"
install -m 0755 "$target/libgpuguard.so" "$prefix/lib/libgpuguard.so"
echo "installed $prefix/bin/gpuguard and $prefix/lib/libgpuguard.so"
case ":$PATH:" in
*":$prefix/bin:"*) ;;
*) echo "note: $prefix/bin is not on PATH" ;;
esac
