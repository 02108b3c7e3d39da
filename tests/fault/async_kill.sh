#!/bin/sh
# Asynchronous checkpoints (ftk-train --async-save, engine/trainer.h):
#  - the same job saved asynchronously and synchronously (2 MPI ranks; and one process in
#    bf16-true) writes byte-identical checkpoints (every shard file and manifest), which
#    ftk-verify --compare also finds identical, and identical losses;
#  - SIGTERM and --stop-after while a background write is under way: it is committed, then
#    the stop's own checkpoint, exit 75; --resume auto ends on the synchronous run's bits;
#  - a background write that fails (an I/O error injected in its second checkpoint) fails
#    the run with exit 1 naming it, `latest` stays on the previous checkpoint, --resume
#    auto finishes;
#  - kill -9 of one rank, then of every rank, inside a background write (FTK_FAULT's
#    bgsave.write, at a random array of a random checkpoint; landing asserted): `latest`
#    names a whole checkpoint (ftk-verify), --resume auto continues from the newest
#    committed one, removes the unfinished directory, and the run ends on the same bits and
#    losses as the uninterrupted synchronous run.
# Faults are aimed with FTK_FAULT (libcommon/fault.h) and each asserts where it landed; a
# write is stretched (bgsave.write sleep) only where a test needs steps to run beside it.
# Usage: tests/fault/async_kill.sh BIN_DIR WORK_DIR [TRIALS]   (TRIALS: kill -9 trials,
#        default 4; make test-slow runs 24; "quick": the one-process checks only, no MPI —
#        the sanitizer build's pass)
set -u
BIN=$1 WORK=$2 TRIALS=${3:-4}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
QUICK=0
[ "$TRIALS" = quick ] && QUICK=1 TRIALS=0
[ $QUICK = 1 ] && TO="timeout -k 5 600" || need_mpi
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
STEPS=12
# the disk's background writes alone: a memory snapshot's writer reaches bgsave.write too
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 -j1 --steps $STEPS --save-every 2 --keep 3 --memory-snapshot-every 0"
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
# same_ckpts NAME RUN_A RUN_B STEP...: those checkpoints byte-identical (shards and manifest)
same_ckpts() {
    name=$1 a=$2 b=$3
    shift 3
    for s in "$@"; do
        d=$(printf 'step-%08d' "$s")
        if ! [ -d "$a/$d" ] || ! diff -r "$a/$d" "$b/$d" >/dev/null 2>&1; then
            notok "$name: $a/$d and $b/$d differ"
            return
        fi
    done
    ok "$name"
}

# --- async against sync: the same bytes -------------------------------------------------------
if [ $QUICK = 0 ]; then
expect "2 ranks, synchronous saves: the reference" 0 $TO $MPI -np 2 $T -o "$WORK/sync"
expect "2 ranks, --async-save" 0 $TO $MPI -np 2 $T -o "$WORK/async" --async-save
same_ckpts "async and sync checkpoints byte-identical (steps 8, 10, 12)" "$WORK/async" "$WORK/sync" 8 10 12
expect "ftk-verify --compare: async and sync step 10 identical" 0 "$BIN/ftk-verify" -q --compare \
    "$WORK/async/step-00000010" "$WORK/sync/step-00000010"
losses "$WORK/async" >"$WORK/la"
losses "$WORK/sync" >"$WORK/ls"
same "async and sync: losses identical at every step" "$WORK/la" "$WORK/ls"
n=$(grep -c '"checkpoint": .*"async": true' "$WORK/async/metrics.jsonl")
check "metrics: one line per background checkpoint (5) with stall_s, write_s and bytes ($n)" \
    sh -c "[ $n = 5 ] && grep '\"async\": true' '$WORK/async/metrics.jsonl' | grep -q '\"stall_s\": .*\"write_s\": .*\"bytes\": [1-9]'"
check "metrics: the last checkpoint (the end of the run) synchronous" \
    grep -q '"step": 12, "checkpoint": "step-00000012", "async": false' "$WORK/async/metrics.jsonl"
check "no unfinished checkpoint directory left" test -z "$(ls -a "$WORK/async" | grep '^\.step-')"

# --plan reports the snapshot: 3 arrays (weights, m, v) × Σ padded/S float32 per rank
"$BIN/ftk-train" --plan -m "$WORK/w.h5" -d "$WORK/d.h5" --ranks 2 --async-save >"$WORK/plan" 2>&1
want=$(grep -o '"padded": [0-9]*' "$WORK/async/step-00000012/manifest.json" |
    awk '{ s += $2 } END { printf "%.2f MB", 3 * s / 2 * 4 / 1e6 }')
got=$(sed -n 's/^  snapshot  *\([0-9.]* [MG]B\).*/\1/p' "$WORK/plan")
check "--plan --async-save: snapshot row $got = 3 × Σ padded/S × 4 bytes ($want), and a host total" \
    sh -c "[ '$got' = '$want' ] && grep -q '^  total + snapshot ' '$WORK/plan'"
fi

P="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j1 --steps 8 --save-every 2 --precision bf16-true"
expect "1 process, bf16-true, synchronous" 0 $TO $P -o "$WORK/tsync"
# each array's write stretched to 100 ms, so that steps run while a write is in flight; the
# fault log (appended in order by both threads) shows a step ending inside a write
expect "1 process, bf16-true, --async-save (writes slowed to overlap steps)" 0 env \
    FTK_FAULT=bgsave.write:1+:sleep=100,train.step-end:1+:sleep=0 FTK_FAULT_LOG="$WORK/overlap.log" \
    $TO $P -o "$WORK/tasync" --async-save
