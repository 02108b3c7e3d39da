#!/bin/sh
# nccl_vs_mpi.sh BIN WORK: 2-rank training on 2 GPUs (NCCL) against the same run on 2 MPI
# ranks on the CPU: the demo's shape (stories260K), 12 steps, every step's loss within 3e-2
# relative (the tolerance of demo_vs_cpu.sh: the GPU's fp32 products run in bf16), for
#   full fp32            all-gathers and reduce-scatters in f32
#   grad-op bf16-mixed   bf16 gathers of the working copy, f32 reductions
#   none bf16-true       bf16 all-reduces (DDP)
#   hybrid, groups of 1  the cross-group all-reduce (each rank a shard group of its own)
#   full bf16-mixed, --compress-weights int8 --compress-grads bf16: int8 codes and scales
#                        gathered as bytes, bf16 reduce-scatters with error feedback
# then the full run stopped after 8 steps and resumed on 2 GPUs, and on one GPU by a process
# alone: the same losses. First, on one GPU: one rank under mpirun (a 1-rank NCCL world)
# against one process alone, and a bad FTK_NCCL_INIT_TIMEOUT refused.
# Exit 77 without mpirun, without a GPU, without NCCL, or with one GPU (after the 1-rank
# checks pass).
#
# nccl_vs_mpi.sh BIN WORK emulated [quick]: BIN is build/tests/emu/bin, where the CUDA
# backend and NCCL run on the host (tests/gpu/emu: emu_runtime.h, emu_nccl.c): two emulated
# GPUs (FTK_EMU_GPUS=2) and a smaller run (the tiny preset, rows of 128, 4 steps of 4 rows,
# stopped after 2), and first what a GPU machine cannot stage: comm.h's contract over the
# emulated NCCL on 2 and 4 ranks (test_comm --nccl), two ranks on one GPU (NCCL's
# duplicate-GPU refusal, every rank exits 1 and nothing is written), a rank that fails before
# it joins (rank 0, left waiting in its join, gives it up at once), and a collective that
# fails on rank 1 (FTK_EMU_NCCL_FAIL): every rank exits 1 with rank 1's message, not that of
# rank 0, which only saw its peer go; last, hybrid on 4 ranks (2 shard groups of 2) and hpz on
# 4 ranks in 2 simulated nodes of 2 (against MPI, and bit for bit against full). quick
# (make test): the checks before the 1-rank ones, and grad-op bf16-mixed alone.
set -u
BIN=$1 WORK=$2 EMU=${3:-} QUICK=${4:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
export FTK_DEVICE=cpu # the runs without --device cuda: on the CPU (ftk-train's default is cuda here)
if [ "$EMU" = emulated ]; then
    export FTK_EMU_GPUS=2
    DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
    TC=$ROOT/build/tests/emu/bin/test_comm
    [ -x "$TC" ] || { echo "skipped (no $TC: the emulation is built where NCCL's nccl.h is found)"; exit 77; }
    ngpu=2
    PRESET=tiny LEN=128 STEPS=4 STOP=2 SHAPE="--global-batch 4 --micro-batch 2 --save-every 2"
else
    "$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1 || { echo "skipped (no GPU)"; exit 77; }
    TC=$ROOT/build/tests/test_comm
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    PRESET=stories260k LEN=256 STEPS=12 STOP=8 SHAPE="--global-batch 8 --micro-batch 2 --save-every 4"
fi
TO="timeout -k 5 150"
# a GPU node without libnccl.so.2 (or a build without NCCL): a skip, as in nccl-comm
nccl=$($MPI -np 1 "$TC" "$ROOT" 2>&1 | grep -m1 '^NCCL: ')
case $nccl in *"libnccl.so.2 loads"*) ;; *) echo "skipped (${nccl:-NCCL: test_comm did not say})"; exit 77 ;; esac
demo_pack "$WORK/demo.h5" $LEN || exit 1
demo_init "$WORK/init.h5" $PRESET 42 || exit 1
T="$BIN/ftk-train -q -m $WORK/init.h5 -d $WORK/demo.h5 $SHAPE --lr 2e-3 --warmup 2 --eval-every 0 --steps $STEPS"
if [ "$EMU" = emulated ]; then
    for np in 2 4; do
        expect "test_comm --nccl on $np ranks (emulated NCCL)" 0 env FTK_EMU_GPUS=4 $TO $MPI -np $np "$TC" "$ROOT" \
            --nccl
        grep -h 'checks passed' "$WORK/out" | sed 's/^/     /'
    done
    expect "2 ranks on 1 GPU: NCCL refuses" 1 env FTK_EMU_GPUS=1 $TO $MPI -np 2 $T -o "$WORK/dup" --device cuda
    check "... named in the error, no run directory" sh -c "[ \$(grep -c 'Duplicate GPU detected' '$WORK/err') \
        -ge 1 ] && grep -q '^ftk-train: error: --device cuda: rank 0: NCCL ncclCommInitRank' '$WORK/err' && \
        [ ! -e '$WORK/dup' ]"
    ls /dev/shm >"$WORK/shm.before" 2>/dev/null
    expect "rank 1 fails before it joins NCCL" 1 env FTK_EMU_NCCL_FAIL=1:init $TO $MPI -np 2 $T -o "$WORK/nojoin" \
        --device cuda
    check "... rank 1's message, no run directory, nothing left in /dev/shm" sh -c "grep -q \
        '^ftk-train: error: --device cuda: rank 1: NCCL ncclCommInitRank.*fails before it joins' '$WORK/err' && \
        [ ! -e '$WORK/nojoin' ] && ! ls /dev/shm | grep '^ftk-emu-nccl-' | grep -vxFf '$WORK/shm.before' | grep -q ."
    expect "a collective fails on rank 1" 1 env FTK_EMU_NCCL_FAIL=1:9 $TO $MPI -np 2 $T -o "$WORK/fail" --device cuda
    check "... the error is rank 1's own, not rank 0's peer gone" sh -c "grep 'ftk-train: error' '$WORK/err' | \
        grep -v 'rank 1: NCCL .*FTK_EMU_NCCL_FAIL: rank 1 of 2 fails here' | grep -q . && exit 1; \
        [ \$(grep -c 'rank 1: NCCL' '$WORK/err') -ge 1 ]"
