#!/bin/sh
# The small things users trip on:
#  - --version names the tool and release, then what the build holds: the backends (cpu;
#    cuda built in or not), MPI and NCCL, and the HDF5, zstd and xxHash versions;
#  - --json on ftk-info (files, token data, checkpoints), ftk-verify and ftk-merge: JSON on
#    stdout, one object per argument;
#  - ftk-info describes a checkpoint named by its directory, its run directory (with or
#    without a trailing slash) or RUN/latest;
#  - a missing file is "No such file or directory", not "not an HDF5 file";
#  - `-o run/` prints run/step-…, never run//step-…;
#  - counts of one are singular (1 step, 1 shard, 1 record);
#  - an existing output is refused by every tool (exit 2, untouched) unless --force
#    (ftk-init, ftk-import-hf, ftk-merge, ftk-pack, ftk-plot);
#  - a weights file given to ftk-merge or ftk-reshard, a run directory to ftk-export-hf, a
#    safetensors file to ftk-import-hf are named for what they are; ftk-verify of a file
#    that is not HDF5 is exit 2.
#  - options: `_` for `-` in a long option of any tool (--global_batch, as
#    YAML takes it); a misspelt long option gets "did you mean"; ftk-train warns of a
#    --micro-batch past --global-batch and of a --warmup not shorter than the run, naming
#    both numbers; its --help says what a resume needs today and which signals stop it.
# Usage: tests/cli/ux.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
PY=/usr/bin/python3
# json_ok NAME FILE: every line of FILE is one JSON object
json_ok() {
    if [ -s "$2" ] && "$PY" -c 'import json, sys
for l in open(sys.argv[1]): assert isinstance(json.loads(l), dict)' "$2" 2>/dev/null; then ok "$1"; else
        notok "$1"
        head -c 400 "$2" | sed 's/^/     | /'
    fi
}
# json_get FILE EXPR: EXPR (python, over the first line's object j) printed
json_get() { "$PY" -c 'import json, sys; j = json.loads(open(sys.argv[1]).readline()); print(eval(sys.argv[2]))' "$1" "$2"; }

for t in ftk ftk-info ftk-verify ftk-merge ftk-pack ftk-train ftk-generate ftk-import-hf ftk-export-hf; do
    "$BIN/$t" --version >"$WORK/v" 2>&1
    # the commit where the build was a git checkout (make test runs in one)
    if head -n 1 "$WORK/v" | grep -Eq "^$t 0\.2\.0( \(commit [0-9a-f]{7,40}\))?\$" && grep -q '^backends: .*cpu (OpenMP, OpenBLAS [0-9.]*)' "$WORK/v" &&
        grep -Eq '^backends: .*(cuda \(built with CUDA [0-9.]+|cuda not built in)' "$WORK/v" &&
        grep -Eq '^communication: +(MPI \(Open MPI [0-9.]+|MPI not built in).*NCCL (built in|not built in)' "$WORK/v" &&
        grep -Eq '^libraries: +HDF5 [0-9]+\.[0-9]+\.[0-9]+, zstd [0-9.]+, xxHash [0-9.]+$' "$WORK/v"; then
        ok "$t --version lists backends and libraries"
    else
        notok "$t --version lists backends and libraries"
        sed 's/^/     | /' "$WORK/v"
    fi
done

# Inputs: the demo's tiny model and data; one record alone for the singular counts.
demo_init "$WORK/w.h5" tiny 1 || exit 1
demo_pack "$WORK/d.h5" 128 2>/dev/null || exit 1
printf '[{"instruction": "Say hello.", "input": "", "output": "Hello."}]\n' >"$WORK/one.json"
expect "pack one record" 0 "$BIN/ftk-pack" -t "$ROOT/examples/demo/tokenizer.model" "$WORK/one.json" -o "$WORK/one.h5" \
    --val-count 0
