#!/bin/sh
# Fault test: ftk-pack killed mid-run (SIGKILL, then SIGTERM) never leaves a partial file
# under the output name, and an existing output stays as it was.
# Usage: tests/cli/fault.sh BIN_DIR WORK_DIR
set -u
BIN=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
# A large input (the demo records repeated) so that the run lasts long enough to be killed.
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
# 20 copies: about 18 MB of JSON
for k in $(seq 20); do cat "$WORK/part.json"; done | sed 's/^\]$/,/; $ s/,$/]/' | sed '1!s/^\[//' >"$WORK/big.json" 2>/dev/null
bad=0
echo "previous content" >"$WORK/out.h5"
for sig in KILL TERM; do
    "$BIN/ftk-pack" -t "$ROOT/examples/demo/tokenizer.model" "$WORK/big.json" -o "$WORK/out.h5" -q --threads 1 \
        2>"$WORK/err.$sig" &
    pid=$!
    sleep 0.3
    kill -s $sig $pid 2>/dev/null
    wait $pid
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "skipped (ftk-pack finished before SIG$sig arrived; machine too fast for this input)"
        exit 77
    fi
    if [ "$(cat "$WORK/out.h5")" = "previous content" ]; then
        echo "ok   SIG$sig (exit $rc): the existing output is untouched"
    else
        echo "FAIL SIG$sig: the output file changed"
        bad=1
    fi
    tmp=$(ls -A "$WORK" | grep '^\.out\.h5\.tmp' || true)
    if [ $sig = TERM ] && [ -n "$tmp" ]; then
        echo "FAIL SIGTERM left its temporary file: $tmp"
        bad=1
    fi
    rm -f "$WORK"/.out.h5.tmp.*
done
# and a run left alone completes and verifies
"$BIN/ftk-pack" -t "$ROOT/examples/demo/tokenizer.model" "$WORK/big.json" -o "$WORK/out.h5" -q --pack || bad=1
"$BIN/ftk-verify" "$WORK/out.h5" || bad=1
exit $bad