fi
if [ "$QUICK" != quick ]; then
    # One GPU is enough for this: one rank under mpirun (a 1-rank NCCL world) against one
    # process alone (a world of one: copies); the same products, so the same losses up to NCCL's copy.
    expect "cuda, 1 rank under mpirun (NCCL)" 0 $TO $MPI -np 1 $T -o "$WORK/one-mpi" --device cuda
    expect "cuda, 1 process alone" 0 $TO $T -o "$WORK/one" --device cuda
    close_losses "1-rank NCCL world follows the process alone" "$WORK/one-mpi" "$WORK/one" 1e-6 $STEPS
fi
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
CFGS='full --precision fp32|grad-op --precision bf16-mixed|none --precision bf16-true|hybrid --shard-group-size 1 --precision fp32|full --precision bf16-mixed --compress-weights int8 --compress-grads bf16'
[ "$QUICK" = quick ] && CFGS='grad-op --precision bf16-mixed'
i=0
OIFS=$IFS IFS='|'
for cfg in $CFGS; do
    IFS=$OIFS
    i=$((i + 1))
    expect "cpu, 2 MPI ranks: --strategy $cfg" 0 $TO $MPI -np 2 $T --strategy $cfg -o "$WORK/cpu$i"
    expect "cuda, 2 NCCL ranks: --strategy $cfg" 0 $TO $MPI -np 2 $T --strategy $cfg -o "$WORK/cu$i" --device cuda
    [ -s "$WORK/err" ] && sed 's/^/     | /' "$WORK/err" | head -n 5
    close_losses "$cfg: the NCCL run follows the MPI run" "$WORK/cu$i" "$WORK/cpu$i" 3e-2 $STEPS
