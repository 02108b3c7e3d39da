#!/bin/sh
# Token data whose datasets have the wrong HDF5 type, checksums recomputed
# (tests/fault/forge_type.py): formats/tokens.h says int32 tokens, uint8
# masks and int64 offsets and sample tables. A float32 loss_mask of 0.9 once trained at
# loss 0 and ftk-verify passed it; float or uint16 tokens were converted (3.7 became 3).
# Each reader refuses them, naming the file and the dataset: ftk-train exit 2 (and no run
# directory), ftk-verify exit 3 (its code for a file that is not what its format says), and
# ftk-info on a set of shards (it reads their index) exit 2.
# Usage: tests/fault/forged_types.sh BIN_DIR WORK_DIR   (needs /usr/bin/python3 with h5py, numpy)
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
"$BIN/ftk-pack" -q -t "$ROOT/examples/demo/tokenizer.model" "$ROOT/examples/demo/alpaca-demo.json" \
    -o "$WORK/s.h5" --pack --max-len 64 --val-count 4 --shards 2 || exit 1
train() { "$BIN/ftk-train" -q -j 1 -m "$WORK/w.h5" -d "$1" -o "$WORK/run" --steps 2 --global-batch 4 \
    --micro-batch 2 --eval-every 1 --no-save; }
expect "the unforged file trains" 0 train "$WORK/d.h5"
rm -rf "$WORK/run"

# says NAME PATTERN...: stderr has every pattern
says() {
    name=$1
    shift
    for p in "$@"; do
        grep -q -- "$p" "$WORK/err" || { notok "$name: the message names $*"; sed 's/^/     | /' "$WORK/err"; return; }
    done
    ok "$name: the message names $*"
}

# forged NAME DATASET DTYPE ADD: ftk-train exit 2, ftk-verify exit 3, each naming f.h5 and the dataset
forged() {
    cp "$WORK/d.h5" "$WORK/f.h5"
    "$PY" "$ROOT/tests/fault/forge_type.py" "$WORK/f.h5" "$2" "$3" "$4" >/dev/null || { notok "$1: forging failed"; return; }
    expect "$1: ftk-train exit 2" 2 train "$WORK/f.h5"
    says "$1: ftk-train" "f.h5" "$2" "type $3"
    check "$1: no run directory left" test ! -e "$WORK/run"
    rm -rf "$WORK/run"
    expect "$1: ftk-verify exit 3" 3 "$BIN/ftk-verify" -q "$WORK/f.h5"
    says "$1: ftk-verify" "f.h5" "$2" "type $3"
}
forged "a float32 loss mask of 0.9" /train/loss_mask float32 -0.1
forged "float32 tokens (3.7)" /train/tokens float32 0.7
forged "float64 tokens" /val/tokens float64 0
forged "uint16 tokens" /train/tokens uint16 0
forged "int32 row offsets" /train/row_offsets int32 0
forged "float64 sample lengths" /val/sample_lengths float64 0

# a set of two shards, one forged: ftk-info reads the set's index (exit 2), ftk-train too
cp "$WORK/s-00001-of-00002.h5" "$WORK/s1.keep"
"$PY" "$ROOT/tests/fault/forge_type.py" "$WORK/s-00002-of-00002.h5" /train/loss_mask float32 -0.1 >/dev/null ||
    notok "shard set: forging failed"
expect "shard set, a float32 loss mask: ftk-info exit 2" 2 "$BIN/ftk-info" "$WORK/s.h5"
says "shard set: ftk-info" "s-00002-of-00002.h5" "/train/loss_mask" "type float32"
expect "shard set, a float32 loss mask: ftk-train exit 2" 2 train "$WORK/s.h5"
says "shard set: ftk-train" "s-00002-of-00002.h5" "/train/loss_mask" "type float32"
expect "shard set, a float32 loss mask: ftk-verify exit 3" 3 "$BIN/ftk-verify" -q "$WORK/s.h5"
finish
