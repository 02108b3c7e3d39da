#!/bin/sh
# Fault test: ftk-pack killed mid-run (SIGKILL, then SIGTERM, each at its output file half
# written: FTK_FAULT's pack.write, the landing asserted) never leaves a partial file under
# the output name, and an existing output stays as it was; SIGTERM leaves no temporary.
# Usage: tests/fault/pack_kill.sh BIN_DIR WORK_DIR
set -u
BIN=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
# An input of a few thousand records (the demo records repeated).
{
    printf '['
    i=0
    while [ $i -lt 3000 ]; do
        [ $i -gt 0 ] && printf ','
        printf '{"instruction": "Repeat the text number %d with some more words to tokenize.", "input": "%s", "output": "%s"}\n' \
            $i "The quick brown fox jumps over the lazy dog. Packing, checksums and atomic renames." \
            "Una frase en español, des mots en français, 日本語の文, and digits 1234567890 for the byte fallback path."
        i=$((i + 1))
    done
    printf ']\n'
} >"$WORK/part.json"
cp "$WORK/part.json" "$WORK/big.json"
bad=0
echo "previous content" >"$WORK/out.h5"
for sig in KILL TERM; do
    rm -f "$WORK/fault.log"
    FTK_FAULT=pack.write:1:$( [ $sig = KILL ] && echo kill || echo sig=TERM) FTK_FAULT_LOG="$WORK/fault.log" \
        "$BIN/ftk-pack" -t "$ROOT/examples/demo/tokenizer.model" "$WORK/big.json" -o "$WORK/out.h5" -q --threads 1 \
        --force 2>"$WORK/err.$sig"
    rc=$?
    if [ $rc -ne $([ $sig = KILL ] && echo 137 || echo 143) ] || ! grep -q '^pack.write 1 ' "$WORK/fault.log"; then
        echo "FAIL SIG$sig: did not land in the output's write (exit $rc)"
        bad=1
    fi
    if [ "$(cat "$WORK/out.h5")" = "previous content" ]; then
        echo "ok   SIG$sig (exit $rc): the existing output is untouched"
    else
        echo "FAIL SIG$sig: the output file changed"
        bad=1
    fi
    tmp=$(ls -A "$WORK" | grep '^\.out\.h5\.tmp' || true)
    if [ $sig = KILL ] && [ -z "$tmp" ]; then
        echo "FAIL SIGKILL mid-write left no temporary: not killed where the test says"
        bad=1
    fi
    if [ $sig = TERM ] && [ -n "$tmp" ]; then
        echo "FAIL SIGTERM left its temporary file: $tmp"
        bad=1
    fi
    rm -f "$WORK"/.out.h5.tmp.*
done
# and a run left alone completes and verifies
"$BIN/ftk-pack" -t "$ROOT/examples/demo/tokenizer.model" "$WORK/big.json" -o "$WORK/out.h5" -q --pack --force || bad=1
"$BIN/ftk-verify" "$WORK/out.h5" || bad=1
exit $bad