done
IFS=$OIFS
# --units group:2 (engine/units.h): a group's slices in one NCCL collective, laid out by the
# backend's copies; the same bits as the run of block units above (the first configuration;
# not in quick: an emulated run takes ~20 s)
if [ "$QUICK" != quick ]; then
    cfg=${CFGS%%|*}
    expect "cuda, 2 NCCL ranks: --strategy $cfg --units group:2" 0 $TO $MPI -np 2 $T --strategy $cfg --units group:2 \
        -o "$WORK/cu-units" --device cuda
    loss_steps "$WORK/cu-units" >"$WORK/units.got"
    loss_steps "$WORK/cu1" >"$WORK/units.want"
    check "... every loss the bits of block units" sh -c "[ -s '$WORK/units.got' ] && cmp -s '$WORK/units.got' '$WORK/units.want'"
fi
if [ "$QUICK" != quick ]; then
    expect "cuda, 2 NCCL ranks, full: stop after $STOP" 75 $TO $MPI -np 2 $T --strategy full -o "$WORK/x" \
        --stop-after $STOP --device cuda
    cp -r "$WORK/x" "$WORK/x1"
    expect "resumed on 2 NCCL ranks" 0 $TO $MPI -np 2 $T --strategy full -o "$WORK/x" --resume auto --device cuda
    close_losses "the resumed NCCL run follows the MPI run" "$WORK/x" "$WORK/cpu1" 3e-2 $STEPS
    expect "the same checkpoint resumed on one GPU, a process alone" 0 $TO $T --strategy full -o "$WORK/x1" \
        --resume auto --device cuda
    close_losses "... follows the MPI run" "$WORK/x1" "$WORK/cpu1" 3e-2 $STEPS
fi
if [ "$EMU" = emulated ] && [ "$QUICK" != quick ]; then
    # hybrid with both of its NCCL communicators at work: 2 shard groups of 2 ranks (the
    # gathers and reduce-scatters) and 2 replicas (the cross-group all-reduce)
    H="--strategy hybrid --shard-group-size 2 --precision bf16-mixed --global-batch 8"
    expect "cpu, 4 MPI ranks: $H" 0 $TO $MPI -np 4 $T $H -o "$WORK/cpu-h4"
    expect "cuda, 4 NCCL ranks: $H" 0 env FTK_EMU_GPUS=4 $TO $MPI -np 4 $T $H -o "$WORK/cu-h4" --device cuda
    close_losses "hybrid 2x2: the NCCL run follows the MPI run" "$WORK/cu-h4" "$WORK/cpu-h4" 3e-2 $STEPS
    # hpz with its two NCCL communicators at work: the world (first gathers, reduce-scatters)
    # and 2 node groups of 2 (FTK_SIM_NODE_RANKS=2: the gathers from the secondary copy); the
    # same bits as full over NCCL
    Z="--precision bf16-mixed --global-batch 8"
    expect "cpu, 4 MPI ranks: hpz, nodes of 2, $Z" 0 env FTK_SIM_NODE_RANKS=2 $TO $MPI -np 4 $T --strategy hpz $Z \
        -o "$WORK/cpu-z4"
    for s in hpz full; do
        expect "cuda, 4 NCCL ranks: $s, nodes of 2, $Z" 0 env FTK_EMU_GPUS=4 FTK_SIM_NODE_RANKS=2 $TO $MPI -np 4 $T \
            --strategy $s $Z -o "$WORK/cu-$s-4" --device cuda
    done
    close_losses "hpz 2x2: the NCCL run follows the MPI run" "$WORK/cu-hpz-4" "$WORK/cpu-z4" 3e-2 $STEPS
    close_losses "hpz 2x2 over NCCL: the losses of full over NCCL" "$WORK/cu-hpz-4" "$WORK/cu-full-4" 0 $STEPS
fi
finish
