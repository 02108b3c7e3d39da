#!/bin/sh
# CLI tests of the training stage: ftk-train and ftk-generate.
#  - stories260K (real pretrained llama2.c model): greedy 200 tokens from BOS equal
#    llama2.c's expected output byte for byte;
#  - bit-exact resume: 2N steps in one go == N steps, stop (--stop-after, exit 75), resume,
#    N more: identical losses at every step and byte-identical checkpoint shards
#    (weights, both AdamW moments); the same through a real SIGTERM after a random step (FTK_FAULT),
#    and through kill -9 with --resume auto falling back to the last committed checkpoint;
#  - the same bit-exact resume (--stop-after, SIGTERM after a random number of steps) in
#    bf16-mixed and bf16-true, on tiny's shape; resuming in another --precision refused
#    (exit 2, naming --precision and ftk-reshard --precision), accepted after ftk-reshard
#    --precision fp32; --rounding nearest on a stochastic bf16-true run resumes with a
#    warning naming --rounding; a run stopped under FTK_SROUND_HASHES=3 (other bits)
#    resumes under the default rule, and other values are refused;
#  - the thread count changes the speed only: -j 1 and -j 3 give the same shard bytes and
#    metrics in each precision (fp32 only in quick), and a run stopped on -j 2 resumes on
#    -j 0 to the same bits;
#  - refusals: inconsistent resume options, another run's directory, damaged checkpoint,
#    vocabulary mismatch — each exit 2 with a message, no checkpoint written;
#  - learning: loss goes down on the demo data; generate from a run directory.
# Usage: tests/cli/train.sh BIN_DIR WORK_DIR DATA_DIR [quick]
#   quick (the sanitizer build's run): the demo-data runs on tiny's shape instead of
#   stories260K's, the same options and checks (a third of the time under ASan), and the
#   thread-count check in fp32 only
set -u
BIN=$1 WORK=$2 DATA=$3 QUICK=${4:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"

for t in ftk-train ftk-generate; do
    expect "$t --help" 0 "$BIN/$t" --help
    grep -q "^Usage: " "$WORK/out" && ok "$t --help prints Usage" || notok "$t --help prints Usage"
done

# --- stories260K against llama2.c -------------------------------------------------------
S=$DATA/stories260K
if [ -f "$S/stories260K.bin" ]; then
    expect "import stories260K" 0 "$BIN/ftk-import-llama2c" "$S/stories260K.bin" --tokenizer "$S/tok512.bin" \
        -o "$WORK/stories.h5"
    # llama2.c `run -t 0 -n 200` forwards BOS and prints 200 sampled tokens; it ends with a
    # newline that the expected file leaves out, as does ftk-generate's final newline here.
    expect "generate greedy 200 from BOS" 0 "$BIN/ftk-generate" -m "$WORK/stories.h5" --greedy -n 200 -q
    head -c -1 "$WORK/out" >"$WORK/greedy.txt"
    same "stories260K greedy-200 == llama2.c's expected text" "$WORK/greedy.txt" "$S/greedy-200.expected.txt"
else
    echo "note: $S missing: stories260K check skipped"
fi

# --- a small run on the demo data -----------------------------------------------------------
demo_pack "$WORK/demo.h5" 128
if [ "$QUICK" = quick ]; then demo_init "$WORK/init.h5" tiny 1; else demo_init "$WORK/init.h5" stories260k 1; fi
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 3 --lr 2e-3 --warmup 2 --eval-every 4 -q"

losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
vals() { grep '"val_loss"' "$1/metrics.jsonl" | sed 's/, "time".*//'; }

expect "train 12 steps in one go" 0 $T -o "$WORK/a" --steps 12 --save-every 4
check "--warmup 2 of 12 steps: no warning" sh -c "! grep -q warning '$WORK/err'"
check "checkpoints at 4, 8, 12 and latest -> step 12" \
    test -d "$WORK/a/step-00000004" -a -d "$WORK/a/step-00000008" -a "$(cat "$WORK/a/latest")" = step-00000012
check "12 metrics lines with loss, 4 with val_loss (steps 0, 4, 8, 12)" test "$(losses "$WORK/a" | wc -l)" = 12 -a "$(vals "$WORK/a" | wc -l)" = 4
first=$(losses "$WORK/a" | head -n 1 | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
last=$(losses "$WORK/a" | tail -n 1 | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
check "the loss goes down ($first -> $last)" awk "BEGIN { exit !($last < $first - 0.1) }"

# --no-save (benchmarks): metrics, no checkpoint; contradicting options refused
expect "--no-save: 3 steps" 0 $T -o "$WORK/ns" --steps 3 --no-save
check "--no-save: metrics.jsonl, no checkpoint and no latest" test -s "$WORK/ns/metrics.jsonl" -a ! -e "$WORK/ns/latest" -a \
    -z "$(ls -d "$WORK/ns"/step-* 2>/dev/null)"
expect "--no-save with --save-every: exit 2" 2 $T -o "$WORK/ns2" --steps 3 --no-save --save-every 1
grep -q -- "--no-save" "$WORK/err" && ok "message names --no-save" || notok "message names --no-save"
expect "stop after 5 steps: exit 75" 75 $T -o "$WORK/b" --steps 12 --save-every 4 --stop-after 5
check "stopped run committed step 5" test "$(cat "$WORK/b/latest")" = step-00000005
expect "resume without --resume: refused" 2 $T -o "$WORK/b" --steps 12 --save-every 4
grep -q "already holds a run" "$WORK/err" && ok "message says the run exists" || notok "message says the run exists"
expect "resume with another --lr: refused" 2 $T -o "$WORK/b" --steps 12 --save-every 4 --resume auto --lr 1e-3
grep -q -- "--lr differs.*; resume with the same options, or add --extend" "$WORK/err" &&
    ok "message names --lr and --extend" || notok "message names --lr and --extend: $(cat "$WORK/err")"
expect "resume with other --steps: refused" 2 $T -o "$WORK/b" --steps 13 --save-every 4 --resume auto
grep -q -- "--steps/--epochs (total steps) differs from the checkpoint's (12 there, 13 here); resume with the same options, or add --extend" \
    "$WORK/err" && ok "message names --steps and --extend" || notok "message names --steps and --extend: $(cat "$WORK/err")"
expect "resume auto: 7 more steps" 0 $T -o "$WORK/b" --steps 12 --save-every 4 --resume auto
losses "$WORK/a" >"$WORK/la"
losses "$WORK/b" >"$WORK/lb"
same "resumed run: identical loss, lr, grad norm at every step" "$WORK/lb" "$WORK/la"
vals "$WORK/a" >"$WORK/va"
vals "$WORK/b" >"$WORK/vb"
same "resumed run: identical validation losses" "$WORK/vb" "$WORK/va"
same "resumed run: final shard (weights, AdamW m and v) byte-identical" \
    "$WORK/b/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"
same "resumed run: same manifest" "$WORK/b/step-00000012/manifest.json" "$WORK/a/step-00000012/manifest.json"

# Activation recomputation runs the same ops on the same values: the same bits, at every
# level (bare --recompute is block; auto, with the host's memory, is one of them); the
# level is no resume option, so a run resumes at another (same bits again).
expect "train 12 steps with --recompute" 0 $T -o "$WORK/r" --steps 12 --save-every 4 --recompute
same "--recompute: final shard byte-identical to the run that keeps activations" \
    "$WORK/r/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"
expect "train 8 steps with --recompute norms, stop" 75 $T -o "$WORK/rn" --steps 12 --save-every 4 \
    --recompute norms --stop-after 8
expect "resume with --recompute auto (a tiny model: none)" 0 $T -o "$WORK/rn" --steps 12 --save-every 4 \
    --recompute auto --resume auto
same "--recompute norms, then auto: final shard byte-identical to the run that keeps activations" \
    "$WORK/rn/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"
expect "--recompute bogus: exit 2" 2 $T -o "$WORK/rx" --steps 2 --recompute=bogus
grep -q -- "--recompute bogus: need none, norms, block or auto" "$WORK/err" && ok "--recompute bogus: message" ||
    notok "--recompute bogus: message"

# A weights file damaged where the loader reads it (pread, not HDF5): a byte of a tensor
# flipped fails its checksum; exit 2 naming the tensor, no run directory.
cp "$WORK/init.h5" "$WORK/bad.h5"
flip_bit "$WORK/bad.h5" tensors/model.layers.0.mlp.down_proj.weight 10 0x40
expect "damaged weights file: exit 2" 2 $BIN/ftk-train -m "$WORK/bad.h5" -d "$WORK/demo.h5" -o "$WORK/bad" --steps 1 -q
grep -q "model.layers.0.mlp.down_proj.weight: checksum mismatch" "$WORK/err" &&
    ok "damaged weights file: the message names the tensor and the checksum" ||
    { notok "damaged weights file: the message names the tensor and the checksum"; head -n 3 "$WORK/err"; }
check "damaged weights file: no run directory" test ! -e "$WORK/bad"

# A real SIGTERM at the end of a random step K (FTK_FAULT raises it there): the next step
# finishes, a checkpoint is written at K + 1, exit 75; resuming ends exactly where the
# uninterrupted run did.
K=$(awk -v s="$$" 'BEGIN { srand(s); print 1 + int(rand() * 10) }')
rm -f "$WORK/fault.log"
expect "SIGTERM after step $K: exit 75" 75 env FTK_FAULT="train.step-end:$K:sig=TERM" FTK_FAULT_LOG="$WORK/fault.log" \
    $T -o "$WORK/c" --steps 12 --save-every 100
check "SIGTERM: landed after step $K, checkpoint at step $((K + 1)) ($(cat "$WORK/c/latest" 2>/dev/null))" \
    sh -c "grep -q '^train.step-end $K sig=TERM' '$WORK/fault.log' && \
    [ \"\$(cat '$WORK/c/latest')\" = $(printf 'step-%08d' $((K + 1))) ]"
expect "SIGTERM: resume auto" 0 $T -o "$WORK/c" --steps 12 --save-every 100 --resume auto
same "after SIGTERM + resume: final shard byte-identical" \
    "$WORK/c/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"

# kill -9 (FTK_FAULT: in the middle of writing the checkpoint of a random step, 2 to 10):
# no chance to write anything more; --resume auto continues from the last committed
# checkpoint (every 2 steps), no temporary is taken for a checkpoint.
K=$(awk -v s="$$" 'BEGIN { srand(s + 1); print 1 + int(rand() * 5) }')
rm -f "$WORK/fault.log"
expect "kill -9 while writing checkpoint #$K" 137 env FTK_FAULT="ckpt.begin:$K:kill" FTK_FAULT_LOG="$WORK/fault.log" \
    $T -o "$WORK/d" --steps 12 --save-every 2
check "kill -9: landed in checkpoint #$K; latest is #$((K - 1))'s ($(cat "$WORK/d/latest" 2>/dev/null || echo none))" \
    sh -c "grep -q '^ckpt.begin $K kill' '$WORK/fault.log' && \
    [ \"\$(cat '$WORK/d/latest' 2>/dev/null || echo none)\" = $([ $K = 1 ] && echo none || printf 'step-%08d' $((2 * K - 2))) ]"
expect "kill -9: resume auto" 0 $T -o "$WORK/d" --steps 12 --save-every 2 --resume auto
same "after kill -9 + resume: final shard byte-identical" \
    "$WORK/d/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"
losses "$WORK/d" >"$WORK/ld"
same "after kill -9 + resume: metrics trimmed and continued, identical" "$WORK/ld" "$WORK/la"
# (.lock is the run's lock file, kept: it names the last writer)
check "no hidden temporaries left in the run directory" test -z "$(ls -A "$WORK/d" | grep '^\.' | grep -vx '\.lock')"

# A damaged checkpoint is refused, naming the file; --resume auto falls back to the one
# before it and, replaying the same steps, ends on the same bits.
cp -r "$WORK/a" "$WORK/e"
printf 'X' | dd of="$WORK/e/step-00000012/shard-00001-of-00001.h5" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect "resume from a named damaged checkpoint: refused" 2 $T -o "$WORK/e" --steps 12 --resume "$WORK/e/step-00000012"
grep -q "shard-00001-of-00001.h5: file checksum [0-9a-f]* differs" "$WORK/err" && ok "message names the damaged shard" ||
    notok "message names the damaged shard"
expect "--resume auto past a damaged newest checkpoint" 0 $T -o "$WORK/e" --steps 12 --resume auto
grep -q "step-00000012 is damaged.*trying the one before" "$WORK/err" && ok "warning names the damaged checkpoint" ||
    notok "warning names the damaged checkpoint"
same "after the fallback: final shard byte-identical to the uninterrupted run" \
    "$WORK/e/step-00000012/shard-00001-of-00001.h5" "$WORK/a/step-00000012/shard-00001-of-00001.h5"
for c in "$WORK"/e/step-*/shard-00001-of-00001.h5; do
    printf 'X' | dd of="$c" bs=1 seek=5000 conv=notrunc 2>/dev/null
done
expect "--resume auto with every checkpoint damaged: refused" 2 $T -o "$WORK/e" --steps 12 --resume auto
grep -q "no checkpoint in .* verifies" "$WORK/err" && ok "message says none verifies" || notok "message says none verifies"
if [ -f "$WORK/stories.h5" ]; then # same shape as init.h5, other weights
    expect "resume from a run of other weights: refused" 2 $T -m "$WORK/stories.h5" -o "$WORK/a" --steps 12 \
        --save-every 4 --resume auto
    grep -q "started from other weights" "$WORK/err" && ok "message says other weights" ||
        notok "message says other weights"
fi

# --- the bf16 modes: bit-exact resume; resuming in another precision or rounding ---------------
# The checks of fp32's above, per mode, on tiny's shape (2 blocks, untied: the same code at a
# fifth of the cost; the sanitizer build runs this too). One thread per run (the CPU
# backend's bits do not depend on the thread count), so that a busy machine does not
# stretch the runs.
demo_init "$WORK/tiny.h5" tiny 1
B="$BIN/ftk-train -m $WORK/tiny.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 3 --lr 2e-3 --warmup 2 --eval-every 4 -q -j1"
SH=shard-00001-of-00001.h5
expect "tiny, fp32: 12 steps" 0 $B --steps 12 --save-every 4 -o "$WORK/fp32-a"
for prec in bf16-mixed bf16-true; do
    P="$B --precision $prec --steps 12 --save-every 4"
    W="$WORK/$prec"
    expect "$prec: 12 steps in one go" 0 $P -o "$W-a"
    grep -q "\"precision\": \"$prec\"" "$W-a/step-00000012/manifest.json" && ok "$prec: the manifest says $prec" ||
        notok "$prec: the manifest says $prec"
    check "$prec: other weights than the fp32 run's" \
        sh -c "! cmp -s '$W-a/step-00000012/$SH' '$WORK/fp32-a/step-00000012/$SH'"
    expect "$prec: stop after 5 steps: exit 75" 75 $P -o "$W-b" --stop-after 5
    # Another precision is refused (fp32 when --precision is not given), naming the way out.
    other=bf16-true
    [ $prec = bf16-true ] && other=fp32
    expect "$prec: resume with --precision $other: refused" 2 $P -o "$W-b" --resume auto --precision $other
    grep -q -- "--precision differs.*($prec there, $other here).*ftk-reshard --precision $other" "$WORK/err" &&
        ok "message names --precision and ftk-reshard --precision" ||
        notok "message names --precision and ftk-reshard --precision"
    expect "$prec: resume without --precision (fp32): refused" 2 $B --steps 12 --save-every 4 -o "$W-b" \
        --resume auto
    grep -q -- "--precision differs.*ftk-reshard --precision fp32" "$WORK/err" &&
        ok "message names --precision and ftk-reshard --precision fp32" ||
        notok "message names --precision and ftk-reshard --precision fp32"
    check "$prec: refused resumes wrote nothing (latest still step 5)" test "$(cat "$W-b/latest")" = step-00000005
    if [ $prec = bf16-true ]; then
        # Resuming with the other rounding: the state is valid for both; allowed, with a warning.
        cp -r "$W-b" "$W-n"
        expect "bf16-true: resume a stochastic run with --rounding nearest" 0 $P -o "$W-n" --resume auto \
            --rounding nearest
        grep -q "warning: .*rounded to stochastic.*rounds nearest (--rounding)" "$WORK/err" &&
            ok "warning names --rounding" || notok "warning names --rounding"
        check "bf16-true: nearest rounding gave other weights than stochastic" \
            sh -c "! cmp -s '$W-n/step-00000012/$SH' '$W-a/step-00000012/$SH'"
        # FTK_SROUND_HASHES=3, the rounding rule before 2026-11-28 (a hash per stored state,
        # kept for timing): other bits, the same state, so a run stopped under it resumes
        # under the default rule; a value other than 1 or 3 is refused.
        expect "bf16-true, FTK_SROUND_HASHES=3: stop after 5 steps: exit 75" 75 env FTK_SROUND_HASHES=3 $P \
            -o "$W-h" --stop-after 5
        check "bf16-true: the 3-hash rule gave other weights than one hash" \
            sh -c "! cmp -s '$W-h/step-00000005/$SH' '$W-b/step-00000005/$SH'"
        expect "bf16-true: the 3-hash run resumes under the default rule" 0 $P -o "$W-h" --resume auto
        expect "bf16-true, FTK_SROUND_HASHES=2: refused" 2 env FTK_SROUND_HASHES=2 $P -o "$W-h2"
        grep -q "FTK_SROUND_HASHES=2: expected 1 .* or 3" "$WORK/err" && ok "message names FTK_SROUND_HASHES" ||
            notok "message names FTK_SROUND_HASHES"
        # Converted to fp32 (widened exactly), the checkpoint resumes as an fp32 run.
        expect "ftk-reshard bf16-true-b/latest --ranks 1 --precision fp32" 0 "$BIN/ftk-reshard" -q "$W-b/latest" \
            -o "$W-f" --ranks 1 --precision fp32
        expect "the converted checkpoint resumes with fp32" 0 $B --steps 12 --save-every 4 -o "$W-f" \
            --resume auto
        check "fp32 continuation: step 12, manifest says fp32" sh -c "test \"\$(cat '$W-f/latest')\" = step-00000012 &&
            grep -q '\"precision\": \"fp32\"' '$W-f/step-00000012/manifest.json'"
    fi
    expect "$prec: resume auto: 7 more steps" 0 $P -o "$W-b" --resume auto
    losses "$W-a" >"$WORK/la"
    losses "$W-b" >"$WORK/lb"
    same "$prec: resumed run: identical loss, lr, grad norm at every step" "$WORK/lb" "$WORK/la"
    vals "$W-a" >"$WORK/va"
    vals "$W-b" >"$WORK/vb"
    same "$prec: resumed run: identical validation losses" "$WORK/vb" "$WORK/va"
    same "$prec: resumed run: final shard byte-identical" "$W-b/step-00000012/$SH" "$W-a/step-00000012/$SH"
    same "$prec: resumed run: same manifest" "$W-b/step-00000012/manifest.json" "$W-a/step-00000012/manifest.json"

    # SIGTERM at the end of a random step (1-8), whatever the machine's speed (FTK_FAULT)
    k=$(awk -v s="$$" 'BEGIN { srand(s); print 1 + int(rand() * 8) }')
    expect "$prec: SIGTERM after step $k: exit 75" 75 env FTK_FAULT="train.step-end:$k:sig=TERM" \
        $P -o "$W-c" --save-every 100
    check "$prec: ... checkpoint at step $((k + 1))" test "$(cat "$W-c/latest" 2>/dev/null)" = \
        "$(printf 'step-%08d' $((k + 1)))"
    expect "$prec: SIGTERM: resume auto" 0 $P -o "$W-c" --save-every 100 --resume auto
    same "$prec: after SIGTERM + resume: final shard byte-identical" "$W-c/step-00000012/$SH" \
        "$W-a/step-00000012/$SH"
    losses "$W-c" >"$WORK/lc"
    same "$prec: after SIGTERM + resume: identical losses" "$WORK/lc" "$WORK/la"
done

# --- the thread count changes the speed only ----------------------------------------------
# -j 1 and 3 (more threads than this machine may have cores) give the same checkpoint bytes
# and metrics in each precision; an fp32 run stopped on 2 threads resumes on all the cores
# (-j 0, what `ftk-train -o RUN --resume auto` takes) to the same bits again. Rows of 249
# tokens make the weight gradients' products sum over K = 996 and 498 tokens, more than
# BLAS's K block, which OpenBLAS cuts one way on one thread and another on several. (The
# sanitizer build's run: fp32 only; test_ops runs every op's threads under it.)
demo_pack "$WORK/demo249.h5" 249 2>/dev/null
J="$BIN/ftk-train -m $WORK/tiny.h5 -d $WORK/demo249.h5 --global-batch 10 --micro-batch 4 --lr 5e-3 --warmup 2 -q
    --steps 2 --save-every 2 --eval-every 2"
metrics_of() { losses "$1"; vals "$1"; }
precs="fp32 bf16-mixed bf16-true"
[ "$QUICK" = quick ] && precs=fp32
for prec in $precs; do
    expect "$prec, -j 1: 2 steps" 0 $J --precision $prec -j 1 -o "$WORK/j1-$prec"
    expect "$prec, -j 3: 2 steps" 0 $J --precision $prec -j 3 -o "$WORK/j3-$prec"
    same "$prec: -j 3 gives -j 1's final shard, byte for byte" "$WORK/j3-$prec/step-00000002/$SH" \
        "$WORK/j1-$prec/step-00000002/$SH"
    metrics_of "$WORK/j3-$prec" >"$WORK/lj"
    metrics_of "$WORK/j1-$prec" >"$WORK/l1"
    same "$prec: -j 3 gives -j 1's losses, gradient norms and validation losses" "$WORK/lj" "$WORK/l1"
done
expect "fp32, -j 2: stop after step 1" 75 $J -j 2 -o "$WORK/jr" --stop-after 1
expect "... resume auto on all the cores (-j 0)" 0 $J -j 0 -o "$WORK/jr" --resume auto
same "... final shard byte-identical to -j 1's uninterrupted run" "$WORK/jr/step-00000002/$SH" \
    "$WORK/j1-fp32/step-00000002/$SH"
metrics_of "$WORK/jr" >"$WORK/lj"
metrics_of "$WORK/j1-fp32" >"$WORK/l1"
same "... and its losses, gradient norms and validation losses" "$WORK/lj" "$WORK/l1"

# Bad usage and inputs.
expect "no --data: exit 2" 2 "$BIN/ftk-train" -m "$WORK/init.h5" -o "$WORK/x"
expect "weights as data: exit 2" 2 "$BIN/ftk-train" -m "$WORK/init.h5" -d "$WORK/init.h5" -o "$WORK/x"
# The CUDA backend: without a GPU (or a CUDA build) --device cuda is refused before anything
# is written; with one, the same run on the GPU follows the CPU's losses (bf16 matrix
# products: 3e-2 relative), and checkpoints cross between the devices both ways.
if "$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1; then
    expect "cuda: 12 steps" 0 $T -o "$WORK/cu" --steps 12 --save-every 4 --device cuda
    close_losses "cuda: losses follow the CPU run's" "$WORK/cu" "$WORK/a" 3e-2
    expect "cuda: 8 steps, stop" 75 $T -o "$WORK/cu2cpu" --steps 12 --save-every 4 --stop-after 8 --device cuda
    expect "cuda checkpoint resumed on the CPU" 0 $T -o "$WORK/cu2cpu" --steps 12 --save-every 4 --resume auto
    close_losses "cuda -> cpu: losses follow the CPU run's" "$WORK/cu2cpu" "$WORK/a" 3e-2
    expect "cpu: 8 steps, stop" 75 $T -o "$WORK/cpu2cu" --steps 12 --save-every 4 --stop-after 8
    expect "cpu checkpoint resumed on cuda" 0 $T -o "$WORK/cpu2cu" --steps 12 --save-every 4 --resume auto \
        --device cuda
    close_losses "cpu -> cuda: losses follow the CPU run's" "$WORK/cpu2cu" "$WORK/a" 3e-2
    expect "cuda: generate from the cuda run" 0 "$BIN/ftk-generate" -m "$WORK/cu" --device cuda -p "Name a colour." \
        -n 20 --greedy
else
    expect "--device cuda without a GPU: exit 2" 2 $T -o "$WORK/x" --device cuda
    grep -q "device cuda: .*CUDA" "$WORK/err" && ok "message says why (no CUDA device or no CUDA build)" ||
        notok "message says why (no CUDA device or no CUDA build)"
    check "no run directory made" test ! -e "$WORK/x"
    expect "ftk-generate --device cuda without a GPU: exit 2" 2 "$BIN/ftk-generate" -m "$WORK/a" --device cuda
    expect "FTK_DEVICE=cuda without a GPU: exit 2" 2 env FTK_DEVICE=cuda $T -o "$WORK/x"
fi
expect "--device tpu: exit 2" 2 $T -o "$WORK/x" --device tpu
expect "FTK_DEVICE=tpu: exit 2" 2 env FTK_DEVICE=tpu $T -o "$WORK/x"
grep -q "tpu: need cpu or cuda (from FTK_DEVICE)" "$WORK/err" && ok "message names FTK_DEVICE" ||
    notok "message names FTK_DEVICE"
# a long name too (the ranks' agreement on the device once compared a truncated copy of it)
expect "FTK_DEVICE=a-long-name-that-is-no-device: exit 2" 2 env FTK_DEVICE=a-long-name-that-is-no-device $T -o "$WORK/x"
grep -q "a-long-name-that-is-no-device: need cpu or cuda (from FTK_DEVICE)" "$WORK/err" &&
    ok "... the same message" || notok "... the same message"
expect "ftk-generate, FTK_DEVICE=tpu: exit 2" 2 env FTK_DEVICE=tpu "$BIN/ftk-generate" -m "$WORK/a" -p "Hi"
# no --device, no FTK_DEVICE (tests/run.sh sets it to cpu): cuda where a GPU is visible, else cpu
if "$ROOT/build/tests/gpu_smoke" >/dev/null 2>&1; then want=cuda; else want=cpu; fi
expect "no --device, no FTK_DEVICE: 2 steps" 0 env -u FTK_DEVICE "$BIN/ftk-train" -m "$WORK/init.h5" \
    -d "$WORK/demo.h5" --global-batch 8 --micro-batch 4 --steps 2 --eval-every 0 --no-save -o "$WORK/dflt"
grep -q "device $want)" "$WORK/err" && ok "it ran on $want" || notok "it ran on $want"
rm -rf "$WORK/dflt"
# FTK_PROFILE: per-op times at the end, the same losses as without it; a path that cannot be
# written is refused before anything is
expect "3 steps" 0 $T -o "$WORK/np" --steps 3 --eval-every 0 --no-save
expect "3 steps, FTK_PROFILE=FILE" 0 env FTK_PROFILE="$WORK/prof.md" $T -o "$WORK/pr" --steps 3 --eval-every 0 --no-save
losses "$WORK/pr" >"$WORK/l1"
losses "$WORK/np" >"$WORK/l2"
same "FTK_PROFILE: the same losses" "$WORK/l1" "$WORK/l2"
check "FTK_PROFILE: heading with the wall share" grep -q "^Per-op times on cpu (host clock): .* s wall (" "$WORK/prof.md"
check "FTK_PROFILE: per op (matmul)" grep -q "^| matmul | " "$WORK/prof.md"
if [ "$QUICK" = quick ]; then shape="attn_bwd f32 hd8 4/2"; else shape="attn_bwd f32 hd8 8/4"; fi
check "FTK_PROFILE: per shape ($shape)" grep -q "^| $shape | " "$WORK/prof.md"
expect "FTK_PROFILE into a missing directory: exit 2" 2 env FTK_PROFILE="$WORK/nodir/p.md" $T -o "$WORK/x" --steps 3
grep -q "FTK_PROFILE=$WORK/nodir/p.md: No such file" "$WORK/err" && ok "message names FTK_PROFILE and why" ||
    notok "message names FTK_PROFILE and why"
check "no run directory made" test ! -e "$WORK/x"
rm -rf "$WORK/np" "$WORK/pr"
"$BIN/ftk-init" -q --preset tiny -o "$WORK/tiny-v512.h5"
if [ -f "$DATA/llama2-tokenizer/tokenizer.model" ]; then
    "$BIN/ftk-pack" -q -t "$DATA/llama2-tokenizer/tokenizer.model" "$ROOT/examples/demo/alpaca-demo.json" \
        -o "$WORK/llama.h5" --pack --max-len 128
    expect "32000-token data on a 512-token model: exit 2" 2 "$BIN/ftk-train" -m "$WORK/tiny-v512.h5" \
        -d "$WORK/llama.h5" -o "$WORK/x"
    grep -q "vocabulary" "$WORK/err" && ok "message names the vocabulary" || notok "message names the vocabulary"
fi
check "no run directory left by refused runs" test ! -e "$WORK/x/latest"

# Generation from a run directory (its latest) and from a checkpoint, seeded.
expect "generate from run/ (latest)" 0 "$BIN/ftk-generate" -m "$WORK/a" --alpaca -p "Name a colour." -n 20 -s 3
cp "$WORK/out" "$WORK/g1"
expect "generate from run/step-00000012" 0 "$BIN/ftk-generate" -m "$WORK/a/step-00000012" --alpaca \
    -p "Name a colour." -n 20 -s 3
same "same seed, same text" "$WORK/out" "$WORK/g1"
expect "generate from a directory that is no run: exit 2" 2 "$BIN/ftk-generate" -m "$WORK"
finish
