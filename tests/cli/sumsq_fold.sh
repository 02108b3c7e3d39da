#!/bin/sh
# sumsq_fold.sh BIN WORK: Σg² folded into the reduce-scatter's add (backend.h add_sumsq,
# engine/shard.c; docs/gpu.md) changes no bit of training. On 2 MPI ranks (4 for hybrid's
# cross-group all-reduce), 4 steps of 2 micro-batches each, FTK_FUSED=add_sumsq against
# FTK_FUSED=none: every step's loss, learning rate and gradient norm, and the final
# checkpoint's shard files, the same bytes; FTK_PROFILE's table says where the fold ran
# (add_sumsq calls and no sumsq pass: full, grad-op, hybrid of one replica) and where the
# separate pass stays (sumsq calls and no add_sumsq: none; hybrid across 2 replicas, whose
# all-reduce writes the gradient after the add).
#
# sumsq_fold.sh BIN WORK emulated: BIN is build/tests/emu/bin (the CUDA backend and NCCL
# on the host, two emulated GPUs): grad-op bf16-mixed, and full bf16-true on stories260K's
# shape (tied embeddings), with --device cuda, every fused op (the CUDA default) against
# every one but add_sumsq. Slow (30 s to minutes of CPU a run, 4 runs): the slow set.
set -u
BIN=$1 WORK=$2 EMU=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
if [ "$EMU" = emulated ]; then
    [ -x "$BIN/ftk-train" ] || { echo "skipped (no $BIN/ftk-train: the emulation is built where nccl.h is found)"; exit 77; }
    export FTK_EMU_GPUS=2
    DEMO_TOOLS=$ROOT/bin
    DEV="--device cuda"
    ON= OFF=rope_qk,glu,qkv_rope,add_rmsnorm,adamw_multi # unset: every fused op on CUDA
else
    export FTK_DEVICE=cpu
    DEV=-j1
    ON=add_sumsq OFF=none
fi
demo_pack "$WORK/demo.h5" 128 >/dev/null 2>&1 || { notok "ftk-pack"; finish; exit 1; }
demo_init "$WORK/init.h5" tiny 1 || { notok "ftk-init"; finish; exit 1; }
if [ "$EMU" = emulated ]; then # tied embeddings (unit 0's gradient from the head and the embedding)
    demo_init "$WORK/tied.h5" stories260k 1 || { notok "ftk-init"; finish; exit 1; }
fi
# --clip 0.5, below the norms (~1): the clipping factor, and so every weight, depends on the norm's bits
T="$BIN/ftk-train -q -d $WORK/demo.h5 --global-batch 4 --micro-batch 1 --lr 2e-3 --warmup 2
   --eval-every 0 --steps 4 --clip 0.5 $DEV"

steps() { grep -o '"step": [0-9]*, "loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1/metrics.jsonl"; }
# calls OP PROFILE: the calls of OP in the profile's table by op (0 when absent)
calls() { awk -F' *[|] *' -v op="$1" '$2 == op && !n { n = $3 } END { print n + 0 }' "$2"; }

# pair RUN FOLDED NP ARGS...: the run without and with the fold; FOLDED 1 where the fold runs
# (the model: $M; the tiny preset unless set to the tied one)
M=$WORK/init.h5
pair() {
    run=$1 folded=$2 np=$3
    shift 3
    a=$WORK/$run.off b=$WORK/$run.on
    expect "$run: FTK_FUSED=$OFF" 0 env FTK_FUSED=$OFF FTK_PROFILE="$a.md" $TO $MPI -np "$np" $T -m "$M" "$@" -o "$a"
    expect "$run: FTK_FUSED=${ON:-(all)}" 0 env FTK_FUSED=$ON FTK_PROFILE="$b.md" $TO $MPI -np "$np" $T -m "$M" "$@" -o "$b"
    steps "$a" >"$a.steps"
    steps "$b" >"$b.steps"
    if [ "$(wc -l <"$a.steps")" -eq 4 ] && cmp -s "$a.steps" "$b.steps"; then
        ok "$run: the same loss, lr and gradient norm at each of 4 steps ($(tail -n 1 "$b.steps" | sed 's/.*"grad_norm": //'))"
    else
        notok "$run: the steps differ"
        diff "$a.steps" "$b.steps" | head -n 6 | sed 's/^/     | /'
    fi
    if diff -r "$a/step-00000004" "$b/step-00000004" >/dev/null 2>&1; then ok "$run: the same checkpoint bytes"; else
        notok "$run: the checkpoints differ"
    fi
    fs=$(calls add_sumsq "$b.md") ss=$(calls sumsq "$b.md") s0=$(calls sumsq "$a.md")
    if [ "$folded" = 1 ]; then
        check "$run: folded: $fs add_sumsq calls, no sumsq pass (without: $s0 sumsq calls)" \
            test "$fs" -gt 0 -a "$ss" = 0 -a "$s0" -gt 0
    else
        check "$run: not folded: $ss sumsq calls, no add_sumsq" test "$fs" = 0 -a "$ss" -gt 0
    fi
}

if [ "$EMU" = emulated ]; then
    pair grad-op-bf16-mixed 1 2 --strategy grad-op --precision bf16-mixed
    M=$WORK/tied.h5
    pair full-bf16-true-tied 1 2 --strategy full --precision bf16-true
else
    pair full-fp32 1 2 --strategy full --precision fp32
    pair grad-op-bf16-true 1 2 --strategy grad-op --precision bf16-true
    pair hybrid-1-replica 1 2 --strategy hybrid --shard-group-size 2 --precision bf16-mixed
    pair hybrid-2-replicas 0 4 --strategy hybrid --shard-group-size 2 --precision bf16-mixed
    pair none 0 2 --strategy none --precision bf16-true
fi
finish
