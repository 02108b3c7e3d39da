#!/bin/sh
# Messages and leftovers: a 3-D tensor where a matrix belongs, a hidden
# size that the heads do not divide and a vocabulary of 2^31 (weights that cannot be
# allocated) get a message naming the file and what is wrong (not
# "unknown error", not an empty one, not the zstd filter), with exit 2 and nothing written;
# a failed ftk-train leaves no run directory it made (but keeps one it was given);
# ftk-export-hf --force does not replace a regular file with a directory; SIGTERM and SIGINT
# to ftk-reshard leave neither its temporary checkpoint nor the run directory it made
# (those two cases stop it at a breakpoint with gdb: skipped without gdb); a malformed
# FTK_FAULT spec is reported whole and ignored; ftk-train stopped before its first step
# leaves no run directory, and one with stderr a closed pipe goes on.
# Usage: tests/fault/messages.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
TOK=$ROOT/examples/demo/tokenizer.model
demo_pack "$WORK/d.h5" 128 2>/dev/null || exit 1
demo_init "$WORK/w.h5" tiny 1 || exit 1
"$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/hf" || exit 1
T="$BIN/ftk-train -q -d $WORK/d.h5 --global-batch 4 --micro-batch 2 --eval-every 0 -j 1"

# says NAME PATTERN: the last command's stderr matches PATTERN (grep -E) and has no
# "unknown error", no empty message and nothing about zstd
says() {
    if grep -Eq "$2" "$WORK/err" && ! grep -Eq 'unknown error|error: *$|zstd' "$WORK/err"; then ok "$1"; else
        notok "$1"
        sed 's/^/     | /' "$WORK/err" | head -n 5
    fi
}
nothing() { check "$1: nothing written" test ! -e "$2"; }

have_h5py=0
"$PY" -c 'import h5py, numpy' 2>/dev/null && have_h5py=1

# a 3-D tensor where a matrix belongs: in a weights file (h5py) ...
Q=model.layers.0.self_attn.q_proj.weight
if [ $have_h5py = 1 ]; then
    cp "$WORK/w.h5" "$WORK/w3.h5"
    "$PY" "$ROOT/tests/fault/forge.py" "$WORK/w3.h5" "/tensors/$Q" reshape:2,16,32 >/dev/null || exit 1
    pat="w3.h5: tensor $Q has shape \[2, 16, 32\]; the file's /config needs \[32, 32\]"
    expect "3-D $Q: ftk-export-hf exit 2" 2 "$BIN/ftk-export-hf" -q "$WORK/w3.h5" -o "$WORK/x3"
    says "... names the file, the tensor and both shapes" "$pat"
    nothing ftk-export-hf "$WORK/x3"
    expect "3-D $Q: ftk-generate exit 2" 2 "$BIN/ftk-generate" -m "$WORK/w3.h5" --max-new 2
    says "... names the file, the tensor and both shapes" "$pat"
    expect "3-D $Q: ftk-train exit 2" 2 $T -m "$WORK/w3.h5" --steps 1 -o "$WORK/r3"
    says "... names the file, the tensor and both shapes" "$pat"
    nothing ftk-train "$WORK/r3"
    expect "3-D $Q: ftk-verify exit 3" 3 "$BIN/ftk-verify" "$WORK/w3.h5"
    says "... names the file and the tensor" "w3.h5: tensor $Q: shape does not match the config"

    # a hidden size the heads do not divide, in a weights file's /config
    for v in 33; do
        cp "$WORK/w.h5" "$WORK/wh.h5"
        "$PY" -c "import h5py, numpy; h5py.File('$WORK/wh.h5', 'r+')['config'].attrs['hidden_size'] = numpy.int64($v)"
        pat="wh.h5: /config: hidden_size $v is not a multiple of num_attention_heads 4"
        expect "/config hidden_size $v: ftk-export-hf exit 2" 2 "$BIN/ftk-export-hf" -q "$WORK/wh.h5" -o "$WORK/xh"
        says "... names the file and the sizes" "$pat"
        nothing ftk-export-hf "$WORK/xh"
        expect "/config hidden_size $v: ftk-train exit 2" 2 $T -m "$WORK/wh.h5" --steps 1 -o "$WORK/rh"
        says "... names the file and the sizes" "$pat"
        nothing ftk-train "$WORK/rh"
    done

    # a vocabulary of 2^31: the embedding and head are chunked datasets never written (a
    # 255 KB file); the 256 GiB of weights cannot be allocated (ASan: return NULL, as malloc)
    cp "$WORK/w.h5" "$WORK/bv.h5"
    "$PY" - "$WORK/bv.h5" <<'EOF2' || exit 1
