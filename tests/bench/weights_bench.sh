#!/bin/sh
# Weights-stage throughput, as ratios to cp of the same bytes in the same run:
# ftk-init --preset llama-1b (1.1 B parameters, bfloat16, normal-distributed: real-looking
# weights), ftk-export-hf of it (HDF5 -> safetensors), ftk-import-hf back (safetensors ->
# HDF5), each against `cp` + fsync of its input file (the tools fsync their output too);
# then the size and speed of zstd compression on those weights.
# Usage: tests/bench/weights_bench.sh [PRESET] (default llama-1b); needs ~12 GB of disk.
set -eu
cd "$(dirname "$0")/../.."
preset=${1:-llama-1b}
W=build/bench/weights
rm -rf "$W" && mkdir -p "$W"
now() { date +%s.%N; }
secs() { awk "BEGIN { printf \"%.3f\", $2 - $1 }"; }
ratio() { awk "BEGIN { printf \"%.2f\", $1 / $2 }"; }
mb() { awk "BEGIN { printf \"%d\", $(stat -c %s "$1") / 1000000 }"; }

t0=$(now); bin/ftk-init -q --preset "$preset" --dtype bfloat16 -o "$W/init.h5"; t1=$(now)
size=$(mb "$W/init.h5")
echo "weights bench: ftk-init --preset $preset (bfloat16): $size MB in $(printf %.1f "$(secs "$t0" "$t1")") s"

# export vs cp of the .h5 it reads
t0=$(now); cp "$W/init.h5" "$W/copy.h5"; sync "$W/copy.h5"; t1=$(now)
t_cp=$(secs "$t0" "$t1"); rm -f "$W/copy.h5"
t0=$(now); bin/ftk-export-hf -q "$W/init.h5" -o "$W/hf"; t1=$(now)
t_ex=$(secs "$t0" "$t1")
echo "weights bench: ftk-export-hf: $(printf %.2f "$t_ex") s, cp+fsync of the same bytes: $(printf %.2f "$t_cp") s -> $(ratio "$t_cp" "$t_ex")x cp"

# import vs cp of the safetensors it reads
st=$(ls "$W"/hf/*.safetensors | head -n 1)
t0=$(now); cp "$st" "$W/copy.st"; sync "$W/copy.st"; t1=$(now)
t_cp=$(secs "$t0" "$t1"); rm -f "$W/copy.st"
t0=$(now); bin/ftk-import-hf -q "$W/hf" -o "$W/back.h5"; t1=$(now)
t_im=$(secs "$t0" "$t1")
echo "weights bench: ftk-import-hf: $(printf %.2f "$t_im") s, cp+fsync of the same bytes: $(printf %.2f "$t_cp") s -> $(ratio "$t_cp" "$t_im")x cp"
cmp -s "$W/init.h5" "$W/back.h5" && echo "weights bench: import(export(init.h5)) is byte-identical to init.h5" ||
    echo "weights bench: note: round-trip file differs from init.h5 (source attribute), tensors verified by make test"
rm -f "$W/back.h5"

for lvl in 1 3; do
    t0=$(now); bin/ftk-import-hf -q "$W/hf" --compress zstd:$lvl -o "$W/z$lvl.h5"; t1=$(now)
    t_z=$(secs "$t0" "$t1")
    echo "weights bench: zstd:$lvl on bf16 normal weights: $(mb "$W/z$lvl.h5") MB of $size MB ($(ratio "$(stat -c %s "$W/z$lvl.h5")" "$(stat -c %s "$W/init.h5")") of the size), import $(printf %.1f "$t_z") s ($(ratio "$size" "$t_z") MB/s; $(ratio "$t_cp" "$t_z")x cp)"
    rm -f "$W/z$lvl.h5"
done
rm -rf "$W"
