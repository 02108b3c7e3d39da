#!/bin/sh
# nccl_vs_mpi.sh BIN WORK: 2-rank training on 2 GPUs (NCCL) against the same run on 2 MPI
# ranks on the CPU: the demo's shape (stories260K), 12 steps, every step's loss within 3e-2
# relative (the tolerance of demo_vs_cpu.sh: the GPU's fp32 products run in bf16), for
#   full fp32            all-gathers and reduce-scatters in f32
#   grad-op bf16-mixed   bf16 gathers of the working copy, f32 reductions
#   none bf16-true       bf16 all-reduces (DDP)
#   hybrid, groups of 1  the cross-group all-reduce (each rank a shard group of its own)
# then the full run stopped after 8 steps and resumed on 2 GPUs: the same losses.
# Exit 77 with fewer than 2 GPUs or without mpirun.
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
TO="timeout -k 5 100"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -lt 2 ]; then
    echo "skipped ($ngpu GPU(s): a 2-rank NCCL run needs two)"
    exit 77
fi
demo_pack "$WORK/demo.h5" 256 || exit 1
demo_init "$WORK/init.h5" stories260k 42 || exit 1
T="$BIN/ftk-train -q -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 --steps 12 --save-every 4"
i=0
for cfg in "full --precision fp32" "grad-op --precision bf16-mixed" "none --precision bf16-true" \
    "hybrid --shard-group-size 1 --precision fp32"; do
    i=$((i + 1))
    expect "cpu, 2 MPI ranks: --strategy $cfg" 0 $TO $MPI -np 2 $T --strategy $cfg -o "$WORK/cpu$i"
    expect "cuda, 2 NCCL ranks: --strategy $cfg" 0 $TO $MPI -np 2 $T --strategy $cfg -o "$WORK/cu$i" --device cuda
    [ -s "$WORK/err" ] && sed 's/^/     | /' "$WORK/err" | head -n 5
    close_losses "$cfg: the NCCL run follows the MPI run" "$WORK/cu$i" "$WORK/cpu$i" 3e-2 12
done
expect "cuda, 2 NCCL ranks, full: stop after 8" 75 $TO $MPI -np 2 $T --strategy full -o "$WORK/x" --stop-after 8 \
    --device cuda
expect "resumed on 2 NCCL ranks" 0 $TO $MPI -np 2 $T --strategy full -o "$WORK/x" --resume auto --device cuda
close_losses "the resumed NCCL run follows the MPI run" "$WORK/x" "$WORK/cpu1" 3e-2 12
finish
