#!/bin/sh
# The communication contract (tests/unit/test_comm.c) on real MPI ranks: 1 to 4 ranks
# under mpirun (the fake device library checks NCCL's set-up order and dispatch on the
# way), each with a timeout so that a hung collective fails the test. `make test` also
# runs test_comm alone (a world of one). On GPUs, tests/gpu/check.sh runs it with --nccl.
# Usage: tests/cli/comm.sh TEST_COMM WORK_DIR [RANKS]   (RANKS: the world sizes, default "4 3 2 1";
#        the sanitizer build's pass runs 4 alone: its groups of 2 cover the 2-rank cases)
set -u
TC=$1 WORK=$2 RANKS=${3:-4 3 2 1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
# 4, 3, 2 first: the shapes with groups of several ranks, then 1 (MPI initialised, one rank)
for np in $RANKS; do
    expect "test_comm on $np MPI rank(s)" 0 $TO $MPI -np $np "$TC" "$ROOT"
    grep -h 'checks passed' "$WORK/out" | sed 's/^/     /'
done
finish
