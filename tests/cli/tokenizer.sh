#!/bin/sh
# The tokenizer carried end to end, without Python:
#  - ftk-import-hf warns about a folder without tokenizer files and takes --tokenizer
#    (a folder, one file, or a weights file); a missing one is exit 2, nothing written;
#  - ftk-pack -t accepts a weights file holding a tokenizer, and records the same
#    tokenizer_xxh3 as with the tokenizer.model file itself; one holding none is exit 2;
#  - llama2.c's tokenizer.bin given to ftk-init or ftk-import-llama2c is stored as
#    tokenizer.bin, so ftk-pack -t W.h5 and ftk-tokenize -t W.h5 read it as llama2.c's;
#  - ftk-train refuses (exit 2, no run directory) data packed with another tokenizer than
#    the model's, naming both files and both checksums; --allow-other-tokenizer trains;
#    a model without tokenizer trains with a warning (nothing to compare);
#  - ftk-generate --tokenizer gives a model without one the same text as the model that
#    carries it; without it, exit 2 naming --tokenizer;
#  - ftk-merge carries the checkpoint's tokenizer (or --tokenizer's), ftk-export-hf writes
#    it out (or --tokenizer's), and warns when there is none.
# tests/ref/tokenizer_end_to_end.py has transformers load the result.
# Usage: tests/cli/tokenizer.sh BIN_DIR WORK_DIR DATA_DIR
set -u
BIN=$1 WORK=$2 DATA=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
SRC=$DATA/tiny-random-llama TOK=$DATA/llama2-tokenizer
if [ ! -d "$SRC" ] || [ ! -f "$TOK/tokenizer.model" ]; then
    echo "skipped ($SRC or $TOK missing)"
    exit 77
