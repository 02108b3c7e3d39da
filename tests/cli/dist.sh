#!/bin/sh
# CLI tests of distributed training (real MPI ranks on this machine, mpirun --oversubscribe):
#  - bit-exact resume at the same world size and strategy (whatever the threads per rank:
#    2 ranks stopped on -j 2 and resumed on -j 0 against -j 1): stopped by --stop-after, by
#    SIGTERM to one rank, by SIGUSR1 to mpirun (each aimed at a step by FTK_FAULT); identical losses and byte-identical shard
#    files (weights and both AdamW moments) against the uninterrupted run; also in
#    bf16-true and bf16-mixed (--stop-after; SIGTERM to one rank in bf16-true);
#  - crash safety: kill -9 of one rank, and of every rank, at named points of random steps
#    (FTK_FAULT: between steps, while shards are written, around the commit), each landing
#    asserted, then --resume auto: the run continues from the newest committed checkpoint
#    and ends on the same bits as the uninterrupted run;
#  - the preemption pipeline (pipelines/preempt-sim.sh: SIGUSR1, exit 75, restart);
#  - start-up refusals on every rank, never a hang: ranks given different arguments, a
#    checkpoint of another model, shard groups that do not divide the ranks (resuming at
#    another world size is tests/cli/ckpt.sh's);
#  - ftk-generate reads a multi-shard checkpoint.
# Usage: tests/cli/dist.sh BIN_DIR WORK_DIR [KILLS]   (KILLS: kill -9 trials, default 6;
#        0 also skips the signal tests, whose runs are long: the sanitizer build's pass)
set -u
BIN=$1 WORK=$2 KILLS=${3:-6}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/init.h5" tiny 1
demo_init "$WORK/other.h5" tiny 2
demo_init "$WORK/s260.h5" stories260k 1
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 4 -j1"
# Signals need runs that last a few seconds: the stories260K shape, 40 steps.
L="$BIN/ftk-train -m $WORK/s260.h5 -d $WORK/demo.h5 --global-batch 7 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 10 -j1 -q --steps 40"

losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
# same_shards NAME RUN_A RUN_B STEP: every shard file and the manifest byte-identical.
same_shards() {
    d=$(printf 'step-%08d' "$4")
    if [ -d "$2/$d" ] && [ -d "$3/$d" ] && diff -r "$2/$d" "$3/$d" >/dev/null; then ok "$1"; else
        notok "$1: $2/$d and $3/$d differ"
        diff -r "$2/$d" "$3/$d" 2>&1 | head -n 5 | sed 's/^/     | /'
    fi
}

expect "mpirun -np 2 ftk-train --help" 0 $TO $MPI -np 2 $T --help
check "--help printed once (rank 0 only)" test "$(grep -c '^Usage: ' "$WORK/out")" = 1
# --device cuda on 2 ranks without a GPU: refused on every rank with nothing written, by a
# build without NCCL (naming it) or by the missing device (a build with NCCL). Where GPUs
# are, tests/gpu/check.sh's nccl-train step runs it for real.
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    ok "--device cuda on 2 ranks: not refused here (a GPU is present; gpu-check's nccl-train runs it)"
else
    expect "--device cuda on 2 ranks without a GPU: refused" 2 $TO $MPI -np 2 $T -q -o "$WORK/cuda2" --steps 2 \
        --device cuda
    grep -q "NCCL\|CUDA" "$WORK/err" && ok "message names NCCL or CUDA" || notok "message names NCCL or CUDA"
    check "nothing written" test ! -e "$WORK/cuda2"
fi
# NCCL_COMM_ID would give every communicator one root: refused before any device is touched
# (a build without NCCL refuses --device cuda on 2 ranks anyway)
expect "NCCL_COMM_ID set: --device cuda on 2 ranks refused" 2 $TO env NCCL_COMM_ID=127.0.0.1:1 $MPI -np 2 $T -q \
    -o "$WORK/cuda3" --steps 2 --device cuda
check "... naming it (or NCCL's absence), nothing written" sh -c "grep -q 'NCCL_COMM_ID is set\|has no NCCL' \
    '$WORK/err' && [ ! -e '$WORK/cuda3' ]"
# the same command line but another FTK_DEVICE on one rank: refused before any device set-up
# (collective) could wait for a rank that took the other path
expect "FTK_DEVICE differing between ranks: exit 2" 2 $TO $MPI -np 1 -x FTK_DEVICE=cpu $T -q -o "$WORK/dev2" \
    --steps 2 : -np 1 -x FTK_DEVICE=cuda $T -q -o "$WORK/dev2" --steps 2