grep -q ": 1 record -> 1 sample (" "$WORK/err" && ok "  1 record, 1 sample" || notok "  1 record, 1 sample: $(cat "$WORK/err")"

T="$BIN/ftk-train -j 1 -m $WORK/w.h5 -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 --warmup 3"
expect "train -o run/ (one step)" 0 $T -o "$WORK/run/" --steps 1
grep -q -- "warning: --warmup 3 is not shorter than the run's 1 step: the learning rate rises for the whole run" \
    "$WORK/err" && ok "  warns that --warmup 3 outlasts the run's 1 step" ||
    notok "  warns that --warmup 3 outlasts the run's 1 step: $(grep -i warmup "$WORK/err")"
grep -q "//" "$WORK/err" && notok "  no double slash: $(grep // "$WORK/err")" || ok "  no double slash"
grep -q "checkpoint $WORK/run/step-00000001 committed" "$WORK/err" && ok "  names run/step-00000001" ||
    notok "  names run/step-00000001"
grep -q " 1 step on 1 rank (strategy full, 1 shard," "$WORK/err" && ok "  1 step on 1 rank, 1 shard" ||
    notok "  1 step on 1 rank, 1 shard: $(grep parameters "$WORK/err")"
grep -Eq "[^0-9]1 (steps|shards|ranks)" "$WORK/err" && notok "  no plural after 1" || ok "  no plural after 1"

# Options: `_` for `-` (any tool, as YAML's keys), "did you mean", warnings of odd batches
expect "ftk-train --global_batch=0: read as --global-batch" 2 "$BIN/ftk-train" --global_batch=0
grep -q -- "option --global-batch: '0' is out of range" "$WORK/err" && ok "  names --global-batch's range" ||
    notok "  names --global-batch's range: $(head -n 1 "$WORK/err")"
expect "ftk-pack --max_len 1: read as --max-len" 2 "$BIN/ftk-pack" --max_len 1
grep -q -- "option --max-len: '1' is out of range" "$WORK/err" && ok "  names --max-len's range" ||
    notok "  names --max-len's range: $(head -n 1 "$WORK/err")"
