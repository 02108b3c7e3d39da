#!/bin/sh
# One writer per run directory (formats/rundir.h rundir_lock): a second ftk-train on
# a live run's --out exits 2 naming the first one's host and process id, with or without
# --resume, and touches nothing (the first run's metrics stay one line per step, in
# order); two started together: exactly one runs, and the one that fails never removes
# the other's run, even where its own mkdir made the directory (the races forced with the
# LD_PRELOAD shim tests/fault/lock_delay.c, built as build/tests/lock_delay.so); after
# kill -9 the lock is gone with the process and --resume auto continues; ftk-reshard takes
# the same lock (a trainer of its output exits 2 while it writes), and a temporary whose
# writer is a live process is never removed as stale.
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
has_steps() { [ "$(steps "$1")" -ge "$2" ]; }
wait_steps() { wait_for "$1 to reach $2 steps" has_steps "$1" "$2"; } # wait_steps RUN N
says() { # says NAME PATTERN FILE: FILE has PATTERN (else it is shown)
    if grep -q "$2" "$3"; then ok "$1"; else
        notok "$1"
        sed 's/^/     | /' "$3"
    fi
}

$T -o "$WORK/src" --steps 2 --save-every 2 || exit 1 # a checkpoint of step 2, to reshard
# a live writer, then a second one
$T -o "$WORK/a" --steps 100000 --save-every 20 2>"$WORK/a.err" &
pa=$!
wait_steps "$WORK/a" 3
# (bounded: without the lock the second writer would run on; 600 s, far beyond any machine)
TO="timeout -k 5 600"
expect "second writer, --resume auto: exit 2" 2 $TO $T -o "$WORK/a" --steps 100000 --save-every 20 --resume auto
says "message names the first one's host and process id" \
    "in use by another ftk-train (host $(hostname), process $pa" "$WORK/err"
expect "second writer, no --resume: exit 2" 2 $TO $T -o "$WORK/a" --steps 100000 --save-every 20
says "message says the directory is in use" "in use by another ftk-train" "$WORK/err"
expect "ftk-reshard into the live run: exit 2" 2 $TO "$BIN/ftk-reshard" -q "$WORK/src" -o "$WORK/a" --ranks 2
says "  naming the ftk-train that holds it" "in use by another ftk-train (host $(hostname), process $pa" "$WORK/err"
check "  and writes nothing there" test -z "$(ls -A "$WORK/a" | grep step-00000002)"
kill -TERM $pa
wait $pa
check "the first writer stops on SIGTERM (exit 75)" test $? -eq 75
grep '"loss"' "$WORK/a/metrics.jsonl" | sed 's/.*"step": \([0-9]*\),.*/\1/' >"$WORK/a.steps"
check "its metrics: one line per step, 1, 2, 3, … in order" awk '$1 != NR { exit 1 }' "$WORK/a.steps"
expect "after it ended, --resume auto runs (2 steps)" 75 $T -o "$WORK/a" --steps 100000 --save-every 20 \
    --resume auto --stop-after 2

# two started together: exactly one runs, and the one that fails leaves the other's run
# alone (even when its mkdir made the directory; the orders that matter are forced below)
together() { # together ROUND STEPS
    rm -rf "$WORK/b"
    $TO $T -o "$WORK/b" --steps $2 >/dev/null 2>"$WORK/b1.err" &
    p1=$!
    $TO $T -o "$WORK/b" --steps $2 >/dev/null 2>"$WORK/b2.err" &
    p2=$!
    wait $p1
    r1=$?
    wait $p2
    r2=$?
    if [ "$r1$r2" = 02 ] || [ "$r1$r2" = 20 ]; then
        ok "two started together (round $1): one exit 0, the other exit 2"
    else
        notok "two started together (round $1): one exit 0, the other exit 2 ($r1, $r2)"
        sed 's/^/     | /' "$WORK/b1.err" "$WORK/b2.err"
    fi
    check "round $1: the run has its $2 steps once" test "$(steps "$WORK/b")" = $2
}
together 1 30

