#!/bin/sh
# A rank that stops answering (SIGSTOP: as a node that hangs, a process stuck in a driver,
# a collective that never completes) must not hold the job until its time limit:
# FTK_STEP_TIMEOUT=S makes every other rank's watchdog end its process when nothing has
# finished for S seconds (exit 1, the message names the variable), mpirun then ends the
# stopped rank too, and --resume auto continues from the last memory snapshot. A bad
# value is a usage error (exit 2, no run directory). Real ranks, real signals.
# Usage: tests/fault/hang.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
T="$BIN/ftk-train -q -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"
S=4

expect "FTK_STEP_TIMEOUT=soon: exit 2" 2 env FTK_STEP_TIMEOUT=soon $T -o "$WORK/bad" --steps 2
check "... naming it, no run directory" sh -c "grep -q 'FTK_STEP_TIMEOUT=soon: not a number of seconds' \
    '$WORK/err' && [ ! -e '$WORK/bad' ]"

# 2 ranks; rank 1 stops itself (SIGSTOP, FTK_FAULT) at the end of step 7, after the first
# checkpoint (step 5) is committed
vrank=1
# (bounded: without the watchdog the job would wait for the stopped rank forever; 600 s is
# far beyond any machine's slowness: the watchdog ends it S seconds after the stop)
FTK_STEP_TIMEOUT=$S FTK_FAULT=train.step-end@$vrank:7:stop FTK_FAULT_LOG="$WORK/fault.log" timeout -k 5 600 \
    $MPI -np 2 $T -o "$WORK/run" --steps 100000 --save-every 5 >"$WORK/run.out" 2>"$WORK/run.err"
rc=$?
check "rank $vrank stopped itself after step 7" grep -q "^train.step-end 7 stop .* rank=$vrank\$" "$WORK/fault.log"
check "the first checkpoint committed before" test "$(cat "$WORK/run/latest" 2>/dev/null)" = step-00000005
check "the job ended by the watchdog (exit $rc, not 0 nor timeout's)" test $rc -ne 0 -a $rc -ne 124 -a $rc -ne 137
# one message, from the rank that ran: the stopped one, continued by mpirun to be ended,
# does not report its own stop as the hang
other=$((1 - ${vrank:-1}))
n_msg=$(grep -c "nothing finished for $S s (FTK_STEP_TIMEOUT)" "$WORK/run.err")
if [ "$n_msg" -eq 1 ] && grep -q "rank $other: nothing finished" "$WORK/run.err"; then
    ok "one message, rank $other's (rank ${vrank:-?} was stopped), naming FTK_STEP_TIMEOUT"
else
    notok "one message, rank $other's (rank ${vrank:-?} was stopped), naming FTK_STEP_TIMEOUT ($n_msg of them)"
    sed 's/^/     | /' "$WORK/run.err" | head -n 20
fi
no_rank() { ! pgrep -f "ftk-train -q -m $WORK/w.h5" >/dev/null; }
wait_for "every rank to be gone" no_rank && ok "no rank left behind"
left=$(pgrep -f "ftk-train -q -m $WORK/w.h5" || true)
[ -n "$left" ] && kill -9 $left 2>/dev/null
# the memory snapshot of step 6 was committed inside step 7 on both ranks (engine/snapshot.h),
# and is newer than the disk's step 5: the run continues from it
expect "--resume auto on 2 ranks continues" 75 timeout -k 5 600 $MPI -np 2 $T -o "$WORK/run" --steps 100000 \
    --save-every 5 --resume auto --stop-after 2
check "... from the memory snapshot of step 6 (2 steps, then its checkpoint of step 8)" \
    test "$(cat "$WORK/run/latest")" = step-00000008
finish
