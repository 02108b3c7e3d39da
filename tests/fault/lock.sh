#!/bin/sh
# One writer per run directory (formats/checkpoint.h ckpt_lock_run): a second ftk-train on
# a live run's --out exits 2 naming the first one's host and process id, with or without
# --resume, and touches nothing (the first run's metrics stay one line per step, in
# order); two started together: exactly one runs; after kill -9 the lock is gone with the
# process and --resume auto continues.
# Usage: tests/fault/lock.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"
steps() {
    c=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null)
    echo "${c:-0}"
}
wait_steps() { # wait_steps RUN N: until RUN has N steps (30 s at most)
    i=0
    while [ "$(steps "$1")" -lt "$2" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
}

# a live writer, then a second one
$T -o "$WORK/a" --steps 100000 --save-every 20 2>"$WORK/a.err" &
pa=$!
wait_steps "$WORK/a" 3
# (bounded: without the lock the second writer would run on)
TO="timeout -k 5 60"
expect "second writer, --resume auto: exit 2" 2 $TO $T -o "$WORK/a" --steps 100000 --save-every 20 --resume auto
grep -q "in use by another ftk-train (host $(hostname), process $pa" "$WORK/err" &&
    ok "message names the first one's host and process id" ||
    { notok "message names the first one's host and process id"; sed 's/^/     | /' "$WORK/err"; }
expect "second writer, no --resume: exit 2" 2 $TO $T -o "$WORK/a" --steps 100000 --save-every 20
grep -q "in use by another ftk-train" "$WORK/err" && ok "message says the directory is in use" ||
    notok "message says the directory is in use"
kill -TERM $pa
wait $pa
check "the first writer stops on SIGTERM (exit 75)" test $? -eq 75
grep '"loss"' "$WORK/a/metrics.jsonl" | sed 's/.*"step": \([0-9]*\),.*/\1/' >"$WORK/a.steps"
check "its metrics: one line per step, 1, 2, 3, … in order" awk '$1 != NR { exit 1 }' "$WORK/a.steps"
expect "after it ended, --resume auto runs (2 steps)" 75 $T -o "$WORK/a" --steps 100000 --save-every 20 \
    --resume auto --stop-after 2

# two started together: exactly one runs
$TO $T -o "$WORK/b" --steps 30 >/dev/null 2>"$WORK/b1.err" &
p1=$!
$TO $T -o "$WORK/b" --steps 30 >/dev/null 2>"$WORK/b2.err" &
p2=$!
wait $p1
r1=$?
wait $p2
r2=$?
check "two started together: one exit 0, the other exit 2 ($r1, $r2)" \
    test "$r1$r2" = 02 -o "$r1$r2" = 20
check "the run has its 30 steps once" test "$(steps "$WORK/b")" = 30

# kill -9: the kernel drops the lock with the process
$T -o "$WORK/c" --steps 100000 --save-every 5 2>/dev/null &
pc=$!
wait_steps "$WORK/c" 12
kill -9 $pc
wait $pc 2>/dev/null
check "a killed writer's lock file stays, naming it" grep -q " $pc\$" "$WORK/c/.lock"
expect "after kill -9, --resume auto continues (2 steps)" 75 $T -o "$WORK/c" --steps 100000 --save-every 5 \
    --resume auto --stop-after 2
finish
