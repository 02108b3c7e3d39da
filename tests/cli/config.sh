#!/bin/sh
# A run keeps its options:
#  - ftk-train --config FILE.yaml: every long option is a key (- or _), the command line
#    overrides the file; LitGPT's finetune/full.yaml of its last three releases (every
#    model's) and litgpt 0.3's are read, their keys that change nothing said as ignored,
#    those ftk cannot honour refused by name, an empty value (null) and a left-out max_norm
#    taken as LitGPT's default (no clipping); unknown keys, a key given twice, an empty
#    key, config:, bad values, malformed YAML, 10000 nested levels, a FIFO: exit 2 with
#    file, line and column;
#  - the resolved options are written into RUN/options.yaml, and `ftk-train -o RUN
#    --resume auto` alone takes them from there, bit-exact with the uninterrupted run;
#    the file sets only what a run keeps (not report, stop-after, plan, out), names no
#    --tensorboard outside the run unless the command line does (kept relative to the
#    run), is not read through a link, and no error quotes it;
#  - --extend lets a resume change the steps or the learning rate (refused without it),
#    says so on stderr and in metrics.jsonl;
#  - -o a/b/run makes the missing a/b (removed again when the run fails at its start).
# Usage: tests/cli/config.sh BIN_DIR WORK_DIR [quick]   (quick: the ASan run; LitGPT's
# file of every model, and the trainings that check values rather than memory, are the
# release run's only)
set -u
BIN=$1 WORK=$2 MODE=${3:-full}
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
PY=${PYTHON:-/usr/bin/python3}

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

# LitGPT's recipe files: those of its last three releases, and an older one
L=$ROOT/tests/corpus/config/litgpt/llama-2-7b-full.yaml
expect "LitGPT's llama-2-7b/full.yaml: read" 0 $T --config "$L" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/lit" \
    --steps 2 --global-batch 4 --micro-batch 2 --eval-every 0
check "... its keys that change nothing said as ignored, with line and column" sh -c "
    grep -q 'full.yaml: line 4, column 1: checkpoint_dir: ignored (a Hugging Face folder: import it with ftk-import-hf' '$WORK/err' &&
    grep -q 'line 10, column 1: data: ignored' '$WORK/err'"
check "... its values taken: precision bf16-true, warmup 25, min-lr 6e-05, betas 0.9/0.95, save-every 200" sh -c "
    grep -qx 'precision: \"bf16-true\"' '$WORK/lit/options.yaml' && grep -qx 'warmup: 25' '$WORK/lit/options.yaml' &&
    grep -qx 'beta2: 0.94999999999999996' '$WORK/lit/options.yaml' && grep -qx 'save-every: 200' '$WORK/lit/options.yaml' &&
    grep -qx 'min-lr: 6.0000000000000002e-05' '$WORK/lit/options.yaml'"
check "... its empty keys are LitGPT's defaults: max_norm: no clipping, max_steps: the epochs decide" sh -c "
    grep -qx 'clip: 0' '$WORK/lit/options.yaml' && ! grep -q 'max_tokens\|max_steps\|max_norm' '$WORK/err'"
grep -v max_norm "$L" >"$WORK/nonorm.yaml"
expect "... without max_norm: read" 0 $T --config "$WORK/nonorm.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" \
    -o "$WORK/lit2" --steps 1 --global-batch 4 --micro-batch 2 --eval-every 0
check "... LitGPT's default, no clipping, said" sh -c "grep -qx 'clip: 0' '$WORK/lit2/options.yaml' &&
    grep -q 'nonorm.yaml: train.max_norm: not given: --clip 0 (LitGPT.s default)' '$WORK/err'"
