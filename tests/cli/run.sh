#!/bin/sh
# CLI golden tests: every tool answers --help; fixed inputs give the expected stdout and
# exit code; every file of tests/corpus/pack-bad is refused with exit 2, the expected
# message and no output; ftk-verify catches a flipped bit and a truncated file (exit 3)
# and refuses a file that is not HDF5 (exit 2).
# Usage: tests/cli/run.sh BIN_DIR WORK_DIR [DATA_DIR]
set -u
BIN=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOK=$ROOT/examples/demo/tokenizer.model
DEMO=$ROOT/examples/demo/alpaca-demo.json
G=$ROOT/tests/cli/golden
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"

# --help and --version on every tool
for t in ftk ftk-tokenize ftk-pack ftk-info ftk-verify ftk-import-hf ftk-export-hf ftk-init ftk-import-llama2c ftk-plot ftk-train \
    ftk-generate ftk-reshard ftk-merge; do
    expect "$t --help" 0 "$BIN/$t" --help
    grep -q "^Usage: " "$WORK/out" && ok "$t --help prints Usage" || notok "$t --help prints Usage"
    expect "$t --version" 0 "$BIN/$t" --version
done
expect "unknown option is exit 2" 2 "$BIN/ftk-pack" --no-such-option
grep -q "Try 'ftk-pack --help'" "$WORK/err" && ok "unknown option points to --help" || notok "unknown option points to --help"
expect "ftk-pack without input is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" -o "$WORK/x.h5"
expect "ftk-pack bad --max-len value is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" --max-len 12x "$DEMO" -o "$WORK/x.h5"
expect "ftk-pack unknown --template is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" --template vicuna "$DEMO" -o "$WORK/x.h5"
grep -q 'unknown template "vicuna"' "$WORK/err" && ok "unknown --template is named" || notok "unknown --template is named"
expect "ftk-pack --template chatml on Alpaca records is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" --template chatml "$DEMO" \
    -o "$WORK/x.h5"
expect "ftk help" 0 "$BIN/ftk" help
expect "ftk unknown command is exit 2" 2 "$BIN/ftk" no-such-command
expect "ftk dispatches to ftk-tokenize" 0 "$BIN/ftk" tokenize -t "$TOK" "$G/tokenize.in"
same "ftk tokenize output" "$WORK/out" "$G/tokenize.out"

# ftk-tokenize golden outputs (expected ids written by SentencePiece itself)
expect "ftk-tokenize" 0 "$BIN/ftk-tokenize" -t "$TOK" "$G/tokenize.in"
same "ftk-tokenize ids equal SentencePiece's" "$WORK/out" "$G/tokenize.out"
expect "ftk-tokenize --bos --eos" 0 "$BIN/ftk-tokenize" -t "$TOK" --bos --eos - <"$G/tokenize.in"
same "ftk-tokenize --bos --eos ids" "$WORK/out" "$G/tokenize-bos-eos.out"
expect "ftk-tokenize --pieces" 0 "$BIN/ftk-tokenize" -t "$TOK" --pieces "$G/tokenize.in"
same "ftk-tokenize --pieces" "$WORK/out" "$G/tokenize-pieces.out"
expect "ftk-tokenize --decode" 0 "$BIN/ftk-tokenize" -t "$TOK" --decode "$G/tokenize.out"
same "decode(encode(text)) == text" "$WORK/out" "$G/tokenize.in"
printf '"unterminated\n' >"$WORK/bad.in"
expect "ftk-tokenize bad JSON line is exit 2" 2 "$BIN/ftk-tokenize" -t "$TOK" "$WORK/bad.in"
grep -q "bad.in:1: column 1: unterminated string" "$WORK/err" && ok "ftk-tokenize names line and column" ||
    notok "ftk-tokenize names line and column: $(cat "$WORK/err")"
expect "ftk-tokenize missing tokenizer is exit 2" 2 "$BIN/ftk-tokenize" -t "$WORK/none.model" "$G/tokenize.in"
head -c 3000 "$TOK" >"$WORK/cut.model"
expect "ftk-tokenize truncated tokenizer is exit 2" 2 "$BIN/ftk-tokenize" -t "$WORK/cut.model" "$G/tokenize.in"
printf '{"model": {"type": "Unigram"}}' >"$WORK/uni.json"
expect "ftk-tokenize refuses a Unigram tokenizer.json" 2 "$BIN/ftk-tokenize" -t "$WORK/uni.json" "$G/tokenize.in"
grep -q "model.type Unigram is not supported" "$WORK/err" && ok "unsupported tokenizer named" || notok "unsupported tokenizer named"

# ftk-pack on the demo data: summary as JSON, files verified
cd "$ROOT"
expect "ftk-pack demo" 0 "$BIN/ftk-pack" -t examples/demo/tokenizer.model examples/demo/alpaca-demo.json \
    -o "$WORK/demo.h5" --pack --max-len 256 --val-count 4 --json
