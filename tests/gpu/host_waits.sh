#!/bin/sh
# host_waits.sh BIN WORK: the host's waits for the device in a training step, counted by the
# host emulation of CUDA (FTK_EMU_STATS, tests/gpu/emu/emu_runtime.h; BIN is
# build/tests/emu/bin). A stream synchronize drains the queue: the device then idles until
# the host issues more. The step's drains must not grow with its micro-batches (no host
# wait inside the micro-batch loop: the arrays a micro-batch uploads are staged and queued),
# and there is one a step: the step's end, after the optimizer is queued (the clipping
# coefficient is computed on the device and the loss and Σg² come back in one copy queued
# before it; FTK_STEP, engine/trainer.h); FTK_STEP=none, the host's clipping, takes two
# (Σg² and the loss before AdamW, then the step's end). No step allocates or frees page-locked host memory either (cudaMallocHost
# and cudaFreeHost wait for the whole device): the upload slots are made once, whole. Runs
# of 2 and 3 steps (the first step also grows scratch buffers) with 1 and 2 micro-batches a
# step (rows of 64 tokens); the difference is what a step costs.
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
demo_pack "$WORK/demo.h5" 64 2>/dev/null || exit 1
demo_init "$WORK/init.h5" tiny 42 || exit 1
# waits MICRO STEPS: "stream synchronizes, pinned allocations + frees" of a run
waits() {
    rm -rf "$WORK/run" "$WORK/stats"
    FTK_EMU_STATS="$WORK/stats" "$BIN/ftk-train" -q -m "$WORK/init.h5" -d "$WORK/demo.h5" --global-batch 2 \
        --micro-batch "$1" --lr 2e-3 --warmup 2 --eval-every 0 --steps "$2" --no-save --precision bf16-true \
        -o "$WORK/run" --device cuda 2>"$WORK/err" &&
        sed -n 's/^stream_syncs \([0-9]*\) .* pinned_allocs \([0-9]*\) pinned_frees \([0-9]*\)$/\1 \2 \3/p' \
            "$WORK/stats" | { read -r s pa pf && echo "$s $((pa + pf))"; }
}
set -- $(waits 2 2) $(waits 2 3) $(waits 1 2) $(waits 1 3)
check "every run counted" [ $# -eq 8 ]
a=${1:-0} pa=${2:-0} b=${3:-0} pb=${4:-0} c=${5:-0} pc=${6:-0} d=${7:-0} pd=${8:-0}
echo "     stream synchronizes: 1 micro-batch a step: $a in 2 steps, $b in 3; 2 micro-batches: $c, $d"
one=$((b - a)) two=$((d - c))
echo "     a step: $one with 1 micro-batch, $two with 2"
check "no drain inside the micro-batch loop (the same a step for 1 and 2 micro-batches)" [ "$one" -eq "$two" ]
check "one a step" sh -c "[ $one -eq 1 ] && [ $two -eq 1 ]"
echo "     pinned host allocations and frees: $pa in 2 steps, $pb in 3; 2 micro-batches: $pc, $pd"
check "no pinned host memory allocated or freed in a step after the first" sh -c "[ $pa -eq $pb ] && [ $pc -eq $pd ]"
# the plain step (FTK_STEP=none): the host's clipping waits for Σg² before AdamW
set -- $(FTK_STEP=none waits 2 2) $(FTK_STEP=none waits 2 3)
echo "     FTK_STEP=none: ${1:-?} in 2 steps, ${3:-?} in 3"
check "two a step with FTK_STEP=none" [ $(( ${3:-0} - ${1:-0} )) -eq 2 ]
finish
