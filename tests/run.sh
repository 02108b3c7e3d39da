#!/bin/sh
# The whole test suite: unit tests, CLI golden tests, reference tests against independent
# implementations (SentencePiece, h5py), fault tests, then the unit and CLI tests again
# with the ASan+UBSan build. Each test exits 0 (pass), 77 (skipped: it prints why) or
# anything else (fail). Ends with the line "N passed, N failed, N skipped".
#
# Usage: sh tests/run.sh        (after `make all` and `make SAN=1 all`; `make test` does both)
#        sh tests/run.sh slow   the slow cases only (`make test-slow`): long fault trials and
#                               large inputs that would push `make test` past 15 minutes on 2 cores
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-/usr/bin/python3}
DATA=${FTK_DATA:-$ROOT/../shared/data}
SET=${1:-all}
WORK=$ROOT/build/test-work
[ "$SET" = slow ] && WORK=$ROOT/build/test-work-slow
rm -rf "$WORK" && mkdir -p "$WORK"
export HDF5_PLUGIN_PATH="$ROOT/build/plugin"
# The tests run on the CPU wherever they do not say --device cuda, also on a GPU machine
# (where ftk-train's default would be cuda)
export FTK_DEVICE=cpu
pass=0 fail=0 skip=0
failed_names=""

