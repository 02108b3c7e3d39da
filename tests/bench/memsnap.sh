#!/bin/sh
# Memory snapshots (docs/checkpoints.md, "Memory snapshots") against the disk checkpoint of
# the same state, on 4 ranks in 2 simulated nodes (FTK_SIM_NODE_RANKS=2) with --memory-dir
# under /dev/shm. The model: llama2.c's stories15M shape with untied embeddings (24.4 M
# parameters, 293 MB of fp32 state: 73 MB per rank), so that state bytes outweigh the fixed
# costs of a start; the llama2 tokenizer and the shared Alpaca 1k set.
#  a) relaunch after kill -9 of every rank at the end of step 6 (FTK_FAULT, before that
#     step's snapshot), --save-every 5: memory and disk both hold step 5. Relaunched with
#     --resume auto (memory), and on a copy of the run directory with
#     --memory-snapshot-every 0 (disk), page cache warm, then cold (drop_caches, where root).
#     Times from the launch of mpirun to the arrival on stderr of the "resuming from" line
#     (start-up + restore) and of the first new step's line; the memory restore alone as its
#     line says it.
#  b) kill -9 at the end of step 9: memory resumes from 8, disk from 5.
#  c) the same 14-step run with --memory-snapshot-every 1 and 0, alternated, REPEATS each:
#     the median of the step-to-step differences of metrics.jsonl's elapsed_s (steps 3-13:
#     each holds one step with the snapshot work around it: the copy at the boundary, the
#     commit inside the next step, and the writer thread's cycles, which on this machine's
#     busy cores come out of training's), and the median of the memory_snapshot records'
#     seconds (what the loop waited for: the copy and the commit, the slowest rank's).
# Usage: tests/bench/memsnap.sh [REPEATS] (default 3); needs mpirun, ../shared/data (FTK_DATA).
set -eu
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
REPEATS=${1:-3}
DATA=${FTK_DATA:-$ROOT/../shared/data}
W=$ROOT/build/bench/memsnap
MEM=/dev/shm/ftk-memsnap-bench-$$
tok=$DATA/llama2-tokenizer/tokenizer.model
alpaca=$DATA/alpaca/BLOOM-LORA_alpaca_data_1k.json
if [ ! -f "$tok" ] || [ ! -f "$alpaca" ] || ! command -v mpirun >/dev/null; then
    echo "memsnap bench: skipped (needs mpirun and $DATA)"
    exit 0
fi
MPI="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
export FTK_SIM_NODE_RANKS=2
rm -rf "$W" "$MEM" && mkdir -p "$W"
trap 'rm -rf "$MEM"' EXIT
cat >"$W/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 288, "intermediate_size": 768,
 "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 6, "vocab_size": 32000,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "initializer_range": 0.02}
EOF
bin/ftk-init -q --config "$W/config.json" -t "$tok" -o "$W/w.h5"
bin/ftk-pack -q -t "$tok" "$alpaca" -o "$W/d.h5" --pack --max-len 128 --val-count 0 2>/dev/null
T="bin/ftk-train -m $W/w.h5 -d $W/d.h5 --steps 14 --global-batch 4 --micro-batch 1 --warmup 0 --eval-every 0 -j1"

