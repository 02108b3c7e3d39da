#!/bin/sh
# Where generation stops: ftk-generate follows transformers' rule,
# generation_config.json's eos_token_id when that file exists (absent or null there: no
# EOS, as transformers 4.38 does), else config.json's; never the tokenizer's EOS;
# ftk-import-hf and ftk-export-hf warn when that differs from the tokenizer's EOS;
# generation_config.json travels through import and export byte for byte.
# The model is the demo's random tiny one; the id it generates first (T1, found by
# bisection with lists of ids as generation_config.json's eos_token_id) serves as the
# "other" end-of-sequence id, so a stop at it gives an empty output.
# Usage: tests/cli/eos.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
demo_init "$WORK/w.h5" tiny 1 || exit 1
"$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/hf" || exit 1
G="$BIN/ftk-generate --greedy -n 12 -p Hello -j 1"
$G -m "$WORK/w.h5" --ignore-eos >"$WORK/all.txt" || exit 1
$G -m "$WORK/w.h5" >"$WORK/plain.txt" || exit 1

# hf_with NAME [SED] [GENERATION_CONFIG]: a copy of the export, config.json edited by SED,
# with that generation_config.json (none when empty), imported to NAME.h5
hf_with() {
    rm -rf "$WORK/$1"
    cp -r "$WORK/hf" "$WORK/$1"
    [ -n "${2:-}" ] && sed -i "$2" "$WORK/$1/config.json"
    [ -n "${3:-}" ] && printf '%s\n' "$3" >"$WORK/$1/generation_config.json"
    "$BIN/ftk-import-hf" -q "$WORK/$1" -o "$WORK/$1.h5" 2>"$WORK/$1.import.err"
}
ids() { seq -s, "$1" "$2"; }
# stops_at_once LO HI: the model's first token is one of LO..HI
stops_at_once() {
    hf_with bis "" "{\"eos_token_id\": [$(ids "$1" "$2")]}" && [ -z "$($G -m "$WORK/bis.h5")" ]
}
# (506 with today's ftk-init and seed; the search runs only when that changes)
T1=506
if ! stops_at_once $T1 $T1; then
    lo=0 hi=511
    stops_at_once $lo $hi || { echo "FAIL: a list of every id does not stop generation at once"; exit 1; }
    while [ $lo -lt $hi ]; do
        mid=$(((lo + hi) / 2))
        if stops_at_once $lo $mid; then hi=$mid; else lo=$((mid + 1)); fi
    done
    T1=$lo
fi
echo "     the model's first greedy token: $T1 (the tokenizer's EOS: 2)"
[ "$T1" != 2 ] || { echo "skipped (the model's first token is the EOS itself)"; exit 77; }

# config.json's eos_token_id differs from the tokenizer's
hf_with cfg "s/\"eos_token_id\": 2/\"eos_token_id\": $T1/"
check "config.json eos $T1: ftk-import-hf imports it" test -f "$WORK/cfg.h5"
check "... and warns that generation stops at $T1, not at the tokenizer's EOS 2" grep -q \
    "warning: .*cfg: generation stops at $T1 (eos_token_id of config.json, as transformers' generate() does), but the tokenizer's EOS is 2" \
    "$WORK/cfg.import.err"
expect "ftk-generate stops at $T1" 0 $G -m "$WORK/cfg.h5"
check "... at once (empty output)" test -z "$(cat "$WORK/out")"
expect "ftk-export-hf of it: exit 0" 0 "$BIN/ftk-export-hf" -q "$WORK/cfg.h5" -o "$WORK/cfg-out"
check "... with the same warning" grep -q "warning: .*cfg.h5: generation stops at $T1 (eos_token_id of config.json" \
    "$WORK/err"

# generation_config.json decides over config.json
hf_with gen "" "{\"bos_token_id\": 1, \"eos_token_id\": $T1}"
check "generation_config.json eos $T1: ftk-import-hf warns, naming generation_config.json" grep -q \
    "generation stops at $T1 (eos_token_id of generation_config.json" "$WORK/gen.import.err"
expect "ftk-generate stops at $T1" 0 $G -m "$WORK/gen.h5"
check "... at once" test -z "$(cat "$WORK/out")"
expect "ftk-export-hf: exit 0" 0 "$BIN/ftk-export-hf" -q "$WORK/gen.h5" -o "$WORK/gen-out"
same "... writes generation_config.json back byte for byte" "$WORK/gen-out/generation_config.json" \
    "$WORK/gen/generation_config.json"
check "... and warns" grep -q "generation stops at $T1 (eos_token_id of generation_config.json" "$WORK/err"
hf_with list "" "{\"eos_token_id\": [2, $T1]}"
expect "a list [2, $T1]: ftk-generate stops at either" 0 $G -m "$WORK/list.h5"
check "... at once" test -z "$(cat "$WORK/out")"
check "... and the import warns" grep -q "generation stops at \[2, $T1\]" "$WORK/list.import.err"
hf_with null "" '{"eos_token_id": null}'
expect "eos_token_id null: ftk-generate does not stop at an EOS" 0 $G -m "$WORK/null.h5"
same "... (the output of --ignore-eos)" "$WORK/out" "$WORK/all.txt"
hf_with none "s/\"eos_token_id\": 2/\"eos_token_id\": $T1/" '{"bos_token_id": 1}'
expect "generation_config.json without eos_token_id: no EOS (not config.json's $T1)" 0 $G -m "$WORK/none.h5"
same "... (transformers 4.38 does the same: the output of --ignore-eos)" "$WORK/out" "$WORK/all.txt"
check "... and the import warns that generation does not stop at an EOS" grep -q \
    "generation stops at no end-of-sequence id (generation_config.json has no eos_token_id" "$WORK/none.import.err"

# all agree: no warning, same text as before
hf_with same "" '{"bos_token_id": 1, "eos_token_id": 2}'
check "all three say 2: no warning" test ! -s "$WORK/same.import.err"
expect "... ftk-generate: exit 0" 0 $G -m "$WORK/same.h5"
same "... the same text as the original weights" "$WORK/out" "$WORK/plain.txt"

# a generation_config.json that cannot be read is bad input
hf_with bad "" '{"eos_token_id": "</s>"}'
check "eos_token_id \"</s>\": ftk-import-hf refuses it (no output)" test ! -e "$WORK/bad.h5"
check "... naming the file and the field" grep -q \
    "error: .*bad/generation_config.json: eos_token_id: not a token id or a list of them" "$WORK/bad.import.err"
finish