check "... naming both, nothing written" sh -c "grep -q 'device cuda on this rank, cpu on rank 0' '$WORK/err' && \
    [ ! -e '$WORK/dev2' ]"

# --- bit-exact resume -------------------------------------------------------------------
# fp32 with every strategy; the bf16 modes with the strategies whose collectives they change
# most (bf16-true: bf16 gathers and reduce-scatters; bf16-mixed: bf16 gathers of the working
# copy, float32 reductions, the copy refreshed once per step under grad-op's held units).
for cfg in "2 full" "3 grad-op" "4 hybrid --shard-group-size 2" "2 none" "2 full --precision bf16-true" \
    "2 grad-op --precision bf16-mixed"; do
    set -- $cfg
    np=$1 strat=$2
    shift 2
    prec=
    [ "${1:-}" = --precision ] && prec=$2
    tag="$np ranks, $strat${prec:+, $prec}"
    R="$WORK/ref-$np-$strat${prec:+-$prec}"
    # 2 ranks, full, fp32: stopped on 2 threads a rank and resumed on all the cores (-j 0),
    # against the reference's 1: the thread count changes the speed only
    jstop= jres=
    [ "$cfg" = "2 full" ] && jstop="-j 2" jres="-j 0"
    expect "$tag: 12 steps uninterrupted" 0 $TO $MPI -np "$np" $T -q -o "$R" --steps 12 --save-every 4 \
        --strategy "$strat" "$@"
    expect "$tag: --stop-after 5${jstop:+ ($jstop)}: exit 75" 75 $TO $MPI -np "$np" $T -q -o "$R.b" --steps 12 \
        --save-every 4 --stop-after 5 --strategy "$strat" $jstop "$@"
    expect "$tag: --resume auto${jres:+ ($jres)}" 0 $TO $MPI -np "$np" $T -q -o "$R.b" --steps 12 --save-every 4 \
        --resume auto --strategy "$strat" $jres "$@"
    losses "$R" >"$WORK/la"
    losses "$R.b" >"$WORK/lb"
    same "$tag: resumed losses identical at every step" "$WORK/lb" "$WORK/la"
    same_shards "$tag: resumed checkpoint byte-identical (every shard, manifest)" "$R.b" "$R" 12
done
R2="$WORK/ref-2-full"
check "2 ranks, full: bf16-true's checkpoint is not fp32's" sh -c "! diff -r -q '$R2/step-00000012' \
    '$R2-bf16-true/step-00000012' >/dev/null"
# --save-every-minutes: rank 0's clock, agreed by all ranks. Each step is stretched to at
# least 350 ms at its end (FTK_FAULT sleep), so 0.005 min (300 ms) has passed at the start of
# step 2 and again two steps after each save, however fast or slow the machine: checkpoints
# at steps 2 and 4 before the end's, none at 1 (the clock starts after the start-up).
expect "--save-every-minutes on 2 ranks" 0 env FTK_FAULT=train.step-end:1+:sleep=350 $TO $MPI -np 2 $T -q \
    -o "$WORK/minutes" --steps 6 --save-every-minutes 0.005
check "--save-every-minutes: checkpoints at steps 2 and 4 ($(ls "$WORK/minutes" | grep '^step-' | tr '\n' ' '))" \
    sh -c "test -d '$WORK/minutes/step-00000002' && test -d '$WORK/minutes/step-00000004' && \
    test ! -d '$WORK/minutes/step-00000001'"
expect "without the clock, only the end's checkpoint" 0 $TO $MPI -np 2 $T -q -o "$WORK/minutes0" --steps 6
check "... (one checkpoint)" test "$(ls "$WORK/minutes0" | grep -c '^step-')" = 1
check "2 ranks, full: checkpoint has 2 shard files" test -f "$R2/step-00000012/shard-00002-of-00002.h5"
check "4 ranks, hybrid: one replica group wrote 2 shards" \
    test "$(ls "$WORK/ref-4-hybrid/step-00000012" | grep -c '^shard-')" = 2

