#!/bin/sh
# load_emu.sh BIN WORK: the weights loader's device path (engine/shard.c: reading threads
# fill unit u + 1 into one page-locked buffer while unit u is uploaded from the other) on
# the host emulation of CUDA (BIN is build/tests/emu/bin), with 1 and 4 threads (-j: 2 and
# 4 readers): the parameters it uploads are the file's, bit for bit (one step at a
# learning rate of 1e-30 changes none: its update is far below half an ulp), read straight
# (bf16-true), converted (fp32) and through HDF5 (zstd-compressed tensors); a damaged
# tensor is refused, naming it, as on the CPU (tests/cli/train.sh).
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack, ftk-init, ftk-merge and ftk-info
demo_pack "$WORK/demo.h5" 128 2>/dev/null || exit 1
tok=$ROOT/examples/demo/tokenizer.model
"$ROOT/bin/ftk-init" -q --preset tiny --seed 42 --dtype bfloat16 -t "$tok" -o "$WORK/w.h5" || exit 1
"$ROOT/bin/ftk-init" -q --preset tiny --seed 42 --dtype bfloat16 --compress zstd -t "$tok" -o "$WORK/wz.h5" || exit 1
sums() { "$ROOT/bin/ftk-info" "$1" | sed -n 's|^  /tensors/\([^ ]*\) .* xxh3 \([0-9a-f]*\)$|\1 \2|p'; }
sums "$WORK/w.h5" >"$WORK/want"
check "the weights file lists its tensors' checksums" test -s "$WORK/want"
# loaded FILE PRECISION THREADS: one step on the emulated GPU, then its checkpoint merged
# back into bf16 and its tensors' checksums
loaded() {
    rm -rf "$WORK/run" "$WORK/m.h5"
    "$BIN/ftk-train" -q -m "$1" -d "$WORK/demo.h5" --precision "$2" -j "$3" --global-batch 2 --micro-batch 2 \
        --steps 1 --lr 1e-30 --min-lr 1e-30 --warmup 0 --eval-every 0 -o "$WORK/run" --device cuda 2>"$WORK/err" &&
        "$ROOT/bin/ftk-merge" "$WORK/run" -o "$WORK/m.h5" --dtype bfloat16 2>>"$WORK/err" &&
        sums "$WORK/m.h5"
}
for p in bf16-true fp32; do
    for j in 1 4; do
        loaded "$WORK/w.h5" $p $j >"$WORK/got"
        same "$p, -j $j: the uploaded weights are the file's" "$WORK/got" "$WORK/want"
    done
done
loaded "$WORK/wz.h5" bf16-true 4 >"$WORK/got"
same "zstd-compressed tensors (through HDF5), -j 4: the file's weights" "$WORK/got" "$WORK/want"

cp "$WORK/w.h5" "$WORK/bad.h5"
flip_bit "$WORK/bad.h5" tensors/model.layers.1.self_attn.v_proj.weight 6 0x10 || exit 1
for j in 1 4; do
    rm -rf "$WORK/bad"
    expect "damaged weights file, -j $j: exit 2" 2 "$BIN/ftk-train" -q -m "$WORK/bad.h5" -d "$WORK/demo.h5" \
        --precision bf16-true -j $j --steps 1 --eval-every 0 -o "$WORK/bad" --device cuda
    grep -q "model.layers.1.self_attn.v_proj.weight: checksum mismatch" "$WORK/err" &&
        ok "damaged weights file, -j $j: the message names the tensor" ||
        { notok "damaged weights file, -j $j: the message names the tensor"; head -n 3 "$WORK/err"; }
done
finish
