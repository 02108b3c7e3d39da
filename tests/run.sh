#!/bin/sh
# The whole test suite, as tests/list says: unit tests, CLI golden tests, reference tests
# against independent implementations (SentencePiece, h5py, PyTorch, transformers), fault
# tests, the host emulation of CUDA and NCCL, then the unit and CLI tests again with the
# ASan+UBSan build. Each test exits 0 (pass), 77 (skipped: it prints why) or anything else
# (fail). Ends with the line "N passed, N failed, N skipped".
#
# Usage: sh tests/run.sh        the tests tagged quick (after `make all` and `make SAN=1 all`;
#                               `make test` does both)
#        sh tests/run.sh slow   the slow cases (`make test-slow`): long fault trials and large
#                               inputs that would push `make test` past 15 minutes on 2 cores
#        sh tests/run.sh TAG    every test with TAG (fault, ref, emu, asan, ...; tests/list)
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-/usr/bin/python3}
DATA=${FTK_DATA:-$ROOT/../shared/data}
SET=${1:-all}
WORK=$ROOT/build/test-work
[ "$SET" != all ] && WORK=$ROOT/build/test-work-$SET
rm -rf "$WORK" && mkdir -p "$WORK"
export HDF5_PLUGIN_PATH="$ROOT/build/plugin"
# The tests run on the CPU wherever they do not say --device cuda, also on a GPU machine
# (where ftk-train's default would be cuda)
export FTK_DEVICE=cpu
# memory snapshots (engine/snapshot.h) of the multi-rank tests: in a tmpfs folder of this run,
# as on a node (removed at the end); in the work folder where /dev/shm is not writable
FTK_MEMORY_DIR="$WORK/memory"
[ -d /dev/shm ] && [ -w /dev/shm ] && FTK_MEMORY_DIR=/dev/shm/ftk-tests-$(id -u)-$$
export FTK_MEMORY_DIR
trap 'rm -rf "$FTK_MEMORY_DIR"' EXIT
# no bytecode caches written beside the Python tests and benchmarks in the tree
export PYTHONDONTWRITEBYTECODE=1
pass=0 fail=0 skip=0
failed_names=""

# run NAME COMMAND...: runs one test, output to $WORK/NAME.log, shown on failure; prints
# its wall time, so the suite's budget (15 minutes on 2 cores) can be kept.
run() {
    name=$1
    shift
    log="$WORK/$(echo "$name" | tr / _).log"
    t0=$(date +%s)
    "$@" </dev/null >"$log" 2>&1
    rc=$?
    secs="$(($(date +%s) - t0)) s"
    if [ $rc -eq 0 ]; then
        pass=$((pass + 1))
        echo "PASS $name ($secs)"
    elif [ $rc -eq 77 ]; then
        skip=$((skip + 1))
        echo "SKIP $name ($secs): $(grep -i 'skipped' "$log" | tail -n 1)"
    else
        fail=$((fail + 1))
        failed_names="$failed_names $name"
        echo "FAIL $name (exit $rc, $secs)"
        tail -n 40 "$log" | sed 's/^/    /'
    fi
}

# finish: the summary line; the exit status says whether everything passed.
finish() {
    echo
    [ -n "$failed_names" ] && echo "failed:$failed_names"
    echo "$pass passed, $fail failed, $skip skipped"
    [ $fail -eq 0 ]
}


# What the ASan+UBSan build's runs need (a finding fails the test: exit 86), and for several
# ranks under mpirun: Open MPI's own allocations are not ours to report (tests/lsan-mpi.supp;
# full stacks are needed to match its unloaded plugins).
SAN_ENV="export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86;"
MPI_SAN_ENV="export ASAN_OPTIONS=\$ASAN_OPTIONS:fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=$ROOT/tests/lsan-mpi.supp;"

. "$ROOT/tests/extras.sh"
has_tag() { case ",$1," in *",$2,"*) return 0 ;; esac; return 1; }

