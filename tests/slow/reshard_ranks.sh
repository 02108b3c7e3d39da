#!/bin/sh
# ftk-reshard at the most ranks a checkpoint can have (99999 shards: five-digit shard names),
# with at most 64 open descriptors (ulimit -n): the tiny preset's one-process checkpoint to N
# shards and back to 1. Every file of 1 -> N -> 1 bit for bit, the N-shard checkpoint
# verifies, the peak memory of each direction under 32 MB + 1 kB a shard (the manifest, about
# 85 bytes a shard, is read and parsed whole; measured at 99999: 34 MB one way, 60 MB the
# other; the tool once held every output file open: 10.9 GB and "Too many open files" at
# 20 000 of 99999 ranks); --ranks 100000 is refused (exit 2) naming the bound. Prints each
# direction's wall time and peak memory.
# Usage: tests/slow/reshard_ranks.sh BIN_DIR WORK_DIR [N]   (N: 99999; needs /usr/bin/python3
#        and, for 99999, about 1.3 GB of disk and 100 000 inodes; the files are removed after)
set -u
BIN=$1 WORK=$2 N=${3:-99999}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
export HDF5_PLUGIN_PATH="$ROOT/build/plugin"
need=$((N / 70000 + 1)) # GB: about 13 kB a shard file
free=$(df -Pk "$WORK" | awk 'NR == 2 { print int($4 / 1e6) }')
[ "$free" -gt $((need + 1)) ] || { echo "skipped (${free} GB free at $WORK, $need + 1 needed)"; exit 77; }
inodes=$(df -Pi "$WORK" | awk 'NR == 2 { print $4 }')
case $inodes in '' | *[!0-9]*) ;; *) [ "$inodes" -gt $((N + 1000)) ] || {
    echo "skipped ($inodes inodes free at $WORK, $N needed)"; exit 77; } ;; esac

demo_pack "$WORK/d.h5" 64 2>/dev/null || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
expect "a one-process checkpoint of step 2" 75 "$BIN/ftk-train" -q -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/run" \
    --steps 4 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1 --save-every 2 --stop-after 2
C=$WORK/run/step-00000002
# one NAME IN OUT RANKS: ftk-reshard IN -> OUT with 64 descriptors at most, its peak memory bounded
one() {
    t0=$(date +%s)
    expect "$1" 0 few_files 64 "$BIN/ftk-reshard" -q "$2" -o "$3" --ranks "$4"
    kb=$(cat "$WORK/rss" 2>/dev/null || echo 0)
    echo "note: $1: $(($(date +%s) - t0)) s, peak memory $((kb / 1024)) MB"
    if [ -n "${ASAN_OPTIONS:-}" ]; then echo "note: peak memory not bounded under the sanitizers"; else
        check "$1: peak memory $((kb / 1024)) MB, under $((32 + N / 1024)) MB" test "$kb" -lt $((32768 + N))
    fi
}
one "1 -> $N shards" "$C" "$WORK/many" "$N"
check "$N shard files" test "$(ls "$WORK/many/step-00000002" | grep -c '^shard-')" = "$N"
expect "ftk-verify: the $N-shard checkpoint" 0 "$BIN/ftk-verify" -q "$WORK/many"
one "$N -> 1 shard" "$WORK/many" "$WORK/one" 1
if diff -r "$C" "$WORK/one/step-00000002" >/dev/null; then ok "1 -> $N -> 1: every file bit for bit"; else
    notok "1 -> $N -> 1: every file bit for bit"
fi
rm -rf "$WORK/many"
expect "--ranks 100000: refused" 2 "$BIN/ftk-reshard" "$C" -o "$WORK/x" --ranks 100000
grep -q -- "--ranks: '100000' is out of range; need an integer 1..99999" "$WORK/err" && test ! -e "$WORK/x" &&
    ok "... naming the bound, nothing written" || notok "... $(cat "$WORK/err")"
finish