fi
# the HF folder without its tokenizer files
mkdir "$WORK/hf" && cp "$SRC/config.json" "$SRC"/*.safetensors "$WORK/hf/" || exit 1
rm -f "$WORK/hf"/tokenizer* "$WORK/hf/special_tokens_map.json"

expect "import-hf: a folder without tokenizer" 0 "$BIN/ftk-import-hf" "$WORK/hf" -o "$WORK/notok.h5"
grep -q "no tokenizer.*--tokenizer" "$WORK/err" && ok "import-hf warns, naming --tokenizer" ||
    notok "import-hf warns, naming --tokenizer"
expect "import-hf --tokenizer DIR" 0 "$BIN/ftk-import-hf" "$WORK/hf" -o "$WORK/m.h5" --tokenizer "$TOK"
grep -q "no tokenizer" "$WORK/err" && notok "no warning with --tokenizer" || ok "no warning with --tokenizer"
"$BIN/ftk-info" "$WORK/m.h5" >"$WORK/m.info"
for f in tokenizer.model tokenizer.json tokenizer_config.json special_tokens_map.json; do
    grep -q "/tokenizer/$f " "$WORK/m.info" && ok "the weights hold $f" || notok "the weights hold $f"
done
expect "import-hf --tokenizer FILE" 0 "$BIN/ftk-import-hf" -q "$WORK/hf" -o "$WORK/m1.h5" -t "$TOK/tokenizer.model"
"$BIN/ftk-info" "$WORK/m1.h5" | grep -c "/tokenizer/tokenizer" >"$WORK/n1"
[ "$(cat "$WORK/n1")" = 1 ] && ok "--tokenizer FILE stores that file alone" || notok "--tokenizer FILE stores that file alone"
expect "import-hf --tokenizer missing" 2 "$BIN/ftk-import-hf" "$WORK/hf" -o "$WORK/x.h5" --tokenizer "$WORK/nope"
grep -q "nope: No such file or directory" "$WORK/err" && [ ! -e "$WORK/x.h5" ] &&
    ok "  says No such file, writes nothing" || notok "  says No such file, writes nothing"
# a tokenizer larger than the model's vocabulary
mkdir "$WORK/hf-small" && cp "$WORK/hf"/* "$WORK/hf-small/" &&
    sed -i 's/"vocab_size": 32000/"vocab_size": 100/' "$WORK/hf-small/config.json"
expect "import-hf --tokenizer larger than the vocabulary" 2 "$BIN/ftk-import-hf" "$WORK/hf-small" -o "$WORK/x.h5" \
    --tokenizer "$TOK"
grep -q "has 32000 pieces but config.json's vocab_size is 100" "$WORK/err" && ok "  says both sizes" ||
    notok "  says both sizes"

# ftk-pack -t W.h5: the same tokenizer_xxh3 as -t tokenizer.model
J=$DATA/alpaca/litgpt_fixture_alpaca.json
expect "pack -t weights.h5" 0 "$BIN/ftk-pack" -t "$WORK/m.h5" "$J" -o "$WORK/d.h5" --max-len 64 --val-count 2
expect "pack -t tokenizer.model" 0 "$BIN/ftk-pack" -t "$TOK/tokenizer.model" "$J" -o "$WORK/d2.h5" --max-len 64 \
    --val-count 2
"$BIN/ftk-info" "$WORK/d.h5" | grep tokenizer_ >"$WORK/t1"
"$BIN/ftk-info" "$WORK/d2.h5" | grep tokenizer_ >"$WORK/t2"
same "  the same tokenizer_format and tokenizer_xxh3" "$WORK/t1" "$WORK/t2"
expect "pack -t DIR" 0 "$BIN/ftk-pack" -q -t "$TOK" "$J" -o "$WORK/d3.h5" --max-len 64 --val-count 2
"$BIN/ftk-info" "$WORK/d3.h5" | grep tokenizer_ >"$WORK/t3"
same "  the same tokenizer_xxh3 from the folder" "$WORK/t3" "$WORK/t2"
expect "pack -t weights without tokenizer" 2 "$BIN/ftk-pack" -t "$WORK/notok.h5" "$J" -o "$WORK/x.h5"
grep -q "notok.h5: no tokenizer in it" "$WORK/err" && ok "  names the file" || notok "  names the file"

# llama2.c's tokenizer.bin carried by ftk-init and ftk-import-llama2c: stored under its own
# name, and read back as llama2.c's by ftk-pack and ftk-tokenize -t W.h5 (the same ids as
# from the file itself)
L=$DATA/stories260K
if [ -f "$L/tok512.bin" ] && [ -f "$L/stories260K.bin" ]; then
    expect "init -t tokenizer.bin" 0 "$BIN/ftk-init" -q --preset tiny -t "$L/tok512.bin" -o "$WORK/l.h5"
    "$BIN/ftk-info" "$WORK/l.h5" | grep -q "/tokenizer/tokenizer.bin " && ok "  stored as tokenizer.bin" ||
        notok "  stored as tokenizer.bin"
    expect "pack -t the weights holding it" 0 "$BIN/ftk-pack" -q -t "$WORK/l.h5" "$J" -o "$WORK/dl.h5" --max-len 64 \
        --val-count 2
    expect "pack -t tokenizer.bin" 0 "$BIN/ftk-pack" -q -t "$L/tok512.bin" "$J" -o "$WORK/dl2.h5" --max-len 64 \
        --val-count 2
    "$BIN/ftk-info" "$WORK/dl.h5" | grep tokenizer_ >"$WORK/t1"
    "$BIN/ftk-info" "$WORK/dl2.h5" | grep tokenizer_ >"$WORK/t2"
    same "  the same tokenizer_format and tokenizer_xxh3" "$WORK/t1" "$WORK/t2"
    printf '"Once upon a time"\n' >"$WORK/once.in"
    expect "tokenize -t the weights holding it" 0 "$BIN/ftk-tokenize" -t "$WORK/l.h5" "$WORK/once.in"
    mv "$WORK/out" "$WORK/ids1"
    expect "tokenize -t tokenizer.bin" 0 "$BIN/ftk-tokenize" -t "$L/tok512.bin" "$WORK/once.in"
    same "  the same ids" "$WORK/ids1" "$WORK/out"
    expect "import-llama2c onto an existing file: exit 2" 2 "$BIN/ftk-import-llama2c" -q "$L/stories260K.bin" \
        -t "$L/tok512.bin" -o "$WORK/l.h5"
    grep -q "l.h5: exists (use --force to replace it)" "$WORK/err" && ok "  says so" || notok "  says so"
    expect "import-llama2c --force" 0 "$BIN/ftk-import-llama2c" -q "$L/stories260K.bin" -t "$L/tok512.bin" \
        -o "$WORK/l.h5" --force
    expect "pack -t the imported weights" 0 "$BIN/ftk-pack" -q -t "$WORK/l.h5" "$J" -o "$WORK/dl.h5" --max-len 64 \
        --val-count 2 --force
fi

# ftk-train: another tokenizer's data is refused; the override trains
demo_pack "$WORK/other.h5" 64 2>/dev/null || exit 1
T="$BIN/ftk-train -j 1 --steps 2 --global-batch 4 --micro-batch 2 --eval-every 0 --warmup 1"
expect "train: data of another tokenizer" 2 $T -m "$WORK/m.h5" -d "$WORK/other.h5" -o "$WORK/run-x"
want=$("$BIN/ftk-info" "$WORK/other.h5" | sed -n 's/.*tokenizer_xxh3 *"\(.*\)"/\1/p')
have=$("$BIN/ftk-info" "$WORK/m.h5" | sed -n 's|.*/tokenizer/tokenizer.model .*xxh3 \([0-9a-f]*\)|\1|p')
if grep -q "other.h5 was packed with another tokenizer" "$WORK/err" && grep -q "m.h5 holds" "$WORK/err" &&
    grep -q "$want" "$WORK/err" && grep -q "tokenizer.model (xxh3 $have)" "$WORK/err" &&
    grep -q -- "--allow-other-tokenizer" "$WORK/err" && [ ! -e "$WORK/run-x" ]; then
    ok "  names both files, both checksums and the override; no run directory"