units=$(grep -c '"padded"' "$WORK/tsync/step-00000002/manifest.json")
check "bf16-true: steps ended while a background write was under way" awk -v per=$((3 * units)) '
    /^bgsave.write/ { j++; if (j % per != 1 && steps) seen = 1; steps = 0 }
    /^train.step-end/ { steps++ }
    END { exit !seen }' "$WORK/overlap.log"
same_ckpts "bf16-true: async and sync checkpoints byte-identical (steps 2-8)" "$WORK/tasync" "$WORK/tsync" 2 4 6 8
losses "$WORK/tasync" >"$WORK/la"
losses "$WORK/tsync" >"$WORK/ls"
same "bf16-true: async and sync losses identical" "$WORK/la" "$WORK/ls"

# --- stopping while a write is under way ------------------------------------------------------
# SIGTERM raised from inside the write of the first background checkpoint's third array
rm -f "$WORK/fault.log"
FTK_FAULT=bgsave.write:3:sig=TERM FTK_FAULT_LOG="$WORK/fault.log" $TO $P -o "$WORK/tterm" --async-save 2>/dev/null
rc=$?
check "SIGTERM: landed inside a background write" grep -q '^bgsave.write 3 sig=TERM' "$WORK/fault.log"
a=$(grep -c '"async": true' "$WORK/tterm/metrics.jsonl")
s=$(grep '"checkpoint"' "$WORK/tterm/metrics.jsonl" | tail -n 1 | grep -c '"async": false')
check "SIGTERM during a background write: exit 75 ($rc), it committed ($a), then a synchronous one ($s)" \
    test "$rc:$s" = 75:1 -a "$a" -ge 1
expect "--stop-after 3 with writes in flight: exit 75" 75 env FTK_FAULT=bgsave.write:1+:sleep=60 $TO $P -o "$WORK/tstop" \
    --async-save --stop-after 3
check "--stop-after: the background step 2 and the stop's step 3 committed" \
    test -d "$WORK/tstop/step-00000002" -a "$(cat "$WORK/tstop/latest")" = step-00000003
for r in tterm tstop; do
    expect "$r: --resume auto finishes the run" 0 $TO $P -o "$WORK/$r" --async-save --resume auto
    same_ckpts "$r: ends on the bits of the synchronous run" "$WORK/$r" "$WORK/tsync" 8
done

# --- a background write fails ------------------------------------------------------------------
# An I/O error at the second array of the second background write (step 4): step 2's
# checkpoint is committed by then (a checkpoint is 3 arrays per unit)
units=$(grep -c '"padded"' "$WORK/tsync/step-00000002/manifest.json")
rm -f "$WORK/fault.log"
FTK_FAULT=bgsave.write:$((3 * units + 2)):eio FTK_FAULT_LOG="$WORK/fault.log" $TO $P -o "$WORK/tfail" --async-save \
    2>"$WORK/fail.err"
rc=$?
check "the I/O error landed in the second background write" grep -q "^bgsave.write $((3 * units + 2)) eio" \
    "$WORK/fault.log"
check "a background write that fails: the run exits 1 ($rc)" test $rc -eq 1
grep -q "background write" "$WORK/fail.err" && ok "its message names the background write" || {
    notok "its message names the background write"
    sed 's/^/     | /' "$WORK/fail.err" | head -n 5
}
named=$(cat "$WORK/tfail/latest" 2>/dev/null)
check "\`latest\` stays on the whole checkpoint of step 2 ($named)" sh -c "[ '$named' = step-00000002 ] && \
    '$BIN/ftk-verify' -q '$WORK/tfail/$named' >/dev/null"
expect "--resume auto after the failed write finishes the run" 0 $TO $P -o "$WORK/tfail" --async-save --resume auto
same_ckpts "and ends on the bits of the synchronous run" "$WORK/tfail" "$WORK/tsync" 8

# --- kill -9 during background writes ----------------------------------------------------------
# Background writes at steps 2, 4, 6, 8 and 10 (12, the end, is synchronous), 3 arrays a unit
# each: the kill lands at a random one of them, in one rank's writer or in every rank's.
units=$(grep -c '"padded"' "$WORK/tsync/step-00000002/manifest.json")
i=0 mid=0 live=0
while [ $i -lt "$TRIALS" ]; do
    i=$((i + 1))
    run="$WORK/kill$i"
    N=$(awk -v s="$$$i" -v n=$((5 * 3 * units)) 'BEGIN { srand(s); print 1 + int(rand() * n) }')
    if [ $((i % 2)) -eq 1 ]; then r=$((i / 2 % 2)); site="bgsave.write@$r" who="rank $r"; else
        site=bgsave.write who="every rank"; fi
    rm -f "$WORK/fault.log"
    FTK_FAULT="$site:$N:kill" FTK_FAULT_LOG="$WORK/fault.log" $TO $MPI -np 2 $T -o "$run" --async-save >/dev/null 2>&1
    check "kill -9 #$i: landed in a background write (array $N, $who)" sh -c "grep -q '^bgsave.write $N kill' \
        '$WORK/fault.log' && ls -a '$run' | grep -q '^\.step-'"
    resume_after_kill $i "$run" $STEPS $TO $MPI -np 2 $(echo "$T" | sed 's/ -q / /') -o "$run" --async-save --resume auto
    same_ckpts "kill -9 #$i: final checkpoint byte-identical to the uninterrupted synchronous run" "$run" \
        "$WORK/sync" $STEPS
    losses "$run" >"$WORK/lk"
    losses "$WORK/sync" >"$WORK/ls"
    same "kill -9 #$i: losses identical to the uninterrupted run at every step" "$WORK/lk" "$WORK/ls"
done
echo "note: $TRIALS kill -9 trials in background writes: $live before the run's end, $mid with a write's directory left"
finish
