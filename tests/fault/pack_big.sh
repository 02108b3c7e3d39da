#!/bin/sh
# The slow set (make test-slow): ftk-pack's memory bound on multi-GB generated inputs.
#  1. a GB-sized JSON Lines file of ordinary records (tokenizing dominates; about 1.4 M
#     records per GB): many rows, all spilled to disk, none held;
#  2. a 3 GB file of records of 100 KB each (an ignored member: reading and parsing
#     dominate).
# Each must pack with a maximum resident size under 64 MB (formats/pack.h states the
# bound: under 60 MB at the defaults with max-len 512 and 2 threads), and ftk-verify the
# result. The files are deleted as soon as they are used (the work needs ~8 GB of disk).
# Usage: tests/fault/pack_big.sh BIN_DIR WORK_DIR [GB of ordinary records (default 1)]
set -u
BIN=$1 WORK=$2 GB=${3:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
[ -x /usr/bin/time ] || { echo "skipped (/usr/bin/time missing: resident size cannot be measured)"; exit 77; }
TOK=$ROOT/../shared/data/llama2-tokenizer/tokenizer.model
[ -f "$TOK" ] || TOK=$ROOT/examples/demo/tokenizer.model
G="/usr/bin/python3 $ROOT/tests/bench/gen_records.py"

big() { # big NAME FILE ARGS...: packs FILE, checks the resident size and the file
    name=$1 in=$2
    shift 2
    expect "$name packs" 0 /usr/bin/time -f "%M %e" -o "$WORK/rss" "$BIN/ftk-pack" -t "$TOK" "$in" -o "$WORK/o.h5" "$@"
    set -- $(tail -n 1 "$WORK/rss")
    echo "     $name: $(($(stat -c %s "$in") / 1000000)) MB in, max resident $(($1 / 1024)) MB, $2 s"
    sed 's/^/     | /' "$WORK/err"
    [ "$1" -lt 65536 ] && ok "$name: resident size under 64 MB" || notok "$name: resident size $1 KB"
    expect "$name: ftk-verify" 0 "$BIN/ftk-verify" "$WORK/o.h5"
    rm -f "$in" "$WORK/o.h5"
}

$G 20000 >"$WORK/unit.jsonl" || exit 1
copies=$((GB * 1000 / 15 + 1))
i=0
while [ $i -lt $copies ]; do cat "$WORK/unit.jsonl"; i=$((i + 1)); done >"$WORK/records.jsonl"
big "ordinary records (${GB} GB)" "$WORK/records.jsonl" --pack -j 2

$G 100 --pad 100000 >"$WORK/unit.jsonl" || exit 1
i=0
while [ $i -lt 300 ]; do cat "$WORK/unit.jsonl"; i=$((i + 1)); done >"$WORK/padded.jsonl"
big "100 KB records (3 GB)" "$WORK/padded.jsonl" --pack -j 2
rm -f "$WORK/unit.jsonl"
finish
