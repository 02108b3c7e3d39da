#!/bin/sh
# A signal removes every temporary a tool made, however many: ftk-pack
# --shards 1500 holds a hidden temporary per shard until it commits them all; SIGTERM when
# more than 1100 exist (the handler's former fixed table held 1024: ~480 were left behind)
# must leave nothing. The signal is aimed by the state, not by time: the directory is polled
# until the temporaries are there, the tool is stopped (SIGSTOP) and counted again, so the
# trial asserts that it landed while they existed; then SIGTERM, SIGCONT, and the tool must
# die of SIGTERM (exit 143) with zero leftovers. A run that ends before the count is
# reached is a failure, not a pass.
# Usage: tests/fault/pack_signal.sh BIN_DIR WORK_DIR [SHARDS [AT]]
set -u
BIN=$1 WORK=$2 SHARDS=${3:-1500} AT=${4:-1100}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
# The output on a tmpfs when there is one: 1500 files fsynced on a disk take a while, and
# the trial is about the temporaries, not the disk.
OUT=$WORK/out
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    OUT=$(mktemp -d /dev/shm/ftk-pack-signal.XXXXXX) || exit 1
    trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"

temporaries() { ls -A "$OUT" | grep -c '^\..*\.tmp\.'; }

"$BIN/ftk-pack" -q -j 1 -t "$ROOT/examples/demo/tokenizer.model" "$ROOT/examples/demo/alpaca-demo.json" \
    -o "$OUT/d.h5" --shards "$SHARDS" 2>"$WORK/err" &
pid=$!
# Bounded by the tool's life: the loop ends when it exits (the trial then fails below).
n=0
while kill -0 "$pid" 2>/dev/null; do
    n=$(temporaries)
    [ "$n" -ge "$AT" ] && break
done
kill -STOP "$pid" 2>/dev/null
n=$(temporaries)
if kill -0 "$pid" 2>/dev/null && [ "$n" -ge "$AT" ]; then
    ok "the signal lands while $n temporaries exist (stopped there: at least $AT)"
else
    notok "the signal lands while at least $AT temporaries exist (the tool ended first, or $n)"
fi
kill -TERM "$pid" 2>/dev/null
kill -CONT "$pid" 2>/dev/null
wait "$pid"
rc=$?
if [ $rc -eq 143 ]; then ok "ftk-pack dies of SIGTERM (exit 143)"; else
    notok "ftk-pack dies of SIGTERM: exit $rc"
    sed 's/^/     | /' "$WORK/err" | head -n 5
fi
left=$(temporaries)
if [ "$left" -eq 0 ]; then ok "no temporary left (of $n)"; else notok "no temporary left: $left of $n remain"; fi
finish
