#!/bin/sh
# step_switches.sh BIN WORK [emulated]: FTK_STEP's savings (engine/trainer.h: the clipping
# coefficient on the device with one host wait a step, no gradient memset, the next rows
# read while the device works, Σg² on a second stream) change no bit.
#   BIN (bin/): on the CPU, fp32, bf16-mixed and bf16-true, 6 steps of 8 rows in
#     micro-batches of 2 (gradient accumulation) across an epoch's end (36 rows: a short
#     step, where the prefetch stops) with clipping in effect: every switch alone and all of
#     them give the losses, gradient norms and checkpoint bytes of FTK_STEP=none; a run
#     stopped after 3 steps and resumed gives the uninterrupted run's checkpoint bytes.
#   emulated (BIN is build/tests/emu/bin: the CUDA backend on the host emulation, slow):
#     bf16-true, 2 steps of 2 rows in micro-batches of 1, FTK_STEP=all and sumsq_overlap
#     against none (the same bits), all against the CPU (within 1e-3: the products' own
#     rounding).
set -u
BIN=$1 WORK=$2 MODE=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
demo_pack "$WORK/demo.h5" 128 || exit 1
demo_init "$WORK/init.h5" tiny 42 || exit 1
if [ "$MODE" = emulated ]; then
    SHAPE="--global-batch 2 --micro-batch 1" STEPS=2 PRECISIONS=bf16-true SWITCHES="all sumsq_overlap"
else
    SHAPE="--global-batch 8 --micro-batch 2" STEPS=6 PRECISIONS="fp32 bf16-mixed bf16-true"
    SWITCHES="all device_clip first_write prefetch sumsq_overlap"
fi
# train DIR PRECISION DEVICE FTK_STEP [ARGS...]: "STEP LOSS NORM" lines in DIR.loss, the
# last checkpoint's shard bytes' cksum in DIR.sum; the exit status
train() {
    dir=$1 prec=$2 dev=$3 st=$4
    shift 4
    b=$BIN
    [ "$dev" = cpu ] && [ "$MODE" = emulated ] && b=$ROOT/bin # the emulation's CPU reference
    FTK_STEP=$st "$b/ftk-train" -q -m "$WORK/init.h5" -d "$WORK/demo.h5" $SHAPE --lr 2e-3 --warmup 1 \
        --eval-every 0 --steps $STEPS --clip 0.05 --precision "$prec" --device "$dev" -o "$dir" "$@" 2>"$dir.err"
    rc=$?
    grep '"loss"' "$dir/metrics.jsonl" 2>/dev/null |
        sed 's/.*"step": \([0-9]*\), "loss": \([0-9.e+-]*\).*"grad_norm": \([0-9.e+-]*\).*/\1 \2 \3/' >"$dir.loss"
    cat "$dir"/step-$(printf %08d $STEPS)/shard-*.h5 2>/dev/null | cksum >"$dir.sum"
    return $rc
}
DEV=cpu
[ "$MODE" = emulated ] && DEV=cuda
for prec in $PRECISIONS; do
    r=$WORK/$prec-$DEV
    train "$r-none" $prec $DEV none
    check "$prec $DEV: FTK_STEP=none trains $STEPS steps" [ "$(wc -l <"$r-none.loss")" -eq $STEPS ]
    for st in $SWITCHES; do
        train "$r-$st" $prec $DEV $st
        check "$prec $DEV: FTK_STEP=$st = none (losses, norms, checkpoint bytes)" \
            sh -c "cmp -s '$r-$st.loss' '$r-none.loss' && cmp -s '$r-$st.sum' '$r-none.sum'"
    done
done
if [ "$MODE" = emulated ]; then
    train "$WORK/cpu" bf16-true cpu all
    paste "$WORK/bf16-true-cuda-all.loss" "$WORK/cpu.loss" | awk -v want=$STEPS '
        { for (k = 2; k <= 3; k++) { d = $k - $(k + 3); if (d < 0) d = -d; r = d / ($(k + 3) > 0 ? $(k + 3) : 1);
          if (r > w) w = r } n++ }
        END { printf "     %d steps, worst relative difference %.3g\n", n, w; exit !(n == want && w <= 1e-3) }' &&
        ok "the emulated GPU follows the CPU" || notok "the emulated GPU follows the CPU"
else
    r=$WORK/resume
    train "$r" bf16-true cpu all --stop-after 3
    check "stopped after 3 steps (exit 75)" [ $? -eq 75 ]
    train "$r" bf16-true cpu all --resume auto
    check "the resumed run's checkpoint = the uninterrupted run's" cmp -s "$r.sum" "$WORK/bf16-true-cpu-all.sum"
fi
finish
