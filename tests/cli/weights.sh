#!/bin/sh
# CLI tests of the weights stage: --help of every weights tool; the corpora of Hugging Face
# folders that must be refused (tests/corpus/safetensors-bad, tests/corpus/config-bad):
# exit 2, the expected message, no output; llama2.c inputs that must be refused; ftk-init
# reproducibility (same seed, any thread count, same bytes); export/import round trips
# that are byte-identical; sharded export; ftk-verify on damaged weights and --deep.
# Usage: tests/cli/weights.sh BIN_DIR WORK_DIR
set -u
BIN=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
C=$ROOT/tests/corpus
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"

for t in ftk-import-hf ftk-export-hf ftk-init ftk-import-llama2c; do
    expect "$t --help" 0 "$BIN/$t" --help
    grep -q "^Usage: " "$WORK/out" && ok "$t --help prints Usage" || notok "$t --help prints Usage"
    expect "$t --version" 0 "$BIN/$t" --version
    expect "$t without arguments is exit 2" 2 "$BIN/$t"
done

# The corpus: each bad safetensors file as model.safetensors beside a valid config.json,
# each bad config.json beside a valid model.safetensors.
mkdir -p "$WORK/st"
cd "$WORK/st"
mkdir good && cp "$C/safetensors-bad/config.json" "$C/config-bad/model.safetensors" good/
expect "corpus positive control imports" 0 "$BIN/ftk-import-hf" good -o good.h5
for f in "$C"/safetensors-bad/*.safetensors; do
    b=$(basename "$f" .safetensors)
    mkdir "$b" && cp "$C/safetensors-bad/config.json" "$b/" && cp "$f" "$b/model.safetensors"
    expect "safetensors-bad/$b is exit 2" 2 "$BIN/ftk-import-hf" "$b" -o out.h5
    same "safetensors-bad/$b message" "$WORK/err" "$C/safetensors-bad/$b.err"
done
for f in "$C"/config-bad/*.json; do
    b=$(basename "$f" .json)
    mkdir "c-$b" && cp "$f" "c-$b/config.json" && cp "$C/config-bad/model.safetensors" "c-$b/"
    expect "config-bad/$b is exit 2" 2 "$BIN/ftk-import-hf" "c-$b" -o out.h5
    same "config-bad/$b message" "$WORK/err" "$C/config-bad/$b.err"
done
check "refused inputs leave no output" test ! -e out.h5
check "no temporary files left behind" sh -c '[ -z "$(ls -A | grep "^\.")" ]'
mkdir empty
expect "folder without safetensors is exit 2" 2 "$BIN/ftk-import-hf" empty -o out.h5
cp "$C/safetensors-bad/config.json" empty/
expect "folder without weights is exit 2" 2 "$BIN/ftk-import-hf" empty -o out.h5
grep -q "pytorch_model.bin is not read" "$WORK/err" && ok "message says why .bin is not read" || notok "message about .bin"
expect "unknown --dtype is exit 2" 2 "$BIN/ftk-import-hf" good --dtype float64 -o out.h5
cd "$WORK"

# llama2.c inputs that must be refused.
printf 'ak42\001\000\000\000' >ak42.bin
expect "llama2.c version-1 export is exit 2" 2 "$BIN/ftk-import-llama2c" ak42.bin -o out.h5
grep -q 'only the legacy format is read' err && ok "ak42 message" || notok "ak42 message"
# header 64 172 5 8 4 512 512 (stories260K's), then far too few weights
printf '\100\000\000\000\254\000\000\000\005\000\000\000\010\000\000\000\004\000\000\000\000\002\000\000\000\002\000\000' >trunc.bin
head -c 100 /dev/zero >>trunc.bin
expect "truncated llama2.c checkpoint is exit 2" 2 "$BIN/ftk-import-llama2c" trunc.bin -o out.h5
grep -q 'the header describes 1056540 bytes, the file has 128' err && ok "truncation message" || notok "truncation message: $(cat err)"
printf '\100\000\000\000\254\000\000\000\005\000\000\000\003\000\000\000\004\000\000\000\000\002\000\000\000\002\000\000' >heads.bin
expect "llama2.c header with bad heads is exit 2" 2 "$BIN/ftk-import-llama2c" heads.bin -o out.h5
check "refused llama2.c inputs leave no output" test ! -e out.h5

# ftk-init: reproducible whatever the thread count; seeds matter; bad presets refused.
expect "ftk-init tiny" 0 "$BIN/ftk-init" --preset tiny -o a.h5 -t "$ROOT/examples/demo/tokenizer.model"
expect "ftk-init tiny, 1 thread" 0 "$BIN/ftk-init" --preset tiny -o b.h5 -j 1 -t "$ROOT/examples/demo/tokenizer.model"
same "ftk-init is byte-identical across runs and thread counts" b.h5 a.h5
expect "ftk-init another seed" 0 "$BIN/ftk-init" --preset tiny -o c.h5 --seed 7
check "another seed gives other weights" sh -c '! cmp -s a.h5 c.h5'
expect "ftk-init unknown preset is exit 2" 2 "$BIN/ftk-init" --preset llama9 -o x.h5
grep -q 'known: tiny' err && ok "unknown preset lists the known ones" || notok "unknown preset message"
expect "ftk-init --preset and --config together is exit 2" 2 "$BIN/ftk-init" --preset tiny --config x.json -o x.h5
expect "ftk-init with a config.json" 0 "$BIN/ftk-init" --config "$C/safetensors-bad/config.json" -o cfg.h5
expect "ftk-verify --deep on init weights" 0 "$BIN/ftk-verify" --deep a.h5
expect "ftk-info on weights" 0 "$BIN/ftk-info" a.h5
grep -q '^model: LlamaForCausalLM, 2 layers, hidden 32' out && ok "ftk-info summarises the model" || notok "ftk-info summary"

# Round trips: h5 -> HF -> h5 -> HF gives the same safetensors bytes, for each dtype.
for dt in float32 bfloat16 float16; do
    expect "init $dt" 0 "$BIN/ftk-init" --preset tiny --dtype $dt -o i-$dt.h5 -t "$ROOT/examples/demo/tokenizer.model"
    expect "export $dt" 0 "$BIN/ftk-export-hf" i-$dt.h5 -o hf1-$dt
    expect "import $dt" 0 "$BIN/ftk-import-hf" hf1-$dt -o r-$dt.h5
    expect "export again $dt" 0 "$BIN/ftk-export-hf" r-$dt.h5 -o hf2-$dt
    same "round trip $dt: safetensors byte-identical" hf2-$dt/model.safetensors hf1-$dt/model.safetensors
    same "round trip $dt: config.json identical" hf2-$dt/config.json hf1-$dt/config.json
    same "round trip $dt: tokenizer travels" hf2-$dt/tokenizer.model "$ROOT/examples/demo/tokenizer.model"
    "$BIN/ftk-info" i-$dt.h5 | grep '/tensors/.*xxh3' | sed 's/ *- *xxh3/ xxh3/' >sum1
    "$BIN/ftk-info" r-$dt.h5 | grep '/tensors/.*xxh3' | sed 's/ *- *xxh3/ xxh3/' >sum2
    same "round trip $dt: every tensor checksum equal" sum2 sum1
done
grep -q '"torch_dtype": "bfloat16"' hf1-bfloat16/config.json && ok "config.json says bfloat16" || notok "torch_dtype"
expect "export to an existing folder is exit 2" 2 "$BIN/ftk-export-hf" i-float32.h5 -o hf1-float32
grep -q 'exists (use --force' err && ok "existing folder message" || notok "existing folder message"
expect "export --force replaces it" 0 "$BIN/ftk-export-hf" i-bfloat16.h5 -o hf1-float32 --force
grep -q '"torch_dtype": "bfloat16"' hf1-float32/config.json && ok "--force wrote the new folder" || notok "--force content"
expect "bad --max-shard-size is exit 2" 2 "$BIN/ftk-export-hf" i-float32.h5 -o x --max-shard-size 5XB
expect "export in shards" 0 "$BIN/ftk-export-hf" i-float32.h5 -o sharded --max-shard-size 40KB
check "shards named model-0000i-of-0000N" test -f sharded/model-00001-of-00005.safetensors -a -f sharded/model-00005-of-00005.safetensors
check "index file written" grep -q '"model.norm.weight": "model-00004-of-00005.safetensors"' sharded/model.safetensors.index.json
expect "import of the shards" 0 "$BIN/ftk-import-hf" sharded -o fromshards.h5
"$BIN/ftk-info" fromshards.h5 | grep '/tensors/.*xxh3' | sed 's/ *- *xxh3/ xxh3/' >sum3
"$BIN/ftk-info" i-float32.h5 | grep '/tensors/.*xxh3' | sed 's/ *- *xxh3/ xxh3/' >sum1
same "sharded round trip: every tensor checksum equal" sum3 sum1
expect "export --dtype bfloat16 of float32 weights" 0 "$BIN/ftk-export-hf" i-float32.h5 --dtype bf16 -o conv-bf16
expect "import --dtype float32 --compress zstd" 0 "$BIN/ftk-import-hf" conv-bf16 --dtype float32 --compress zstd -o z.h5
expect "ftk-verify of the compressed weights" 0 "$BIN/ftk-verify" --deep z.h5

# ftk-verify: a flipped byte inside a tensor; NaN found by --deep only.
cp i-float32.h5 flip.h5
off=$(h5dump -p -H -d "/tensors/model.layers.1.mlp.up_proj.weight" flip.h5 2>/dev/null | awk '/OFFSET/ {print $2; exit}')
if [ -n "$off" ]; then
    printf '\177' | dd of=flip.h5 bs=1 seek=$((off + 100)) conv=notrunc 2>/dev/null
    expect "ftk-verify flipped weight byte is exit 3" 3 "$BIN/ftk-verify" flip.h5
    grep -q 'model.layers.1.mlp.up_proj.weight: checksum mismatch' err && ok "mismatch names the tensor" || notok "mismatch message: $(cat err)"
else
    notok "h5dump gave no dataset offset"
fi
mkdir nan && cp "$C/safetensors-bad/config.json" "$C/config-bad/model.safetensors" nan/
hl=$(od -An -t u8 -N 8 nan/model.safetensors | tr -d ' ')
printf '\000\000\300\177' | dd of=nan/model.safetensors bs=1 seek=$((8 + hl)) conv=notrunc 2>/dev/null
expect "import of weights holding a NaN" 0 "$BIN/ftk-import-hf" nan -o nan.h5
expect "ftk-verify without --deep passes" 0 "$BIN/ftk-verify" nan.h5
expect "ftk-verify --deep finds the NaN: exit 3" 3 "$BIN/ftk-verify" --deep nan.h5
grep -q 'model.embed_tokens.weight: 1 NaN and 0 infinite values' err && ok "--deep names the tensor" || notok "--deep message: $(cat err)"
check "no temporary files left behind" sh -c '[ -z "$(ls -A | grep "^\.")" ]'
finish