import sys, h5py, numpy as np
V = 2**31
with h5py.File(sys.argv[1], "r+") as f:
    f["config"].attrs["vocab_size"] = np.int64(V)
    for n in ("model.embed_tokens.weight", "lm_head.weight"):
        d = f["tensors"][n]
        attrs, dt, c = dict(d.attrs), d.dtype, d.shape[1]
        del f["tensors"][n]
        x = f["tensors"].create_dataset(n, shape=(V, c), dtype=dt, chunks=(1024, c))
        for k, v in attrs.items():
            x.attrs[k] = v
EOF2
    A="env ASAN_OPTIONS=${ASAN_OPTIONS:-}:allocator_may_return_null=1"
    expect "vocabulary 2^31: ftk-train exit 2" 2 $A $T -m "$WORK/bv.h5" --steps 1 -o "$WORK/rbv"
    says "... names the file and the size" "bv.h5: out of memory on cpu allocating weights \(274877906944 bytes"
    nothing ftk-train "$WORK/rbv"
    expect "vocabulary 2^31: ftk-generate exit 1" 1 $A "$BIN/ftk-generate" -m "$WORK/bv.h5" --max-new 2
    says "... names the file and the size" "bv.h5: out of memory on cpu allocating weights \(274877906944 bytes"
else
    ok "skipped the h5py-made cases ($PY lacks h5py)"
fi

# ... and in safetensors (written here: 8 bytes of header length, a JSON header, the data)
mkdir -p "$WORK/hf3"
cp "$WORK/hf/config.json" "$WORK/hf/tokenizer.model" "$WORK/hf3/"
"$PY" - "$WORK/hf/model.safetensors" "$WORK/hf3/model.safetensors" "$Q" <<'EOF' || exit 1
import json, struct, sys
src, dst, q = sys.argv[1:4]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h[q]["shape"] = [2, 16, 32]
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
EOF
expect "3-D $Q in model.safetensors: ftk-import-hf exit 2" 2 "$BIN/ftk-import-hf" -q "$WORK/hf3" -o "$WORK/i3.h5"
says "... names the file, the tensor and both shapes" "hf3/model.safetensors: tensor \"$Q\" has shape \[2, 16, 32\], config.json implies \[32, 32\]"
nothing ftk-import-hf "$WORK/i3.h5"

# a hidden size the heads do not divide, in config.json (uncompressed and with zstd)
mkdir -p "$WORK/hfh"
cp "$WORK/hf/model.safetensors" "$WORK/hf/tokenizer.model" "$WORK/hfh/"
sed 's/"hidden_size": 32/"hidden_size": 30/; /"head_dim"/d' "$WORK/hf/config.json" >"$WORK/hfh/config.json"
for c in none zstd; do
    expect "config.json hidden_size 30: ftk-init --compress $c exit 2" 2 "$BIN/ftk-init" -q -c "$WORK/hfh/config.json" \
        -t "$TOK" --compress $c -o "$WORK/ih.h5"
    says "... names the file and the sizes" "hfh/config.json: hidden_size 30 is not a multiple of num_attention_heads 4"
    nothing ftk-init "$WORK/ih.h5"
done
expect "config.json hidden_size 30: ftk-import-hf exit 2" 2 "$BIN/ftk-import-hf" -q "$WORK/hfh" -o "$WORK/ih.h5"
says "... names the file and the sizes" "hfh/config.json: hidden_size 30 is not a multiple of num_attention_heads 4"
nothing ftk-import-hf "$WORK/ih.h5"

# ftk-train: a failure removes the run directory it made, not one it was given
expect "ftk-train, a non-finite loss at step 3: exit 1" 1 $T -m "$WORK/w.h5" --steps 5 --lr 1e30 --warmup 0 \
    -o "$WORK/rn"
says "... says so" "step 3: the loss is -?nan"
check "... and removes the run directory it made" test ! -e "$WORK/rn"
mkdir "$WORK/given"
expect "the same in a directory it was given: exit 1" 1 $T -m "$WORK/w.h5" --steps 5 --lr 1e30 --warmup 0 \
    -o "$WORK/given"
check "... which stays" test -d "$WORK/given"
expect "ftk-train, a missing data file: exit 2" 2 $T -m "$WORK/w.h5" -d "$WORK/none.h5" --steps 1 -o "$WORK/rd"
nothing ftk-train "$WORK/rd"

