#!/bin/sh
# CLI tests of memory snapshots (engine/snapshot.h; ftk-train --memory-snapshot-every,
# --memory-dir), on simulated nodes (FTK_SIM_NODE_RANKS: node I's memory is MEM/node-I).
# Every case kills a run at a named point (FTK_FAULT, its landing asserted), takes away some
# memory, relaunches with --resume auto, asserts where it resumed from, and compares the
# losses and the final checkpoint, byte for byte, with the uninterrupted run's:
#  - 4 ranks in 2 nodes, every rank killed at a step end, node 1's memory gone: resumed from
#    the snapshot of the step before, the missing shards fetched from node 0's partner copies;
#  - killed while a partner copy is sent: resumed from the snapshot before that one;
#  - 6 ranks in 3 nodes, two neighbouring nodes' memory gone: a shard has no copy left, the
#    run falls back to the disk checkpoint (or, with none, to the initial weights) and says so;
#  - bad snapshots refused as bad checkpoints are, the run falling back to disk: a truncated
#    partner copy, a flipped byte in a shard file, a snapshot of another run's weights;
#  - a normal end removes the run's snapshots; a run whose run directory was deleted has its
#    snapshots removed by the next run's start on the node;
#  - one run in the real /dev/shm (one node of 2 ranks): resumed from memory, nothing left.
# slow: every strategy and precision (and --compress-grads bf16) on 4 ranks in 2 nodes, and
# full on 6 ranks in 3 nodes: node 1's memory lost at a step end, identical at the end.
# Usage: tests/cli/memsnap.sh BIN_DIR WORK_DIR [slow]
set -u
BIN=$1 WORK=$2 MODE=${3:-quick}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi

demo_pack "$WORK/demo.h5" 128 2>/dev/null
demo_init "$WORK/init.h5" tiny 1
demo_init "$WORK/other.h5" tiny 2
T="$BIN/ftk-train -d $WORK/demo.h5 --global-batch 8 --micro-batch 2 -j1 --eval-every 0 --lr 2e-3 --warmup 2 --steps 8"
UROOT="ftk-$(id -u)"

losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
# same_end NAME RUN REF: identical losses at every step and a byte-identical step-8 checkpoint
same_end() {
    losses "$2" >"$WORK/la"
    losses "$3" >"$WORK/lb"
    same "$1: losses identical at every step" "$WORK/la" "$WORK/lb"
    if [ -d "$2/step-00000008" ] && [ -d "$3/step-00000008" ] && diff -r "$2/step-00000008" "$3/step-00000008" \
        >/dev/null; then ok "$1: final checkpoint byte-identical"; else
        notok "$1: $2/step-00000008 and $3/step-00000008 differ"
        diff -r "$2/step-00000008" "$3/step-00000008" 2>&1 | head -n 5 | sed 's/^/     | /'
    fi
}
# launch NP NODE_RANKS MEM CMD_OPTIONS...: ftk-train on NP ranks in nodes of NODE_RANKS
# (0: one node), snapshots in MEM
launch() {
    _np=$1 _nr=$2 _mem=$3
    shift 3
    if [ "$_nr" -gt 0 ]; then
        $TO $MPI -np "$_np" -x FTK_SIM_NODE_RANKS="$_nr" $T --memory-dir "$_mem" "$@"
    else
        $TO $MPI -np "$_np" $T --memory-dir "$_mem" "$@"
    fi
}
# killed NAME NP NODE_RANKS MEM SITE RANK N OPTIONS...: the run killed (-9) at the N-th hit of
# fault point SITE on RANK ("": every rank), the landing asserted from the fault log (every
# rank: at least one landed; mpirun may end the others first, before they log theirs)
killed() {
    _name=$1 _np=$2 _nr=$3 _mem=$4 _site=$5 _rank=$6 _n=$7
    shift 7
    rm -f "$WORK/fault.log"
    export FTK_FAULT="$_site${_rank:+@$_rank}:$_n:kill" FTK_FAULT_LOG="$WORK/fault.log"
    launch "$_np" "$_nr" "$_mem" -q "$@" >"$WORK/out" 2>"$WORK/err"
    _rc=$?
    unset FTK_FAULT FTK_FAULT_LOG
    _who=$(grep -c "^$_site $_n kill " "$WORK/fault.log" 2>/dev/null)
    check "$_name: killed at $_site #$_n on ${_rank:+rank }${_rank:-every rank} ($_who landed, exit $_rc)" \
        sh -c "[ $_rc -ne 0 ] && grep -q '^$_site $_n kill .* rank=${_rank:-[0-9]*}\$' '$WORK/fault.log'"
}
# resumed NAME NP NODE_RANKS MEM RUN REF SAYS OPTIONS...: --resume auto of RUN exits 0,
# its stderr holds SAYS, and it ends on REF's bits
resumed() {
    _name=$1 _np=$2 _nr=$3 _mem=$4 _run=$5 _ref=$6 _says=$7
    shift 7
    expect "$_name: --resume auto" 0 launch "$_np" "$_nr" "$_mem" -o "$_run" --resume auto "$@"
    if grep -q "$_says" "$WORK/err"; then ok "$_name: says \"$(grep -o "$_says" "$WORK/err" | head -n 1)\""; else
        notok "$_name: does not say \"$_says\""
        grep -v '^ftk-train: step ' "$WORK/err" | head -n 8 | sed 's/^/     | /'
    fi
    same_end "$_name" "$_run" "$_ref"
}
# runs_in MEM: the run folders left in every node's memory under MEM
runs_in() { ls -d "$1"/node-*/"$UROOT"/* "$1/$UROOT"/* 2>/dev/null; }

if [ "$MODE" != slow ]; then
    I="-m $WORK/init.h5 --save-every 4"
    R="$WORK/ref4"
    expect "4 ranks in 2 nodes: 8 steps uninterrupted" 0 launch 4 2 "$WORK/mem-ref" $I -q -o "$R"
    check "a normal end removes the run's snapshots ($(runs_in "$WORK/mem-ref" | wc -l) left)" \
        sh -c "[ -d '$WORK/mem-ref/node-1/$UROOT' ] && [ -z \"\$(ls -A '$WORK/mem-ref/node-0/$UROOT')\" ] && \
        [ -z \"\$(ls -A '$WORK/mem-ref/node-1/$UROOT')\" ]"

    # 1. every rank killed after step 6 (the snapshot of step 5 the newest), node 1 replaced
    M="$WORK/mem-node"
    killed "node lost" 4 2 "$M" train.step-end "" 6 $I -o "$WORK/node"
    check "node lost: ... each node holds a snapshot of step 5" sh -c "ls -d '$M'/node-0/$UROOT/*/rank-*/step-00000005 \
        >/dev/null && ls -d '$M'/node-1/$UROOT/*/rank-*/step-00000005 >/dev/null"
    # the bad snapshots' cases (4.) start from copies of this run and its memory
    for c in cut flip forged; do cp -a "$WORK/node" "$WORK/$c" && cp -a "$M" "$WORK/mem-$c"; done
    rm -rf "$M/node-1"
    resumed "node lost" 4 2 "$M" "$WORK/node" "$R" "resuming from the memory snapshot of step 5 " $I
    check "node lost: ... the shards of node 1 received from partners" \
        sh -c "grep 'memory snapshot of step 5 ' '$WORK/err' | grep -qv ' 0.0 MB received'"
    check "node lost: ... no snapshot left after the end" test -z "$(runs_in "$M")"

    # 2. rank 1 killed sending its partner copy of step 7: the snapshot of step 6 is the newest
    M="$WORK/mem-send"
    killed "killed in a partner send" 4 2 "$M" snapshot.send 1 7 $I -o "$WORK/send"
    rm -rf "$M/node-1"
    resumed "killed in a partner send" 4 2 "$M" "$WORK/send" "$R" "resuming from the memory snapshot of step 6 " $I

    # 3. two neighbouring nodes of 3 lost: shard 1's copies (node 0, and its partner node 1)
    # are gone: back to the disk checkpoint of step 4, or with none to the initial weights
    R6="$WORK/ref6"
    expect "6 ranks in 3 nodes: 8 steps uninterrupted" 0 launch 6 2 "$WORK/mem-ref6" $I -q -o "$R6"
    M="$WORK/mem-two"
    killed "two nodes lost" 6 2 "$M" train.step-end "" 6 $I -o "$WORK/two"
    rm -rf "$M/node-0" "$M/node-1"
    resumed "two nodes lost" 6 2 "$M" "$WORK/two" "$R6" \
        "no complete memory snapshot on the nodes (the newest held: step 5); resuming from disk" $I
    check "two nodes lost: ... from the disk checkpoint of step 4" grep -q "resuming from $WORK/two/step-00000004 " \
        "$WORK/err"
    # (--save-every changes neither the losses nor the final checkpoint: the same reference)
    I0="-m $WORK/init.h5"
    M="$WORK/mem-two-nodisk"
    killed "two nodes lost, nothing on disk" 6 2 "$M" train.step-end "" 6 $I0 -o "$WORK/two0"
    check "two nodes lost, nothing on disk: ... no checkpoint" test -z "$(ls -d "$WORK"/two0/step-* 2>/dev/null)"
    rm -rf "$M/node-0" "$M/node-1"
    resumed "two nodes lost, nothing on disk" 6 2 "$M" "$WORK/two0" "$R6" \
        "no complete memory snapshot on the nodes (the newest held: step 5)" $I0
    check "two nodes lost, nothing on disk: ... starts over from the initial weights" \
        sh -c "! grep -q 'resuming from .*step-' '$WORK/err' && grep -q 'init.h5: weights loaded' '$WORK/err'"

    # 4. bad snapshots: read as checkpoints are (every array's checksum, the file's XXH3-64 in
    # the sealed manifest, the manifest against this run); one that fails is said and the
    # run resumes from disk (step 4)
    # (copies of case 1's killed run and memory). Node 1 lost, and the partner copy node 0
    # holds of rank 2's shard (.raw) cut short: its size is not its header's, so it is passed
    # over, said, and step 5 lacks that shard: the snapshot of step 4
    M="$WORK/mem-cut"
    rm -rf "$M/node-1"
    f=$(ls "$M"/node-0/$UROOT/*/rank-00000/step-00000005/shard-00003-of-00004.raw)
    truncate -s 100000 "$f"
    resumed "truncated partner copy" 4 2 "$M" "$WORK/cut" "$R" "resuming from the memory snapshot of step 4 " $I
    check "truncated partner copy: ... the copy passed over, said" grep -q '1 memory snapshot or partner copy unreadable' \
        "$WORK/err"
    # one byte flipped in rank 0's own shard file: found when it is read, the disk's step 4
    M="$WORK/mem-flip"
    f=$(ls "$M"/node-0/$UROOT/*/rank-00000/step-00000005/shard-00001-of-00004.h5)
    /usr/bin/python3 -c 'import sys
with open(sys.argv[1], "r+b") as g:
    g.seek(0, 2); n = g.tell() // 2; g.seek(n); b = g.read(1); g.seek(n); g.write(bytes([b[0] ^ 0x10]))' "$f"
    resumed "flipped byte" 4 2 "$M" "$WORK/flip" "$R" "the memory snapshot of step 5 cannot be used (.*); resuming from disk" $I
    check "flipped byte: ... from the disk checkpoint of step 4" grep -q "resuming from $WORK/flip/step-00000004 " \
        "$WORK/err"
    # rank 0's snapshot of step 5 replaced by that of a run of other weights (the same options)
    M="$WORK/mem-forged"
    killed "another run's snapshot (other weights)" 4 2 "$WORK/mem-other" train.step-end "" 6 -m "$WORK/other.h5" \
        --save-every 4 -o "$WORK/other"
    d=$(ls -d "$M"/node-0/$UROOT/*/rank-00000/step-00000005)
    rm -rf "$d" && cp -r "$(ls -d "$WORK"/mem-other/node-0/$UROOT/*/rank-00000/step-00000005)" "$d"
    resumed "another run's snapshot" 4 2 "$M" "$WORK/forged" "$R" \
        "the memory snapshot of step 5 cannot be used (.*); resuming from disk" $I
    check "another run's snapshot: ... from the disk checkpoint of step 4" \
        grep -q "resuming from $WORK/forged/step-00000004 " "$WORK/err"

    # 7. stale snapshots: a killed run's, whose run directory is then deleted, are removed by
    # the start of the next run using that memory (the lowest rank of each node)
    M="$WORK/mem-other"
    old=$(cat "$WORK/other/.run-id")
    check "stale: the killed run's snapshots are on both nodes" \
        test -d "$M/node-0/$UROOT/$old" -a -d "$M/node-1/$UROOT/$old"
    rm -rf "$WORK/other"
    expect "stale: another run on the same memory" 0 launch 4 2 "$M" $I -o "$WORK/next"
    check "stale: ... the deleted run's snapshots removed on both nodes, said" sh -c "[ ! -e '$M/node-0/$UROOT/$old' ] \
        && [ ! -e '$M/node-1/$UROOT/$old' ] && grep -q 'memory snapshots of a finished run removed: .*$old' '$WORK/err'"
    check "stale: ... and the new run's own removed at its end" test -z "$(runs_in "$M")"

    # 6. the real /dev/shm: one node of 2 ranks (no partner copies: the node's memory survives
    # the processes), nothing left behind
    expect "/dev/shm: 2 ranks, 8 steps uninterrupted" 0 env -u FTK_MEMORY_DIR $TO $MPI -np 2 $T $I -q -o "$WORK/ref2"
    rm -f "$WORK/fault.log"
    env -u FTK_MEMORY_DIR FTK_FAULT=train.step-end:6:kill FTK_FAULT_LOG="$WORK/fault.log" $TO $MPI -np 2 $T $I -q \
        -o "$WORK/shm" >/dev/null 2>&1
    rc=$?
    check "/dev/shm: killed after step 6 ($(grep -c '^train.step-end 6 kill ' "$WORK/fault.log" 2>/dev/null) landed)" \
        sh -c "[ $rc -ne 0 ] && grep -q '^train.step-end 6 kill ' '$WORK/fault.log'"
    id=$(cat "$WORK/shm/.run-id")
    check "/dev/shm: ... its snapshots there" test -d "/dev/shm/$UROOT/$id/rank-00000/step-00000005"
    expect "/dev/shm: --resume auto" 0 env -u FTK_MEMORY_DIR $TO $MPI -np 2 $T $I -o "$WORK/shm" --resume auto
    check "/dev/shm: ... resumed from the memory snapshot of step 5" \
        grep -q "resuming from the memory snapshot of step 5 " "$WORK/err"
    same_end "/dev/shm" "$WORK/shm" "$WORK/ref2"
    check "/dev/shm: nothing of the run left there" test ! -e "/dev/shm/$UROOT/$id"
    finish
    exit
fi

# --- slow: every strategy and precision --------------------------------------------------
# each configuration: uninterrupted, then killed after step 6 with node 1's memory removed:
# resumed from step 5 and identical
for cfg in "4 full fp32" "4 full bf16-mixed" "4 full bf16-true" "4 full fp32 --compress-grads bf16" \
    "4 grad-op fp32" "4 grad-op bf16-mixed" "4 grad-op bf16-true" "4 none fp32" "4 none bf16-mixed" \
    "4 none bf16-true" "4 hybrid fp32 --shard-group-size 2" "4 hybrid bf16-mixed --shard-group-size 2" \
    "4 hybrid bf16-true --shard-group-size 2" "4 hpz fp32" "4 hpz bf16-mixed" "4 hpz bf16-true" "6 full fp32" \
    "6 full bf16-mixed" "6 full bf16-true"; do
    set -- $cfg
    np=$1 strat=$2 prec=$3
    shift 3
    tag="$np ranks in $((np / 2)) nodes, $strat, $prec${1:+ $*}"
    id=$(echo "$np-$strat-$prec$*" | tr -c 'A-Za-z0-9-\n' '-')
    O="-m $WORK/init.h5 --strategy $strat --precision $prec $*"
    expect "$tag: uninterrupted" 0 launch "$np" 2 "$WORK/mem-ref-$id" $O -q -o "$WORK/ref-$id"
    killed "$tag" "$np" 2 "$WORK/mem-$id" train.step-end "" 6 $O -o "$WORK/run-$id"
    rm -rf "$WORK/mem-$id/node-1"
    resumed "$tag" "$np" 2 "$WORK/mem-$id" "$WORK/run-$id" "$WORK/ref-$id" \
        "resuming from the memory snapshot of step 5 " $O
done
finish
