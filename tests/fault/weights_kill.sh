#!/bin/sh
# Fault test of the weights stage: ftk-export-hf and ftk-import-hf killed mid-write (SIGKILL,
# then SIGTERM, at the second block written: FTK_FAULT's weights.write, the landing
# asserted) leave an existing output exactly as it was, and SIGTERM leaves no temporary
# file or folder behind.
# Usage: tests/fault/weights_kill.sh BIN_DIR WORK_DIR
set -u
BIN=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
# A small model: the fault point, not the size, puts the kill inside the write.
cat >cfg.json <<'JSON'
{"model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
 "num_attention_heads": 4, "vocab_size": 4096, "torch_dtype": "float32"}
JSON
"$BIN/ftk-init" -q --config cfg.json -o big.h5 || exit 1
"$BIN/ftk-export-hf" -q big.h5 -o big-hf || exit 1
bad=0
mkdir hf && echo "previous content" >hf/config.json
echo "previous content" >out.h5
for sig in KILL TERM; do
    for tool in export import; do
        act=$([ $sig = KILL ] && echo kill || echo sig=TERM)
        rm -f fault.log
        if [ $tool = export ]; then
            FTK_FAULT=weights.write:2:$act FTK_FAULT_LOG=fault.log "$BIN/ftk-export-hf" -q big.h5 -o hf --force 2>err
        else
            FTK_FAULT=weights.write:2:$act FTK_FAULT_LOG=fault.log "$BIN/ftk-import-hf" -q big-hf -o out.h5 --force 2>err
        fi
        rc=$?
        if [ $rc -ne $([ $sig = KILL ] && echo 137 || echo 143) ] || ! grep -q '^weights.write 2 ' fault.log; then
            echo "FAIL $tool, SIG$sig: did not land in the write (exit $rc)"
            bad=1
        fi
        if [ $sig = KILL ] && [ -z "$(ls -A | grep '^\.' | grep -v '^\.$')" ]; then
            echo "FAIL $tool, SIGKILL mid-write left no temporary: not killed where the test says"
            bad=1
        fi
        if [ "$(cat hf/config.json 2>/dev/null)" = "previous content" ] && [ "$(ls hf)" = config.json ] &&
            [ "$(cat out.h5)" = "previous content" ]; then
            echo "ok   $tool, SIG$sig (exit $rc): the existing output is untouched"
        else
            echo "FAIL $tool, SIG$sig: the existing output changed"
            bad=1
        fi
        left=$(ls -A | grep '^\.' || true)
        if [ $sig = TERM ] && [ -n "$left" ]; then
            echo "FAIL $tool, SIGTERM left temporaries: $left"
            bad=1
        fi
        rm -rf .hf.tmp.* .out.h5.tmp.*
    done
done
# and runs left alone complete and replace the outputs
"$BIN/ftk-export-hf" -q big.h5 -o hf --force && [ "$(cat hf/config.json)" != "previous content" ] &&
    [ -f hf/model.safetensors ] || bad=1
"$BIN/ftk-import-hf" -q hf -o out.h5 --force && "$BIN/ftk-verify" out.h5 || bad=1
rm -rf big.h5 big-hf hf out.h5
exit $bad
