#!/bin/sh
# Forged checkpoints (formats/checkpoint.h): a manifest edited after it was written fails
# its seal (manifest_xxh3); one forged with its seal recomputed, so that only its values
# lie, is refused by the range checks — ftk-verify exit 3, ftk-train --resume auto,
# ftk-reshard and ftk-merge exit 2, each naming the field, never a crash (ASan runs this
# too: a negative data.rows_consumed was a segfault in the trainer); a shard whose padding
# is not zero, or that holds a dataset the shard map does not (checksums recomputed), is
# refused by ftk-reshard and ftk-merge as by ftk-verify, not turned into a checkpoint that
# verifies; a manifest of an older ftk (no seal) is read, with a warning; a units_policy not
# spelt as ftk writes it (size:1KiB) is refused; --compress-grads residuals of another shape or
# type, missing or NaN are damage to ftk-verify and to --resume auto, which falls back.
# Usage: tests/fault/ckpt_forged.sh BIN_DIR WORK_DIR   (needs /usr/bin/python3 with h5py)
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
"$PY" -c 'import h5py, numpy' 2>/dev/null || { echo "skipped ($PY lacks h5py/numpy)"; exit 77; }
export HDF5_PLUGIN_PATH="$ROOT/build/plugin"
FORGE="$PY $ROOT/tests/fault/forge.py"
demo_pack "$WORK/d.h5" 64 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --steps 4 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"
# one checkpoint, step 2 of 4: a resume has steps to run
expect "a run stopped at step 2 (its checkpoint)" 75 $T -o "$WORK/run" --save-every 2 --stop-after 2
C=step-00000002
rows=$(sed -n 's/.*"n_rows": \([0-9]*\).*/\1/p' "$WORK/run/$C/manifest.json")
expect "the unforged checkpoint verifies" 0 "$BIN/ftk-verify" "$WORK/run"
check "its manifest is sealed (manifest_xxh3, last)" sh -c "tail -n 2 '$WORK/run/$C/manifest.json' | grep -q '\"manifest_xxh3\": \"[0-9a-f]\{16\}\"'"

says() { # says NAME PATTERN: $WORK/err has PATTERN (else it is shown)
    if grep -q -- "$2" "$WORK/err"; then ok "$1"; else
        notok "$1"
        sed 's/^/     | /' "$WORK/err" | head -n 5
    fi
}
# refused NAME PATTERN [all]: the copy in $WORK/f is refused by ftk-verify and ftk-train
# naming PATTERN (and with `all` by ftk-reshard and ftk-merge: they read it as those do)
refused() {
    expect "$1: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$WORK/f"
    says "$1: ftk-verify names it ($2)" "$2"
    expect "$1: ftk-train --resume auto exit 2" 2 $T -o "$WORK/f" --save-every 2 --resume auto
    says "$1: ftk-train names it" "$2"
    check "$1: ftk-train wrote no checkpoint" test ! -e "$WORK/f/step-00000004"
    [ "${3:-}" = all ] || return 0
    expect "$1: ftk-reshard exit 2" 2 "$BIN/ftk-reshard" -q "$WORK/f" -o "$WORK/rs" --ranks 2
    says "$1: ftk-reshard names it" "$2"
    expect "$1: ftk-merge exit 2" 2 "$BIN/ftk-merge" -q "$WORK/f" -o "$WORK/m.h5"
    check "$1: nothing written" test ! -e "$WORK/rs" -a ! -e "$WORK/m.h5"
}
# forged NAME KEY VALUE PATTERN [all]: KEY of the manifest set to VALUE, the seal recomputed
forged() {
    rm -rf "$WORK/f" && cp -r "$WORK/run" "$WORK/f"
    $FORGE "$WORK/f/$C/manifest.json" "$2" "$3" >/dev/null || { notok "$1: forging failed"; return; }
    refused "$1" "$4" "${5:-}"
}
forged "rows consumed -1000000" data.rows_consumed -1000000 '"data.rows_consumed" is -1000000' all
forged "rows consumed -3" data.rows_consumed -3 '"data.rows_consumed" is -3'
forged "rows consumed past the end" data.rows_consumed $((rows + 1)) "\"data.rows_consumed\" is $((rows + 1)), outside \[0, data.n_rows = $rows\]"
forged "epoch -1" data.epoch -1 '"data.epoch" is -1' all
forged "epoch 1000000" data.epoch 1000000 '"data.epoch" is 1000000'
forged "a position two steps cannot reach" data.rows_consumed 9 '"data.rows_consumed" 9 .* are not a position 2 steps'
forged "step -1" step -1 '"step" is -1'
forged "step past the total" step 5 '"step" is 5, outside \[0, train.total_steps = 4\]'
forged "global batch 0" train.global_batch 0 '"train.global_batch" is 0'
forged "learning rate -1" train.lr -1 '"train.lr" is -1'
forged "world size 3 for one shard" world_size 3 '"shard_count" 1 is not "world_size" 3'
forged "a unit's padded length" units.1.padded 99999999 'unit 1 (layer.0, .*) does not match' all
forged "a tensor's offset" units.1.tensors.2.offset 7 'unit layer.0, tensor 2: name, shape or offset'
forged "units_policy size:1KiB (the manifest spells sizes in digits)" units_policy '"size:1KiB"' \
    '"units_policy" is "size:1KiB", not as ftk writes it (size:1024' all

