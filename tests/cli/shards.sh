#!/bin/sh
# CLI tests of shard sets (ftk-pack --shards N) as training data (formats/tokens_set.h):
#  - the packer puts the same rows in the same global order in 1 file and in 3 shards
#    (h5py, when at hand: the shards' rows concatenated = the file's);
#  - ftk-train on a 1-file pack and on a 3-shard pack of the same records (named by its
#    base name or by one of its shards) gives identical losses on 1 rank and on 3 ranks,
#    and on an 11-shard pack (more files than the reader keeps open) and a compressed
#    3-shard pack on 1 rank;
#    1 and 3 ranks agree within 1e-5 (reduction order);
#  - resume: a run on the set resumes when the set is named another way, and refuses the
#    1-file pack (other data: another set checksum);
#  - refused sets, exit 2 naming the file, no run directory: a missing shard, an extra
#    one, a renamed one, one of another tokenizer, one of another max_len, one of another
#    pack of the same options, one whose datasets changed after packing (set checksum),
#    a base naming two sets, a name that is nothing; ftk-verify exits 3 on the same sets;
#  - ftk-verify and ftk-info describe the set as a whole.
# Usage: tests/cli/shards.sh BIN_DIR WORK_DIR DATA_DIR [quick]   (quick: the sanitizer build's
#        pass: without the 3-rank runs, the h5py checks, the other-tokenizer case, the set
#        named by a shard and the compressed set, whose cost is MPI's, Python's, a
#        32000-token tokenizer's or HDF5's, through reader code the other cases run)
set -u
BIN=$1 WORK=$2 DATA=$3 QUICK=${4:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"

PACK="$BIN/ftk-pack -q -t $ROOT/examples/demo/tokenizer.model $ROOT/examples/demo/alpaca-demo.json --pack --val-count 4"
$PACK --max-len 256 -o "$WORK/one.h5" 2>/dev/null
$PACK --max-len 256 -o "$WORK/three.h5" --shards 3 2>/dev/null
demo_init "$WORK/init.h5" tiny 1
S="$WORK/three"
check "3 shards written" test -f "$S-00001-of-00003.h5" -a -f "$S-00002-of-00003.h5" -a -f "$S-00003-of-00003.h5"

if [ "$QUICK" != quick ] && "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    check "the shards' rows, concatenated, are the 1-file pack's (both splits, tokens and masks)" "$PY" -c '
import sys, h5py, numpy as np
one = h5py.File(sys.argv[1], "r")
parts = [h5py.File("%s-%05d-of-00003.h5" % (sys.argv[2], k), "r") for k in (1, 2, 3)]
for g in ("train", "val"):
    for d in ("tokens", "loss_mask", "sample_lengths", "sample_record"):
        if not np.array_equal(one[g][d][...], np.concatenate([p[g][d][...] for p in parts])):
            sys.exit("/%s/%s differs" % (g, d))
' "$WORK/one.h5" "$S"
fi

# --- the same losses ---------------------------------------------------------------------------
T="$BIN/ftk-train -m $WORK/init.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 5 -q -j1 --steps 5"
losses() { grep 'loss' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//; s/, "time".*//'; }
expect "1 rank, 1-file pack" 0 $T -d "$WORK/one.h5" -o "$WORK/r1-one" --no-save
expect "1 rank, 3 shards by base name" 0 $T -d "$S" -o "$WORK/r1-three" --save-every 3
losses "$WORK/r1-one" >"$WORK/l-one"
losses "$WORK/r1-three" >"$WORK/l-three"
check "1 rank: 5 steps (into the second epoch) and 2 evaluations" test "$(grep -c "\"loss\"" "$WORK/l-one")" = 5 -a "$(grep -c val_loss "$WORK/l-one")" = 2
same "1 rank: 3 shards (base name) give the 1-file pack's losses, validation losses, token counts" "$WORK/l-three" \
    "$WORK/l-one"
if [ "$QUICK" != quick ]; then # the same reader code as above: not worth the sanitizer's time
    expect "1 rank, 3 shards by its second shard" 0 $T -d "$S-00002-of-00003.h5" -o "$WORK/r1-three2" --no-save
    losses "$WORK/r1-three2" >"$WORK/l-three2"
    same "1 rank: 3 shards (named by a shard) the same" "$WORK/l-three2" "$WORK/l-one"
fi
# More shards than the reader keeps open (8): files closed and reopened as rows are read;
# some shards hold no validation row.
$PACK --max-len 256 -o "$WORK/eleven.h5" --shards 11 2>/dev/null
expect "1 rank, 11 shards" 0 $T -d "$WORK/eleven" -o "$WORK/r1-eleven" --no-save
losses "$WORK/r1-eleven" >"$WORK/l-eleven"
same "1 rank: 11 shards give the 1-file pack's losses" "$WORK/l-eleven" "$WORK/l-one"
if [ "$QUICK" != quick ]; then # HDF5 decompresses; the reader's code is the same
    $PACK --max-len 256 -o "$WORK/z.h5" --shards 3 --compress zstd 2>/dev/null
    expect "1 rank, 3 compressed shards" 0 $T -d "$WORK/z" -o "$WORK/r1-z" --no-save
    losses "$WORK/r1-z" >"$WORK/l-z"
    same "1 rank: 3 compressed shards give the 1-file pack's losses" "$WORK/l-z" "$WORK/l-one"
fi
if [ "$QUICK" = quick ]; then
    echo "note: quick: the 3-rank runs are skipped"
elif command -v mpirun >/dev/null; then
    need_mpi
    expect "3 ranks, 1-file pack" 0 $TO $MPI -np 3 $T -d "$WORK/one.h5" -o "$WORK/r3-one" --no-save
    expect "3 ranks, 3 shards" 0 $TO $MPI -np 3 $T -d "$S.h5" -o "$WORK/r3-three" --no-save
    losses "$WORK/r3-one" >"$WORK/l3-one"
    losses "$WORK/r3-three" >"$WORK/l3-three"
    same "3 ranks: 3 shards give the 1-file pack's losses" "$WORK/l3-three" "$WORK/l3-one"
    close_losses "3 ranks follow 1 rank (1e-5: reduction order)" "$WORK/r3-three" "$WORK/r1-one" 1e-5 5
else
    echo "note: no mpirun: the 3-rank runs are skipped"
fi

# --- resume: the set's identity ----------------------------------------------------------------
expect "resume the set's run, the set named by its third shard" 0 $T -d "$S-00003-of-00003.h5" -o "$WORK/r1-three" \
    --save-every 3 --resume "$WORK/r1-three/step-00000003"
losses "$WORK/r1-three" >"$WORK/l-three"
same "... the same losses" "$WORK/l-three" "$WORK/l-one"
expect "resume the set's run on the 1-file pack: refused" 2 $T -d "$WORK/one.h5" -o "$WORK/r1-three" --save-every 3 \
    --resume "$WORK/r1-three/step-00000003"
grep -q "trained on other data" "$WORK/err" && ok "... message: other data" || notok "... message: other data"

# --- refused sets --------------------------------------------------------------------------------
$PACK --max-len 128 -o "$WORK/ml128.h5" --shards 3 2>/dev/null
$PACK --max-len 256 --seed 7 -o "$WORK/seed7.h5" --shards 3 2>/dev/null
LT=$DATA/llama2-tokenizer/tokenizer.model
[ "$QUICK" = quick ] && LT="$LT (quick)" # not a file
[ -f "$LT" ] && "$BIN/ftk-pack" -q -t "$LT" "$ROOT/examples/demo/alpaca-demo.json" --pack --val-count 4 --max-len 256 \
    -o "$WORK/llama.h5" --shards 3 2>/dev/null
# refuse NAME DIR DATA PATTERN: ftk-train on DIR's set (a copy of the 3 shards, altered by
# the caller) exits 2 with PATTERN in its message and writes nothing; ftk-verify exits 3.
copy() { rm -rf "$WORK/$1" && mkdir "$WORK/$1" && cp "$S"-0000?-of-00003.h5 "$WORK/$1/"; }
refuse() {
    expect "$1: ftk-train exit 2" 2 $T -d "$3" -o "$WORK/$2/run"
    if grep -q -- "$4" "$WORK/err"; then ok "$1: message names $4"; else
        notok "$1: message names $4"
        sed 's/^/     | /' "$WORK/err"
    fi
    check "$1: no run directory" test ! -e "$WORK/$2/run"
    expect "$1: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$3"
    grep -q -- "$4" "$WORK/err" && ok "$1: ftk-verify names it too" || notok "$1: ftk-verify names it too"
}
copy miss && rm "$WORK/miss/three-00002-of-00003.h5"
refuse "missing shard" miss "$WORK/miss/three" "three-00002-of-00003.h5: shard 2 of 3 is missing"
copy extra && cp "$S-00001-of-00003.h5" "$WORK/extra/three-00004-of-00003.h5"
refuse "extra shard" extra "$WORK/extra/three-00001-of-00003.h5" "three-00004-of-00003.h5: extra shard"
copy ren && mv "$WORK/ren/three-00003-of-00003.h5" "$WORK/ren/three-00002-of-00003.h5"
refuse "a shard under another shard's name" ren "$WORK/ren/three.h5" \
    "three-00002-of-00003.h5: its name says shard 2 of 3, the file says shard 3 of 3"
copy ml && cp "$WORK/ml128-00003-of-00003.h5" "$WORK/ml/three-00003-of-00003.h5"
refuse "a shard of another max_len" ml "$WORK/ml/three" "three-00003-of-00003.h5: max_len 128, but .*three-00001-of-00003.h5 has 256"
if [ -f "$LT" ]; then
    copy tok && cp "$WORK/llama-00002-of-00003.h5" "$WORK/tok/three-00002-of-00003.h5"
    refuse "a shard of another tokenizer" tok "$WORK/tok/three" "three-00002-of-00003.h5: tokenizer_xxh3 \"[0-9a-f]*\", but"
else
    echo "note: $LT: not at hand: the other-tokenizer case is skipped"
fi
copy s7 && cp "$WORK/seed7-00002-of-00003.h5" "$WORK/s7/three-00002-of-00003.h5"
refuse "a shard of another pack with the same options" s7 "$WORK/s7/three" "three-00002-of-00003.h5: set_xxh3 [0-9a-f]*, but"
if [ "$QUICK" != quick ] && "$PY" -c 'import h5py, numpy' 2>/dev/null; then # a dataset changed with its own checksum, not the set's
    copy forged
    "$PY" "$ROOT/tests/fault/forge.py" "$WORK/forged/three-00002-of-00003.h5" /train/tokens set:5:7 >/dev/null
    refuse "a shard changed after packing" forged "$WORK/forged/three" "set_xxh3 [0-9a-f]*, but their datasets' checksums make"
fi
copy two && cp "$WORK/ml128-00001-of-00003.h5" "$WORK/two/three-00001-of-00002.h5"
expect "a base naming two sets: exit 2" 2 $T -d "$WORK/two/three" -o "$WORK/two/run"
grep -q "names several sets" "$WORK/err" && ok "... message: several sets" || notok "... message: several sets"
expect "... the set named by its file is fine" 0 $T -d "$WORK/two/three-00001-of-00003.h5" -o "$WORK/two/run" --steps 1 \
    --no-save
expect "a name that is nothing: exit 2" 2 $T -d "$WORK/nothing" -o "$WORK/x"
grep -q "nothing: no such file, nor a set of shards" "$WORK/err" && ok "... message says so" || notok "... message says so"

# --- the set as a whole ----------------------------------------------------------------------------
expect "ftk-verify the set by one shard and by its base (checked once)" 0 "$BIN/ftk-verify" "$S-00002-of-00003.h5" "$S"
check "... one OK line per shard and one for the set" test "$(grep -c ': OK' "$WORK/out")" = 4
# The set's rows are the 1-file pack's: R train and V val rows, shard k holding [R·k/3, R·(k+1)/3).
"$BIN/ftk-info" "$WORK/one.h5" >"$WORK/one.info" 2>&1
R=$(awk '$1 == "n_rows" { print $2; exit }' "$WORK/one.info")
V=$(awk '$1 == "n_rows" { n++; if (n == 2) { print $2; exit } }' "$WORK/one.info")
grep -q "three: OK (token set of 3 shards, $R train and $V val rows" "$WORK/out" && ok "... the set line counts the rows ($R, $V)" ||
    notok "... the set line counts the rows ($R, $V)"
expect "ftk-info the set" 0 "$BIN/ftk-info" "$S"
grep -q "ftk token set of 3 shards" "$WORK/out" && grep -q "/train $R rows, 36 samples" "$WORK/out" &&
    grep -q "three-00003-of-00003.h5  train $((R * 2 / 3))..$R, val $((V * 2 / 3))..$V" "$WORK/out" &&
    ok "... shares, totals and global rows" || notok "... shares, totals and global rows"
finish
