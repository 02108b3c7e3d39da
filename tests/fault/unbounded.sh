#!/bin/sh
# Unbounded inputs.
# ftk-pack on inputs with no end or no bound (formats/pack.h, formats/records.h): it reads
# them as a stream in bounded memory and refuses them at the first bad byte or at the
# record limit, with exit 2, line and column, and no output file:
#   /dev/zero (NULs are not JSON), NULs after valid records, a record that never ends (a
#   string, then whitespace inside an object), and a 50 MB stream of records of 100 KB
#   each (an ignored member) whose maximum resident size must stay under 48 MB, less
#   than the input (the old whole-file reader held the text and its parse: > 100 MB).
# Also: the same rows whatever --threads.
# ftk-init given a vocabulary of 2^31 (at Llama-2-7B's width: 70 TB of float32 weights, more
# than any disk here) checks the size against the free space first: exit 1, the sizes
# named, nothing written, at once.
# Usage: tests/fault/unbounded.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
TOK=$ROOT/examples/demo/tokenizer.model
PACK="timeout -k 5 60 $BIN/ftk-pack -q -t $TOK"
gone() { [ ! -e "$WORK/o.h5" ] && [ -z "$(ls -A "$WORK" | grep '^\.')" ]; }
said() { grep -q "$1" "$WORK/err" && ok "$2" || notok "$2: $(cat "$WORK/err")"; }

expect "/dev/zero is exit 2" 2 $PACK /dev/zero -o "$WORK/o.h5"
said "/dev/zero: line 1, column 1: expected an array of records or JSON Lines, found byte 0x00" \
    "/dev/zero is refused at its first byte"
check "/dev/zero leaves no output" gone

expect "NULs after a record are exit 2" 2 sh -c "(printf '[{\"instruction\": \"a\", \"output\": \"b\"},\n '; \
    exec cat /dev/zero) | $PACK - -o '$WORK/o.h5'"
said "<stdin>: line 2, column 2: unexpected byte 0x00, a value was expected" "NULs named at line 2, column 2"
check "NULs leave no output" gone

expect "a string that never ends is exit 2" 2 sh -c "(printf '{\"instruction\": \"a\", \"output\": \"b\"}\n\
{\"instruction\": \"'; yes aaaaaaaaaaaaaaa | exec tr -d '\\n') | $PACK - -o '$WORK/o.h5' --max-record-bytes 1000000"
said "<stdin>: line 2, column 1: record 2 is longer than 1000000 bytes (--max-record-bytes)" \
    "the endless record is named with its line"
check "the endless record leaves no output" gone
expect "blanks that never end inside a record are exit 2" 2 sh -c "(printf '[{\"instruction\": '; \
    exec yes '   ') | $PACK - -o '$WORK/o.h5'"
said "line 1, column 2: record 1 is longer than 4194304 bytes" "the default limit is 4 MiB"

# 50 MB of records through a pipe, in bounded memory.
/usr/bin/python3 "$ROOT/tests/bench/gen_records.py" 100 --pad 100000 >"$WORK/pad.jsonl" || exit 1
TIME=
[ -x /usr/bin/time ] && TIME="/usr/bin/time -f %M -o $WORK/rss"
copies="1 2 3 4 5"
case "$BIN" in *asan*) copies=1 ;; esac # (10 MB: the sanitizer build is slow)
expect "a 50 MB stream packs" 0 sh -c "for i in $copies; do cat '$WORK/pad.jsonl'; done | \
    $TIME $BIN/ftk-pack -q -t $TOK - -o '$WORK/big.h5' --pack --max-len 128"
expect "ftk-verify the streamed file" 0 "$BIN/ftk-verify" "$WORK/big.h5"
case "$BIN" in
*asan*) echo "note: resident size not checked under AddressSanitizer (shadow memory and quarantine)" ;;
*)
    if [ -n "$TIME" ]; then
        rss=$(tail -n 1 "$WORK/rss")
        [ "$rss" -lt 49152 ] && ok "resident size $rss KB < 48 MB for a 50 MB input" ||
            notok "resident size $rss KB for a 50 MB input"
    else
        echo "note: /usr/bin/time missing, resident size not measured"
    fi
    ;;
esac

# The same bytes whatever the number of threads.
/usr/bin/python3 "$ROOT/tests/bench/gen_records.py" 3000 --array >"$WORK/g.json" || exit 1
expect "pack with 1 thread" 0 $PACK "$WORK/g.json" -o "$WORK/j1.h5" --pack --max-len 256 -j 1
expect "pack with 2 threads" 0 $PACK "$WORK/g.json" -o "$WORK/j2.h5" --pack --max-len 256 -j 2
expect "pack with 3 threads" 0 $PACK "$WORK/g.json" -o "$WORK/j3.h5" --pack --max-len 256 -j 3
check "1, 2 and 3 threads write the same file" sh -c "cmp -s '$WORK/j1.h5' '$WORK/j2.h5' && cmp -s '$WORK/j1.h5' '$WORK/j3.h5'"

# ftk-init: an absurd configuration is refused before writing.
cat >"$WORK/config.json" <<EOF2
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
 "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 2147483648,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1,
 "eos_token_id": 2, "tie_word_embeddings": false}
EOF2
expect "ftk-init, vocabulary 2^31: exit 1" 1 timeout -k 5 60 "$BIN/ftk-init" --config "$WORK/config.json" -o "$WORK/w.h5"
said "w.h5: No space left on device: the weights need 70369.6 GB (1.76e+13 parameters of float32) and .* free; nothing written" \
    "ftk-init names the size and the free space"
check "ftk-init wrote nothing" sh -c "[ ! -e '$WORK/w.h5' ] && [ -z \"\$(ls -A '$WORK' | grep '^\.')\" ]"
expect "ftk-init of a small model still works" 0 "$BIN/ftk-init" -q --preset tiny -o "$WORK/w.h5"
finish