if [ "$KILLS" -gt 0 ]; then
    # SIGTERM to one rank at the end of a random step K (FTK_FAULT: the signal raised there,
    # logged): every rank stops at the next step boundary, K + 1, with a checkpoint.
    # sigterm_one TAG NP RUN REF OPTIONS...: 40 steps of $L with OPTIONS, the last rank
    # signalled, resumed; the end byte-identical to REF's (the same options, uninterrupted).
    sigterm_one() {
        stag=$1 snp=$2 run=$3 sref=$4
        shift 4
        K=$(awk -v s="$$" 'BEGIN { srand(s); print 1 + int(rand() * 37) }')
        rm -f "$WORK/fault.log"
        expect "$stag: SIGTERM to rank $((snp - 1)) of $snp after step $K: every rank stops, exit 75" 75 \
            env FTK_FAULT="train.step-end@$((snp - 1)):$K:sig=TERM" FTK_FAULT_LOG="$WORK/fault.log" \
            $TO $MPI -np "$snp" $L -o "$run" --save-every 20 "$@"
        check "$stag: ... the signal landed after step $K on rank $((snp - 1))" \
            grep -q "^train.step-end $K sig=TERM .* rank=$((snp - 1))\$" "$WORK/fault.log"
        check "$stag: ... the checkpoint is step $((K + 1))'s ($(cat "$run/latest" 2>/dev/null))" \
            test "$(cat "$run/latest" 2>/dev/null)" = "$(printf 'step-%08d' $((K + 1)))"
        expect "$stag: SIGTERM: --resume auto" 0 $TO $MPI -np "$snp" $L -o "$run" --save-every 20 "$@" --resume auto
        same_shards "$stag: after SIGTERM + resume: byte-identical to the uninterrupted run" "$run" "$sref" 40
    }
    expect "3 ranks, grad-op, 40 steps of stories260K's shape uninterrupted" 0 $TO $MPI -np 3 $L -o "$WORK/lref3" \
        --save-every 20 --strategy grad-op
    sigterm_one "3 ranks, grad-op" 3 "$WORK/term" "$WORK/lref3" --strategy grad-op
    expect "2 ranks, full, bf16-true, 40 steps of stories260K's shape uninterrupted" 0 $TO $MPI -np 2 $L \
        -o "$WORK/lref2t" --save-every 20 --precision bf16-true
    sigterm_one "2 ranks, full, bf16-true" 2 "$WORK/term2t" "$WORK/lref2t" --precision bf16-true
    losses "$WORK/term2t" >"$WORK/lb"
    losses "$WORK/lref2t" >"$WORK/la"
    same "2 ranks, full, bf16-true: after SIGTERM + resume: losses identical at every step" "$WORK/lb" "$WORK/la"

    # --- the preemption pipeline --------------------------------------------------------------
    # preempt-sim's step mode: each of 3 attempts is preempted after a random 3-20 steps of its
    # own, rank 0 sending SIGUSR1 to mpirun (FTK_FAULT psig), which forwards it to every rank
    expect "2 ranks, full, 100 steps uninterrupted" 0 $TO $MPI -np 2 $L -o "$WORK/lref2" --save-every 10 --steps 100
    rm -f "$WORK/fault.log"
    expect "preempt-sim: SIGUSR1 to mpirun 3 times, requeued each time, completes" 0 env \
        FTK_FAULT_LOG="$WORK/fault.log" $TO sh "$ROOT/pipelines/preempt-sim.sh" -n 3 -s 3:20 -- \
        $MPI -np 2 $L -o "$WORK/sim" --save-every 10 --steps 100 --resume auto
    k=$(grep -c 'preempted (exit 75)' "$WORK/err")
    check "preempt-sim: 3 preemptions (exit 75 each; $k)" test "$k" = 3
    check "preempt-sim: ... each signal sent by rank 0 to mpirun ($(grep -c psig=USR1 "$WORK/fault.log" 2>/dev/null))" \
        test "$(grep -c '^train.step-end [0-9]* psig=USR1 .* rank=0$' "$WORK/fault.log" 2>/dev/null)" = 3
    same_shards "preempt-sim: final checkpoint byte-identical to the uninterrupted run" "$WORK/sim" "$WORK/lref2" 100
    losses "$WORK/sim" >"$WORK/ls"
    losses "$WORK/lref2" >"$WORK/la"
    same "preempt-sim: losses identical at every step" "$WORK/ls" "$WORK/la"

    # --- crash safety: kill -9 -----------------------------------------------------------------
    # Each trial kills at a named point (FTK_FAULT, logged before the kill) of a random step:
    # one rank or every rank, between steps, while the shard files are written, after the
    # manifest, between the checkpoint's rename and `latest`, after the commit. Each asserts
    # that the kill landed there and what the run directory must show, then resumes.
    # The checkpoints on disk alone: a memory snapshot writes its shards through the same
    # fault points (ckpt.shard-put) and a restart takes it over a disk checkpoint as new
    # (tests/cli/memsnap.sh kills those).
    C="$T -q --steps 30 --save-every 1 --keep 3 --memory-snapshot-every 0"
    expect "crash reference: 30 steps, a checkpoint every step" 0 $TO $MPI -np 2 $C -o "$WORK/cref"
    losses "$WORK/cref" >"$WORK/lcref"
    set -- "train.step-end" "ckpt.shard-put@1" "ckpt.before-rename@0" "ckpt.before-latest@0" "ckpt.shard-done" \
        "ckpt.begin@0" "ckpt.shard-put" "ckpt.committed@0" "train.step-end@1" "ckpt.shard-done@0" \
        "ckpt.before-latest@0" "ckpt.shard-put@0"
    i=0 mid=0 live=0
    while [ $i -lt "$KILLS" ]; do
        i=$((i + 1))
        site=$(eval echo "\${$(( (i - 1) % $# + 1 ))}")
        # hits of a site: one a step (the first checkpoint's shard puts are 2 kinds x units)
        N=$(awk -v s="$$$i" 'BEGIN { srand(s); print 2 + int(rand() * 26) }')
        case $site in *@*) who="rank ${site#*@}" ;; *) who="every rank" ;; esac
        run="$WORK/crash$i"
        rm -f "$WORK/fault.log"
        FTK_FAULT="$site:$N:kill" FTK_FAULT_LOG="$WORK/fault.log" $TO $MPI -np 2 $C -o "$run" >/dev/null 2>&1
        rc=$?
        check "kill -9 #$i: landed at ${site%@*} #$N on $who (mpirun exit $rc)" \
            sh -c "[ $rc -ne 0 ] && grep -q '^${site%@*} $N kill ' '$WORK/fault.log'"
        hidden=$(ls -a "$run" | grep -c '^\.step-')
        named=$(cat "$run/latest" 2>/dev/null || echo none)
        newest=$(ls -d "$run"/step-* 2>/dev/null | sort | tail -n 1)
        case ${site%@*} in
        ckpt.begin | ckpt.shard-put | ckpt.shard-done | ckpt.before-rename)
            check "kill -9 #$i: ... mid-checkpoint: its hidden directory left ($hidden)" test "$hidden" -ge 1 ;;
        ckpt.before-latest)
            check "kill -9 #$i: ... renamed, \`latest\` not yet replaced ($named, newest $(basename "$newest"))" \
                test "$named" != "$(basename "$newest")" ;;
        *)
            check "kill -9 #$i: ... between checkpoints: nothing hidden, \`latest\` the newest" \
                test "$hidden" = 0 -a "$named" = "$(basename "$newest")" ;;
        esac
        resume_after_kill $i "$run" 30 $TO $MPI -np 2 $T --steps 30 --save-every 1 --keep 3 \
            --memory-snapshot-every 0 -o "$run" --resume auto
        same_shards "kill -9 #$i: final checkpoint byte-identical to the uninterrupted run" "$run" "$WORK/cref" 30
        losses "$run" >"$WORK/lc"
        same "kill -9 #$i: metrics continue identically" "$WORK/lc" "$WORK/lcref"
    done
    echo "note: $KILLS kill -9 trials at named points: $live before the run's end, $mid mid-checkpoint"
