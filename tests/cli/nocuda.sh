#!/bin/sh
# nocuda.sh — ftk-train and ftk-generate of the CUDA build on a machine without the CUDA
# libraries (docs/gpu.md, "Without CUDA"). In a mount namespace (unshare) where libcudart and
# cuBLAS are hidden (the CUDA toolkit's library folders under empty folders, every libcudart*
# and libcublas* the loader's cache knows under an empty file):
#  - the CUDA backend's library (lib/libftk-cuda.so beside BIN) no longer resolves libcudart;
#  - ftk-train --help, --plan --device cuda and a 2-step training without --device (the CPU:
#    no GPU is seen) work, and so does ftk-generate;
#  - --device cuda exits 2 naming the missing library, and writes no run directory;
#  - ftk-generate copied away from lib/ works on the CPU, and --device cuda names where the
#    library was looked for.
# Exit 77 where this is not the CUDA build (no libftk-cuda.so beside BIN) or unshare is refused.
# Usage: tests/cli/nocuda.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${3:-}" != --inside ]; then
    SO=$BIN/../lib/libftk-cuda.so
    [ -f "$SO" ] || { echo "skipped (no $SO: not the CUDA build)"; exit 77; }
    . "$ROOT/tests/cli/ns.sh"
    need_unshare
    rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
    BIN=$(cd "$BIN" && pwd)
    WORK=$(cd "$WORK" && pwd)
    exec $NS sh "$0" "$BIN" "$WORK" --inside
fi

# --- inside the namespace
. "$ROOT/tests/cli/lib.sh"
SO=$BIN/../lib/libftk-cuda.so
. "$ROOT/tests/cli/ns.sh"
hidden=0
# the files first: a folder mounted over hides what is in it from the file loop
hide_paths "$WORK/hidden-by" $(ldconfig -p 2>/dev/null | awk '$1 ~ /^lib(cudart|cublas)/ {print $NF}') \
    /usr/local/cuda*/lib64/libcudart* /usr/local/cuda*/lib64/libcublas* \
    /usr/local/cuda*/targets/*/lib/libcudart* /usr/local/cuda*/targets/*/lib/libcublas*
hide_paths "$WORK/hidden-by" /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/local/cuda*/targets/*/lib
echo "hidden: $hidden files and folders"
check "libftk-cuda.so no longer finds libcudart" sh -c "ldd '$SO' 2>&1 | grep -q 'libcudart.*not found\|libcudart.*too short' ||
    ! ldd '$SO' >/dev/null 2>&1"
check "ftk-train does not need libcudart to start" sh -c "! ldd '$BIN/ftk-train' | grep -q 'libcudart\|libcublas'"

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/init.h5" tiny 1
expect "ftk-train --help" 0 "$BIN/ftk-train" --help
expect "ftk-generate --help" 0 "$BIN/ftk-generate" --help
expect "ftk-train --plan --device cuda" 0 "$BIN/ftk-train" --plan -m "$WORK/init.h5" -d "$WORK/demo.h5" --micro-batch 2 --device cuda
grep -q "device cuda" "$WORK/out" && ok "... a plan for device cuda" || notok "... a plan for device cuda"
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 4 --micro-batch 2 --lr 2e-3 --warmup 1 --eval-every 0 -j1 -q --steps 2"
expect "ftk-train, 2 steps, no --device (the CPU)" 0 $T -o "$WORK/run"
check "... wrote its run directory" test -d "$WORK/run"
expect "ftk-generate, no --device (the CPU)" 0 "$BIN/ftk-generate" -m "$WORK/init.h5" -p Hello -n 4 --greedy
check "... generated text" test -s "$WORK/out"

expect "ftk-train --device cuda: exit 2" 2 $T --device cuda -o "$WORK/run-cuda"
grep -q 'libcudart\|libcublas' "$WORK/err" && ok "... naming the missing library" ||
    { notok "... naming the missing library"; sed 's/^/     | /' "$WORK/err"; }
check "... no run directory" test ! -e "$WORK/run-cuda"
expect "ftk-generate --device cuda: exit 2" 2 "$BIN/ftk-generate" -m "$WORK/init.h5" -p Hello -n 4 --device cuda
grep -q 'libcudart\|libcublas' "$WORK/err" && ok "... naming the missing library" ||
    { notok "... naming the missing library"; sed 's/^/     | /' "$WORK/err"; }
# a tool apart from its lib/ (and, where none is installed, from any libftk-cuda.so): the
# same answers, --device cuda naming where it looked (or, installed, the missing library)
mkdir -p "$WORK/alone/bin" && cp "$BIN/ftk-generate" "$WORK/alone/bin/"
expect "ftk-generate without its lib/: no --device (the CPU)" 0 "$WORK/alone/bin/ftk-generate" -m "$WORK/init.h5" -p Hello -n 4 --greedy
expect "ftk-generate without its lib/: --device cuda, exit 2" 2 "$WORK/alone/bin/ftk-generate" -m "$WORK/init.h5" -p Hello -n 4 --device cuda
grep -q "libftk-cuda.so is not found (looked for $WORK/alone/bin/../lib/libftk-cuda.so\|libcudart\|libcublas" "$WORK/err" &&
    ok "... naming where it looked" || { notok "... naming where it looked"; sed 's/^/     | /' "$WORK/err"; }
finish
