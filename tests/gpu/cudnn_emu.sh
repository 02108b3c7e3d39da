#!/bin/sh
# cudnn_emu.sh BIN WORK: FTK_CUDA_ATTN=cudnn's host code on the host emulation of CUDA (BIN is
# build/tests/emu/bin). Bf16 steps of the tiny model (4 query heads, 2 key/value heads of 8)
# on packed rows of 96 tokens.
#  - Without cuDNN (the emulation has none): one line says so and attention runs on the
#    flash kernels: the losses of FTK_CUDA_ATTN=flash, bit for bit. With FTK_CUDNN_STRICT=1
#    the missing cuDNN is an error: ftk-train exits 2 naming it, and trains nothing.
#  - With the stand-in (FTK_EMU_CUDNN=9.19.0, attention_cudnn.cu), rows of 256 tokens (1 or
#    2 samples and the padding): one forward and one backward plan, made before the first
#    step for the bound the data gives (the most segments a row holds, computed here from
#    the file with h5py; S = 256), and no other during 2 steps of 2 micro-batches holding
#    different numbers of segments (the instance's summary line says how many).
#  - A plan the stand-in refuses (FTK_EMU_CUDNN_REFUSE=bwd): one line naming the shape, the
#    flash kernels' losses; with FTK_CUDNN_STRICT=1 an error naming it (B, S, heads, kv
#    heads, head dim, backward), no step.
#  - cuDNN 9.5 (FTK_EMU_CUDNN=9.5.0) with grouped-query heads: refused before cuDNN is asked,
#    the message naming 9.6; strict: an error.
#  - ftk-train --plan --device cuda with FTK_CUDA_ATTN=cudnn: a "cuDNN attention" line with
#    B·H·S²·2 + 2·round256(B·H·S·4) bytes, the plan's total that much above the plan
#    without it.
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
unset FTK_CUDNN_STRICT FTK_EMU_CUDNN FTK_EMU_CUDNN_REFUSE
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
demo_pack "$WORK/demo.h5" 96 2>/dev/null || exit 1
demo_init "$WORK/init.h5" tiny 42 || exit 1
# train NAME ATTN MB STEPS [ENV...]: STEPS steps of MB rows each on the emulated GPU with
# FTK_CUDA_ATTN=ATTN; run-NAME/, err-NAME
train() {
    n=$1 a=$2 mb=$3 st=$4
    shift 4
    rm -rf "$WORK/run-$n"
    env FTK_CUDA_ATTN="$a" "$@" "$BIN/ftk-train" -m "$WORK/init.h5" -d "$WORK/demo.h5" --global-batch "$mb" \
        --micro-batch "$mb" --lr 2e-3 --warmup 2 --eval-every 0 --steps "$st" --no-save --precision bf16-true \
        -o "$WORK/run-$n" --device cuda >/dev/null 2>"$WORK/err-$n"
}
show() { sed 's/^/     | /' "$WORK/err-$1"; }
# same_losses NAME RUN STEPS: RUN's losses are run-flash-STEPS's (STEPS of them, not 0), bit for bit
same_losses() {
    loss_steps "$WORK/run-$2" >"$WORK/$2.txt"
    loss_steps "$WORK/run-flash$3" >"$WORK/flash$3.txt"
    check "$1" sh -c "[ \$(wc -l <'$WORK/flash$3.txt') -eq $3 ] && grep -qv ' 0\$' '$WORK/flash$3.txt' && \
        cmp -s '$WORK/flash$3.txt' '$WORK/$2.txt'"
}
no_step() { ! grep -qs '"loss"' "$WORK/run-$1/metrics.jsonl"; }

train flash2 flash 1 2
check "FTK_CUDA_ATTN=flash trains" [ $? -eq 0 ]
train cudnn cudnn 1 2
check "FTK_CUDA_ATTN=cudnn without cuDNN trains" [ $? -eq 0 ]
show cudnn
check "one line says cuDNN is missing and the flash kernels run" \
    [ "$(grep -c 'FTK_CUDA_ATTN=cudnn: cuDNN is not part of the host emulation; attention runs on the flash kernels' "$WORK/err-cudnn")" -eq 1 ]
same_losses "the flash kernels' losses (2 steps, not 0), bit for bit" cudnn 2
train strict cudnn 1 2 FTK_CUDNN_STRICT=1
rc=$?
show strict
check "FTK_CUDNN_STRICT=1 without cuDNN: exit 2, naming cuDNN, no step" sh -c "[ $rc -eq 2 ] && grep -q 'FTK_CUDNN_STRICT=1.*cuDNN is not part of the host emulation' '$WORK/err-strict'" && no_step strict

# the stand-in: plans for the data's bound, at the start, and never during the run (rows of
# 256 tokens: 1 or 2 samples and the padding; one a micro-batch, two a step)
demo_pack "$WORK/demo256.h5" 256 2>/dev/null || exit 1
"$PY" - "$WORK/demo256.h5" >"$WORK/bound" <<'EOF' || exit 1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
segs = {sp: [int(b - a) + 1 for a, b in zip(f[sp]["row_samples"][:-1], f[sp]["row_samples"][1:])] for sp in ("train", "val")}
print(max(max(s) for s in segs.values()))
EOF
read -r B <"$WORK/bound"
rm -rf "$WORK/run-stand"
FTK_EMU_CUDNN=9.19.0 FTK_CUDA_ATTN=cudnn "$BIN/ftk-train" -m "$WORK/init.h5" -d "$WORK/demo256.h5" --global-batch 2 \
    --micro-batch 1 --lr 2e-3 --warmup 1 --eval-every 0 --steps 2 --no-save --precision bf16-true \
    -o "$WORK/run-stand" --device cuda >/dev/null 2>"$WORK/err-stand"