else
    notok "  names both files, both checksums and the override; no run directory"
    sed 's/^/     | /' "$WORK/err"
fi
expect "train --allow-other-tokenizer" 0 $T -m "$WORK/m.h5" -d "$WORK/other.h5" -o "$WORK/run-o" --no-save \
    --allow-other-tokenizer
grep -q "training anyway" "$WORK/err" && ok "  warns" || notok "  warns"
expect "train: a model without tokenizer" 0 $T -m "$WORK/notok.h5" -d "$WORK/d.h5" -o "$WORK/run-n" --no-save
grep -q "holds no tokenizer: cannot check" "$WORK/err" && ok "  warns that it cannot check" ||
    notok "  warns that it cannot check"
expect "train: the model's own tokenizer" 0 $T -m "$WORK/m.h5" -d "$WORK/d.h5" -o "$WORK/run/"
grep -q "warning:.*tokenizer" "$WORK/err" && notok "  no tokenizer warning" || ok "  no tokenizer warning"

# ftk-generate --tokenizer
G="$BIN/ftk-generate --greedy -n 6 -p Hello -j 1"
expect "generate: model without tokenizer" 2 $G -m "$WORK/notok.h5"
grep -q -- "--tokenizer" "$WORK/err" && ok "  names --tokenizer" || notok "  names --tokenizer"
$G -m "$WORK/m.h5" >"$WORK/g1" 2>/dev/null
expect "generate --tokenizer DIR" 0 $G -m "$WORK/notok.h5" --tokenizer "$TOK"
same "  the text of the model that carries it" "$WORK/out" "$WORK/g1"
expect "generate --tokenizer W.h5" 0 $G -m "$WORK/notok.h5" --tokenizer "$WORK/m.h5"
same "  the same from a weights file" "$WORK/out" "$WORK/g1"
expect "generate from the run" 0 $G -m "$WORK/run"

# ftk-merge carries it; ftk-export-hf writes it
expect "merge" 0 "$BIN/ftk-merge" "$WORK/run" -o "$WORK/final.h5"
# (the datasets' lines only: the work directory's own path may hold the word)
"$BIN/ftk-info" "$WORK/final.h5" | grep '^ */tokenizer/' | awk '{print $1, $4}' >"$WORK/tf"
"$BIN/ftk-info" "$WORK/m.h5" | grep '^ */tokenizer/' | awk '{print $1, $4}' >"$WORK/tm"
same "  the merged weights carry the model's tokenizer files, byte for byte" "$WORK/tf" "$WORK/tm"
expect "merge --tokenizer" 0 "$BIN/ftk-merge" "$WORK/run" -o "$WORK/final-demo.h5" \
    --tokenizer "$ROOT/examples/demo/tokenizer.model"
"$BIN/ftk-info" "$WORK/final-demo.h5" | grep -c '/tokenizer/tokenizer' >"$WORK/n2"
[ "$(cat "$WORK/n2")" = 1 ] && ok "  replaces the checkpoint's" || notok "  replaces the checkpoint's"
expect "export-hf" 0 "$BIN/ftk-export-hf" "$WORK/final.h5" -o "$WORK/out-hf"
for f in tokenizer.model tokenizer.json tokenizer_config.json special_tokens_map.json; do
    cmp -s "$TOK/$f" "$WORK/out-hf/$f" && ok "  writes $f as given to import" || notok "  writes $f as given to import"
done
expect "export-hf of weights without tokenizer" 0 "$BIN/ftk-export-hf" "$WORK/notok.h5" -o "$WORK/notok-hf"
grep -q "holds no tokenizer.*AutoTokenizer" "$WORK/err" && ok "  warns" || notok "  warns"
expect "export-hf --tokenizer W.h5" 0 "$BIN/ftk-export-hf" "$WORK/notok.h5" -o "$WORK/given-hf" -t "$WORK/m.h5"
cmp -s "$TOK/tokenizer.model" "$WORK/given-hf/tokenizer.model" && ok "  writes the given tokenizer" ||
    notok "  writes the given tokenizer"
finish