# The same races made to happen, in a chosen order: tests/fault/lock_delay.c holds a
# process at the lock until the test creates a gate file.
SHIM=$ROOT/build/tests/lock_delay.so
wait_path() { wait_for "$1 to exist" test -e "$1"; } # wait_path PATH
G=$WORK/gates
mkdir -p "$G"
if [ -f "$SHIM" ]; then
    # ASan wants its runtime first; the shim only waits around fcntl
    SHIM_ENV="LD_PRELOAD=$SHIM ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
    # 1a. the first one's mkdir makes the directory, the second one locks it first and is
    #     running when the first one tries: the first one exits 2 and leaves it
    rm -rf "$WORK/b"
    env $SHIM_ENV FTK_TEST_LOCK_BEFORE="$G/1a" $TO $T -o "$WORK/b" --steps 30 >/dev/null 2>"$WORK/b1.err" &
    p1=$!
    wait_path "$G/1a.waiting"
    $T -o "$WORK/b" --steps 100000 --save-every 20 >/dev/null 2>"$WORK/b2.err" &
    p2=$!
    wait_steps "$WORK/b" 1
    touch "$G/1a"
    wait $p1
    r1=$?
    check "mkdir by one, lock by the other (running): the one that made it exits 2 ($r1)" test $r1 = 2
    says "  saying the directory is in use" "in use by another ftk-train" "$WORK/b1.err"
    s0=$(steps "$WORK/b")
    wait_steps "$WORK/b" $((s0 + 2))
    kill -TERM $p2
    wait $p2
    r2=$?
    check "  the other's run goes on, and stops on SIGTERM (exit 75) ($r2)" test $r2 = 75
    check "  with its metrics and checkpoint" test -f "$WORK/b/latest" -a "$(steps "$WORK/b")" -gt "$s0"
    # 1b. the same, but the second one has ended when the first one locks: a run is there
    rm -rf "$WORK/b"
    env $SHIM_ENV FTK_TEST_LOCK_BEFORE="$G/1b" $TO $T -o "$WORK/b" --steps 30 >/dev/null 2>"$WORK/b1.err" &
    p1=$!
    wait_path "$G/1b.waiting"
    expect "mkdir by one, lock and 2 steps by the other, which ends first: exit 0" 0 $T -o "$WORK/b" --steps 2
    touch "$G/1b"
    wait $p1
    r1=$?
    check "  the first one exits 2 ($r1)" test $r1 = 2
    says "  saying the directory holds a run" "already holds a run" "$WORK/b1.err"
    check "  and leaves it: 2 steps, their checkpoint" \
        test "$(steps "$WORK/b")" = 2 -a -f "$WORK/b/step-00000002/manifest.json"

    # 2. the first one locks, then fails (an infinite norm gain: the loss of step 1 is NaN,
    #    exit 1) and removes the directory it made while the second one waits on the lock
    #    file it opened: the second one must not take a lock on the removed file and run
    #    in a removed directory
    PY=${PYTHON:-/usr/bin/python3}
    if "$PY" -c 'import h5py, numpy' 2>/dev/null; then
        cp "$WORK/w.h5" "$WORK/fw.h5"
        HDF5_PLUGIN_PATH="$ROOT/build/plugin" "$PY" "$ROOT/tests/fault/forge.py" "$WORK/fw.h5" \
            /tensors/model.norm.weight set:0:1$(printf '%039d' 0) >/dev/null 2>&1
        Tf=$(echo "$T" | sed "s|$WORK/w.h5|$WORK/fw.h5|")
        rm -rf "$WORK/e"
        env $SHIM_ENV FTK_TEST_LOCK_AFTER="$G/2a" $TO $Tf -o "$WORK/e" --steps 30 >/dev/null 2>"$WORK/e1.err" &
        p1=$!
        wait_path "$G/2a.waiting"
        env $SHIM_ENV FTK_TEST_LOCK_BEFORE="$G/2b" $TO $T -o "$WORK/e" --steps 30 >/dev/null 2>"$WORK/e2.err" &
        p2=$!
        wait_path "$G/2b.waiting"
        touch "$G/2a"
        wait $p1
        r1=$?
        touch "$G/2b"
        wait $p2
        r2=$?
        check "lock, then failure and removal: the failing one exits 1 ($r1)" test $r1 = 1
        check "  the waiting one exits 1 ($r2)" test $r2 = 1
        says "  saying the directory was removed while it started" "was removed while this ftk-train started" \
            "$WORK/e2.err"
        check "  and nothing is left" test ! -e "$WORK/e"
    else
        echo "skipped: lock, then failure and removal ($PY lacks h5py/numpy)"
    fi

    # 3. ftk-reshard writes into a run directory too, under the same lock: held there (its
    #    output's lock taken, its checkpoint not begun), a trainer of that run exits 2
    #    naming it and touches nothing; let go, the reshard commits a checkpoint that
    #    verifies and a trainer continues from it
    rm -rf "$WORK/g" "$WORK/h"
    expect "reshard: a 2-step run to reshard" 75 $T -o "$WORK/g" --steps 4 --save-every 2 --stop-after 2
    env $SHIM_ENV FTK_TEST_LOCK_AFTER="$G/3" $TO "$BIN/ftk-reshard" -q "$WORK/g" -o "$WORK/h" --ranks 2 \
        >/dev/null 2>"$WORK/h.err" &
    p1=$!
    wait_path "$G/3.waiting"
    check "reshard: ftk-reshard holds the output's lock" test -e "$G/3.waiting"
    expect "  ftk-train --resume auto on its output: exit 2" 2 $TO $T -o "$WORK/h" --steps 4 --save-every 2 \
        --resume auto
    # (held between taking the lock and writing its name into it: not named yet)
    says "  saying the directory is in use" "is in use by another ftk" "$WORK/err"
    touch "$G/3"
    wait $p1
    r1=$?
    check "  let go, ftk-reshard commits (exit 0) ($r1)" test $r1 = 0
    check "  the lock file names it (host, process, tool)" grep -q "^$(hostname) [0-9]* ftk-reshard\$" "$WORK/h/.lock"
    expect "  its checkpoint verifies" 0 "$BIN/ftk-verify" "$WORK/h"
    expect "  and a trainer continues from it (2 steps)" 0 $T -o "$WORK/h" --steps 4 --save-every 2 --resume auto
