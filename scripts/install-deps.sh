#!/bin/sh
# Installs the Debian packages ftk needs to build, test and run its demo.
# Idempotent: asks apt only for what dpkg says is missing, so a second run is a no-op.
# Usage: scripts/install-deps.sh [build|test]   (test = build + the reference-test packages)
set -eu
what=${1:-test}

# OpenBLAS (its OpenMP build, to share threads with ours) does the CPU backend's matrix products.
pkgs="build-essential pkg-config libhdf5-dev hdf5-tools libzstd-dev libxxhash-dev zstd libopenblas-openmp-dev"
# libyaml reads ftk-train --config files.
pkgs="$pkgs libyaml-dev"
# MPI is for ftk-train (a later stage); installed now so that every machine has the same base.
pkgs="$pkgs libopenmpi-dev openmpi-bin"
if [ "$what" = test ]; then
    # Independent references for the tests, from Debian (run with /usr/bin/python3).
    pkgs="$pkgs python3 python3-numpy python3-h5py python3-sentencepiece python3-torch python3-pip"
    # clang's libFuzzer for the safetensors header fuzz run (tests/fuzz/run.sh).
    pkgs="$pkgs clang libclang-rt-dev"
    # gdb stops ftk-reshard at a breakpoint, so the signal-cleanup test hits a write under way.
    pkgs="$pkgs gdb"
fi

missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install-deps: error: missing packages:$missing (run as root or install them)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
