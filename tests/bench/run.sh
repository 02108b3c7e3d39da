#!/bin/sh
# make bench: every benchmark prints a ratio against a peer measured in the same run.
set -eu
cd "$(dirname "$0")/../.."
# the CPU benchmarks stay on the CPU on a GPU machine (gpu_bench.py says --device itself)
export FTK_DEVICE=cpu
/usr/bin/python3 tests/bench/tokenize_bench.py "$(pwd)" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench
sh tests/bench/pack_bench.sh "$(pwd)/bin" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench/pack
sh tests/bench/weights_bench.sh
# ftk-train's load of a 2.2 GB bf16 file against cat of it, page cache warm and cold
sh tests/bench/weights_load.sh "${FTK_DATA:-$(pwd)/../shared/data}"
/usr/bin/python3 tests/bench/train_bench.py "$(pwd)/bin" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench/train 6
sh tests/bench/reshard_bench.sh
# the step's HDF5 read beside a background checkpoint write: ftk's 4 MiB pieces against one
# H5Dwrite per array (1.6 GB of disk, briefly)
build/tests/h5_wait build/bench
# --async-save against synchronous saves: the 1.1 B shape in bf16-true (minutes; needs ~17 GB of
# memory and ~18 GB of disk, else it says skipped)
/usr/bin/python3 tests/bench/async_save_bench.py "$(pwd)/bin" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench/async-save
# memory snapshots against the disk checkpoint of the same state: relaunch after kill -9,
# steps lost, the per-step cost of a snapshot every step (4 ranks in 2 simulated nodes)
sh tests/bench/memsnap.sh
# One GPU: each CUDA op against a device-to-device copy (tests/gpu/gpu_opbench.c), then
# ftk-train --device cuda against PyTorch + transformers on the same GPU
# (tests/bench/gpu_bench.py; the device machine's python3 has torch and transformers).
if [ -x build/tests/gpu_smoke ] && build/tests/gpu_smoke >/dev/null 2>&1; then
    build/tests/gpu_opbench
    ${GPU_PYTHON:-python3} tests/bench/gpu_bench.py "$(pwd)/bin" "${FTK_DATA:-$(pwd)/../shared/data}" build/bench/gpu
else
    echo "gpu bench: skipped (no GPU)"
fi
