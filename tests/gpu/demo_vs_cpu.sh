#!/bin/sh
# demo_vs_cpu.sh BIN WORK: the demo's training (examples/demo, stories260K's shape) on the
# GPU against the CPU, in fp32 and bf16-true: 12 steps on each device with the same options,
# every step's loss within 3e-2 relative (the GPU's fp32 products run in bf16; reductions
# are ordered differently), then a GPU checkpoint resumed on the CPU and a CPU one on the
# GPU, which must follow the same losses. Exit 77 without a GPU.
# demo_vs_cpu.sh BIN WORK emulated: BIN's ftk-train and ftk-generate are the ones on the
# host emulation of CUDA (build/tests/emu/bin, tests/gpu/emu): no GPU needed, and a smaller
# run (the tiny preset, rows of 128, 4 steps of 2 rows, stopped after 2), which that
# emulation runs in minutes.
set -u
BIN=$1 WORK=$2 EMU=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu # the runs without --device cuda: on the CPU (ftk-train's default is cuda here)
. "$ROOT/tests/cli/lib.sh"
# each run's seconds go to the log (a bf16-true CUDA checkpoint resumed on the CPU outran the
# step's limit once on an H200: which run is slow?)
t_expect() {
    t0=$(date +%s)
    expect "$@"
    echo "     ($(($(date +%s) - t0)) s)"
}
if [ "$EMU" = emulated ]; then
    DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
    PRESET=tiny LEN=128 STEPS=4 STOP=2 SHAPE="--global-batch 4 --micro-batch 2 --save-every 2"
else
    "$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1 || { echo "skipped (no GPU)"; exit 77; }
    PRESET=stories260k LEN=256 STEPS=12 STOP=8 SHAPE="--global-batch 8 --micro-batch 4 --save-every 4"
fi
demo_pack "$WORK/demo.h5" $LEN || exit 1
demo_init "$WORK/init.h5" $PRESET 42 || exit 1
T="$BIN/ftk-train -q -m $WORK/init.h5 -d $WORK/demo.h5 $SHAPE --lr 2e-3 --warmup 2 --eval-every 0 --steps $STEPS"
for p in fp32 bf16-true; do
    t_expect "$p: cpu, $STEPS steps" 0 $T --precision $p -o "$WORK/cpu-$p"
    t_expect "$p: cuda, $STEPS steps" 0 $T --precision $p -o "$WORK/cu-$p" --device cuda
    close_losses "$p: cuda losses follow the CPU's" "$WORK/cu-$p" "$WORK/cpu-$p" 3e-2 $STEPS
    t_expect "$p: cuda, stop after $STOP" 75 $T --precision $p -o "$WORK/x-$p" --stop-after $STOP --device cuda
    t_expect "$p: resumed on the CPU" 0 $T --precision $p -o "$WORK/x-$p" --resume auto
    close_losses "$p: cuda -> cpu follows the CPU's losses" "$WORK/x-$p" "$WORK/cpu-$p" 3e-2 $STEPS
    t_expect "$p: cpu, stop after $STOP" 75 $T --precision $p -o "$WORK/y-$p" --stop-after $STOP
    t_expect "$p: resumed on cuda" 0 $T --precision $p -o "$WORK/y-$p" --resume auto --device cuda
    close_losses "$p: cpu -> cuda follows the CPU's losses" "$WORK/y-$p" "$WORK/cpu-$p" 3e-2 $STEPS
done
expect "generate on cuda from the cuda run" 0 "$BIN/ftk-generate" -m "$WORK/cu-bf16-true" --device cuda \
    -p "Name a colour." -n 20 --greedy
finish
