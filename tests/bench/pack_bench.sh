#!/bin/sh
# ftk-pack's throughput (records/s, MB/s of input) with 1 and 2 threads on ~100k generated
# records, the ratio of the two, then the padding of its packer against first-fit in
# input order and whole-split best-fit-decreasing (pack_efficiency.py).
# Conversational records ({"messages": [...]}, multi-turn, llama-2-chat) are
# the default; FTK_PACK_BENCH_KIND=alpaca benches Alpaca records. FTK_PACK_BENCH_N sets
# the record count.
# Usage: tests/bench/pack_bench.sh BIN_DIR DATA_DIR WORK_DIR
set -eu
BIN=$1 DATA=$2 WORK=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIND=${FTK_PACK_BENCH_KIND:-chat} N=${FTK_PACK_BENCH_N:-100000}
mkdir -p "$WORK"
TOK=$DATA/llama2-tokenizer/tokenizer.model
[ -f "$TOK" ] || TOK=$ROOT/examples/demo/tokenizer.model
/usr/bin/python3 "$ROOT/tests/bench/gen_records.py" "$N" --kind "$KIND" >"$WORK/records.jsonl"
bytes=$(stat -c %s "$WORK/records.jsonl")
for j in 1 2; do
    /usr/bin/time -f "%e %U %S" -o "$WORK/time$j" "$BIN/ftk-pack" -q -t "$TOK" "$WORK/records.jsonl" \
        -o "$WORK/p$j.h5" --pack --max-len 512 -j $j --force
    set -- $(tail -n 1 "$WORK/time$j")
    eval "s$j=$1 c$j=$(echo "$2 + $3" | bc -l)"
done
cmp -s "$WORK/p1.h5" "$WORK/p2.h5" || { echo "pack bench: 1 and 2 threads wrote different files"; exit 1; }
awk -v n="$N" -v b="$bytes" -v s1="$s1" -v s2="$s2" -v c1="$c1" -v c2="$c2" -v kind="$KIND" -v tok="$(basename "$(dirname "$TOK")")" 'BEGIN {
    printf "ftk-pack, %d %s records (%.1f MB, %s tokenizer), --pack --max-len 512:\n", n, kind, b / 1e6, tok
    printf "  1 thread : %8.0f records/s %6.1f MB/s (%.2f s wall, %.2f s CPU)\n", n / s1, b / 1e6 / s1, s1, c1
    printf "  2 threads: %8.0f records/s %6.1f MB/s (%.2f s wall, %.2f s CPU); 2 threads / 1 thread = %.2f\n",
        n / s2, b / 1e6 / s2, s2, c2, s1 / s2 }'
echo "  (load average then: $(cut -d' ' -f1-3 /proc/loadavg), on $(nproc) cores: wall-clock ratios mean little on a busy machine)"
rm -f "$WORK/records.jsonl" "$WORK/p1.h5" "$WORK/p2.h5"
/usr/bin/python3 "$ROOT/tests/bench/pack_efficiency.py" "$BIN" "$DATA" "$WORK"