sed "s|$WORK/||" "$WORK/out" >"$WORK/summary.json"
same "ftk-pack --json summary" "$WORK/summary.json" "$G/pack-demo.json"
expect "ftk-verify demo file" 0 "$BIN/ftk-verify" "$WORK/demo.h5"
expect "ftk-info demo file" 0 "$BIN/ftk-info" "$WORK/demo.h5"
grep -q "ftk tokens file, format version 1" "$WORK/out" && ok "ftk-info names the format" || notok "ftk-info names the format"
expect "ftk-pack same input twice" 0 "$BIN/ftk-pack" -t examples/demo/tokenizer.model examples/demo/alpaca-demo.json \
    -o "$WORK/demo2.h5" --pack --max-len 256 --val-count 4 -q
expect "ftk-pack is deterministic" 0 cmp "$WORK/demo.h5" "$WORK/demo2.h5"
expect "ftk-pack --shards 3 --compress zstd:5 from stdin" 0 "$BIN/ftk-pack" -t examples/demo/tokenizer.model - \
    -o "$WORK/sh.h5" --shards 3 --compress zstd:5 -q --no-mask-prompt --threads 2 <examples/demo/alpaca-demo.json
expect "ftk-verify shards" 0 "$BIN/ftk-verify" "$WORK/sh-00001-of-00003.h5" "$WORK/sh-00002-of-00003.h5" \
    "$WORK/sh-00003-of-00003.h5"
expect "ftk-pack refuses stdout for HDF5" 2 "$BIN/ftk-pack" -t examples/demo/tokenizer.model examples/demo/alpaca-demo.json -o -
expect "ftk-pack --drop-long dropping everything is exit 2" 2 "$BIN/ftk-pack" -t examples/demo/tokenizer.model \
    examples/demo/alpaca-demo.json -o "$WORK/none.h5" --max-len 8 --drop-long
[ ! -e "$WORK/none.h5" ] && ok "nothing written when everything is dropped" || notok "nothing written when everything is dropped"
expect "ftk-pack into a missing directory is exit 2, before any work" 2 "$BIN/ftk-pack" -t examples/demo/tokenizer.model \
    examples/demo/alpaca-demo.json -o "$WORK/no/such/dir/x.h5"
grep -q "no/such/dir/x.h5: No such file or directory" "$WORK/err" && ok "... naming the file and why" ||
    notok "... naming the file and why: $(cat "$WORK/err")"

# The corpus of inputs that must fail: exit 2, the expected message, no output file.
cd "$ROOT/tests/corpus/pack-bad"
for f in *.json *.jsonl; do
    base=${f%.*}
    expect "pack-bad/$f is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" "$f" -o "$WORK/bad.h5"
    same "pack-bad/$f message" "$WORK/err" "$base.err"
    [ ! -e "$WORK/bad.h5" ] && ok "pack-bad/$f leaves no output" || { notok "pack-bad/$f left output"; rm -f "$WORK/bad.h5"; }
done
expect "missing tokenizer is exit 2" 2 "$BIN/ftk-pack" -t "$WORK/none.model" "$DEMO" -o "$WORK/bad.h5"
expect "missing input is exit 2" 2 "$BIN/ftk-pack" -t "$TOK" "$WORK/none.json" -o "$WORK/bad.h5"
[ -z "$(ls -A "$WORK" | grep '^\.' )" ] && ok "no temporary files left behind" || notok "temporary files left: $(ls -A "$WORK")"
cd "$ROOT"

# ftk-verify against damage: one flipped bit in /train/tokens, a truncated file; not HDF5.
cp "$WORK/demo.h5" "$WORK/flip.h5"
off=$(h5dump -p -H -d /train/tokens "$WORK/flip.h5" 2>/dev/null | awk '/OFFSET/ {print $2; exit}')
if [ -n "$off" ]; then
    pos=$((off + 101))
    byte=$(od -An -tu1 -j "$pos" -N1 "$WORK/flip.h5" | tr -d ' ')
    printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of="$WORK/flip.h5" bs=1 seek="$pos" conv=notrunc 2>/dev/null
    expect "ftk-verify flipped bit is exit 3" 3 "$BIN/ftk-verify" "$WORK/flip.h5"
    grep -q "dataset /train/tokens: checksum mismatch" "$WORK/err" && ok "ftk-verify names the damaged dataset" ||
        notok "ftk-verify names the damaged dataset: $(cat "$WORK/err")"
else
    notok "h5dump found no data offset for /train/tokens"
fi
head -c 3000 "$WORK/demo.h5" >"$WORK/cut.h5"
expect "ftk-verify truncated file is exit 3" 3 "$BIN/ftk-verify" "$WORK/cut.h5"
# a file that is not HDF5 at all is not an ftk file (bad input: 2), not a damaged one (3)
expect "ftk-verify non-HDF5 file is exit 2" 2 "$BIN/ftk-verify" "$DEMO"
expect "ftk-verify missing file is exit 2" 2 "$BIN/ftk-verify" "$WORK/none.h5"

finish
