#!/bin/sh
# cudnn_emu.sh BIN WORK: FTK_CUDA_ATTN=cudnn where cuDNN is not there, on the host emulation of
# CUDA (BIN is build/tests/emu/bin; the emulation has no cuDNN). The instance says so in one
# line and attention runs on the flash kernels: two bf16 steps of the tiny model (rows of 96
# tokens, one a step: the second step's loss follows the first's backward) give the losses
# of FTK_CUDA_ATTN=flash, bit for bit. With FTK_CUDNN_STRICT=1 (the GPU tests' setting) the
# missing cuDNN is an error instead: ftk-train exits 2 naming it (the device cannot be made
# as asked), and trains nothing.
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
demo_pack "$WORK/demo.h5" 96 2>/dev/null || exit 1
demo_init "$WORK/init.h5" tiny 42 || exit 1
# train NAME ATTN [ENV...]: two steps on the emulated GPU with FTK_CUDA_ATTN=ATTN; run-NAME/, err-NAME
train() {
    n=$1 a=$2
    shift 2
    rm -rf "$WORK/run-$n"
    env FTK_CUDA_ATTN="$a" "$@" "$BIN/ftk-train" -m "$WORK/init.h5" -d "$WORK/demo.h5" --global-batch 1 \
        --micro-batch 1 --lr 2e-3 --warmup 2 --eval-every 0 --steps 2 --no-save --precision bf16-true \
        -o "$WORK/run-$n" --device cuda >/dev/null 2>"$WORK/err-$n"
}
train flash flash
check "FTK_CUDA_ATTN=flash trains" [ $? -eq 0 ]
train cudnn cudnn
check "FTK_CUDA_ATTN=cudnn trains" [ $? -eq 0 ]
sed 's/^/     | /' "$WORK/err-cudnn"
check "one line says cuDNN is missing and the flash kernels run" \
    [ "$(grep -c 'FTK_CUDA_ATTN=cudnn: cuDNN is not part of the host emulation; attention runs on the flash kernels' "$WORK/err-cudnn")" -eq 1 ]
loss_steps "$WORK/run-flash" >"$WORK/flash.txt"
loss_steps "$WORK/run-cudnn" >"$WORK/cudnn.txt"
sed 's/^/     flash: /' "$WORK/flash.txt"
check "the flash kernels' losses (2 steps, not 0), bit for bit" sh -c "[ \$(wc -l <'$WORK/flash.txt') -eq 2 ] && \
    ! grep -q ' 0\$' '$WORK/flash.txt' && cmp -s '$WORK/flash.txt' '$WORK/cudnn.txt'"
train strict cudnn FTK_CUDNN_STRICT=1
rc=$?
sed 's/^/     | /' "$WORK/err-strict"
check "FTK_CUDNN_STRICT=1: exit 2, naming cuDNN, no step" sh -c "[ $rc -eq 2 ] && grep -q 'FTK_CUDNN_STRICT=1.*cuDNN is not part of the host emulation' '$WORK/err-strict' && ! grep -qs '\"loss\"' '$WORK/run-strict/metrics.jsonl'"
finish