# stamped OUT CMD...: CMD's stderr, each line prefixed by its arrival time, into OUT; the
# launch time in OUT.t0
stamped() {
    out=$1
    shift
    /usr/bin/python3 -c 'import time; print("%.3f" % time.time())' >"$out.t0"
    "$@" 2>&1 >/dev/null | /usr/bin/python3 -u -c 'import sys, time
for l in iter(sys.stdin.readline, ""):
    sys.stdout.write("%.3f %s" % (time.time(), l))' >"$out" || true
}
# since OUT PATTERN: seconds from the launch to the first line matching PATTERN
since() { awk -v t0="$(cat "$1.t0")" -v p="$2" '$0 ~ p { printf "%.2f", $1 - t0; found = 1; exit } END { if (!found) printf "-" }' "$1"; }
# killed RUN N: a run killed (kill -9, every rank) at the end of step N, --save-every 5
killed() {
    rm -rf "${W:?}/$1" "$MEM"
    FTK_FAULT="train.step-end:$2" $MPI -np 4 $T -q -o "$W/$1" --save-every 5 --memory-dir "$MEM" >/dev/null 2>&1 || true
}
drop_caches() { sync && (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; }

echo "memsnap bench: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), $(date +%F), load average $(cut -d' ' -f1-3 /proc/loadavg)"
cache=cold
drop_caches || cache="warm (drop_caches refused: not root)"
for i in $(seq "$REPEATS"); do
    killed a 6
    cp -a "$W/a" "$W/a-disk"
    stamped "$W/disk$i" $MPI -np 4 $T -o "$W/a-disk" --resume auto --stop-after 1 --memory-snapshot-every 0
    rm -rf "$W/a-disk"
    cp -a "$W/a" "$W/a-disk"
    if drop_caches; then
        stamped "$W/cold$i" $MPI -np 4 $T -o "$W/a-disk" --resume auto --stop-after 1 --memory-snapshot-every 0
    fi
    rm -rf "$W/a-disk"
    stamped "$W/mem$i" $MPI -np 4 $T -o "$W/a" --resume auto --stop-after 1 --memory-dir "$MEM"
    killed a 6
    rm -rf "$MEM/node-1"
    stamped "$W/lost$i" $MPI -np 4 $T -o "$W/a" --resume auto --stop-after 1 --memory-dir "$MEM"
    for f in mem lost; do
        grep -q 'resuming from the memory snapshot of step 5 ' "$W/$f$i" ||
            { echo "memsnap bench: relaunch $f$i did not resume from memory" >&2; sed 's/^/  | /' "$W/$f$i" >&2; exit 1; }
    done
    grep -q 'resuming from .*step-00000005' "$W/disk$i" || { echo "memsnap bench: relaunch $i did not resume from disk" >&2; sed 's/^/  | /' "$W/disk$i" >&2; exit 1; }
done
echo "memsnap bench: a) relaunch after kill -9 at the end of step 6, state of step 5 (73 MB per rank, 293 MB in all), seconds from launch:"
printf '  %-22s %-10s %-10s %s\n' "from" "resumed" "step 6" "restore alone"
for i in $(seq "$REPEATS"); do
    printf '  %-22s %-10s %-10s %s\n' "memory #$i" "$(since "$W/mem$i" 'resuming from the memory')" \
        "$(since "$W/mem$i" 'step 6/')" "$(sed -n 's/.*memory snapshot of step 5 of [0-9]* (\([0-9.]*\) s; \([0-9.]*\) MB.*/\1 s (\2 MB from partners)/p' "$W/mem$i")"
    printf '  %-22s %-10s %-10s %s\n' "memory, node 1 lost" "$(since "$W/lost$i" 'resuming from the memory')" \
        "$(since "$W/lost$i" 'step 6/')" "$(sed -n 's/.*memory snapshot of step 5 of [0-9]* (\([0-9.]*\) s; \([0-9.]*\) MB.*/\1 s (\2 MB from partners)/p' "$W/lost$i")"
    printf '  %-22s %-10s %-10s\n' "disk, page cache warm" "$(since "$W/disk$i" 'resuming from ')" "$(since "$W/disk$i" 'step 6/')"
    [ -f "$W/cold$i" ] && printf '  %-22s %-10s %-10s\n' "disk, $cache" "$(since "$W/cold$i" 'resuming from ')" "$(since "$W/cold$i" 'step 6/')"
done

killed b 9
dstep=$(ls -d "$W"/b/step-* | tail -n 1 | sed 's/.*step-0*//')
stamped "$W/b9" $MPI -np 4 $T -o "$W/b" --resume auto --stop-after 1 --memory-dir "$MEM"
mstep=$(sed -n 's/.*memory snapshot of step \([0-9]*\) .*/\1/p' "$W/b9")
echo "memsnap bench: b) kill -9 at the end of step 9 (before its snapshot), --save-every 5: memory resumes from step ${mstep:-?} ($((9 - ${mstep:-9})) step lost), the disk holds step $dstep ($((9 - dstep)) steps lost)"

# c) per-step cost of a snapshot every step
step_median() { # RUN: median of elapsed_s differences, steps 3..13
    grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"step": \([0-9]*\),.*"elapsed_s": \([0-9.e+-]*\).*/\1 \2/' |
        awk '$1 >= 2 && $1 <= 13 { if (n++) print $2 - prev; prev = $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
on="" off="" waited=""
for i in $(seq "$REPEATS"); do
    for k in 1 0; do
        rm -rf "$W/c" "$MEM"
        $MPI -np 4 $T -q -o "$W/c" --memory-snapshot-every $k --memory-dir "$MEM" >/dev/null 2>&1
        if [ $k = 1 ]; then
            on="$on $(step_median "$W/c")"
            waited="$waited $(sed -n 's/.*"memory_snapshot", "step": [0-9]*, "seconds": \([0-9.]*\).*/\1/p' "$W/c/metrics.jsonl" |
                sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", v[int((NR + 1) / 2)] }')"
        else off="$off $(step_median "$W/c")"; fi
    done
done
med() { echo "$@" | tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "memsnap bench: c) median step time (elapsed_s differences, steps 3-13), $REPEATS runs each:"
echo "  --memory-snapshot-every 1: $on s -> median $(med $on) s"
echo "  --memory-snapshot-every 0: $off s -> median $(med $off) s"
echo "  ratio $(awk -v a="$(med $on)" -v b="$(med $off)" 'BEGIN { printf "%.2f", a / b }')x"
echo "  the loop's wait a snapshot (memory_snapshot records' seconds, median of a run): $waited s -> $(med $waited) s," \
    "$(awk -v a="$(med $waited)" -v b="$(med $off)" 'BEGIN { printf "%.1f", 100 * a / b }')% of a step without"
rm -rf "$W"