# FTK_FAULT: a malformed spec is reported as written and ignored, never read as another one
# (an empty or out-of-range rank is not rank 0; a second action does not replace the first)
I="$BIN/ftk-init -q --preset tiny --seed 1 -t $TOK"
specs="atomic.begin@:exit,atomic.begin@4294967296:exit,atomic.begin@ 0:exit,atomic.begin:exit:kill"
expect "FTK_FAULT='$specs': every spec ignored, ftk-init exit 0" 0 env FTK_FAULT="$specs" $I -o "$WORK/f.h5"
check "... each reported in full" sh -c "$(echo "$specs" | tr ',' '\n' | while read -r spec; do
    printf "grep -qF \"FTK_FAULT: cannot read '%s': \" '%s' && " "$spec" "$WORK/err"; done) true"
expect "FTK_FAULT='atomic.begin@0:exit' (a process alone is rank 0): it fires, exit 1" 1 env \
    FTK_FAULT='atomic.begin@0:exit' $I -o "$WORK/f2.h5"

# ftk-train stopped before its first step, or with stderr a closed pipe (tests/cli/preempt.sh
# has the cases; here under the sanitizers too)
expect "ftk-train, SIGUSR1 before its handlers exist: exit 75" 75 env FTK_FAULT=train.start:sig=USR1 \
    $T -m "$WORK/w.h5" --steps 5 -o "$WORK/rs1"
nothing ftk-train "$WORK/rs1"
expect "ftk-train, stderr a closed pipe, SIGHUP after step 2: exit 75" 75 closed_pipe env \
    FTK_FAULT=train.step-end:2:sig=HUP $(echo "$T" | sed 's/ -q / /') -m "$WORK/w.h5" --steps 5 -o "$WORK/rs2"
check "... a checkpoint at step 3, and the metrics say that stderr failed" sh -c "
    [ \"\$(cat '$WORK/rs2/latest')\" = step-00000003 ] && grep -q '\"kind\": \"warning\"' '$WORK/rs2/metrics.jsonl'"

# ftk-export-hf --force replaces only a directory
echo "a file" >"$WORK/file"
expect "ftk-export-hf -o FILE --force: exit 2" 2 "$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/file" --force
says "... says it is not a directory" "file: exists and is not a directory"
check "... and the file is untouched" grep -qx "a file" "$WORK/file"
ln -s "$WORK/hf" "$WORK/link"
expect "ftk-export-hf -o LINK --force: exit 2" 2 "$BIN/ftk-export-hf" -q "$WORK/w.h5" -o "$WORK/link" --force
check "... the link and its directory stay" test -L "$WORK/link" -a -f "$WORK/hf/model.safetensors"
expect "ftk-export-hf -o DIR --force over an earlier export: exit 0" 0 "$BIN/ftk-export-hf" -q "$WORK/w.h5" \
    -o "$WORK/hf" --force

# a signal to ftk-reshard while it writes (stopped where its shards are written)
if command -v gdb >/dev/null; then
    $T -m "$WORK/w.h5" --steps 2 -o "$WORK/run" || exit 1
    for sig in SIGTERM SIGINT; do
        gdb -q -batch -ex 'handle SIGTERM SIGINT nostop noprint pass' -ex 'break ckpt_shard_finish_many' -ex run -ex "signal $sig" \
            --args "$BIN/ftk-reshard" -q "$WORK/run" -o "$WORK/rs/step-00000002" --ranks 2 >"$WORK/gdb.out" 2>&1
        if grep -q "terminated with signal $sig" "$WORK/gdb.out"; then
            ok "ftk-reshard: $sig while writing its shards ends it"
        else
            notok "ftk-reshard: $sig while writing its shards ends it"
            tail -n 5 "$WORK/gdb.out" | sed 's/^/     | /'
        fi
        check "... and leaves no temporary checkpoint and no run directory" test ! -e "$WORK/rs"
    done
    mkdir "$WORK/rs"
    gdb -q -batch -ex 'handle SIGTERM SIGINT nostop noprint pass' -ex 'break ckpt_shard_finish_many' -ex run -ex "signal SIGTERM" \
        --args "$BIN/ftk-reshard" -q "$WORK/run" -o "$WORK/rs/step-00000002" --ranks 2 >"$WORK/gdb.out" 2>&1
    check "SIGTERM, in a run directory it was given: the directory stays, holding only its lock file" \
        test -d "$WORK/rs" -a -z "$(ls -A "$WORK/rs" | grep -vx '\.lock')"
else
    ok "skipped the signal cases (no gdb to stop ftk-reshard where it writes)"
fi
finish
