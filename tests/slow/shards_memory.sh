#!/bin/sh
# The memory bound of ftk-train's data reader (formats/tokens_set.h) on a generated set of
# several GB (tests/slow/big_tokens.py, 3 shards): what ftk-train (tiny model, 2 steps)
# holds more than on a 40-record set stays under 24 bytes per row + 32 MB — the reader's row
# index (16 bytes per row), the trainer's permutation (8 bytes per training row), one
# global batch of rows, a block of the start-up check; ftk-verify under 400 MB. Prints
# the set's size, each tool's maximum RSS and wall time (the cost of checking every row at
# start is in ftk-train's: compare with the seconds per step it reports).
# Usage: tests/slow/shards_memory.sh BIN_DIR WORK_DIR [GB]   (GB: 3; needs /usr/bin/time,
#        /usr/bin/python3 with h5py, numpy, and GB of free disk; the files are removed after)
set -u
BIN=$1 WORK=$2 GB=${3:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
"$PY" -c 'import h5py, numpy' 2>/dev/null || { echo "skipped ($PY lacks h5py/numpy)"; exit 77; }
[ -x /usr/bin/time ] || { echo "skipped (no /usr/bin/time)"; exit 77; }
free=$(df -Pk "$WORK" | awk 'NR == 2 { print int($4 / 1e6) }')
[ "$free" -gt $((GB + 2)) ] || { echo "skipped (${free} GB free at $WORK, $GB + 2 needed)"; exit 77; }

expect "generate a $GB GB set of 3 shards" 0 "$PY" "$ROOT/tests/slow/big_tokens.py" "$WORK/big" "$GB" 3
cat "$WORK/out"
size=$(du -cm "$WORK"/big-0000?-of-00003.h5 | tail -n 1 | cut -f1)
demo_init "$WORK/init.h5" tiny 1
demo_pack "$WORK/demo.h5" 512
rows=$(sed -n 's/.*: \([0-9]*\) train rows.*/\1/p' "$WORK/out")
rss() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/err" | awk '{ printf "%d", $1 / 1024 }'; }
wall() { sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/err"; }
# The process alone (libraries, the model, a batch): the same run on the 40-record demo set.
TR="$BIN/ftk-train -m $WORK/init.h5 --steps 2 --global-batch 64 --micro-batch 8 --eval-every 2 --eval-rows 8 --no-save -q"
expect "ftk-train on the demo set" 0 /usr/bin/time -v $TR -d "$WORK/demo.h5" -o "$WORK/run0"
r0=$(rss)
# big_tokens.py names no tokenizer (tokenizer_xxh3 0); its ids are the demo vocabulary's
expect "ftk-train on the $GB GB set" 0 /usr/bin/time -v $TR -d "$WORK/big" -o "$WORK/run" --allow-other-tokenizer
r=$(rss) w=$(wall)
bound=$((rows * 24 / 1048576 + 32))
echo "note: set $size MB, $rows training rows; ftk-train: max RSS $r MB ($r0 MB on the demo set), wall $w (2 steps and the start-up check of every row)"
check "ftk-train: the set adds $((r - r0)) MB, under 24 bytes per row + 32 MB ($bound MB)" test $((r - r0)) -le "$bound"
expect "ftk-verify the set" 0 /usr/bin/time -v "$BIN/ftk-verify" "$WORK/big"
r=$(rss) w=$(wall)
echo "note: ftk-verify: max RSS $r MB, wall $w"
check "ftk-verify's max RSS ($r MB) is under 400 MB" test "$r" -lt 400
rm -f "$WORK"/big-*.h5
finish
