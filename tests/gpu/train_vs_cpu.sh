#!/bin/sh
# train_vs_cpu.sh BIN WORK [emulated] [nccl]: the GPU bundle's short training checks
# (tests/gpu/bundle/run.sh, steps train and nccl), the demo's data (examples/demo):
#   train: ftk-train --device cuda against the CPU with the same options, fp32 and
#          bf16-true (the weight loader, the staged uploads, the device-side loss and Σg²):
#          every step's loss and gradient norm within 3e-2 relative (the GPU's fp32 products
#          run in bf16); then an fp32 GPU run stopped halfway and resumed on the CPU, which
#          must follow the CPU's losses
#   nccl:  one rank under mpirun (a 1-rank NCCL world) against one process alone, both
#          --device cuda: the same losses up to NCCL's copy (1e-6)
# Each run has its own time limit and prints its seconds (demo_vs_cpu.sh's bf16-true resume
# on the CPU outran its step once: which run is slow?). Stories260K's shape, rows of 256,
# 8 steps of 8 rows; emulated (BIN on the host emulation of CUDA): the tiny preset, rows of
# 128, 2 steps of one row, fp32 only. Without a GPU (and not emulated): exit 77.
set -u
BIN=$1 WORK=$2
shift 2
EMU="" NCCL=""
for a in "$@"; do
    case $a in emulated) EMU=emulated ;; nccl) NCCL=nccl ;; esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu # the runs without --device cuda: on the CPU
. "$ROOT/tests/cli/lib.sh"
if [ "$EMU" = emulated ]; then
    PRESET=tiny LEN=128 STEPS=2 STOP=1 SHAPE="--global-batch 1 --micro-batch 1 --save-every 1" LIM=300
    PRECISIONS=fp32
else
    "$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1 || { echo "skipped (no GPU)"; exit 77; }
    PRESET=stories260k LEN=256 STEPS=8 STOP=4 SHAPE="--global-batch 8 --micro-batch 4 --save-every 4" LIM=60
    PRECISIONS="fp32 bf16-true"
fi
# run LABEL CODE ARGS...: ftk-train under its limit, its seconds printed
run() {
    label=$1 code=$2
    shift 2
    t0=$(date +%s)
    expect "$label" "$code" timeout -k 5 $LIM "$@"
    echo "     ($(($(date +%s) - t0)) s)"
}
# close_norms NAME RUN_GOT RUN_WANT REL: every step's gradient norm within REL relative
close_norms() {
    for r in "$2" "$3"; do
        grep '"loss"' "$r/metrics.jsonl" | sed 's/.*"step": \([0-9]*\),.*"grad_norm": \([0-9.e+-]*\).*/\1 \2/'
        echo --
    done | awk -v tol="$4" '$0 == "--" { part++; next } part == 0 { got[$1] = $2; next }
        ($1 in got) { d = got[$1] - $2; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1); if (r > w) w = r; n++ }
        END { printf "     %d steps, worst relative difference %.3g\n", n, w; exit !(n > 0 && w <= tol) }' &&
        ok "$1" || notok "$1"
}
demo_pack "$WORK/demo.h5" $LEN || exit 1
demo_init "$WORK/init.h5" $PRESET 42 || exit 1
T="$BIN/ftk-train -q -m $WORK/init.h5 -d $WORK/demo.h5 $SHAPE --lr 2e-3 --warmup 1 --eval-every 0 --steps $STEPS"
if [ "$NCCL" = nccl ]; then
    need_mpi
    run "cuda, 1 rank under mpirun (NCCL)" 0 $MPI -np 1 $T -o "$WORK/one-mpi" --device cuda
    grep -q 'NCCL' "$WORK/err" && sed 's/^/     | /' "$WORK/err" | head -n 5
    run "cuda, 1 process alone" 0 $T -o "$WORK/one" --device cuda
    close_losses "the 1-rank NCCL world follows the process alone" "$WORK/one-mpi" "$WORK/one" 1e-6 $STEPS
    finish
    exit
fi
for p in $PRECISIONS; do
    run "$p: cpu, $STEPS steps" 0 $T --precision $p -o "$WORK/cpu-$p"
    run "$p: cuda, $STEPS steps" 0 $T --precision $p -o "$WORK/cu-$p" --device cuda
    close_losses "$p: the cuda losses follow the CPU's" "$WORK/cu-$p" "$WORK/cpu-$p" 3e-2 $STEPS
    close_norms "$p: the cuda gradient norms follow the CPU's" "$WORK/cu-$p" "$WORK/cpu-$p" 3e-2
done
run "fp32: cuda, stopped after $STOP" 75 $T --precision fp32 -o "$WORK/x" --stop-after $STOP --device cuda
run "fp32: the cuda checkpoint resumed on the CPU" 0 $T --precision fp32 -o "$WORK/x" --resume auto
close_losses "fp32: cuda -> cpu follows the CPU's losses" "$WORK/x" "$WORK/cpu-fp32" 3e-2 $STEPS
finish
