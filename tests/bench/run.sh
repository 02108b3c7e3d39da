#!/bin/sh
# make bench: every benchmark prints a ratio against a peer measured in the same run.
set -eu
cd "$(dirname "$0")/../.."
/usr/bin/python3 tests/bench/tokenize_bench.py "$(pwd)" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench
sh tests/bench/weights_bench.sh
/usr/bin/python3 tests/bench/train_bench.py "$(pwd)/bin" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench/train 6
sh tests/bench/reshard_bench.sh