check "the stand-in trains (2 steps of 2 micro-batches)" [ $? -eq 0 ]
show stand
check "two plans made, forward and backward, for B $B (the data's bound), S 256, 4/2 heads of 8" sh -c "
    [ \$(grep -c 'attention: cuDNN made' '$WORK/err-stand') -eq 2 ] &&
    grep -q 'cuDNN made the forward plan for B $B, S 256, 4 heads, 2 kv heads, head dim 8 (workspace 0.0 MB)\$' '$WORK/err-stand' &&
    grep -q 'cuDNN made the backward plan for B $B, S 256, 4 heads, 2 kv heads, head dim 8 (workspace [0-9.]* MB)\$' '$WORK/err-stand'"
check "no plan made on first use, no micro-batch beyond the bound" sh -c "! grep -q 'on first use\\|beyond the' '$WORK/err-stand'"
check "16 calls (2 layers, 4 micro-batches, forward and backward) on those 2 plans" \
    grep -Eq 'attention: cuDNN ran 16 calls of [0-9]+ to [0-9]+ segments on 2 plans$' "$WORK/err-stand"
lo=$(sed -n 's/.*cuDNN ran 16 calls of \([0-9]*\) to \([0-9]*\) segments.*/\1/p' "$WORK/err-stand")
hi=$(sed -n 's/.*cuDNN ran 16 calls of \([0-9]*\) to \([0-9]*\) segments.*/\2/p' "$WORK/err-stand")
check "the micro-batches held ${lo:-?} to ${hi:-?} segments: different counts, within the bound" \
    sh -c "[ '${lo:-0}' -lt '${hi:-0}' ] && [ '${hi:-0}' -le $B ]"

# a plan refused, then strict
train refuse cudnn 1 2 FTK_EMU_CUDNN=9.19.0 FTK_EMU_CUDNN_REFUSE=bwd
check "a refused backward plan trains" [ $? -eq 0 ]
show refuse
check "one line names the refused plan's shape, and the flash kernels run" \
    grep -q 'FTK_CUDA_ATTN=cudnn: cuDNN refuses the backward plan for B [0-9]*, S 96, 4 heads, 2 kv heads, head dim 8: .*; attention runs on the flash kernels' "$WORK/err-refuse"
same_losses "the flash kernels' losses, bit for bit" refuse 2
train refuse-strict cudnn 1 2 FTK_EMU_CUDNN=9.19.0 FTK_EMU_CUDNN_REFUSE=bwd FTK_CUDNN_STRICT=1
rc=$?
show refuse-strict
check "FTK_CUDNN_STRICT=1 and a refused plan: an error naming the shape, no step" sh -c "[ $rc -ne 0 ] &&
    grep -q 'FTK_CUDNN_STRICT=1): cuDNN refuses the backward plan for B [0-9]*, S 96, 4 heads, 2 kv heads, head dim 8' '$WORK/err-refuse-strict'" &&
    no_step refuse-strict

# cuDNN older than 9.6 with grouped-query heads
train old cudnn 1 2 FTK_EMU_CUDNN=9.5.0
check "cuDNN 9.5.0 trains" [ $? -eq 0 ]
show old
check "cuDNN 9.5.0, grouped-query heads: the forward plan refused, naming 9.6; the flash kernels" \
    grep -q 'cuDNN refuses the forward plan for B [0-9]*, S 96, 4 heads, 2 kv heads, head dim 8: cuDNN 9.5.0 takes ragged offsets with grouped-query heads from 9.6 on.*; attention runs on the flash kernels' "$WORK/err-old"
train old-strict cudnn 1 2 FTK_EMU_CUDNN=9.5.0 FTK_CUDNN_STRICT=1
rc=$?
check "cuDNN 9.5.0, FTK_CUDNN_STRICT=1: an error, no step" sh -c "[ $rc -ne 0 ] && grep -q 'from 9.6 on' '$WORK/err-old-strict'" &&
    no_step old-strict

# --plan counts the workspace (the 96-token rows: a sample and the padding each, 2 a micro-batch)
B=4
plan() { env "$@" "$ROOT/bin/ftk-train" --plan -m "$WORK/init.h5" -d "$WORK/demo.h5" --micro-batch 2 \
    --precision bf16-true --device cuda --recompute none; }
plan FTK_CUDA_ATTN=cudnn >"$WORK/plan-cudnn" 2>&1
check "--plan with FTK_CUDA_ATTN=cudnn" [ $? -eq 0 ]
plan FTK_CUDA_ATTN=flash >"$WORK/plan-flash" 2>&1
sed 's/^/     | /' "$WORK/plan-cudnn"
ws=$(awk -v B="$B" 'function r(n) { return int((n + 255) / 256) * 256 }
    BEGIN { printf "%d", r(B * 4 * 96 * 96 * 2) + 2 * r(B * 4 * 96 * 4) }')
want=$(awk -v b="$ws" 'BEGIN { printf "%.2f MB", b / 1e6 }')
check "a cuDNN attention line: $want ($B segments x 96 tokens)" \
    grep -q "^    cuDNN attention *$want *(FTK_CUDA_ATTN=cudnn: $B segments x 96 tokens, in the workspaces)" "$WORK/plan-cudnn"
allocs() { sed -n 's/^  allocations .*(\([0-9]*\) bytes.*/\1/p' "$1"; } # the rows above; total adds cudaMalloc's pages
d=$(($(allocs "$WORK/plan-cudnn") - $(allocs "$WORK/plan-flash")))
check "the allocations are $ws bytes above FTK_CUDA_ATTN=flash's ($d), and flash has no such line" \
    sh -c "[ $d -eq $ws ] && ! grep -q 'cuDNN' '$WORK/plan-flash'"
finish
