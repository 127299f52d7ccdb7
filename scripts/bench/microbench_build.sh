# Sourced by bar.sh and group_bar.sh: builds what they run, into $BUILD (log in
# $BUILD/build.log): the library (unless SKIP_BUILD=1), the simulated driver and
# scripts/bench/microbench.c against it. Needs ROOT, BUILD, LIB and NAME (for
# messages) set, and the repository root as the working directory; exits 1 on a
# failed step.
mkdir -p "$BUILD"
LOG=$BUILD/build.log
: >"$LOG"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --lib >>"$LOG" 2>&1 || { echo "$NAME: cargo build failed (see $LOG)" >&2; exit 1; }
fi
[ -f "$LIB" ] || { echo "$NAME: missing $LIB" >&2; exit 1; }
sh tests/sim/build.sh "$BUILD/sim" >>"$LOG" 2>&1 || { echo "$NAME: sim build failed (see $LOG)" >&2; exit 1; }
cc -O2 -g -fno-omit-frame-pointer -I tests/sim -o "$BUILD/microbench" scripts/bench/microbench.c \
  -L"$BUILD/sim" -Wl,-rpath,"$BUILD/sim" -lcuda -ldl -lpthread >>"$LOG" 2>&1 ||
  { echo "$NAME: microbench build failed (see $LOG)" >&2; exit 1; }