# the seal: an edit without it
rm -rf "$WORK/f" && cp -r "$WORK/run" "$WORK/f"
sed -i 's/"rows_consumed": [0-9]*/"rows_consumed": 1/' "$WORK/f/$C/manifest.json"
refused "a manifest edited after it was written" "manifest.json: checksum [0-9a-f]* differs from its manifest_xxh3" all
# an older ftk's manifest (no seal): read, with a warning
rm -rf "$WORK/f" && cp -r "$WORK/run" "$WORK/f"
M=$WORK/f/$C/manifest.json
head -n $(($(wc -l <"$M") - 3)) "$M" >"$M.old" && printf '  ]\n}\n' >>"$M.old" && mv "$M.old" "$M"
expect "a manifest without a seal (an older ftk's): ftk-verify exit 0" 0 "$BIN/ftk-verify" "$WORK/f"
says "... with a warning" "has no manifest_xxh3 (written by an older ftk)"
expect "... ftk-train --resume auto runs on (exit 0)" 0 $T -o "$WORK/f" --save-every 2 --resume auto
says "... with the warning" "has no manifest_xxh3"
expect "... and what it writes is sealed and verifies" 0 "$BIN/ftk-verify" "$WORK/f/step-00000004"
check "... (no warning then)" test ! -s "$WORK/err"

# non-zero padding, every checksum recomputed: 3 shards, the last one padded in some unit
expect "resharded to 3 shards (padding in the last)" 0 "$BIN/ftk-reshard" -q "$WORK/run" -o "$WORK/r3" --ranks 3
unit=$("$PY" -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(next(u["name"] for u in m["units"] if u["padded"] > u["length"]))' "$WORK/r3/$C/manifest.json")
rm -rf "$WORK/f" && cp -r "$WORK/r3" "$WORK/f"
$FORGE "$WORK/f/$C/shard-00003-of-00003.h5" "/adam_m/$unit" set:-1:1 >/dev/null &&
    $FORGE "$WORK/f/$C/manifest.json" --sums >/dev/null || notok "padding: forging failed"
refused "a padding element of /adam_m/$unit is 1" "dataset /adam_m/$unit: 1 padding elements are not zero" all
# a dataset the shard map does not have (the file's checksum recomputed)
rm -rf "$WORK/f" && cp -r "$WORK/run" "$WORK/f"
"$PY" -c 'import h5py, sys; h5py.File(sys.argv[1], "r+").create_dataset("extra", data=[1, 2, 3])' \
    "$WORK/f/$C/shard-00001-of-00001.h5" && $FORGE "$WORK/f/$C/manifest.json" --sums >/dev/null ||
    notok "extra dataset: forging failed"
refused "a dataset not in the shard map" "unexpected dataset /extra (not in the shard map)" all

# --compress-grads residuals (/grad_residual/UNIT): only runs on several ranks write them, so
# tests/fault/forge_residual.py gives a one-process run's step-2 checkpoint residuals as they
# write them, then forges one (checksums, sizes and seal recomputed). ftk-verify names each
# forgery (exit 3); ftk-train --resume auto takes it for damage, as ftk-verify does, and falls
# back to step 1 (once verify passed these and the resume exited 1 or trained on NaN).
expect "a run with checkpoints at steps 1 and 2" 75 $T -o "$WORK/g" --save-every 1 --stop-after 2
$PY "$ROOT/tests/fault/forge_residual.py" "$WORK/g" ok short long float64 int32 2d nogroup nan >/dev/null ||
    notok "residuals: forging failed"
expect "residuals as a run writes them: ftk-verify exit 0" 0 "$BIN/ftk-verify" "$WORK/g-ok"
n=$(sed -n 's/.*"name": "layer.0", "length": [0-9]*, "padded": \([0-9]*\).*/\1/p' "$WORK/g/$C/manifest.json")
for x in "short|dataset /grad_residual/layer.0: shape \[$((n - 1))\], not \[$n\]" \
    "long|dataset /grad_residual/layer.0: shape \[$((n + 1))\], not \[$n\]" \
    "float64|dataset /grad_residual/layer.0: stored as float64, not float32" \
    "int32|dataset /grad_residual/layer.0: stored as int32, not float32" \
    "2d|dataset /grad_residual/layer.0: shape \[1, $n\], not \[$n\]" \
    "nogroup|0 of the 4 /grad_residual datasets the manifest's compress_grads asks for" \
    "nan|dataset /grad_residual/layer.0: 1 NaN and 0 infinite values"; do
    case=${x%%|*} pat=${x#*|}
    expect "residual $case: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$WORK/g-$case"
    says "residual $case: ftk-verify names it" "$pat"
done
for case in short nogroup nan; do
    expect "residual $case: ftk-train --resume auto falls back (exit 75 after a step)" 75 "$BIN/ftk-train" ${T#*-q } \
        -o "$WORK/g-$case" --save-every 1 --resume auto --stop-after 1
    says "residual $case: ... says step 2 is damaged" "$C is damaged (.*grad_residual"
    says "residual $case: ... resumes from step 1" "resuming from .*step-00000001"
done
finish