fi

# --- refusals at start-up: every rank stops, one message, no hang -----------------------------
expect "ranks given different arguments: exit 2" 2 $TO $MPI -np 1 $T -q -o "$WORK/x1" --steps 4 : \
    -np 1 $T -q -o "$WORK/x2" --steps 4
grep -q "different arguments" "$WORK/err" && ok "message: different arguments" || notok "message: different arguments"
expect "resume another model's run on 2 ranks: exit 2" 2 $TO $MPI -np 2 $T -q -m "$WORK/other.h5" -o "$R2" \
    --steps 12 --save-every 4 --resume auto
grep -q "started from other weights" "$WORK/err" && ok "message: other weights" || notok "message: other weights"
expect "--shard-group-size 3 on 4 ranks: exit 2" 2 $TO $MPI -np 4 $T -q -o "$WORK/x3" --strategy hybrid \
    --shard-group-size 3
grep -q "does not divide the 4 ranks" "$WORK/err" && ok "message: group size" || notok "message: group size"
expect "--strategy bogus: exit 2" 2 $TO $MPI -np 2 $T -q -o "$WORK/x4" --strategy bogus

# --- a multi-shard checkpoint is a checkpoint ---------------------------------------------------
expect "generate from a 3-shard checkpoint" 0 "$BIN/ftk-generate" -m "$WORK/ref-3-grad-op" -n 12 --greedy -q \
    --alpaca --prompt "Name a colour."
cp "$WORK/out" "$WORK/gen3"
expect "train the same 12 steps in one process" 0 $TO $MPI -np 1 $T -q -o "$WORK/one" --steps 12 --save-every 4
expect "generate from the 1-shard checkpoint" 0 "$BIN/ftk-generate" -m "$WORK/one" -n 12 --greedy -q --alpaca \
    --prompt "Name a colour."
same "3-rank grad-op run generates the same text as the 1-process run" "$WORK/gen3" "$WORK/out"
finish
