#!/bin/sh
# Asynchronous checkpoints (ftk-train --async-save, engine/trainer.h):
#  - the same job saved asynchronously and synchronously (2 MPI ranks; and one process in
#    bf16-true) writes byte-identical checkpoints (every shard file and manifest), which
#    ftk-verify --compare also finds identical, and identical losses;
#  - SIGTERM and --stop-after while a background write is under way: it is committed, then
#    the stop's own checkpoint, exit 75; --resume auto ends on the synchronous run's bits;
#  - a background write that fails (its directory removed under it) fails the run with
#    exit 1 naming it, `latest` stays on the previous checkpoint, --resume auto finishes;
#  - kill -9 of one rank, then of every rank, at random instants while background writes
#    are under way (FTK_TEST_WRITE_DELAY_MS stretches each write to a few hundred ms, as a
#    large shard's would be): `latest` names a whole checkpoint (ftk-verify), --resume auto
#    continues from the newest committed one, removes the unfinished directory, and the run
#    ends on the same bits and losses as the uninterrupted synchronous run.
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
[ $QUICK = 1 ] && TO="timeout -k 5 120" || need_mpi
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
STEPS=12
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 -j1 --steps $STEPS --save-every 2 --keep 3"
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
# writing RUN: a background write is under way in RUN (its hidden step directory exists);
# committed_writing RUN: and a checkpoint was committed before it.
writing() { ls -a "$1" 2>/dev/null | grep -q '^\.step-'; }
committed_writing() { [ -e "$1/latest" ] && writing "$1"; }
# wait_until CMD...: polls CMD every 50 ms until it succeeds, at most 15 s.
wait_until() {
    _w=0
    while [ $_w -lt 300 ] && ! "$@"; do
        sleep 0.05
        _w=$((_w + 1))
    done
}
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
expect "1 process, bf16-true, --async-save (writes slowed to overlap steps)" 0 env FTK_TEST_WRITE_DELAY_MS=5 \
    $TO $P -o "$WORK/tasync" --async-save
same_ckpts "bf16-true: async and sync checkpoints byte-identical (steps 2-8)" "$WORK/tasync" "$WORK/tsync" 2 4 6 8
losses "$WORK/tasync" >"$WORK/la"
losses "$WORK/tsync" >"$WORK/ls"
same "bf16-true: async and sync losses identical" "$WORK/la" "$WORK/ls"

# --- stopping while a write is under way ------------------------------------------------------
FTK_TEST_WRITE_DELAY_MS=60 $TO $P -o "$WORK/tterm" --async-save 2>/dev/null &
pt=$!
wait_until writing "$WORK/tterm"
kill -TERM $pt
wait $pt
rc=$?
a=$(grep -c '"async": true' "$WORK/tterm/metrics.jsonl")
s=$(grep '"checkpoint"' "$WORK/tterm/metrics.jsonl" | tail -n 1 | grep -c '"async": false')
check "SIGTERM during a background write: exit 75 ($rc), it committed ($a), then a synchronous one ($s)" \
    test "$rc:$s" = 75:1 -a "$a" -ge 1
expect "--stop-after 3 with writes in flight: exit 75" 75 env FTK_TEST_WRITE_DELAY_MS=60 $TO $P -o "$WORK/tstop" \
    --async-save --stop-after 3
check "--stop-after: the background step 2 and the stop's step 3 committed" \
    test -d "$WORK/tstop/step-00000002" -a "$(cat "$WORK/tstop/latest")" = step-00000003
for r in tterm tstop; do
    expect "$r: --resume auto finishes the run" 0 $TO $P -o "$WORK/$r" --async-save --resume auto
    same_ckpts "$r: ends on the bits of the synchronous run" "$WORK/$r" "$WORK/tsync" 8
done

# --- a background write fails ------------------------------------------------------------------
# Writes of 12 × 60 ms: once step 2 is committed, the next write's hidden directory is
# removed under it; the shard file's fsync then fails in the writer thread.
FTK_TEST_WRITE_DELAY_MS=60 $TO $P -o "$WORK/tfail" --async-save 2>"$WORK/fail.err" &
pf=$!
wait_until committed_writing "$WORK/tfail"
rm -rf "$WORK"/tfail/.step-*
wait $pf
rc=$?
check "a background write that fails: the run exits 1 ($rc)" test $rc -eq 1
grep -q "background write" "$WORK/fail.err" && ok "its message names the background write" || {
    notok "its message names the background write"
    sed 's/^/     | /' "$WORK/fail.err" | head -n 5
}
named=$(cat "$WORK/tfail/latest" 2>/dev/null)
check "\`latest\` stays on a whole checkpoint ($named)" sh -c "'$BIN/ftk-verify' -q '$WORK/tfail/$named' >/dev/null"
expect "--resume auto after the failed write finishes the run" 0 $TO $P -o "$WORK/tfail" --async-save --resume auto
same_ckpts "and ends on the bits of the synchronous run" "$WORK/tfail" "$WORK/tsync" 8

# --- kill -9 during background writes ----------------------------------------------------------
i=0 mid=0 live=0
while [ $i -lt "$TRIALS" ]; do
    i=$((i + 1))
    run="$WORK/kill$i"
    FTK_TEST_WRITE_DELAY_MS=25 $MPI -np 2 $T -o "$run" --async-save >/dev/null 2>&1 &
    mp=$!
    # A random instant once the first background write has begun (most of the run from
    # there on has one under way): the start-up of MPI takes anything from 0.5 to 5 s here.
    wait_until writing "$run"
    sleep "$(awk -v s=$i 'BEGIN { srand(s + systime()); printf "%.2f", rand() * 1.5 }')"
    kill_ranks $mp $i
    resume_after_kill $i "$run" $STEPS $TO $MPI -np 2 $(echo "$T" | sed 's/ -q / /') -o "$run" --async-save --resume auto
    same_ckpts "kill -9 #$i: final checkpoint byte-identical to the uninterrupted synchronous run" "$run" \
        "$WORK/sync" $STEPS
    losses "$run" >"$WORK/lk"
    losses "$WORK/sync" >"$WORK/ls"
    same "kill -9 #$i: losses identical to the uninterrupted run at every step" "$WORK/lk" "$WORK/ls"
done
echo "note: $TRIALS kill -9 trials ($(( (TRIALS + 1) / 2 )) of one rank, $((TRIALS / 2)) of every rank): $live landed before the run's end, $mid of them during a background write"
finish
