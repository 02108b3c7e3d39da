#!/bin/sh
# A run keeps its options:
#  - ftk-train --config FILE.yaml: every long option is a key (- or _), the command line
#    overrides the file; LitGPT's finetune/full.yaml (its Llama-2-7B recipe) is read, its
#    keys that change nothing said as ignored, those ftk cannot honour refused by name;
#    unknown keys, bad values, malformed YAML, a FIFO: exit 2 with file, line and column;
#  - the resolved options are written into RUN/options.yaml, and `ftk-train -o RUN
#    --resume auto` alone takes them from there, bit-exact with the uninterrupted run;
#  - --extend lets a resume change the steps or the learning rate (refused without it),
#    says so on stderr and in metrics.jsonl.
# Usage: tests/cli/config.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
demo_pack "$WORK/d.h5" 128 || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
losses() { grep '"kind": "step"' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
cat >"$WORK/c.yaml" <<EOF
# a run's options
model: $WORK/w.h5
data: $WORK/d.h5
steps: 8
global_batch: 4
micro-batch: 2
lr: 1.0e-3
warmup: 1
eval-every: 0
decay_norms: true
EOF
T="$BIN/ftk-train -j1"

expect "--config: 8 steps from the file" 0 $T --config "$WORK/c.yaml" -o "$WORK/ref"
check "... its options took effect (lr 1e-3 peak, 8 steps, decay-norms kept)" sh -c "
    grep -q '\"step\": 1, \"loss\": [0-9.e+-]*, \"lr\": 0.001,' '$WORK/ref/metrics.jsonl' &&
    [ \$(grep -c '\"kind\": \"step\"' '$WORK/ref/metrics.jsonl') = 8 ] &&
    grep -qx 'decay-norms: true' '$WORK/ref/options.yaml'"
check "RUN/options.yaml holds the resolved options (absolute inputs, not the run's place or --config)" sh -c "
    grep -qx 'model: \"$WORK/w.h5\"' '$WORK/ref/options.yaml' && grep -qx 'global-batch: 4' '$WORK/ref/options.yaml' &&
    ! grep -q '^out:\|^config:\|^resume:' '$WORK/ref/options.yaml'"
expect "the command line overrides the file (--steps 3)" 0 $T --config "$WORK/c.yaml" -o "$WORK/over" --steps 3
check "... 3 steps" test "$(grep -c '"kind": "step"' "$WORK/over/metrics.jsonl")" = 3

# --resume auto takes the run's options
expect "--config, --stop-after 3: exit 75" 75 $T --config "$WORK/c.yaml" -o "$WORK/r" --stop-after 3
expect "ftk-train -o RUN --resume auto (nothing else) finishes it" 0 $T -o "$WORK/r" --resume auto
check "... said where its options came from" grep -q "options of the run from $WORK/r/options.yaml" "$WORK/err"
losses "$WORK/r" >"$WORK/lr"
losses "$WORK/ref" >"$WORK/lref"
same "... losses identical to the uninterrupted run" "$WORK/lr" "$WORK/lref"
same "... final shard byte-identical" "$WORK/r/step-00000008/shard-00001-of-00001.h5" \
    "$WORK/ref/step-00000008/shard-00001-of-00001.h5"

# --extend
expect "resume with --steps 12: refused without --extend" 2 $T -o "$WORK/r" --resume auto --steps 12
check "... naming --steps" grep -q -- "--steps/--epochs (total steps) differs" "$WORK/err"
expect "--extend --steps 12 --lr 5e-4: 4 more steps" 0 $T -o "$WORK/r" --resume auto --steps 12 --lr 5e-4 --extend
check "... said on stderr (no longer bit-exact)" grep -q "extend: --lr 0.001 -> 0.0005, --steps 8 -> 12; from step 8 on, the run is no longer bit-exact" \
    "$WORK/err"
check "... and in metrics.jsonl (kind extend at step 8), 12 steps in all" sh -c "
    grep -q '^{\"kind\": \"extend\", \"step\": 8, \"changed\": \"--lr 0.001 -> 0.0005, --steps 8 -> 12\", \"bit_exact\": false' \
    '$WORK/r/metrics.jsonl' && [ \$(grep -c '\"kind\": \"step\"' '$WORK/r/metrics.jsonl') = 12 ] &&
    [ \"\$(cat '$WORK/r/latest')\" = step-00000012 ]"
check "... options.yaml now says 12 steps" grep -qx "steps: 12" "$WORK/r/options.yaml"
expect "--extend cannot change the batch: refused" 2 $T -o "$WORK/r" --resume auto --steps 14 --global-batch 2 --extend
check "... naming --global-batch" grep -q -- "--global-batch differs" "$WORK/err"

# LitGPT's recipe file
L=$ROOT/tests/corpus/config/litgpt-llama-2-7b-full.yaml
expect "LitGPT's llama-2-7b/full.yaml: read" 0 $T --config "$L" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/lit" \
    --steps 2 --global-batch 4 --micro-batch 2 --eval-every 0
check "... its keys that change nothing said as ignored, with line and column" sh -c "
    grep -q 'full.yaml: line 5, column 1: checkpoint_dir: ignored (a Hugging Face folder: import it with ftk-import-hf' '$WORK/err' &&
    grep -q 'line 21, column 1: data: ignored' '$WORK/err'"
check "... its values taken: precision bf16-true, warmup 25, min-lr 6e-05, betas 0.9/0.95, save-every 200" sh -c "
    grep -qx 'precision: \"bf16-true\"' '$WORK/lit/options.yaml' && grep -qx 'warmup: 25' '$WORK/lit/options.yaml' &&
    grep -qx 'beta2: 0.94999999999999996' '$WORK/lit/options.yaml' && grep -qx 'save-every: 200' '$WORK/lit/options.yaml' &&
    grep -qx 'min-lr: 6.0000000000000002e-05' '$WORK/lit/options.yaml'"

# refusals: exit 2, file, line, column, nothing written
refuse() { # refuse NAME MESSAGE YAML-TEXT
    printf '%s\n' "$3" >"$WORK/bad.yaml"
    expect "$1: exit 2" 2 $T --config "$WORK/bad.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/bad" --steps 1
    check "... $2, nothing written" sh -c "grep -q -- '$2' '$WORK/err' && [ ! -e '$WORK/bad' ]"
}
refuse "an unknown key" "bad.yaml: line 2, column 1: learning_rat: not an option of this tool" "steps: 2
learning_rat: 1e-3"
refuse "a flag that is not true or false" "line 1, column 1: decay-norms: a flag: true or false" "decay-norms: maybe"
refuse "LitGPT's quantize" "line 1, column 1: quantize: ftk trains full-precision weights" "quantize: bnb.nf4"
refuse "another optimizer" "optimizer.class_path: \"torch.optim.SGD\" is not a value ftk has an equivalent of" \
    "optimizer:
  class_path: torch.optim.SGD"
refuse "a precision ftk has not" "precision 16-mixed: need fp32, bf16-mixed or bf16-true" "precision: 16-mixed"
refuse "malformed YAML (an unterminated string)" "bad.yaml: line [0-9]*, column [0-9]*: found unexpected end of stream" "steps: 2
lr: \"1e-3"
refuse "a list where one value goes" "lr: a list is not a value of this option" "lr: [1, 2]"
mkfifo "$WORK/fifo.yaml"
expect "a FIFO as --config: exit 2 at once" 2 timeout 60 $T --config "$WORK/fifo.yaml" -m "$WORK/w.h5" \
    -d "$WORK/d.h5" -o "$WORK/bad" --steps 1
check "... not a configuration file" grep -q "fifo.yaml: not a configuration file" "$WORK/err"
finish