# Whether the reference implementations are there; the test-only extras from PyPI (the
# product has no Python): the safetensors reference library, transformers to load our exports
# (and jinja2 for its apply_chat_template), pinned to versions that work with Debian 12's
# torch 1.13, installed into build/pylib once for each pin list (tests/extras.sh).
ref_ready=
REF_PINS="transformers==4.38.2 tokenizers==0.15.2 huggingface_hub==0.21.4 safetensors==0.4.2 \
regex==2023.12.25 tqdm==4.66.2 filelock==3.13.1 packaging==23.2 fsspec==2024.2.0 jinja2==3.1.3 MarkupSafe==2.1.5"
ref_prepare() {
    [ -n "$ref_ready" ] && return
    ref_ready=no
    [ -x "$PY" ] && "$PY" -c 'import sentencepiece, h5py, numpy' 2>/dev/null || return
    ref_ready=yes
    export PYTHONPATH="$ROOT/build/pylib"
    # where the folder is not what REF_PINS says, the system's packages if they have all, else the pins
    if ! extras_kept "$ROOT/build/pylib" $REF_PINS && ! "$PY" -c 'import safetensors, transformers, jinja2' 2>/dev/null
    then
        if "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$ROOT/build/pylib" $REF_PINS \
            >"$WORK/pip.log" 2>&1; then
            extras_done "$ROOT/build/pylib" $REF_PINS
        else
            echo "note: pip install of the test extras failed (see $WORK/pip.log)"
        fi
    fi
}

# one TAGS NAME COMMAND: runs a line of tests/list (or skips it, saying why)
one() {
    tags=$1 name=$2 cmd=$3
    BIN=$ROOT/bin TESTS=$ROOT/build/tests
    if has_tag "$tags" asan; then
        if [ ! -d build/asan/bin ]; then
            run "$name" sh -c 'echo "FAIL: build/asan missing: run make SAN=1 all"; exit 1'
            return
        fi
        BIN=$ROOT/build/asan/bin TESTS=$ROOT/build/asan/tests
    fi
    if has_tag "$tags" cuda || has_tag "$tags" gpu; then
        if [ ! -x build/tests/gpu_smoke ]; then
            run "$name" sh -c 'echo "skipped (CUDA toolkit not found at build time)"; exit 77'
            return
        fi
        if has_tag "$tags" gpu && ! build/tests/gpu_smoke >/dev/null 2>&1; then
            run "$name" sh -c 'echo "skipped (no GPU)"; exit 77'
            return
        fi
    fi
    if has_tag "$tags" ref; then
        ref_prepare
        if [ "$ref_ready" != yes ]; then
            run "$name" sh -c "echo 'skipped ($PY lacks sentencepiece/h5py/numpy: run scripts/install-deps.sh)'; exit 77"
            return
        fi
    fi
    prefix=${name%\*}
    case $name in
    */\*)
        for T in "$TESTS"/test_*; do
            [ -x "$T" ] && one_run "$tags" "$prefix$(basename "$T")" "$cmd"
        done ;;
    *) one_run "$tags" "$name" "$cmd" ;;
    esac
}
one_run() {
    env_=""
    has_tag "$1" asan && env_=$SAN_ENV
    has_tag "$1" mpi && env_="$env_ $MPI_SAN_ENV"
    run "$2" sh -c "$env_ ROOT='$ROOT' WORK='$WORK' DATA='$DATA' PY='$PY' BIN='$BIN' TESTS='$TESTS' T='$T'; $3"
}

T=
while read -r tags name cmd; do
    case $tags in '' | '#'*) continue ;; esac
    case $SET in
    all) has_tag "$tags" quick || continue ;;
    *) has_tag "$tags" "$SET" || continue ;;
    esac
    one "$tags" "$name" "$cmd"
done <"${FTK_TEST_LIST:-tests/list}"
finish