# run NAME COMMAND...: runs one test, output to $WORK/NAME.log, shown on failure; prints
# its wall time, so the suite's budget (15 minutes on 2 cores) can be kept.
run() {
    name=$1
    shift
    log="$WORK/$(echo "$name" | tr / _).log"
    t0=$(date +%s)
    "$@" >"$log" 2>&1
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

# sanitizer_env: what the ASan+UBSan build's runs need (a finding fails the test: exit 86).
sanitizer_env() {
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86
}

# The slow set: the same kinds of test at full size (make test runs smaller counts).
if [ "$SET" = slow ]; then
    run slow/shards-memory-3GB sh tests/slow/shards_memory.sh "$ROOT/bin" "$WORK/shards-memory" 3
    run fault/async-save-kill-24 sh tests/fault/async_kill.sh "$ROOT/bin" "$WORK/async-kill" 24
    run fault/pack-multi-gb sh tests/fault/pack_big.sh "$ROOT/bin" "$WORK/pack-big"
    run cli/dist-12-kills sh tests/cli/dist.sh "$ROOT/bin" "$WORK/dist" 12
    # SIGTERM to mpirun under a long odls_base_sigkill_timeout too (10 s of waiting)
    run cli/preemption-signals-all sh tests/cli/preempt.sh "$ROOT/bin" "$WORK/preempt" slow
    # every strategy and precision on the CPU's fused ops (adamw_multi over sharded slices)
    run cli/dist-fused env FTK_FUSED=all sh tests/cli/dist.sh "$ROOT/bin" "$WORK/dist-fused" 2
    # the CUDA backend emulated on the host (tests/gpu/emu): the fp32 training step too, and
    # gpu/ops-vs-cpu-fp32's settings (exact products, simple attention, one element a thread)
    run gpu/ops-emulated-all-steps env FTK_GPU_OPS_QUICK=1 build/tests/gpu_ops_emu
    run gpu/ops-emulated-fp32 env FTK_GPU_OPS_QUICK=1 FTK_CUDA_MATMUL=fp32 FTK_CUDA_ATTN=simple FTK_FUSED=none \
        FTK_CUDA_VEC=0 build/tests/gpu_ops_emu
    # ftk-train and ftk-generate on it: the demo's GPU-against-CPU runs and resumes, smaller
    run gpu/demo-emulated sh tests/gpu/demo_vs_cpu.sh "$ROOT/build/tests/emu/bin" "$WORK/demo-emu" emulated
    # and over the emulated NCCL: every strategy, a resume, hybrid on 4 ranks (nccl_vs_mpi.sh)
    run gpu/nccl-emulated-all sh tests/gpu/nccl_vs_mpi.sh "$ROOT/build/tests/emu/bin" "$WORK/nccl-emu" emulated
    # The multi-rank CLI tests under the sanitizers (make test runs the fault tests, the
    # plans and the communication contract under them; these two take 3 minutes)
    sanitizer_env
    run asan/cli-dist env ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-mpi.supp" sh tests/cli/dist.sh "$ROOT/build/asan/bin" \
        "$WORK/asan-dist" 0
    run asan/cli-checkpoint-tools env ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-mpi.supp" sh tests/cli/ckpt.sh "$ROOT/build/asan/bin" \
        "$WORK/asan-ckpt"
    finish
    exit
fi

# Unit tests (C).
for t in build/tests/test_*; do
    [ -x "$t" ] && run "unit/$(basename "$t")" "$t" "$ROOT"
done
# the trainer (shard engine, optimizer, resume) on the CPU's fused ops, adamw_multi included
run unit/trainer-fused env FTK_FUSED=all build/tests/test_trainer "$ROOT"
# The CUDA backend's sources emulated on the host (tests/gpu/emu; no GPU needed): gpu_ops
# against the CPU backend, the bf16 training steps (make test-slow adds fp32's), and
# flash_mma.cuh's attention kernels on cases of their own
run gpu/ops-emulated env FTK_GPU_OPS_QUICK=1 FTK_GPU_OPS_STEPS=bf16-mixed,bf16-true build/tests/gpu_ops_emu
run gpu/flash-emu build/tests/flash_emu
# gpu_opbench's harness at small shapes on the emulation: every row, each time positive and
# finite (the figures themselves mean nothing there)
run gpu/opbench-emulated sh -c 'build/tests/gpu_opbench_emu >"$1" || exit 1; cat "$1"
    grep -Eiq "nan|inf|-[0-9]" "$1" && { echo "a figure that is not positive and finite"; exit 1; }
    [ "$(grep -Ec " [0-9]+\.[0-9]+ ms " "$1")" -ge 60 ] || { echo "fewer rows than expected"; exit 1; }' \
    opbench "$WORK/opbench-emu.txt"
# the host's waits for the device in a training step (counted by the emulation): none in the
# micro-batch loop, 3 a step
run gpu/host-waits-emulated sh tests/gpu/host_waits.sh "$ROOT/build/tests/emu/bin" "$WORK/host-waits"
# NCCL emulated too (tests/gpu/emu/emu_nccl.c): comm.h's contract on 2 and 4 ranks, the
# duplicate-GPU refusal, a failed collective's report, and 2-rank grad-op training over NCCL
# against the MPI run (make test-slow: every strategy, resume, hybrid on 4 ranks)
run gpu/nccl-emulated sh tests/gpu/nccl_vs_mpi.sh "$ROOT/build/tests/emu/bin" "$WORK/nccl-emu" emulated quick
if [ -x build/tests/gpu_smoke ]; then
    run gpu/smoke build/tests/gpu_smoke
    # every CUDA op and a whole training step against the CPU backend: bf16 matrix products
    # (the default), then exact fp32 ones for tight bounds, with the model's unfused path
    # (FTK_FUSED=none; the first run has every fused op, the CUDA default)
    if build/tests/gpu_smoke >/dev/null 2>&1; then
        run gpu/ops-vs-cpu build/tests/gpu_ops
        run gpu/ops-vs-cpu-fp32 env FTK_CUDA_MATMUL=fp32 FTK_CUDA_ATTN=simple FTK_FUSED=none FTK_CUDA_VEC=0 build/tests/gpu_ops
        if command -v compute-sanitizer >/dev/null; then
            run gpu/ops-compute-sanitizer compute-sanitizer --error-exitcode 1 --report-api-errors no \
                build/tests/gpu_ops
        fi
    fi
else
    run gpu/smoke sh -c 'echo "skipped (CUDA toolkit not found at build time)"; exit 77'
fi

# CLI tests: --help of every tool, golden outputs, the corpus of bad inputs, verify faults.
run cli/release sh tests/cli/run.sh "$ROOT/bin" "$WORK/cli" "$DATA"
run cli/weights sh tests/cli/weights.sh "$ROOT/bin" "$WORK/weights"
run cli/train sh tests/cli/train.sh "$ROOT/bin" "$WORK/train" "$DATA"
run cli/shards sh tests/cli/shards.sh "$ROOT/bin" "$WORK/shards" "$DATA"
run cli/dist sh tests/cli/dist.sh "$ROOT/bin" "$WORK/dist" 2
run cli/comm sh tests/cli/comm.sh "$ROOT/build/tests/test_comm" "$WORK/comm"
# the communication and time report on 4 and 8 MPI ranks in simulated nodes (FTK_SIM_NODE_RANKS)
run cli/comm-report sh tests/cli/comm_report.sh "$ROOT/bin" "$WORK/comm-report"
run cli/plan sh tests/cli/plan.sh "$ROOT/bin" "$WORK/plan"
run cli/checkpoint-tools sh tests/cli/ckpt.sh "$ROOT/bin" "$WORK/ckpt"
run cli/generation-eos sh tests/cli/eos.sh "$ROOT/bin" "$WORK/eos"
run cli/metrics-plot-tensorboard sh tests/cli/metrics.sh "$ROOT/bin" "$WORK/metrics"
run cli/preemption-signals sh tests/cli/preempt.sh "$ROOT/bin" "$WORK/preempt"
run cli/config-and-kept-options sh tests/cli/config.sh "$ROOT/bin" "$WORK/config"
run cli/tokenizer-carried sh tests/cli/tokenizer.sh "$ROOT/bin" "$WORK/tokenizer" "$DATA"
run cli/ux sh tests/cli/ux.sh "$ROOT/bin" "$WORK/ux"
run fault/kill-during-pack sh tests/cli/fault.sh "$ROOT/bin" "$WORK/fault"
run fault/kill-during-weights-export-import sh tests/cli/fault-weights.sh "$ROOT/bin" "$WORK/fault-weights"
run fault/forged-files sh tests/fault/forged.sh "$ROOT/bin" "$WORK/forged"
run fault/one-writer-per-run sh tests/fault/lock.sh "$ROOT/bin" "$WORK/lock"
run fault/full-disk sh tests/fault/disk.sh "$ROOT/bin" "$WORK/disk" "$DATA"
run fault/messages-and-leftovers sh tests/fault/messages.sh "$ROOT/bin" "$WORK/messages"
run fault/async-save-kill sh tests/fault/async_kill.sh "$ROOT/bin" "$WORK/async-kill" 2
run fault/stopped-rank sh tests/fault/hang.sh "$ROOT/bin" "$WORK/hang"
run fault/unbounded-input sh tests/fault/unbounded.sh "$ROOT/bin" "$WORK/unbounded"
run fuzz/safetensors-header-10s sh tests/fuzz/run.sh 10 "$ROOT/build/fuzz"

# Reference tests against independent implementations.
if [ -x "$PY" ] && "$PY" -c 'import sentencepiece, h5py, numpy' 2>/dev/null; then
    run ref/tokenizer-vs-sentencepiece "$PY" tests/ref/tokenizer_vs_sentencepiece.py bin "$DATA" "$WORK/tok"
    run ref/tokenizer-edge-bytes "$PY" tests/ref/tokenizer_bytes.py bin "$ROOT/examples/demo/tokenizer.model" "$DATA"
    run ref/pack-vs-python "$PY" tests/ref/pack_vs_python.py bin "$ROOT" "$DATA" "$WORK/pack"
    run ref/h5py-reads-ftk-files "$PY" tests/ref/h5py_reads.py bin "$ROOT" "$WORK/h5py"
    # Test-only extras from PyPI (the product has no Python): the safetensors reference
    # library, transformers to load our exports (and jinja2 for its apply_chat_template). Pinned to versions that work with
    # Debian 12's torch 1.13; installed once into build/pylib.
    export PYTHONPATH="$ROOT/build/pylib"
    if ! "$PY" -c 'import safetensors, transformers, jinja2' 2>/dev/null; then
        "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$ROOT/build/pylib" \
            transformers==4.38.2 tokenizers==0.15.2 huggingface_hub==0.21.4 safetensors==0.4.2 \
            regex==2023.12.25 tqdm==4.66.2 filelock==3.13.1 packaging==23.2 fsspec==2024.2.0 \
            jinja2==3.1.3 MarkupSafe==2.1.5 \
            >"$WORK/pip.log" 2>&1 || echo "note: pip install of the test extras failed (see $WORK/pip.log)"
    fi
    run ref/weights-vs-safetensors-torch "$PY" tests/ref/weights_vs_reference.py bin "$DATA" "$WORK/weights-ref"
    run ref/transformers-loads-exports "$PY" tests/ref/transformers_loads.py bin "$DATA" "$WORK/transformers"
    run ref/tokenizer-end-to-end "$PY" tests/ref/tokenizer_end_to_end.py bin "$DATA" "$WORK/tokenizer-e2e"
    run ref/chat-template-vs-transformers "$PY" tests/ref/chat_template_vs_transformers.py bin "$DATA" "$WORK/chat-ref"
    run ref/model-vs-torch "$PY" tests/ref/model_vs_torch.py bin build/tests/probe_model "$DATA" "$WORK/model-ref"
    run ref/precision-vs-torch "$PY" tests/ref/precision_vs_torch.py bin build/tests/probe_model "$DATA" \
        "$WORK/precision-ref"
    run ref/dist-equivalence "$PY" tests/ref/dist_equivalence.py bin "$ROOT" "$WORK/dist-eq"
else
    for n in dist-equivalence precision-vs-torch model-vs-torch weights-vs-safetensors-torch transformers-loads-exports tokenizer-end-to-end chat-template-vs-transformers tokenizer-vs-sentencepiece tokenizer-edge-bytes pack-vs-python h5py-reads-ftk-files; do
        run "ref/$n" sh -c "echo 'skipped ($PY lacks sentencepiece/h5py/numpy: run scripts/install-deps.sh)'; exit 77"
    done
fi

# The same unit and CLI tests under AddressSanitizer + UndefinedBehaviorSanitizer.
if [ -d build/asan/bin ]; then
    sanitizer_env
    for t in build/asan/tests/test_*; do
        [ -x "$t" ] && run "asan/unit/$(basename "$t")" "$t" "$ROOT"
    done
    run asan/cli sh tests/cli/run.sh "$ROOT/build/asan/bin" "$WORK/asan-cli" "$DATA"
    run asan/cli-weights sh tests/cli/weights.sh "$ROOT/build/asan/bin" "$WORK/asan-weights"
    run asan/cli-train sh tests/cli/train.sh "$ROOT/build/asan/bin" "$WORK/asan-train" "$DATA" quick
    run asan/cli-shards sh tests/cli/shards.sh "$ROOT/build/asan/bin" "$WORK/asan-shards" "$DATA" quick
    run asan/cli-generation-eos sh tests/cli/eos.sh "$ROOT/build/asan/bin" "$WORK/asan-eos"
    run asan/cli-config-and-kept-options sh tests/cli/config.sh "$ROOT/build/asan/bin" "$WORK/asan-config"
    run asan/cli-ux sh tests/cli/ux.sh "$ROOT/build/asan/bin" "$WORK/asan-ux"
    run asan/fault-forged-files sh tests/fault/forged.sh "$ROOT/build/asan/bin" "$WORK/asan-forged"
    run asan/fault-one-writer-per-run sh tests/fault/lock.sh "$ROOT/build/asan/bin" "$WORK/asan-lock"
    run asan/fault-full-disk sh tests/fault/disk.sh "$ROOT/build/asan/bin" "$WORK/asan-disk" "$DATA"
    run asan/fault-messages-and-leftovers sh tests/fault/messages.sh "$ROOT/build/asan/bin" "$WORK/asan-messages"
    run asan/fault-unbounded-input sh tests/fault/unbounded.sh "$ROOT/build/asan/bin" "$WORK/asan-unbounded"
    # Several ranks under mpirun: Open MPI's own allocations are not ours to report
    # (tests/lsan-mpi.supp; full stacks are needed to match its unloaded plugins).
    run asan/cli-comm env ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-mpi.supp" sh tests/cli/comm.sh "$ROOT/build/asan/tests/test_comm" \
        "$WORK/asan-comm" 4
    run asan/cli-plan env ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-mpi.supp" sh tests/cli/plan.sh "$ROOT/build/asan/bin" \
        "$WORK/asan-plan" quick
    run asan/fault-async-save env ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$ROOT/tests/lsan-mpi.supp" sh tests/fault/async_kill.sh "$ROOT/build/asan/bin" \
        "$WORK/asan-async-kill" quick
else
    run asan/build sh -c 'echo "FAIL: build/asan missing: run make SAN=1 all"; exit 1'
fi

finish