for c in "ftk-train --micro-bach 2:--micro-batch" "ftk-train --lr-min=0:--min-lr" "ftk-pack --outptu x:--output" \
    "ftk-plot --csvv:--csv" "ftk-train --eval=3:--eval-every' or '--eval-rows"; do
    cmd=${c%%:*} want=${c#*:}
    a=${cmd#* }
    expect "$cmd: exit 2" 2 $BIN/$cmd
    grep -q -- "error: unknown option '${a%% *}'; did you mean '$want'?" "$WORK/err" && ok "  did you mean '$want'?" ||
        notok "  did you mean '$want'?: $(head -n 1 "$WORK/err")"
done
expect "ftk-train --frobnicate: no suggestion" 2 "$BIN/ftk-train" --frobnicate
grep -qx "ftk-train: error: unknown option '--frobnicate'" "$WORK/err" && ok "  only 'unknown option'" ||
    notok "  only 'unknown option': $(head -n 1 "$WORK/err")"
expect "ftk-train --plan --micro-batch 8 --global-batch 4: planned" 0 "$BIN/ftk-train" --plan -m "$WORK/w.h5" \
    --max-len 64 --micro-batch 8 --global-batch 4
grep -q -- "warning: --micro-batch 8 is more than --global-batch 4: a micro-batch never holds more than the global batch's 4 rows" \
    "$WORK/err" && ok "  warns, naming both" || notok "  warns, naming both: $(cat "$WORK/err")"
expect "ftk-train --help" 0 "$BIN/ftk-train" --help
check "  the resume paragraph: options kept in RUN/options.yaml, -o RUN --resume auto needs nothing else" \
    sh -c "tr '\n' ' ' <'$WORK/out' | grep -q 'keeps its options in RUN/options.yaml: .ftk-train -o RUN --resume auto. needs nothing else' &&
        ! grep -q 'same options must be given again' '$WORK/out'"
check "  the Signals line: SIGINT, SIGTERM, SIGUSR1 and SIGHUP" grep -q "^Signals: SIGINT, SIGTERM, SIGUSR1 or SIGHUP" "$WORK/out"

# ftk-info on checkpoints
for p in "$WORK/run" "$WORK/run/" "$WORK/run/latest" "$WORK/run/step-00000001"; do
    expect "ftk-info ${p#$WORK/}" 0 "$BIN/ftk-info" "$p"
    head -n 1 "$WORK/out" | grep -q "^$WORK/run/step-00000001: ftk checkpoint, format version 1, step 1 of 1$" &&
        grep -q "^  shard-00001-of-00001.h5 " "$WORK/out" && grep -q "^model: LlamaForCausalLM" "$WORK/out" &&
        ok "  describes the checkpoint" || notok "  describes the checkpoint: $(head -n 2 "$WORK/out")"
done
expect "ftk-info an empty directory" 2 "$BIN/ftk-info" "$WORK"
grep -q "neither a checkpoint" "$WORK/err" && ok "  says it holds no checkpoint" || notok "  says it holds no checkpoint"

# missing files
expect "ftk-info missing.h5" 2 "$BIN/ftk-info" "$WORK/missing.h5"
grep -q "no such file" "$WORK/err" && ok "  no such file" || notok "  no such file"
for c in "ftk-export-hf $WORK/missing.h5 -o $WORK/x" "ftk-generate -m $WORK/missing.h5" \
    "ftk-train -m $WORK/missing.h5 -d $WORK/d.h5 -o $WORK/x" "ftk-pack -t $WORK/missing.h5 $WORK/one.json -o $WORK/x.h5"; do
    expect "${c%% *} of a missing file" 2 $BIN/$c
    grep -q "missing.h5: No such file or directory" "$WORK/err" && ! grep -q "not an HDF5" "$WORK/err" &&
        ok "  No such file or directory" || notok "  No such file or directory: $(cat "$WORK/err")"
done
: >"$WORK/empty.h5"
expect "ftk-export-hf of an empty file" 2 "$BIN/ftk-export-hf" "$WORK/empty.h5" -o "$WORK/x"
grep -q "empty.h5: not an HDF5 file" "$WORK/err" && ok "  not an HDF5 file" || notok "  not an HDF5 file"

# --json
if [ -x "$PY" ]; then
    expect "ftk-info --json weights, data, run" 0 "$BIN/ftk-info" --json "$WORK/w.h5" "$WORK/d.h5" "$WORK/run"
    json_ok "  one JSON object per argument" "$WORK/out"
    [ "$(wc -l <"$WORK/out")" = 3 ] && ok "  three lines" || notok "  three lines"
    head -n 1 "$WORK/out" >"$WORK/j1"
    sed -n 3p "$WORK/out" >"$WORK/j3"
    [ "$(json_get "$WORK/j1" 'j["format"], j["model"]["num_hidden_layers"] > 0')" = "('weights', True)" ] &&
        ok "  weights: format and model" || notok "  weights: format and model"
    [ "$(json_get "$WORK/j3" 'j["format"], j["step"], j["shard_count"], len(j["shards"])')" = "('checkpoint', 1, 1, 1)" ] &&
        ok "  checkpoint: step and shards" || notok "  checkpoint: step and shards"
    expect "ftk-verify --json" 0 "$BIN/ftk-verify" --json "$WORK/w.h5" "$WORK/run"
    json_ok "  one JSON object per path" "$WORK/out"
    [ "$(json_get "$WORK/out" 'j["ok"], j["exit"], "OK (" in j["report"][0]')" = "(True, 0, True)" ] &&
        ok "  ok, exit and report" || notok "  ok, exit and report"
    expect "ftk-verify --json of a missing file" 2 "$BIN/ftk-verify" --json "$WORK/missing.h5"
    [ "$(json_get "$WORK/out" 'j["ok"], j["exit"]')" = "(False, 2)" ] && ok "  ok false, exit 2" ||
        notok "  ok false, exit 2"
    expect "ftk-merge --json" 0 "$BIN/ftk-merge" --json "$WORK/run" -o "$WORK/final.h5"
    json_ok "  a JSON summary" "$WORK/out"
    [ "$(json_get "$WORK/out" 'j["step"], j["shards"], j["dtype"], j["tokenizer_files"]')" = "(1, 1, 'float32', 1)" ] &&
        ok "  step, shards, dtype, tokenizer" || notok "  step, shards, dtype, tokenizer: $(cat "$WORK/out")"
fi

# One rule for every tool's output (docs/cli.md "Outputs"): an existing one is refused, exit 2
# and left as it was, unless --force, which replaces it once the new one is complete.
"$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/hf" || exit 1
cp "$WORK/w.h5" "$WORK/keep.h5" && cp "$WORK/w.h5" "$WORK/x.h5"
for c in "ftk-init -q --preset tiny --seed 2" "ftk-import-hf -q $WORK/hf" "ftk-merge -q $WORK/run" \
    "ftk-pack -q -t $ROOT/examples/demo/tokenizer.model $WORK/one.json --val-count 0" "ftk-plot -q $WORK/run"; do
    expect "${c%% *} onto an existing output: exit 2" 2 $BIN/$c -o "$WORK/x.h5"
    grep -q "x.h5: exists (use --force to replace it)" "$WORK/err" && cmp -s "$WORK/x.h5" "$WORK/keep.h5" &&
        ok "  says so; the file is untouched" || notok "  says so; the file is untouched: $(cat "$WORK/err")"
    expect "  --force replaces it" 0 $BIN/$c -o "$WORK/x.h5" --force
    cmp -s "$WORK/x.h5" "$WORK/keep.h5" && notok "  replaced" || ok "  replaced"
    cp "$WORK/keep.h5" "$WORK/x.h5"
done
# what a tool takes, said when it is given another kind of file (nothing written)
expect "ftk-merge of a weights file: exit 2" 2 "$BIN/ftk-merge" "$WORK/w.h5" -o "$WORK/m2.h5"
grep -q "w.h5: an ftk weights file, not a checkpoint" "$WORK/err" && ok "  says it is a weights file" ||
    notok "  says it is a weights file: $(cat "$WORK/err")"
expect "ftk-reshard of a weights file: exit 2" 2 "$BIN/ftk-reshard" "$WORK/w.h5" -o "$WORK/rs" --ranks 2
grep -q "w.h5: an ftk weights file, not a checkpoint" "$WORK/err" && ok "  says it is a weights file" ||
    notok "  says it is a weights file: $(cat "$WORK/err")"
expect "ftk-export-hf of a run directory: exit 2" 2 "$BIN/ftk-export-hf" "$WORK/run" -o "$WORK/hf2"
grep -q "run: a checkpoint or run directory, not a weights file; merge it into one first: ftk-merge" "$WORK/err" &&
    ok "  says to merge it first" || notok "  says to merge it first: $(cat "$WORK/err")"
expect "ftk-import-hf of a safetensors file: exit 2" 2 "$BIN/ftk-import-hf" "$WORK/hf/model.safetensors" -o "$WORK/i.h5"
grep -q "model.safetensors: not a folder" "$WORK/err" && ok "  says it takes the folder" ||
    notok "  says it takes the folder: $(cat "$WORK/err")"
expect "ftk-verify of a JSON file: exit 2 (not an ftk file; 3 is for damage)" 2 "$BIN/ftk-verify" "$WORK/one.json"
check "  nothing written" test ! -e "$WORK/m2.h5" -a ! -e "$WORK/rs" -a ! -e "$WORK/hf2" -a ! -e "$WORK/i.h5"
finish
