#!/bin/sh
# The demo: the data and weights stages on the embedded example (examples/demo), nothing from outside
# the repository, no network. Later stages extend this same pipeline.
set -eu
cd "$(dirname "$0")/.."
PATH="$(pwd)/bin:$PATH"
OUT=${DEMO_OUT:-build/demo}
mkdir -p "$OUT"
export HDF5_PLUGIN_PATH="$(pwd)/build/plugin"

echo "== 1. tokenize a prompt with the demo tokenizer (a 512-piece SentencePiece BPE model)"
echo '"Explain what a checksum is."' | ftk tokenize -t examples/demo/tokenizer.model --pieces
echo
echo "== 2. pack the 40 demo Alpaca records into rows of 256 tokens (zstd-compressed)"
ftk pack -t examples/demo/tokenizer.model examples/demo/alpaca-demo.json -o "$OUT/alpaca-demo.h5" \
    --pack --max-len 256 --val-count 4 --compress zstd
echo
echo "== 3. describe the file"
ftk info "$OUT/alpaca-demo.h5"
echo
echo "== 4. verify every checksum and invariant"
ftk verify "$OUT/alpaca-demo.h5"
echo
echo "== 5. the first training row's first tokens, decoded back to text (h5dump reads the zstd data through the plugin)"
h5dump -A 0 -d /train/tokens -s 0 -c 60 -y -w 0 "$OUT/alpaca-demo.h5" |
    awk '/DATA \{/ {on = 1; next} on && /\}/ {on = 0} on' | tr -d ',' | tr -s ' \n' ' ' | sed 's/^ *//' |
    ftk tokenize -t examples/demo/tokenizer.model --decode
echo
echo "== 6. weights: random-initialise the 'tiny' Llama (57k parameters, grouped-query attention) with the demo tokenizer"
ftk init --preset tiny --seed 42 -t examples/demo/tokenizer.model -o "$OUT/tiny-init.h5"
echo
echo "== 7. export it as a Hugging Face folder (config.json, model.safetensors, tokenizer.model) ..."
ftk export-hf "$OUT/tiny-init.h5" -o "$OUT/tiny-hf" --force
ls -l "$OUT/tiny-hf"
echo
echo "== 8. ... import that folder back (bfloat16, zstd) and prove it whole (checksums, shapes, no NaN/Inf)"
ftk import-hf "$OUT/tiny-hf" --dtype bfloat16 --compress zstd -o "$OUT/tiny.h5"
ftk info "$OUT/tiny.h5" | sed -n '1,6p'
ftk verify --deep "$OUT/tiny.h5"
