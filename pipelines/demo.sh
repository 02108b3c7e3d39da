#!/bin/sh
# The demo: every stage on the embedded example (examples/demo), nothing from outside the
# repository, no network: data, weights, training through a preemption, generation, the
# checkpoint tools, a precision mode and the memory plan. Run again, it replaces its outputs:
# --force (an existing output is refused without it) or a fresh name.
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
    --pack --max-len 256 --val-count 4 --compress zstd --force
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
ftk init --preset tiny --seed 42 -t examples/demo/tokenizer.model -o "$OUT/tiny-init.h5" --force
echo
echo "== 7. export it as a Hugging Face folder (config.json, model.safetensors, tokenizer.model) ..."
ftk export-hf "$OUT/tiny-init.h5" -o "$OUT/tiny-hf" --force
ls -l "$OUT/tiny-hf"
echo
echo "== 8. ... import that folder back (bfloat16, zstd) and prove it whole (checksums, shapes, no NaN/Inf)"
ftk import-hf "$OUT/tiny-hf" --dtype bfloat16 --compress zstd -o "$OUT/tiny.h5" --force
ftk info "$OUT/tiny.h5" | sed -n '1,6p'
ftk verify --deep "$OUT/tiny.h5"
echo
echo "== 9. train: a random-initialised model of llama2.c's stories260K shape (260k parameters) with the demo"
echo "      tokenizer on the 36 training examples packed into 24 rows: AdamW, warmup + cosine, a checkpoint every 50 steps,"
MPI=""
if command -v mpirun >/dev/null 2>&1; then
    MPI="mpirun --oversubscribe -np 2"
    [ "$(id -u)" = 0 ] && MPI="mpirun --oversubscribe --allow-run-as-root -np 2"
    echo "      on 2 MPI ranks (strategy full: parameters, gradients and AdamW moments sharded, one shard file each)."
else
    echo "      in one process (mpirun not found)."
fi
echo "      Preempted after step 50 by SIGUSR1 (what SLURM sends before a time limit): every rank finishes"
echo "      the step, a checkpoint is written, exit 75; a restart without --resume is refused; --resume auto continues."
ftk init --preset stories260k --seed 7 -t examples/demo/tokenizer.model -o "$OUT/demo-init.h5" --force
rm -rf "$OUT/run"
PROMPT="Give three tips for staying healthy."
echo "   before training, greedy answer to \"$PROMPT\":"
ftk generate -m "$OUT/demo-init.h5" --alpaca -p "$PROMPT" --greedy -n 30 | tr '\n' ' ' | sed 's/^/   | /'
echo
TRAIN="$MPI ftk train -m $OUT/demo-init.h5 -d $OUT/alpaca-demo.h5 -o $OUT/run --steps 200 --global-batch 8
       --micro-batch 4 --lr 5e-3 --min-lr 5e-4 --warmup 10 --weight-decay 0 --save-every 50 --keep 2
       --eval-every 50 -j 1"
$TRAIN >"$OUT/train.log" 2>&1 &
pid=$!
while [ ! -d "$OUT/run/step-00000050" ] && kill -0 $pid 2>/dev/null; do sleep 0.2; done
kill -USR1 $pid 2>/dev/null || true
rc=0
wait $pid || rc=$?
awk '/ftk-train: (step (1|50)\/|.*validation|.*checkpoint|.*stopped|.*steps on)/' "$OUT/train.log"
echo "   exit $rc (75: preempted, checkpoint written, run again)"
rc=0
$TRAIN -q >/dev/null 2>&1 || rc=$?
echo "   (a second start without --resume is refused: exit $rc; with --resume auto it continues)"
$TRAIN --resume auto 2>&1 | awk '/ftk-train: (resuming|step (150|200)\/|.*validation|.*checkpoint)/'
ls "$OUT/run" "$OUT/run/$(cat "$OUT/run/latest")"
echo
echo "== 10. after training, the same instruction, greedy, from the run's latest checkpoint. With 36 examples"
echo "       the model memorises its training answers (validation loss rises: it overfits, as it must):"
ftk generate -m "$OUT/run" --alpaca -p "$PROMPT" --greedy -n 60 | sed 's/^/   | /'
echo
echo "== 11. the checkpoint moves on: prove it whole (manifest, every shard's size and checksum, every dataset's,"
echo "       every parameter covered once), reshard it for 3 ranks (what a requeued job on other GPUs gets; ftk train"
echo "       --resume also does this on load), compare the layouts value by value, merge it into one weights file"
echo "       (Hugging Face names, bfloat16), export that to a Hugging Face folder, verify, and generate from it."
rm -rf "$OUT/run3" "$OUT/final-hf" "$OUT/final.h5"
ftk verify "$OUT/run" | sed 's/^/   /'
ftk reshard "$OUT/run" -o "$OUT/run3" --ranks 3
ftk verify --compare "$OUT/run" "$OUT/run3" | tail -n 1 | sed 's/^/   /'
ftk merge "$OUT/run3" -o "$OUT/final.h5" --dtype bfloat16
ftk export-hf "$OUT/final.h5" -o "$OUT/final-hf"
ftk verify --deep "$OUT/final.h5" | sed 's/^/   /'
ls "$OUT/final-hf" | sed 's/^/   final-hf\//'
echo "   greedy answer from the merged bfloat16 weights:"
ftk generate -m "$OUT/final.h5" --alpaca -p "$PROMPT" --greedy -n 60 | sed 's/^/   | /'
echo
echo "== 12. precision: the first 50 steps again in bf16-true (weights, gradients and AdamW moments stored in bf16,"
echo "       8 bytes per parameter; AdamW rounds stochastically), one process; validation loss at step 50 against"
echo "       the fp32 run's (a step's own loss is of its 8 rows, too noisy to compare one step)"
rm -rf "$OUT/run-bf16"
ftk train -m "$OUT/demo-init.h5" -d "$OUT/alpaca-demo.h5" -o "$OUT/run-bf16" --steps 200 --global-batch 8 \
    --micro-batch 4 --lr 5e-3 --min-lr 5e-4 --warmup 10 --weight-decay 0 --eval-every 50 --stop-after 50 -j 1 \
    --precision bf16-true 2>&1 | awk '/step 50: validation/' | sed 's/^/   bf16-true /' || true
awk '/step 50: validation/' "$OUT/train.log" | sed 's/^/   fp32      /'
echo
echo "== 13. the memory plan: what Llama-2-7B (rows of 512, micro-batch 4, --recompute) takes per GPU in bf16-true,"
echo "       on one 80 GB GPU; computed by a dry run of the code that allocates, no GPU needed"
ftk train --plan --preset llama2-7b --max-len 512 --micro-batch 4 --recompute --precision bf16-true --device cuda |
    sed 's/^/   /'
