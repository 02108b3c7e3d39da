#!/bin/sh
# The initial weights into the backend (engine/shard.c shard_load_weights, as ftk-train runs
# it) against `cat FILE >/dev/null` of the same file in the same run: ftk-init --preset
# llama-1b --dtype bfloat16 (1.1 B parameters, 2.2 GB), loaded by ftk-train --precision
# bf16-true on the CPU backend, one process; the run ends right after the load
# (FTK_FAULT=train.weights-loaded:exit) and its "weights loaded in S s: G GB read" line is the
# figure. Twice each, page cache warm (the file read once before: both read memory) and
# cold (the file's pages dropped before each read with dd iflag=nocache, which needs no
# privilege: both read the disk). Prints ftk's GB/s / cat's GB/s for each, and the CPU
# seconds each spent (the line's "s of CPU": the reading threads' clocks; cat's user + sys
# from the shell's times, 10 ms ticks): on a machine other work shares, the wall-time ratio
# is partly the scheduler's, the CPU time is the work each did per byte.
# Usage: tests/bench/weights_load.sh [DATA_DIR]; needs ~12 GB of memory and 2.3 GB of disk.
# FTK_BENCH_TRIES: tries of each (2); FTK_BENCH_KEEP=1 keeps the files in build/bench for the next run.
set -eu
cd "$(dirname "$0")/../.."
DATA=${1:-${FTK_DATA:-$(pwd)/../shared/data}}
W=build/bench/weights-load
tok=$DATA/llama2-tokenizer/tokenizer.model
alpaca=$DATA/alpaca/BLOOM-LORA_alpaca_data_1k.json
if [ ! -f "$tok" ] || [ ! -f "$alpaca" ]; then
    echo "weights load bench: skipped ($DATA missing)"
    exit 0
fi
mkdir -p "$W"
# what an earlier run kept (FTK_BENCH_KEEP) is used only where newer than the tool and the
# inputs that made it, as make would judge
[ "$W/init.h5" -nt bin/ftk-init ] && [ "$W/init.h5" -nt "$tok" ] ||
    bin/ftk-init -q --preset llama-1b --dtype bfloat16 -t "$tok" -o "$W/init.h5" --force
[ "$W/d.h5" -nt bin/ftk-pack ] && [ "$W/d.h5" -nt "$tok" ] && [ "$W/d.h5" -nt "$alpaca" ] ||
    bin/ftk-pack -q -t "$tok" "$alpaca" -o "$W/d.h5" --pack --max-len 128 --val-count 0 --force
OPTS="-m $W/init.h5 -d $W/d.h5 --precision bf16-true --micro-batch 1 --global-batch 1 --eval-every 0 --no-save"
total=$(bin/ftk-train --plan $OPTS | sed -n 's/^  total .*(\([0-9]*\) bytes,.*/\1/p')
avail=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
if [ $((total / 1024 + 2 * 1024 * 1024)) -gt "$avail" ]; then
    echo "weights load bench: skipped (needs $((total / 1000000000 + 2)) GB of memory, $((avail / 1000000)) GB available)"
    exit 0
fi

now() { date +%s.%N; }
drop() { dd if="$1" iflag=nocache count=0 status=none 2>/dev/null || true; }
size=$(stat -c %s "$W/init.h5")
cat_gbs() { # cat_gbs cold|warm: "GB/s CPU-seconds" of cat FILE >/dev/null
    [ "$1" = warm ] && cat "$W/init.h5" >/dev/null || drop "$W/init.h5"
    t0=$(now); cpu=$(sh -c 'cat "$1" >/dev/null; times' - "$W/init.h5" | awk 'NR == 2 {
        split($1, u, "m"); split($2, s, "m"); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'); t1=$(now)
    awk "BEGIN { printf \"%.3f %s\", $size / 1e9 / ($t1 - $t0), \"$cpu\" }"
}
ftk_gbs() { # ftk_gbs cold|warm: GB/s of ftk-train's load, as it prints it
    [ "$1" = warm ] && cat "$W/init.h5" >/dev/null || drop "$W/init.h5"
    rm -rf "$W/run"
    FTK_FAULT=train.weights-loaded:exit FTK_DEVICE=cpu bin/ftk-train $OPTS -o "$W/run" 2>"$W/err" || true
    rm -rf "$W/run"
    g=$(sed -n 's/.*weights loaded in [0-9.]* s: [0-9.]* GB read, \([0-9.]*\) GB\/s (\([0-9]*\) reading threads, \([0-9.]*\) s of CPU.*/\1 \3 \2/p' "$W/err")
    [ -n "$g" ] || { echo "weights load bench: ftk-train printed no load time:" >&2; cat "$W/err" >&2; exit 1; }
    echo "$g"
}
for cache in warm cold; do
    for i in $(seq "${FTK_BENCH_TRIES:-2}"); do
        set -- $(cat_gbs $cache) $(ftk_gbs $cache) # cat's GB/s and CPU s, ftk's GB/s, CPU s, threads
        echo "weights load bench: $((size / 1000000)) MB bf16, page cache $cache, try $i: ftk-train's load $3 GB/s," \
            "cat $1 GB/s -> $(awk "BEGIN { printf \"%.2f\", $3 / $1 }")x cat; CPU: ftk's $5 readers $4 s, cat $2 s" \
            "(load average $(cut -d' ' -f1 /proc/loadavg))"
    done
done
[ -n "${FTK_BENCH_KEEP:-}" ] || rm -rf "$W"
