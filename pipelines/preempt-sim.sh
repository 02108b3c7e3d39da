#!/bin/sh
# preempt-sim.sh — a preemptible cluster on one machine, for trying (and testing) the
# requeue loop of pipelines/slurm-finetune.sbatch without SLURM.
#
# Runs COMMAND (an `ftk-train … --resume auto`, alone or under mpirun); after a random
# delay sends it SIGUSR1, as SLURM's --signal=USR1@… does before a time limit (mpirun
# forwards SIGUSR1 to every rank); while it exits 75 ("preempted, checkpoint written")
# starts it again, like a requeued job. After N preemptions the last run goes undisturbed.
#
# Usage: pipelines/preempt-sim.sh [-n N] [-d MIN:MAX | -s MIN:MAX] -- COMMAND...
#   -n N        preemptions to simulate (default 3)
#   -d MIN:MAX  seconds between a start and its signal, drawn uniformly (default 1:3)
#   -s MIN:MAX  instead, steps between a start and its signal, drawn uniformly: the signal
#               comes from inside the job at the end of that step (FTK_FAULT, see
#               libcommon/fault.h): rank 0 sends SIGUSR1 to mpirun, which forwards it to
#               every rank, or a process alone raises it. However fast the machine, every
#               attempt but the last is preempted (what tests need).
# Exit status: COMMAND's final one. Prints "preempt-sim: …" lines on stderr, the last one
# "preempt-sim: done after K preemptions (exit C)".
set -u
n=3 range=1:3 steps=
while [ $# -gt 0 ]; do
    case $1 in
    -n) n=$2; shift 2 ;;
    -d) range=$2; shift 2 ;;
    -s) steps=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: preempt-sim.sh [-n N] [-d MIN:MAX | -s MIN:MAX] -- COMMAND..." >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: preempt-sim.sh [-n N] [-d MIN:MAX | -s MIN:MAX] -- COMMAND..." >&2; exit 2; }
lo=${range%:*} hi=${range#*:}
[ -n "$steps" ] && lo=${steps%:*} hi=${steps#*:}
# the signal from inside: to the launcher when there is one
case $(basename "$1") in mpirun | mpiexec | orterun) act=psig=USR1 ;; *) act=sig=USR1 ;; esac
done_k=0 attempt=0
while :; do
    attempt=$((attempt + 1))
    if [ -n "$steps" ] && [ $done_k -lt "$n" ]; then
        k=$(awk -v lo="$lo" -v hi="$hi" -v s="$$$attempt" 'BEGIN { srand(s); print int(lo + rand() * (hi - lo + 1)) }')
        echo "preempt-sim: attempt $attempt: SIGUSR1 after step $k of this attempt" >&2
        FTK_FAULT="train.step-end@0:$k:$act" "$@" &
    else
        "$@" &
    fi
    pid=$!
    if [ -z "$steps" ] && [ $done_k -lt "$n" ]; then
        delay=$(awk -v lo="$lo" -v hi="$hi" -v s="$$$attempt" 'BEGIN { srand(s + systime()); printf "%.2f", lo + rand() * (hi - lo) }')
        sleep "$delay"
        if kill -USR1 $pid 2>/dev/null; then
            echo "preempt-sim: attempt $attempt: SIGUSR1 after $delay s" >&2
        fi
    fi
    wait $pid
    rc=$?
    if [ $rc -eq 75 ]; then
        done_k=$((done_k + 1))
        echo "preempt-sim: attempt $attempt: preempted (exit 75), requeueing" >&2
        continue
    fi
    echo "preempt-sim: done after $done_k preemptions (exit $rc)" >&2
    exit $rc
done
