#!/bin/sh
# CLI tests of the checkpoint tools (ftk-reshard, ftk-merge, ftk-verify on checkpoints) and
# of ftk-train resharding on load, on real checkpoints written by real MPI ranks:
#  - continuation across rank counts: 8 steps on 4 ranks, then (a) ftk-reshard to 2 and
#    resume on 2 ranks, (b) resume directly on 3 ranks; steps 9-16 match the uninterrupted
#    4-rank run within 1e-5 (relative), and the final checkpoints compare equal within
#    tolerance to its own (ftk-verify --compare across shard counts);
#  - round trips: 4 -> 3 -> 1 -> 2 -> 4 shards, and full -> hybrid -> full, reproduce every
#    file of the original bit for bit;
#  - many ranks with 64 descriptors at most (ulimit -n): 4 -> 100 -> 4 bit for bit, peak memory
#    independent of the rank count, a 100-shard checkpoint resumed on one process;
#  - ftk-merge: of a 4-rank checkpoint equals the weights of the same run on one process
#    (within tolerance), of any shard count the same bytes; bf16; --with-optimizer;
#  - precision modes (fp32, bf16-mixed, bf16-true): checkpoints of each by the library's
#    writer and by ftk-reshard --precision verify (--deep) and reshard bit for bit; fp32 ->
#    bf16-true stores PyTorch's nearest-even bf16 of every value (h5py), bf16-true -> fp32 ->
#    bf16-true and fp32 -> bf16-mixed -> fp32 give back every file; --compare across
#    precisions by value; ftk-merge and ftk-generate of bf16-true (the values widened);
#    damage (a flipped bf16 bit, datasets of another type than the manifest's precision, an
#    unknown precision) named and refused;
#  - a corruption corpus made from a real checkpoint (a bit flipped in each kind of dataset,
#    a truncated shard, a missing shard, a shard from another step, a manifest edited
#    without its seal, one (resealed) with a wrong size or checksum, a stale .tmp
#    directory): ftk-verify names each (exit 3), and
#    ftk-train --resume auto refuses the damaged checkpoint and falls back to the one before;
#  - refusals: ftk-reshard of a damaged checkpoint (exit 2, nothing written), an existing
#    output, a hybrid group that does not divide the ranks.
# Usage: tests/cli/ckpt.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
PY=/usr/bin/python3
HAVE_H5PY=0
# reseal MANIFEST: its manifest_xxh3 recomputed after an edit (so that the check behind
# the seal is what a test reaches)
reseal() { $PY "$ROOT/tests/fault/forge.py" "$1" --seal >/dev/null; }
$PY -c 'import h5py' 2>/dev/null && HAVE_H5PY=1

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/init.h5" tiny 1
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 -j1 --steps 16 --save-every 8"
TQ="$T -q"
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "lr".*//; s/.*"step": //; s/, "loss": / /'; }
# close NAME A B: the losses of steps 9-16 of runs A and B within 1e-5 relative.
close() {
    losses "$2" | awk '$1 > 8' >"$WORK/la"
    losses "$3" | awk '$1 > 8' >"$WORK/lb"
    worst=$(paste "$WORK/la" "$WORK/lb" | awk 'BEGIN { w = 0; n = 0 }
        { n++; if ($1 != $3) { w = 1e300; exit } d = $2 - $4; if (d < 0) d = -d; s = $4 < 0 ? -$4 : $4;
          r = s > 0 ? d / s : d; if (r > w) w = r }
        END { if (n != 8) w = 1e300; printf "%.3g", w }')
    if awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then ok "$1 (largest relative difference $worst)"; else
        notok "$1: largest relative loss difference $worst"
        paste "$WORK/la" "$WORK/lb" | sed 's/^/     | /'
    fi
}

# --- continuation across rank counts ----------------------------------------------------
expect "4 ranks: 16 steps uninterrupted" 0 $TO $MPI -np 4 $TQ -o "$WORK/ref4"
expect "4 ranks: stop after 8 (exit 75)" 75 $TO $MPI -np 4 $TQ -o "$WORK/run4" --stop-after 8
expect "ftk-verify: the 4-shard checkpoint is whole" 0 "$BIN/ftk-verify" --deep "$WORK/run4/latest"
grep -q "4 shards, strategy full on 4 ranks" "$WORK/out" && ok "ftk-verify: reports the layout" ||
    notok "ftk-verify: reports the layout"
expect "(a) ftk-reshard 4 -> 2" 0 "$BIN/ftk-reshard" "$WORK/run4/latest" -o "$WORK/run2/step-00000008" --ranks 2
check "(a) the new checkpoint has 2 shards and a latest" test -f "$WORK/run2/step-00000008/shard-00002-of-00002.h5" \
    -a -f "$WORK/run2/latest"
expect "(a) ftk-verify of the resharded checkpoint" 0 "$BIN/ftk-verify" "$WORK/run2"
expect "(a) resume on 2 ranks, 8 more steps" 0 $TO $MPI -np 2 $TQ -o "$WORK/run2" --resume auto
close "(a) steps 9-16 on 2 ranks after ftk-reshard match the 4-rank run" "$WORK/run2" "$WORK/ref4"
cp -r "$WORK/run4" "$WORK/run3"
expect "(b) resume a 4-shard checkpoint directly on 3 ranks" 0 $TO $MPI -np 3 $T -o "$WORK/run3" --resume auto
grep -q "4 shards (4 ranks, strategy full) resliced on load into 3" "$WORK/err" &&
    ok "(b) says it reshards on load" || notok "(b) says it reshards on load"
close "(b) steps 9-16 on 3 ranks after reshard-on-load match the 4-rank run" "$WORK/run3" "$WORK/ref4"
expect "(b) final checkpoint (3 shards) equals the 4-rank run's within 1e-4" 0 "$BIN/ftk-verify" --compare \
    "$WORK/run3" "$WORK/ref4" --rtol 1e-4 --atol 1e-7
expect "resume a 4-shard checkpoint on 1 process" 0 $TO $TQ -o "$WORK/run4" --resume auto
close "1 process after reshard-on-load matches the 4-rank run" "$WORK/run4" "$WORK/ref4"

# --- round trips --------------------------------------------------------------------------
C="$WORK/ref4/step-00000016"
expect "reshard 4 -> 3" 0 "$BIN/ftk-reshard" "$C" -o "$WORK/rt3" -n 3
expect "reshard 3 -> 1" 0 "$BIN/ftk-reshard" "$WORK/rt3" -o "$WORK/rt1" -n 1
expect "reshard 1 -> 2" 0 "$BIN/ftk-reshard" "$WORK/rt1/latest" -o "$WORK/rt2/step-00000016" -n 2
expect "reshard 2 -> 4" 0 "$BIN/ftk-reshard" "$WORK/rt2" -o "$WORK/rt4" -n 4
if diff -r "$C" "$WORK/rt4/step-00000016" >/dev/null; then ok "4 -> 3 -> 1 -> 2 -> 4: every file bit for bit"; else
    notok "4 -> 3 -> 1 -> 2 -> 4: every file bit for bit"
fi
expect "reshard full -> hybrid (4 ranks, groups of 2)" 0 "$BIN/ftk-reshard" "$C" -o "$WORK/rth" -n 4 \
    --strategy hybrid --shard-group-size 2
grep -q '"strategy": "hybrid"' "$WORK/rth/step-00000016/manifest.json" &&
    test "$(ls "$WORK/rth/step-00000016" | grep -c '^shard-')" = 2 && ok "hybrid: 2 shards, strategy recorded" ||
    notok "hybrid: 2 shards, strategy recorded"
expect "reshard hybrid -> full (4 ranks)" 0 "$BIN/ftk-reshard" "$WORK/rth" -o "$WORK/rtf" -n 4 --strategy full
if diff -r "$C" "$WORK/rtf/step-00000016" >/dev/null; then ok "full -> hybrid -> full: bit for bit"; else
    notok "full -> hybrid -> full: bit for bit"
fi
expect "ftk-verify --compare across shard counts: identical" 0 "$BIN/ftk-verify" --compare "$C" "$WORK/rt3"
expect "refused: the output exists" 2 "$BIN/ftk-reshard" "$C" -o "$WORK/rt3" -n 3
expect "refused: hybrid group does not divide the ranks" 2 "$BIN/ftk-reshard" "$C" -o "$WORK/x" -n 4 \
    --strategy hybrid --shard-group-size 3
expect "refused: -o names another step" 2 "$BIN/ftk-reshard" "$C" -o "$WORK/x/step-00000003" -n 2
check "refusals wrote nothing" test ! -e "$WORK/x"

# --- many ranks: open files and memory bounded --------------------------------------------
# 4 -> 100 -> 4 shards and a 100-shard checkpoint resumed on one process (reshard on load), each
# with at most 64 open descriptors: ftk-reshard writes 16 output files at a time and keeps 16
# inputs open, ftk-train's reshard on load 16 (the old ftk-reshard held every file open, about
# 0.6 MB of memory each, and failed here with "Too many open files"). Peak memory of 4 -> 100
# within 32 MB of 4 -> 2's (not under the sanitizers, whose allocator keeps freed memory).
C8="$WORK/run4/step-00000008"
expect "reshard 4 -> 2, 64 descriptors at most" 0 few_files 64 "$BIN/ftk-reshard" -q "$C8" -o "$WORK/m2" -n 2
r2=$(cat "$WORK/rss")
expect "reshard 4 -> 100, 64 descriptors at most" 0 few_files 64 "$BIN/ftk-reshard" -q "$C8" -o "$WORK/m100" -n 100
r100=$(cat "$WORK/rss")
if [ -n "${ASAN_OPTIONS:-}" ]; then
    echo "note: peak memory not compared under the sanitizers (4 -> 2: $r2 KB, 4 -> 100: $r100 KB)"
else
    check "peak memory of 4 -> 100 ($r100 KB) within 32 MB of 4 -> 2's ($r2 KB)" test "$r100" -le $((r2 + 32768))
fi
expect "ftk-verify: the 100-shard checkpoint" 0 "$BIN/ftk-verify" "$WORK/m100"
expect "reshard 100 -> 4, 64 descriptors at most" 0 few_files 64 "$BIN/ftk-reshard" -q "$WORK/m100" -o "$WORK/m4" -n 4
if diff -r "$C8" "$WORK/m4/step-00000008" >/dev/null; then ok "4 -> 100 -> 4: every file bit for bit"; else
    notok "4 -> 100 -> 4: every file bit for bit"
fi
expect "resume the 100-shard checkpoint on one process, 64 descriptors at most (exit 75 after a step)" 75 \
    few_files 64 $T -o "$WORK/m100" --resume auto --stop-after 1
grep -q "100 shards (100 ranks, strategy full) resliced on load into 1" "$WORK/err" && ok "... resliced on load" ||
    notok "... resliced on load"
losses "$WORK/m100" | sed -n 9p >"$WORK/l9" && losses "$WORK/run4" | sed -n 9p | cmp -s - "$WORK/l9" && test -s "$WORK/l9" &&
    ok "... step 9's loss = one process's from the 4-shard checkpoint, bit for bit" ||
    notok "... step 9's loss differs from one process's from the 4-shard checkpoint"

# --- ftk-merge ----------------------------------------------------------------------------
expect "ftk-merge of the 4-shard checkpoint" 0 "$BIN/ftk-merge" "$WORK/ref4/latest" -o "$WORK/m4.h5"
expect "ftk-merge of the 1-shard reshard" 0 "$BIN/ftk-merge" "$WORK/rt1" -o "$WORK/m1.h5"
expect "the merged weights verify" 0 "$BIN/ftk-verify" --deep "$WORK/m4.h5"
expect "merge of 4 shards = merge of 1 (every tensor identical)" 0 "$BIN/ftk-verify" --compare "$WORK/m4.h5" \
    "$WORK/m1.h5"
expect "one process: the same 16 steps" 0 $TO $TQ -o "$WORK/ref1"
expect "ftk-merge of the one-process checkpoint" 0 "$BIN/ftk-merge" "$WORK/ref1" -o "$WORK/mref1.h5"
expect "merged 4-rank weights = one-process weights (rtol 1e-4, atol 1e-5: the distributed equivalence bound)" 0 "$BIN/ftk-verify" --compare "$WORK/m4.h5" \
    "$WORK/mref1.h5" --rtol 1e-4 --atol 1e-5
expect "ftk-merge --dtype bfloat16" 0 "$BIN/ftk-merge" "$C" -o "$WORK/mbf.h5" --dtype bfloat16
expect "bf16 merge differs from fp32 by rounding only (rtol 2^-8)" 0 "$BIN/ftk-verify" --compare "$WORK/mbf.h5" \
    "$WORK/m4.h5" --rtol 0.00390625
expect "ftk-merge --with-optimizer" 0 "$BIN/ftk-merge" "$C" -o "$WORK/mopt.h5" --with-optimizer
expect "the merged file with moments verifies" 0 "$BIN/ftk-verify" "$WORK/mopt.h5"
expect "ftk-generate from merged weights" 0 "$BIN/ftk-generate" -m "$WORK/m4.h5" -p "Hello" -n 8 --greedy
cp "$WORK/out" "$WORK/gen-merged"
expect "ftk-generate from the checkpoint" 0 "$BIN/ftk-generate" -m "$C" -p "Hello" -n 8 --greedy
same "the same text from the checkpoint and its merge" "$WORK/out" "$WORK/gen-merged"
expect "ftk-export-hf of merged weights" 0 "$BIN/ftk-export-hf" "$WORK/m4.h5" -o "$WORK/hf"
check "the export has config.json and safetensors" test -f "$WORK/hf/config.json" -a -f "$WORK/hf/model.safetensors"

# --- precision modes ----------------------------------------------------------------------
# Checkpoints of each precision from the library's writer (bench_make_ckpt: the initial
# weights, pseudo-random moments) and from the real run's $C by ftk-reshard --precision;
# h5py and PyTorch read the bf16 ones independently of ftk (tests/ref/ckpt_precision.py).
MK="$BIN/../tests/bench_make_ckpt" # the sanitizer build's, beside its bin/
[ -x "$MK" ] || MK="$ROOT/build/tests/bench_make_ckpt"
CP="$PY $ROOT/tests/ref/ckpt_precision.py"
for p in fp32 bf16-mixed bf16-true; do
    P="$WORK/p-$p/step-00000001"
    expect "$p: a 2-shard checkpoint by the library's writer" 0 "$MK" "$WORK/init.h5" "$WORK/p-$p" 2 $p
    grep -q "\"precision\": \"$p\"" "$P/manifest.json" && ok "$p: the manifest says so" ||
        notok "$p: the manifest says so"
    expect "$p: ftk-verify --deep" 0 "$BIN/ftk-verify" --deep "$WORK/p-$p"
    grep -q "precision $p, .*padding and values (no NaN/Inf) verified" "$WORK/out" &&
        ok "$p: ftk-verify reports the precision" || notok "$p: ftk-verify reports the precision"
    expect "$p: reshard 2 -> 3" 0 "$BIN/ftk-reshard" "$WORK/p-$p" -o "$WORK/p3-$p" -n 3
    grep -q "\"precision\": \"$p\"" "$WORK/p3-$p/step-00000001/manifest.json" &&
        ok "$p: resharding keeps the precision" || notok "$p: resharding keeps the precision"
    expect "$p: ftk-verify --deep of 3 shards" 0 "$BIN/ftk-verify" --deep "$WORK/p3-$p"
    expect "$p: reshard 3 -> 2" 0 "$BIN/ftk-reshard" "$WORK/p3-$p" -o "$WORK/p2-$p" -n 2
    if diff -r "$P" "$WORK/p2-$p/step-00000001" >/dev/null; then ok "$p: 2 -> 3 -> 2 bit for bit"; else
        notok "$p: 2 -> 3 -> 2 bit for bit"
    fi
done
check "bf16-mixed: the fp32 shard files (the same float32 arrays)" cmp -s \
    "$WORK/p-fp32/step-00000001/shard-00001-of-00002.h5" "$WORK/p-bf16-mixed/step-00000001/shard-00001-of-00002.h5"
# (and so the manifest's seal)
grep -v '"manifest_xxh3"' "$WORK/p-fp32/step-00000001/manifest.json" >"$WORK/m-fp32"
grep -v '"manifest_xxh3"' "$WORK/p-bf16-mixed/step-00000001/manifest.json" >"$WORK/m-bf16-mixed"
test "$(diff "$WORK/m-fp32" "$WORK/m-bf16-mixed" | grep -c '^[<>]')" = 2 &&
    ok "bf16-mixed: only the manifest's precision (and seal) differs from fp32" ||
    notok "bf16-mixed: only the manifest's precision (and seal) differs from fp32"
expect "bf16-true: the writer's 2 shards = ftk-reshard --precision of the fp32 ones" 0 "$BIN/ftk-reshard" \
    "$WORK/p-fp32" -o "$WORK/p-f2t" -n 2 --precision bf16-true
if diff -r "$WORK/p-bf16-true/step-00000001" "$WORK/p-f2t/step-00000001" >/dev/null; then
    ok "bf16-true: narrowed by the writer or by ftk-reshard, the same files"
else notok "bf16-true: narrowed by the writer or by ftk-reshard, the same files"; fi

# the real run's checkpoint converted
PT="$WORK/pt/step-00000016"
expect "--precision fp32 -> bf16-true (4 shards)" 0 "$BIN/ftk-reshard" "$C" -o "$WORK/pt" -n 4 --precision bf16-true
grep -q "(full, 4 ranks, fp32) -> 4 (full, 4 ranks, bf16-true)" "$WORK/err" && ok "ftk-reshard says what it converts" ||
    notok "ftk-reshard says what it converts"
expect "bf16-true: ftk-verify --deep" 0 "$BIN/ftk-verify" --deep "$WORK/pt"
expect "--precision bf16-true -> fp32" 0 "$BIN/ftk-reshard" "$WORK/pt" -o "$WORK/ptf" -n 4 --precision fp32
expect "--precision fp32 -> bf16-true again" 0 "$BIN/ftk-reshard" "$WORK/ptf" -o "$WORK/ptft" -n 4 --precision bf16-true
if diff -r "$PT" "$WORK/ptft/step-00000016" >/dev/null; then ok "bf16-true -> fp32 -> bf16-true: every file bit for bit"
else notok "bf16-true -> fp32 -> bf16-true: every file bit for bit"; fi
expect "--precision fp32 -> bf16-mixed" 0 "$BIN/ftk-reshard" "$C" -o "$WORK/pm" -n 4 --precision bf16-mixed
expect "bf16-mixed: ftk-verify --deep" 0 "$BIN/ftk-verify" --deep "$WORK/pm"
check "fp32 -> bf16-mixed: the same shard files" cmp -s "$C/shard-00003-of-00004.h5" \
    "$WORK/pm/step-00000016/shard-00003-of-00004.h5"
expect "--precision bf16-mixed -> fp32" 0 "$BIN/ftk-reshard" "$WORK/pm" -o "$WORK/pmf" -n 4 --precision fp32
if diff -r "$C" "$WORK/pmf/step-00000016" >/dev/null; then ok "fp32 -> bf16-mixed -> fp32: every file bit for bit"
else notok "fp32 -> bf16-mixed -> fp32: every file bit for bit"; fi
expect "--precision bf16-true while resharding 4 -> 3" 0 "$BIN/ftk-reshard" "$C" -o "$WORK/pt3" -n 3 \
    --precision bf16-true
expect "bf16-true 4 -> 3 -> 1 -> 4 shards" 0 sh -c "'$BIN/ftk-reshard' '$WORK/pt3' -o '$WORK/pt1' -n 1 &&
    '$BIN/ftk-reshard' '$WORK/pt1' -o '$WORK/pt4' -n 4"
if diff -r "$PT" "$WORK/pt4/step-00000016" >/dev/null; then ok "bf16-true: converted while resharding, the same files"
else notok "bf16-true: converted while resharding, the same files"; fi
expect "refused: --precision fp16" 2 "$BIN/ftk-reshard" "$C" -o "$WORK/x" -n 4 --precision fp16
check "refused --precision wrote nothing" test ! -e "$WORK/x"

# --compare across precisions
expect "--compare fp32 vs its bf16-true: different (exit 3)" 3 "$BIN/ftk-verify" --compare "$C" "$WORK/pt"
grep -q "precision: .* is fp32, .* is bf16-true; compared by value" "$WORK/out" &&
    ok "--compare names both precisions" || notok "--compare names both precisions"
expect "--compare fp32 vs its bf16-true: within bf16 rounding (rtol 2^-8)" 0 "$BIN/ftk-verify" --compare "$C" \
    "$WORK/pt" --rtol 0.00390625
expect "--compare bf16-true widened to fp32 vs bf16-true" 0 "$BIN/ftk-verify" --compare "$WORK/ptf" "$WORK/pt"
tail -n 1 "$WORK/out" | grep -q ": identical$" && ok "... identical values, reported identical" ||
    notok "... identical values, reported identical"
expect "--compare bf16-true 3 shards vs 4 shards" 0 "$BIN/ftk-verify" --compare "$WORK/pt3" "$WORK/pt"
tail -n 1 "$WORK/out" | grep -q ": identical$" && ok "... identical" || notok "... identical"
expect "--compare fp32 vs bf16-mixed (the same arrays)" 0 "$BIN/ftk-verify" --compare "$C" "$WORK/pm"
tail -n 1 "$WORK/out" | grep -q ": identical$" && ok "... identical" || notok "... identical"

# merge and generate from bf16-true
expect "ftk-merge of bf16-true" 0 "$BIN/ftk-merge" "$WORK/pt" -o "$WORK/mpt.h5"
expect "ftk-merge of bf16-true --with-optimizer" 0 "$BIN/ftk-merge" "$WORK/pt" -o "$WORK/mptopt.h5" --with-optimizer
expect "the merged bf16-true checkpoint verifies" 0 "$BIN/ftk-verify" --deep "$WORK/mptopt.h5"
expect "ftk-merge of bf16-true's fp32 widening" 0 "$BIN/ftk-merge" "$WORK/ptf" -o "$WORK/mptf.h5" --with-optimizer
expect "merge of bf16-true = merge of its fp32 widening (weights and moments)" 0 "$BIN/ftk-verify" --compare \
    "$WORK/mptopt.h5" "$WORK/mptf.h5"
expect "ftk-merge --dtype bfloat16 of bf16-true" 0 "$BIN/ftk-merge" "$WORK/pt" -o "$WORK/mptbf.h5" --dtype bfloat16
expect "... = ftk-merge --dtype bfloat16 of the fp32 original (one nearest-even rounding either way)" 0 \
    "$BIN/ftk-verify" --compare "$WORK/mptbf.h5" "$WORK/mbf.h5"
expect "ftk-generate from a bf16-true checkpoint" 0 "$BIN/ftk-generate" -m "$WORK/pt" -p "Hello" -n 8 --greedy
cp "$WORK/out" "$WORK/gen-bf16"
expect "ftk-generate from its float32 merge" 0 "$BIN/ftk-generate" -m "$WORK/mpt.h5" -p "Hello" -n 8 --greedy
same "the same text from the bf16-true checkpoint and its merge" "$WORK/out" "$WORK/gen-bf16"

# damage and refusals
cp -r "$WORK/pt" "$WORK/ptlie" && sed -i 's/"precision": "bf16-true"/"precision": "fp32"/' \
    "$WORK/ptlie/step-00000016/manifest.json" && reseal "$WORK/ptlie/step-00000016/manifest.json"
expect "bf16 datasets under a manifest saying fp32: exit 3" 3 "$BIN/ftk-verify" "$WORK/ptlie"
grep -q "shard-00001-of-00004.h5: dataset /param/embed: stored as bfloat16, but the manifest's precision fp32" \
    "$WORK/err" && ok "... names the file and dataset" || notok "... names the file and dataset"
cp -r "$WORK/ref4/step-00000016" "$WORK/fplie" && sed -i 's/"precision": "fp32"/"precision": "bf16-true"/' \
    "$WORK/fplie/manifest.json" && reseal "$WORK/fplie/manifest.json"
expect "float32 datasets under a manifest saying bf16-true: exit 3" 3 "$BIN/ftk-verify" "$WORK/fplie"
grep -q "dataset /adam_v/head: stored as float32, but the manifest's precision bf16-true" "$WORK/err" &&
    ok "... names the dataset" || notok "... names the dataset"
expect "ftk-merge refuses it (exit 2)" 2 "$BIN/ftk-merge" "$WORK/fplie" -o "$WORK/y.h5"
cp -r "$WORK/ref4/step-00000016" "$WORK/fp8" && sed -i 's/"precision": "fp32"/"precision": "fp8"/' \
    "$WORK/fp8/manifest.json" && reseal "$WORK/fp8/manifest.json"
expect "a manifest with an unknown precision: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$WORK/fp8"
grep -q "fp8: manifest.json: precision \"fp8\" is not one this ftk knows" "$WORK/err" &&
    ok "... names the manifest and the precision" || notok "... names the manifest and the precision"
expect "... ftk-reshard refuses it (exit 2)" 2 "$BIN/ftk-reshard" "$WORK/fp8" -o "$WORK/y" -n 2
expect "... ftk-merge refuses it (exit 2)" 2 "$BIN/ftk-merge" "$WORK/fp8" -o "$WORK/y.h5"
expect "... ftk-generate refuses it (exit 2)" 2 "$BIN/ftk-generate" -m "$WORK/fp8" -p "Hello" -n 2
check "the refusals wrote nothing" test ! -e "$WORK/y" -a ! -e "$WORK/y.h5"
if [ $HAVE_H5PY = 1 ] && $PY -c 'import torch' 2>/dev/null; then
    expect "h5py/PyTorch: fp32 -> bf16-true stores PyTorch's nearest-even bf16 of every value (uint16, dtype attribute)" \
        0 $CP rounded "$C" "$PT"
    expect "h5py/PyTorch: the library writer's bf16-true = the nearest-even bf16 of its fp32 twin" 0 $CP rounded \
        "$WORK/p-fp32/step-00000001" "$WORK/p-bf16-true/step-00000001"
    expect "h5py: merge of bf16-true = the shards' bf16 values widened (weights and moments)" 0 $CP merged "$PT" \
        "$WORK/mptopt.h5"
    cp -r "$WORK/pt" "$WORK/ptbad"
    flip_bit "$WORK/ptbad/step-00000016/shard-00002-of-00004.h5" param/layer.1
    expect "bf16-true, a bit flipped in /param/layer.1: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$WORK/ptbad"
    grep -q "shard-00002-of-00004.h5: dataset /param/layer.1: checksum mismatch" "$WORK/err" && ok "... named" ||
        notok "... named"
    expect "... ftk-reshard refuses it (exit 2)" 2 "$BIN/ftk-reshard" "$WORK/ptbad" -o "$WORK/y" -n 2
    rm -rf "$WORK/ptbad" && cp -r "$WORK/pt" "$WORK/ptbad"
    flip_bit "$WORK/ptbad/step-00000016/shard-00001-of-00004.h5" adam_v/embed
    expect "bf16-true, a bit flipped in /adam_v/embed: ftk-merge --with-optimizer refuses it (exit 2)" 2 \
        "$BIN/ftk-merge" "$WORK/ptbad" -o "$WORK/y.h5" --with-optimizer
    grep -q "shard-00001-of-00004.h5: file checksum" "$WORK/err" && ok "... named (the file, checked first)" ||
        notok "... named (the file, checked first)"
    check "nothing written" test ! -e "$WORK/y" -a ! -e "$WORK/y.h5"
else
    echo "skip the h5py/PyTorch checks of bf16 checkpoints (no h5py or torch in $PY)"
fi

# --- corruption corpus --------------------------------------------------------------------
# damage KIND: a copy of run4 (steps 8 and 16 on 4 ranks... here ref4) with step 16 damaged.
fresh() { rm -rf "$WORK/bad" && cp -r "$WORK/ref4" "$WORK/bad"; }
D="$WORK/bad/step-00000016"
S2="$D/shard-00002-of-00004.h5"
# corrupt NAME EXPECTED_MESSAGE: ftk-verify exit 3 naming it; --resume auto falls back to step 8.
corrupt() {
    expect "corpus, $1: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$D"
    if grep -q -- "$2" "$WORK/err"; then ok "corpus, $1: named ($2)"; else
        notok "corpus, $1: message should contain '$2'"
        sed 's/^/     | /' "$WORK/err" | head -n 5
    fi
    expect "corpus, $1: --resume auto falls back" 75 $TO $MPI -np 4 $T -o "$WORK/bad" --resume auto --stop-after 1
    grep -q "step-00000016 is damaged" "$WORK/err" && grep -q "resuming from .*step-00000008" "$WORK/err" &&
        ok "corpus, $1: says the newest is damaged, resumes from step 8" ||
        { notok "corpus, $1: fallback message"; sed 's/^/     | /' "$WORK/err" | head -n 5; }
}
if [ $HAVE_H5PY = 1 ]; then
    for ds in param/layer.0 adam_m/embed adam_v/head tokenizer/tokenizer.model; do
        fresh
        f="$D/shard-00001-of-00004.h5"
        [ "$ds" = tokenizer/tokenizer.model ] || f=$S2
        flip_bit "$f" "$ds"
        corrupt "bit flipped in /$ds" "dataset /$ds: checksum mismatch"
    done
else
    echo "skip corpus bit flips (no h5py in $PY)"
fi
fresh
truncate -s 20000 "$S2"
corrupt "truncated shard" "shard-00002-of-00004.h5: 20000 bytes, the manifest says"
fresh
rm "$S2"
corrupt "missing shard" "shard-00002-of-00004.h5: No such file"
fresh
cp "$WORK/bad/step-00000008/shard-00002-of-00004.h5" "$S2"
corrupt "shard from another step" "written at step 8, the manifest is of step 16"
fresh
sed -i '0,/"bytes": \([0-9]*\)/s//"bytes": 1\1/' "$D/manifest.json"
corrupt "manifest edited (a shard's size), its seal not" "manifest.json: checksum [0-9a-f]* differs from its manifest_xxh3"
fresh
sed -i '0,/"bytes": \([0-9]*\)/s//"bytes": 1\1/' "$D/manifest.json" && reseal "$D/manifest.json"
corrupt "manifest with a wrong size" "the manifest says 1"
fresh
sed -i '/"shard-00001-of-00004.h5"/s/"xxh3": "[0-9a-f]*"/"xxh3": "0123456789abcdef"/' "$D/manifest.json"
reseal "$D/manifest.json"
corrupt "manifest with a wrong shard checksum" "differs from the manifest's 0123456789abcdef, though every dataset verifies"
fresh
dead=$(sh -c 'echo $$') # the id of a process that has ended (a live one's temporary stays: lock.sh)
mkdir "$WORK/bad/.step-00000024.tmp.$dead" && cp "$S2" "$WORK/bad/.step-00000024.tmp.$dead/"
expect "corpus, stale .tmp directory: the checkpoints still verify" 0 "$BIN/ftk-verify" "$WORK/bad"
grep -q "\.step-00000024\.tmp\.$dead: an unfinished checkpoint" "$WORK/err" && ok "corpus, stale .tmp: named" ||
    notok "corpus, stale .tmp: named"
expect "corpus, stale .tmp: --resume auto removes it, resumes from step 16" 0 $TO $MPI -np 4 $T -o "$WORK/bad" \
    --resume auto
check "corpus, stale .tmp: removed" test ! -e "$WORK/bad/.step-00000024.tmp.$dead"
fresh
truncate -s 20000 "$S2"
expect "ftk-reshard refuses a damaged checkpoint (exit 2)" 2 "$BIN/ftk-reshard" "$D" -o "$WORK/y" -n 2
check "ftk-reshard wrote nothing (not even the run directory)" test ! -e "$WORK/y"
fresh
printf 'junk' | dd of="$S2" bs=1 seek=30000 conv=notrunc 2>/dev/null
expect "ftk-merge refuses a damaged checkpoint (exit 2)" 2 "$BIN/ftk-merge" "$D" -o "$WORK/y.h5"
check "ftk-merge wrote nothing" test ! -e "$WORK/y.h5"
expect "reshard-on-load refuses a damaged checkpoint and falls back" 75 $TO $MPI -np 3 $T -o "$WORK/bad" \
    --resume auto --stop-after 1
grep -q "resuming from .*step-00000008" "$WORK/err" && ok "reshard-on-load: fell back to step 8" ||
    notok "reshard-on-load: fell back to step 8"
finish
