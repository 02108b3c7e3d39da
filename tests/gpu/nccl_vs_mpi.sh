#!/bin/sh
# nccl_vs_mpi.sh BIN WORK: 2-rank training on 2 GPUs (NCCL) against the same run on 2 MPI
# ranks on the CPU: the demo's shape (stories260K), 12 steps, every step's loss within 3e-2
# relative (the tolerance of demo_vs_cpu.sh: the GPU's fp32 products run in bf16), for
#   full fp32            all-gathers and reduce-scatters in f32
#   grad-op bf16-mixed   bf16 gathers of the working copy, f32 reductions
#   none bf16-true       bf16 all-reduces (DDP)
#   hybrid, groups of 1  the cross-group all-reduce (each rank a shard group of its own)
# then the full run stopped after 8 steps and resumed on 2 GPUs: the same losses. First, on
# one GPU: one rank under mpirun (a 1-rank NCCL world) against one process alone, and a
# bad FTK_NCCL_INIT_TIMEOUT refused.
# Exit 77 without mpirun, without a GPU, without NCCL, or with one GPU (after the 1-rank
# checks pass).
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
TO="timeout -k 5 100"
"$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1 || { echo "skipped (no GPU)"; exit 77; }
# a GPU node without libnccl.so.2 (or a build without NCCL): a skip, as in nccl-comm
nccl=$($MPI -np 1 "$ROOT/build/tests/test_comm" "$ROOT" 2>&1 | grep -m1 '^NCCL: ')
case $nccl in *"libnccl.so.2 loads"*) ;; *) echo "skipped (${nccl:-NCCL: test_comm did not say})"; exit 77 ;; esac
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
demo_pack "$WORK/demo.h5" 256 || exit 1
demo_init "$WORK/init.h5" stories260k 42 || exit 1
export FTK_DEVICE=cpu # the runs without --device cuda: on the CPU (ftk-train's default is cuda here)
T="$BIN/ftk-train -q -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 --steps 12 --save-every 4"
# One GPU is enough for this: one rank under mpirun (a 1-rank NCCL world) against one
# process alone (a world of one: copies); the same products, so the same losses up to NCCL's copy.
expect "cuda, 1 rank under mpirun (NCCL)" 0 $TO $MPI -np 1 $T -o "$WORK/one-mpi" --device cuda
expect "cuda, 1 process alone" 0 $TO $T -o "$WORK/one" --device cuda
close_losses "1-rank NCCL world follows the process alone" "$WORK/one-mpi" "$WORK/one" 1e-6 12
# a join deadline that is not one: a usage error before NCCL is touched, no run directory
expect "FTK_NCCL_INIT_TIMEOUT=soon refused" 2 env FTK_NCCL_INIT_TIMEOUT=soon $TO $MPI -np 1 $T -o "$WORK/soon" \
    --device cuda
check "... naming it, no run directory" sh -c "grep -q 'FTK_NCCL_INIT_TIMEOUT=soon: not a number' '$WORK/err' && \
    [ ! -e '$WORK/soon' ]"
if [ "$ngpu" -lt 2 ]; then
    finish || exit 1
    echo "skipped ($ngpu GPU: the 2-rank NCCL runs need two; the 1-rank checks above passed)"
    exit 77
fi
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
