#!/bin/sh
# Checkpoint resharding, as a ratio to `cp -r` + sync of the same directory in the same run,
# and ftk-reshard's peak memory against the model's largest unit.
# The checkpoint: ftk-init --preset llama-1b (1.1 B parameters) written as an 8-shard
# checkpoint by the library's checkpoint writer with pseudo-random moments
# (tests/unit/bench_make_ckpt.c: one training step of this model needs ~24 GB on one
# process, more than this machine has), then the measured 8 -> 3. ftk-reshard verifies every input byte (file and dataset checksums),
# writes every output file through HDF5, fsyncs it and checksums it; cp -r only copies.
# Usage: tests/bench/reshard_bench.sh [PRESET] (default llama-1b); needs ~45 GB of disk.
set -eu
cd "$(dirname "$0")/../.."
preset=${1:-llama-1b}
W=build/bench/reshard
rm -rf "$W" && mkdir -p "$W"
free_gb=$(df -Pk "$W" | awk 'NR == 2 { printf "%d", $4 / 1e6 }')
if [ "$preset" = llama-1b ] && [ "$free_gb" -lt 45 ]; then
    echo "reshard bench: skipped (needs 45 GB of disk; $free_gb GB free)"
    exit 0
fi
now() { date +%s.%N; }
secs() { awk "BEGIN { printf \"%.3f\", $2 - $1 }"; }
ratio() { awk "BEGIN { printf \"%.2f\", $1 / $2 }"; }

bin/ftk-init -q --preset "$preset" --seed 1 -t examples/demo/tokenizer.model -o "$W/init.h5"
t0=$(now)
build/tests/bench_make_ckpt "$W/init.h5" "$W/run8" 8
t1=$(now)
echo "reshard bench: $preset checkpoint (weights + both moments) in 8 shards: $(du -sm "$W/run8/step-00000001" | cut -f1) MB ($(printf %.0f "$(secs "$t0" "$t1")") s to make)"
rm -f "$W/init.h5"
src="$W/run8/step-00000001"
mb=$(du -sm "$src" | cut -f1)
sync
t0=$(now); cp -r "$src" "$W/copy"; sync; t1=$(now)
t_cp=$(secs "$t0" "$t1")
rm -rf "$W/copy"; sync
t0=$(now); bin/ftk-reshard "$src" -o "$W/run3" --ranks 3 2>"$W/reshard.err"; t1=$(now)
t_rs=$(secs "$t0" "$t1")
peak=$(sed -n 's/.*peak memory \([0-9.]*\) MB (largest unit \([0-9.]*\) MB).*/\1 \2/p' "$W/reshard.err")
echo "reshard bench: ftk-reshard 8 -> 3 shards of $mb MB: $(printf %.2f "$t_rs") s ($(awk "BEGIN { printf \"%.0f\", $mb / $t_rs }") MB/s); cp -r + sync of the same directory: $(printf %.2f "$t_cp") s -> $(ratio "$t_cp" "$t_rs")x cp"
echo "$peak" | awk '{ printf "reshard bench: ftk-reshard peak memory %.0f MB; largest unit %.0f MB (fp32) -> %.2fx the largest unit\n", $1, $2, $1 / $2 }'
bin/ftk-verify -q "$W/run3" >/dev/null && echo "reshard bench: the 3-shard checkpoint verifies"
rm -rf "$W"