else
    echo "skipped: the forced races ($SHIM not built)"
fi

# kill -9 (at the end of step 12: FTK_FAULT): the kernel drops the lock with the process
FTK_FAULT=train.step-end:12:kill $T -o "$WORK/c" --steps 100000 --save-every 5 2>/dev/null &
pc=$!
wait $pc 2>/dev/null
check "killed at step 12 (exit 137; $(steps "$WORK/c") steps)" test $? = 137 -a "$(steps "$WORK/c")" = 12
check "a killed writer's lock file stays, naming it" grep -q " $pc ftk-train\$" "$WORK/c/.lock"
expect "after kill -9, --resume auto continues (2 steps)" 75 $T -o "$WORK/c" --steps 100000 --save-every 5 \
    --resume auto --stop-after 2

# A temporary checkpoint whose writer is a live process (one that took no lock: an older
# ftk) is not taken for a dead writer's: it stays until that process is gone.
tail -f /dev/null &
holder=$!
mkdir "$WORK/c/.step-99999999.tmp.$holder"
expect "a live process's temporary: --resume auto runs (1 step)" 75 $T -o "$WORK/c" --steps 100000 --save-every 5 \
    --resume auto --stop-after 1
check "  and leaves that temporary" test -d "$WORK/c/.step-99999999.tmp.$holder"
kill $holder
wait $holder 2>/dev/null
expect "  that process gone, --resume auto runs (1 step)" 75 $T -o "$WORK/c" --steps 100000 --save-every 5 \
    --resume auto --stop-after 1
check "  and removes it" test ! -e "$WORK/c/.step-99999999.tmp.$holder"
finish
