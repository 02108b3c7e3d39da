#!/bin/sh
# Files whose checksums hold but whose contents are wrong (tests/fault/forge.py rewrites a
# dataset and its checksum): ftk-train, ftk-generate and ftk-export-hf must refuse them at
# load with exit 2, naming the file, the dataset or tensor and the first bad index, and
# leave nothing behind — not read past an array (ASan runs this too), not train on it.
#  - data: a token id equal to the vocabulary size, a negative one, a huge one; row
#    offsets that decrease, that end past the tokens; a loss mask of 2; a sample length
#    past its row;
#  - weights: a matrix transposed, a norm gain too short, a 3-D tensor.
# Usage: tests/fault/forged.sh BIN_DIR WORK_DIR   (needs /usr/bin/python3 with h5py, numpy)
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
"$PY" -c 'import h5py, numpy' 2>/dev/null || { echo "skipped ($PY lacks h5py/numpy)"; exit 77; }
export HDF5_PLUGIN_PATH="$ROOT/build/plugin"
demo_pack "$WORK/d.h5" 64 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
train() { "$BIN/ftk-train" -q -m "$1" -d "$2" -o "$WORK/run" --steps 2 --global-batch 4 --micro-batch 2 \
    --eval-every 1 --no-save; }
expect "the unforged files train" 0 train "$WORK/w.h5" "$WORK/d.h5"
rm -rf "$WORK/run"

# forged_data NAME DATASET EDIT PATTERN: ftk-train exits 2 with PATTERN in its message
forged_data() {
    cp "$WORK/d.h5" "$WORK/f.h5"
    "$PY" "$ROOT/tests/fault/forge.py" "$WORK/f.h5" "$2" "$3" >/dev/null || { notok "$1: forging failed"; return; }
    expect "data, $1: exit 2" 2 train "$WORK/w.h5" "$WORK/f.h5"
    if grep -q "f.h5" "$WORK/err" && grep -q -- "$4" "$WORK/err"; then ok "data, $1: message names the file and $4"
    else notok "data, $1: message names the file and $4"; sed 's/^/     | /' "$WORK/err"; fi
    check "data, $1: no run directory left" test ! -e "$WORK/run"
    rm -rf "$WORK/run"
}
forged_data "token id = vocabulary size" /train/tokens set:5:512 "/train/tokens\[5\] = 512"
forged_data "negative token id" /train/tokens set:-1:-7 "/train/tokens\[.*\] = -7"
forged_data "huge token id" /val/tokens set:3:2000000000 "/val/tokens\[3\] = 2000000000"
forged_data "row offsets decrease" /train/row_offsets set:2:10 "/train/row_offsets"
forged_data "row offsets end past the tokens" /train/row_offsets set:-1:99999999 "/train/row_offsets"
forged_data "loss mask 2" /train/loss_mask set:9:2 "/train/loss_mask\[9\]"
forged_data "sample length past its row" /train/sample_lengths set:0:100000 "/train/sample_lengths\[0\]"

# forged_weights NAME TENSOR EDIT: ftk-train, ftk-generate and ftk-export-hf exit 2 naming it
forged_weights() {
    cp "$WORK/w.h5" "$WORK/fw.h5"
    "$PY" "$ROOT/tests/fault/forge.py" "$WORK/fw.h5" "/tensors/$2" "$3" >/dev/null || {
        notok "$1: forging failed"
        return
    }
    expect "weights, $1: ftk-train exit 2" 2 train "$WORK/fw.h5" "$WORK/d.h5"
    grep -q "fw.h5.*tensor $2 has shape" "$WORK/err" && ok "weights, $1: message names the file, $2 and its shape" ||
        { notok "weights, $1: message names the file, $2 and its shape"; sed 's/^/     | /' "$WORK/err"; }
    check "weights, $1: no run directory left" test ! -e "$WORK/run"
    expect "weights, $1: ftk-generate exit 2" 2 "$BIN/ftk-generate" -q -m "$WORK/fw.h5" -p hi -n 4 --greedy
    expect "weights, $1: ftk-export-hf exit 2" 2 "$BIN/ftk-export-hf" -q "$WORK/fw.h5" -o "$WORK/hf"
    check "weights, $1: no export left" test ! -e "$WORK/hf"
    rm -rf "$WORK/run" "$WORK/hf"
}
forged_weights "a matrix transposed" model.layers.0.mlp.gate_proj.weight reshape:32,96
forged_weights "a norm gain too short" model.norm.weight reshape:16
forged_weights "the embedding one row short" model.embed_tokens.weight reshape:511,32
forged_weights "a 3-D tensor" model.layers.1.self_attn.o_proj.weight reshape:32,32,1
finish
