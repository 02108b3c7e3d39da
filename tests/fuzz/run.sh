#!/bin/sh
# Builds the libFuzzer harness (clang, -fsanitize=fuzzer,address,undefined) and runs it for
# SECONDS seconds, seeded with the malformed corpus and valid files, and with what earlier
# runs into the same OUT_DIR found (its corpus/: make fuzz keeps build/fuzz between runs;
# make test gives a fresh folder, so that its verdict depends on the tree alone). Exit 77
# when clang's libFuzzer is not installed (scripts/install-deps.sh test installs it).
# Usage: tests/fuzz/run.sh SECONDS [OUT_DIR]
set -u
cd "$(dirname "$0")/../.."
secs=${1:-20}
out=${2:-build/fuzz}
CLANG=${CLANG:-$(command -v clang || command -v clang-16 || command -v clang-14 || true)}
if [ -z "$CLANG" ]; then
    echo "skipped (clang not found: run scripts/install-deps.sh test)"
    exit 77
fi
mkdir -p "$out/corpus" "$out/seeds"
HDF5_CFLAGS=$(pkg-config --cflags hdf5 2>/dev/null)
src="tests/fuzz/fuzz_safetensors.c formats/safetensors.c formats/json.c libcommon/dtype.c libcommon/log.c libcommon/buf.c libcommon/hash.c"
# shellcheck disable=SC2086
if ! "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE \
    $HDF5_CFLAGS $src -lxxhash -o "$out/fuzz_safetensors" 2>"$out/build.log"; then
    if grep -q "fuzzer" "$out/build.log"; then
        cat "$out/build.log"
        echo "skipped (clang has no libFuzzer runtime: install libclang-rt-dev)"
        exit 77
    fi
    cat "$out/build.log"
    exit 1
fi
cp tests/corpus/safetensors-bad/*.safetensors tests/corpus/config-bad/model.safetensors "$out/seeds/"
[ -f ../shared/data/tiny-random-llama/model.safetensors ] && head -c 65536 ../shared/data/tiny-random-llama/model.safetensors >"$out/seeds/tiny-head"
# a crash's input is written into OUT_DIR (libFuzzer's default is the current folder: the tree)
"$out/fuzz_safetensors" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus" "$out/seeds"
