#!/usr/bin/env bash
# Instructions per ledger operation (callgrind; exact and repeatable), with 0 and 100k
# live records, and the resident bytes per live record:
#
#   bash scripts/bench/ledger_ops.sh          (~1 minute)
#
# Each op runs twice, with N1 and N2 pairs; (Ir(N2) - Ir(N1)) / (N2 - N1) is the cost
# of one pair with start-up and the prefill cancelled out. See
# crates/core/examples/ledger_ops.rs for what each op does.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
N1=${N1:-2000}
N2=${N2:-22000}
OPS=${OPS:-"pair capped insert get"}
LIVES=${LIVES:-"0 100000"}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build -q --release -p gpuguard-core --example ledger_ops
BIN=$ROOT/target/release/examples/ledger_ops
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ir() {
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg" "$BIN" "$@" >/dev/null 2>"$TMP/err"
  sed -n 's/.*Collected : *\([0-9]*\).*/\1/p' "$TMP/err"
}
printf '%-8s %8s %10s\n' op live 'Ir/pair'
for live in $LIVES; do
  for op in $OPS; do
    [ "$op" = get ] && [ "$live" = 0 ] && continue
    a=$(ir "$op" "$N1" "$live")
    b=$(ir "$op" "$N2" "$live")
    printf '%-8s %8s %10.1f\n' "$op" "$live" "$(echo "($b - $a) / ($N2 - $N1)" | bc -l)"
  done
done
for live in 1000000; do "$BIN" mem 0 "$live"; done