[ "$MODE" = quick ] && corpus= || corpus=$(ls "$ROOT"/tests/corpus/config/litgpt/*.yaml)
for f in $corpus; do
    expect "$(basename "$f"): loads (ftk-train --plan)" 0 $T --config "$f" --plan --preset tiny --max-len 64
    check "... every key taken or said as ignored" sh -c "[ \$(grep -c ': ignored (' '$WORK/err') -ge 10 ] &&
        [ \$(grep -vc ': ignored (' '$WORK/err') = 0 ]"
done
if [ "$MODE" != quick ]; then # trainings that check values, not memory: the release run
    printf 'train:\n  max_norm: 0.5\n' >"$WORK/norm.yaml"
    expect "train.max_norm 0.5: --clip 0.5" 0 $T --config "$WORK/norm.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" \
        -o "$WORK/lit3" --steps 1 --global-batch 4 --micro-batch 2 --eval-every 0
    check "... in options.yaml" grep -qx 'clip: 0.5' "$WORK/lit3/options.yaml"
    expect "litgpt 0.3's train.learning_rate, weight_decay, beta1, beta2" 0 $T --config \
        "$ROOT/tests/corpus/config/litgpt/v0.3.1-llama-2-7b-full.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/lit4" \
        --steps 1 --global-batch 4 --micro-batch 2 --eval-every 0
    check "... taken: lr 2e-4, weight decay 0.1, betas 0.9/0.95" sh -c "
        grep -qx 'lr: 0.00020000000000000001' '$WORK/lit4/options.yaml' && grep -qx 'weight-decay: 0.10000000000000001' '$WORK/lit4/options.yaml' &&
        grep -qx 'beta1: 0.90000000000000002' '$WORK/lit4/options.yaml' && grep -qx 'beta2: 0.94999999999999996' '$WORK/lit4/options.yaml'"
fi

# refusals: exit 2, file, line, column, nothing written
refuse() { # refuse NAME MESSAGE YAML-TEXT
    printf '%s\n' "$3" >"$WORK/bad.yaml"
    expect "$1: exit 2" 2 $T --config "$WORK/bad.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/bad" --steps 1
    check "... $2, nothing written" sh -c "grep -q -- '$2' '$WORK/err' && [ ! -e '$WORK/bad' ]"
}
refuse "an unknown key" "bad.yaml: line 2, column 1: learning_rat: not an option of this tool" "steps: 2
learning_rat: 1e-3"
refuse "a misspelt key" "line 1, column 1: min_lrr: not an option of this tool (did you mean .--min-lr.?; see --help" \
    "min_lrr: 1e-5"
refuse "a flag that is not true or false" "line 1, column 1: decay-norms: a flag: true or false" "decay-norms: maybe"
refuse "LitGPT's quantize" "line 1, column 1: quantize: ftk trains full-precision weights" "quantize: bnb.nf4"
refuse "another optimizer" "optimizer.class_path: \"torch.optim.SGD\" is not a value ftk has an equivalent of" \
    "optimizer:
  class_path: torch.optim.SGD"
refuse "a precision ftk has not" "precision 16-mixed: need fp32, bf16-mixed or bf16-true" "precision: 16-mixed"
refuse "malformed YAML (an unterminated string)" "bad.yaml: line [0-9]*, column [0-9]*: found unexpected end of stream" "steps: 2
lr: \"1e-3"
refuse "a list where one value goes" "lr: a list is not a value of this option" "lr: [1, 2]"
refuse "a key given twice, as global_batch and global-batch" \
    "line 3, column 1: global-batch: given twice (first at line 1, column 1; - and _ are the same)" "global_batch: 4
steps: 1
global-batch: 8"
refuse "two keys that set one option" "line 4, column 5: optimizer.init_args.lr: sets --lr, which line 1, column 1 set already" \
    "lr: 1e-3
optimizer:
  init_args:
    lr: 2e-4"
refuse "an empty key" "line 2, column 1: an empty key" "steps: 1
\"\": 2"
refuse "config: inside a config" "line 1, column 1: config: a configuration file cannot name another" "config: other.yaml"
refuse "an empty value where LitGPT has no default either (epochs)" \
    "line 2, column 3: train.epochs: no value (null), and LitGPT.s default for it is none ftk can take" "train:
  epochs:"
refuse "mappings nested deeper than 16 levels" "line 1, column 64: mappings nested deeper than 16 levels" \
    "a: $(printf '{a: %.0s' $(seq 40))1$(printf '}%.0s' $(seq 40))"
# 10000 levels of empty keys (60 KB) once recursed until the stack overflowed (exit 139)
"$PY" -c "n = 10000; print('\"\": ' + '{\"\": ' * (n - 1) + '1' + '}' * (n - 1))" >"$WORK/deep.yaml"
expect "10000 levels of empty keys: exit 2" 2 $T --config "$WORK/deep.yaml" -m "$WORK/w.h5" -d "$WORK/d.h5" -o "$WORK/bad"
check "... naming line and column" grep -q "deep.yaml: line 1, column 1: an empty key" "$WORK/err"
mkfifo "$WORK/fifo.yaml"
expect "a FIFO as --config: exit 2 at once" 2 timeout 60 $T --config "$WORK/fifo.yaml" -m "$WORK/w.h5" \
    -d "$WORK/d.h5" -o "$WORK/bad" --steps 1
check "... not a regular file" grep -q "fifo.yaml: a FIFO, not a regular file: refused" "$WORK/err"

# RUN/options.yaml is a run directory's, which may be someone else's: it sets only what a
# run keeps, names no path outside the run unless the command line does, is not read
# through a link, and no error quotes it
expect "a run of 2 steps stopped after 1 (the runs below are copies of it)" 75 $T --config "$WORK/c.yaml" \
    -o "$WORK/r1" --steps 2 --stop-after 1
kept() { # kept NAME: a copy of that run, as $WORK/NAME
    rm -rf "$WORK/$1" && cp -r "$WORK/r1" "$WORK/$1"
}
echo "precious" >"$WORK/victim"
for k in "report: \"$WORK/victim\"" "stop-after: 1" "plan: true" "out: \"$WORK/victim\""; do
    kept k1 && echo "$k" >>"$WORK/k1/options.yaml"
    expect "options.yaml with ${k%%:*}: (not kept): --resume auto refused" 2 $T -o "$WORK/k1" --resume auto
    check "... naming it, the victim untouched" sh -c "grep -q 'k1/options.yaml: line [0-9]*, column 1: ${k%%:*}: not an option a run keeps' '$WORK/err' &&
        [ \"\$(cat '$WORK/victim')\" = precious ] && [ \"\$(cat '$WORK/k1/latest')\" = step-00000001 ]"
done
mkdir "$WORK/outside"
ln -s "$WORK/outside" "$WORK/r1/tblink"
for k in "$WORK/outside" "../outside" "tblink/tb"; do
    kept k2 && echo "tensorboard: \"$k\"" >>"$WORK/k2/options.yaml"
    expect "options.yaml with tensorboard: $k (outside the run): --resume auto refused" 2 $T -o "$WORK/k2" --resume auto
    check "... saying why, nothing written there" sh -c "grep -q 'tensorboard: a path that leaves the directory' '$WORK/err' &&
        [ -z \"\$(ls '$WORK/outside')\" ]"
done
if [ "$MODE" != quick ]; then # a 1-step training: the release run
    expect "... unless the command line names it" 0 $T -o "$WORK/k2" --resume auto --tensorboard "$WORK/outside"
    check "... kept as an absolute path" grep -qx "tensorboard: \"$WORK/outside\"" "$WORK/k2/options.yaml"
fi
mkdir "$WORK/elsewhere"
kept k3 && echo 'tensorboard: "tb"' >>"$WORK/k3/options.yaml"
expect "options.yaml with tensorboard: tb: inside the run, from another directory" 0 sh -c "cd '$WORK/elsewhere' && $T -o '$WORK/k3' --resume auto"
check "... its events there" sh -c "ls '$WORK/k3/tb' | grep -q '^events.out.tfevents' && [ -z \"\$(ls '$WORK/elsewhere')\" ]"
if [ "$MODE" != quick ]; then # two trainings: the release run
    # relative to the working directory on the command line, kept relative to the run
    rm -rf "$WORK/t1"
    expect "-o t1 --tensorboard t1/tb --stop-after 1 (relative paths)" 75 sh -c "cd '$WORK' && $T --config c.yaml -o t1 --steps 2 --tensorboard t1/tb --stop-after 1"
    check "... kept relative to the run" grep -qx 'tensorboard: "tb"' "$WORK/t1/options.yaml"
    expect "... resumed from another directory" 0 sh -c "cd '$WORK/elsewhere' && $T -o '$WORK/t1' --resume auto"
    check "... its events beside the first ones" sh -c "[ \$(ls '$WORK/t1/tb' | grep -c '^events.out.tfevents') = 2 ] && [ -z \"\$(ls '$WORK/elsewhere')\" ]"
fi

printf 'secret-key: hunter2\n' >"$WORK/secret" && chmod 600 "$WORK/secret"
kept k4 && rm "$WORK/k4/options.yaml" && ln -s "$WORK/secret" "$WORK/k4/options.yaml"
expect "options.yaml a link (to a secret): refused" 2 $T -o "$WORK/k4" --resume auto
check "... as a link, its target not quoted" sh -c "grep -q 'k4/options.yaml: a symbolic link, refused' '$WORK/err' &&
    ! grep -q 'hunter2\|secret-key' '$WORK/err'"
kept k5 && cp "$WORK/secret" "$WORK/k5/options.yaml"
expect "options.yaml holding a secret: refused" 2 $T -o "$WORK/k5" --resume auto
check "... by line and column, nothing of it quoted" sh -c "grep -q 'k5/options.yaml: line 1, column 1: this key: not an option' '$WORK/err' &&
    ! grep -q 'hunter2\|secret' '$WORK/err'"
kept k6 && printf 'steps: 8\ndecay-norms: hunter2\n' >"$WORK/k6/options.yaml"
expect "options.yaml with a value that is not one: refused" 2 $T -o "$WORK/k6" --resume auto
check "... the value not quoted" sh -c "grep -q 'line 2, column 1: decay-norms: a flag: true or false' '$WORK/err' && ! grep -q hunter2 '$WORK/err'"
kept k7 && head -c 300 "$WORK/w.h5" >"$WORK/k7/options.yaml"
expect "options.yaml of binary bytes: refused" 2 $T -o "$WORK/k7" --resume auto
check "... at a line and column, saying what was wrong, no byte of it" sh -c "
    grep -q 'k7/options.yaml: line [0-9]*, column [0-9]*: [a-z]' '$WORK/err' && [ \$(wc -l <'$WORK/err') = 1 ] &&
    ! LC_ALL=C grep -q '[^ -~]' '$WORK/err'"
kept k8 && "$PY" -c "n = 10000; print('\"\": ' + '{\"\": ' * (n - 1) + '1' + '}' * (n - 1))" >"$WORK/k8/options.yaml"
expect "options.yaml of 10000 levels of empty keys: refused" 2 $T -o "$WORK/k8" --resume auto

# -o a/b/run: the missing directories made, as LitGPT makes its out_dir
expect "-o NEW/a/b/run: made" 0 $T --config "$WORK/c.yaml" -o "$WORK/new/a/b/run" --steps 1
check "... the run there" test -f "$WORK/new/a/b/run/latest"
expect "-o NEW2/a/b/run failing before its first checkpoint (--tensorboard under a file): exit 1" 1 \
    $T --config "$WORK/c.yaml" -o "$WORK/new2/a/b/run" --steps 1 --tensorboard "$WORK/victim/tb"
check "... the directories it made removed" test ! -e "$WORK/new2"
finish
