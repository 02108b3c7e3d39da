#!/bin/sh
# run.sh OUTDIR [BUDGET_S]: every GPU check and benchmark of ftk from the GPU bundle (`make
# gpu-bundle` writes it: scripts/gpu-bundle.sh; docs/gpu.md, "The GPU bundle"), on a machine
# with a GPU and CUDA's driver, and none of ftk's other dependencies. Sent as gpu/ (this
# script, BUILD_INFO, payload.tar.gz), it unpacks the payload into FTK_BUNDLE_WORK/bundle and
# goes on from the run.sh there. One clock for the whole run (BUDGET_S, default 560 s), the
# steps in order of value, the headline first (the table below, STEP_TABLE, gives each its
# limit; docs/gpu.md, "The GPU bundle"):
#   libs (every program resolves: ldd, with CUDA's libraries, NCCL and cuDNN located), smoke,
#   ops (gpu_ops, quick cases), bench-7b (Llama-2-7B 8 x 512, --recompute auto: ftk with cuDNN's
#   and mma's attention against PyTorch eager + transformers; a profiled ftk row beside them
#   where time is left), ops-cudnn (cuDNN's fused attention against the CPU, strict),
#   train (a short ftk-train --device cuda against the CPU), opbench (each memory-bound
#   family's fraction of the copy, each attention's TFLOP/s), epoch (Alpaca1024 with the
#   fastest attention that passed, --recompute auto: steps, wall time split, weights load
#   against cat); then the rest: sanitizer, ops-all, ops-fp32, bench-1b, attn-e2e, demo, and
#   nccl (on one GPU) last.
# The limits of the steps through opbench add up inside the budget, so bench-7b and opbench
# run even when every earlier step takes its whole limit. A step starts only while its limit
# fits what is left, else it is "not run (time budget)"; the benchmarks, whose rows are
# written as each lands, are cut instead: run with what is left as their limit.
# After every step OUTDIR holds report.md (the steps, the figures, the memory plans beside the
# measured peaks, the goals table last), summary.json (the same for programs: steps_done
# counts the steps finished, goals_missing the goal figures not measured) and logs.tar.gz
# (every log), three files of a few MB at most; large work files (the 7B weights) go to
# FTK_BUNDLE_WORK (default /tmp/ftk-gpu-work), never to OUTDIR. Statuses: pass, FAIL (…),
# skipped (reason), not run (time budget), cut at its limit (…). Exit 0 when no step failed
# and every goal figure was measured (7B MFU and the ratio to PyTorch eager, the copy
# fractions, the epoch's steps and wall time, --plan beside the 7B peak), 1 otherwise.
# Environment: GPU_PYTHON (python3 with PyTorch, default python3), FTK_BUNDLE_STEPS (a
# subset, by name), FTK_BUNDLE_WORK, FTK_BUNDLE_EMULATED=DIR (the rehearsal without a GPU:
# DIR, made by `gpu-bundle.sh --emulated`, holds the programs on the host emulation of CUDA,
# put in place of the GPU's; small shapes; tests/gpu/bundle/rehearsal.sh), FTK_BUNDLE_ON_STEP
# (a command run after each rewrite of OUTDIR: the rehearsal keeps each summary.json),
# FTK_BUNDLE_FAKE=limits (the rehearsal of the schedule: no step's body runs, each takes its
# whole GPU limit on a fake clock; no sleep).
set -u
B=$(cd "$(dirname "$0")" && pwd)
ME=$B/run.sh

# --- The folder as sent (run.sh, BUILD_INFO, payload.tar.gz): the clock starts, the payload
# is unpacked into FTK_BUNDLE_WORK/bundle (the emulated programs over it, for a rehearsal),
# and the run.sh there goes on.
if [ "${1:-}" != --step ] && [ -f "$B/payload.tar.gz" ] && [ ! -f "$B/env.sh" ]; then
    FTK_BUNDLE_T0=$(date +%s)
    export FTK_BUNDLE_T0
    [ $# -ge 1 ] || { echo "usage: run.sh OUTDIR [BUDGET_S]" >&2; exit 2; }
    W=${FTK_BUNDLE_WORK:-${TMPDIR:-/tmp}/ftk-gpu-work}
    rm -rf "$W/bundle" && mkdir -p "$W/bundle" || exit 2
    gzip -dc "$B/payload.tar.gz" | tar -C "$W/bundle" -xf - || { echo "run.sh: error: cannot unpack $B/payload.tar.gz into $W/bundle" >&2; exit 2; }
    E=${FTK_BUNDLE_EMULATED:-}
    if [ -n "$E" ] && [ "$E" != 0 ]; then
        [ -f "$E/EMULATED" ] || { echo "run.sh: error: FTK_BUNDLE_EMULATED=$E: not a folder made by gpu-bundle.sh --emulated" >&2; exit 2; }
        cp "$E"/libexec/* "$W/bundle/libexec/" && cp "$E"/lib/* "$W/bundle/lib/" && cp "$E/EMULATED" "$W/bundle/" || exit 2
    fi
    export FTK_BUNDLE_WORK=$W
    exec sh "$W/bundle/run.sh" "$@"
fi

# --- One step's body, run by the driver below under its time limit: run.sh --step NAME
if [ "${1:-}" = --step ]; then
    . "$B/env.sh"
    name=$2
    EMU=$FTK_BUNDLE_EMULATED
    BIN=$B/bin
    DATA=$B/data
    W=$FTK_BUNDLE_WORK/$name
    rm -rf "$W" && mkdir -p "$W"
    PY=${GPU_PYTHON:-python3}
    MPI="mpirun --oversubscribe"
    [ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
    # FTK_BUNDLE_STEP_LIMIT: this step's limit (cut to what was left): the benchmarks start
    # their optional rows only with room left
    GB="$PY $B/tests/bench/gpu_bench.py $BIN $DATA $FTK_BUNDLE_WORK/bench --goals $FTK_BUNDLE_WORK/goals.txt
        --time-limit $((${FTK_BUNDLE_STEP_LIMIT:-600} - 5))"
    skip() { echo "skipped ($*)"; exit 77; }
    emu_skip() { [ "$EMU" = 1 ] && skip "emulated: $*"; return 0; }
    # plan_peaks: the ftk-train runs on the GPU that the bin/ wrappers listed in
    # $FTK_BUNDLE_RUNS (rank 0's command lines; the last of each run folder): each run's
    # --plan (the same command line, --ranks its world size) beside the backend's peak it
    # measured (metrics.jsonl's mem_peak_bytes)
    export FTK_BUNDLE_RUNS=$W/runs.txt
    t_step=$(date +%s)
    plan_peaks() {
        [ -s "$FTK_BUNDLE_RUNS" ] || return 0
        # the plans are a note: not one that would take the step past its limit
        if [ $(($(date +%s) - t_step + 40)) -gt "${FTK_BUNDLE_STEP_LIMIT:-600}" ]; then
            echo "MEM its GPU runs not planned: too little of its limit left"
            return 0
        fi
        seen=" "
        tac "$FTK_BUNDLE_RUNS" | while IFS= read -r line; do
            IFS=$(printf '\037')
            set -f
            # shellcheck disable=SC2086 # split at 0x1f: the arguments as given
            set -- $line
            set +f
            IFS=' 	
'
            ranks=$1 prog=$2
            shift 2
            [ "$prog" = ftk-train ] || continue
            case " $* " in *" --device cuda "* | *" --device=cuda "*) ;; *) continue ;; esac
            case " $* " in *" --plan "*) continue ;; esac
            run="" prev=""
            for x in "$@"; do
                case $prev in -o | --out) run=$x ;; esac
                case $x in --out=*) run=${x#--out=} ;; esac
                prev=$x
            done
            case $seen in *" $run "*) continue ;; esac
            seen="$seen$run "
            [ -s "$run/metrics.jsonl" ] || continue
            [ $(($(date +%s) - t_step + 35)) -le "${FTK_BUNDLE_STEP_LIMIT:-600}" ] || break
            peak=$(grep '"mem_peak_bytes"' "$run/metrics.jsonl" | tail -n 1 | sed 's/.*"mem_peak_bytes": *\([0-9]*\).*/\1/')
            plan=$(FTK_BUNDLE_RUNS="" timeout -k 5 30 "$BIN/ftk-train" "$@" --plan --ranks "$ranks" 2>/dev/null |
                sed -n 's/^ *total .*(\([0-9]*\) bytes.*/\1/p')
            awk -v r="${run#"$FTK_BUNDLE_WORK"/}" -v n="$ranks" -v p="$plan" -v k="$peak" 'BEGIN {
                printf "MEM %s (%d rank%s): %s; %s; device: not measured (no process watched)\n", r, n, (n > 1 ? "s" : ""),
                    (p == "" ? "plan: --plan failed" : sprintf("plan %.3f GiB", p / 2^30)),
                    (k == "" ? "backend peak: not measured" : sprintf("backend peak %.3f GiB%s", k / 2^30,
                        (p > 0 ? sprintf(" (%+.1f%% against the plan)", 100 * (k - p) / p) : ""))) }'
        done
    }
    # the epoch's attention: the fastest of bench-7b's rows whose correctness step (ops-cudnn
    # for cudnn, ops for the others) did not fail; without bench-7b's rows, cudnn where
    # ops-cudnn passed, else mma where ops did, else ftk's default
    epoch_attn() {
        order=$(awk -F '\t' '$1 == "7b_attn_order" { v = $2 } END { print v }' "$FTK_BUNDLE_WORK/goals.txt" 2>/dev/null)
        for at in $order; do
            case $at in cudnn) chk=ops-cudnn ;; *) chk=ops ;; esac
            case $(cat "$FTK_BUNDLE_STATE/$chk.status" 2>/dev/null) in FAIL*) continue ;; esac
            [ "$at" = default ] && at=""
            echo "$at|the fastest in bench-7b ($order) whose $chk step did not fail"
            return
        done
        [ "$(cat "$FTK_BUNDLE_STATE/ops-cudnn.status" 2>/dev/null)" = pass ] && { echo "cudnn|no bench-7b row: ops-cudnn passed"; return; }
        [ "$(cat "$FTK_BUNDLE_STATE/ops.status" 2>/dev/null)" = pass ] && { echo "mma|no bench-7b row: ops passed"; return; }
        echo "|no bench-7b row, neither ops step passed: ftk's default"
    }
    case $name in
    libs)
        # every ELF program and library of the bundle, with the libraries env.sh and the
        # driver located; a library not found is named
        bad=""
        for f in "$B"/libexec/* "$B"/mpi/libexec-* "$B"/mpi/lib/openmpi3/*.so "$B"/mpi/lib/pmix/*.so "$B"/lib/*.so*; do
            [ -f "$f" ] || continue
            [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
            out=$(LD_LIBRARY_PATH=$FTK_BUNDLE_LD_PATH ldd "$f" 2>&1)
            miss=$(echo "$out" | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
            echo "$(basename "$f"): ${miss:+NOT FOUND: }${miss:-ok}"
            [ -n "$miss" ] && bad="$bad $(basename "$f"): $miss;"
        done
        echo "LD_LIBRARY_PATH of the bundle's programs: $FTK_BUNDLE_LD_PATH"
        echo "$FTK_BUNDLE_FOUND" | tr ';' '\n'
        [ -n "$FTK_BUNDLE_NOT_FOUND" ] && bad="$bad not found: $FTK_BUNDLE_NOT_FOUND"
        if [ -n "$bad" ]; then
            case $FTK_BUNDLE_GPU in
            yes | emulated) echo "FAIL: $bad"; exit 1 ;;
            esac
            # no GPU: CUDA's own libraries may well be absent; anything else is the bundle's fault
            if echo "$bad" | tr ' ;:' '\n\n\n' | grep -v '^$' | grep '^lib' | grep -Eqv '^lib(cudart|cublas|cublasLt|nccl|cudnn)\.'; then
                echo "FAIL: $bad"
                exit 1
            fi
            skip "no GPU, and no CUDA libraries: $bad"
        fi
        exit 0
        ;;
    smoke)
        if [ "$EMU" = 1 ]; then # the emulated device answers: one step of a tiny model
            "$BIN/ftk-pack" -q -t "$B/examples/demo/tokenizer.model" "$B/examples/demo/alpaca-demo.json" \
                -o "$W/d.h5" --pack --max-len 48 --val-count 0 || exit 1
            "$BIN/ftk-init" -q --preset tiny --seed 1 -t "$B/examples/demo/tokenizer.model" -o "$W/w.h5" || exit 1
            exec "$BIN/ftk-train" -m "$W/w.h5" -d "$W/d.h5" -o "$W/run" --steps 1 --global-batch 1 --micro-batch 1 \
                --eval-every 0 --no-save --device cuda
        fi
        "$B/build/tests/gpu_smoke"
        rc=$?
        if [ $rc -eq 77 ] && [ "$FTK_BUNDLE_GPU" = yes ]; then
            echo "FAIL: gpu_smoke sees no device, though this machine lists one (the driver, CUDA_VISIBLE_DEVICES?)"
            exit 1
        fi
        exit $rc
        ;;
    ops)
        # the defaults: bf16 products, fused ops, 8 elements a thread, both tensor-core
        # attentions; the quick cases (ops-all, later, runs the larger ones)
        emu_skip "make test runs gpu_ops_emu, minutes here"
        exec env FTK_GPU_OPS_QUICK=1 "$B/build/tests/gpu_ops"
        ;;
    ops-all)
        # every case, the larger ones and the staged uploads' race case
        emu_skip "make test runs gpu_ops_emu, minutes here"
        exec "$B/build/tests/gpu_ops"
        ;;
    ops-cudnn)
        # cuDNN's fused attention (FTK_CUDA_ATTN=cudnn), strict: a cuDNN that does not load or
        # a graph it refuses fails the step instead of falling back to the flash kernels.
        # First the graphs against cuDNN's heuristics (no GPU needed), then gpu_ops's table
        # (every attention case against the CPU, the backward's bits twice) and a bf16 step.
        emu_skip "the host emulation has no cuDNN (make test checks its fallback)"
        [ -n "${FTK_CUDNN_LIB:-}" ] || echo "cuDNN: not found by run.sh; the loader's own search follows"
        "$B/build/tests/cudnn_graphs"
        rc=$?
        [ $rc -eq 0 ] || [ $rc -eq 77 ] || exit 1
        exec env FTK_CUDA_ATTN=cudnn FTK_CUDNN_STRICT=1 FTK_GPU_OPS_QUICK=1 FTK_GPU_OPS_STEPS=bf16-true \
            "$B/build/tests/gpu_ops"
        ;;
    train)
        sh "$B/tests/gpu/train_vs_cpu.sh" "$BIN" "$W" $([ "$EMU" = 1 ] && echo emulated)
        rc=$?
        plan_peaks
        exit $rc
        ;;
    nccl)
        # NCCL loads (a GPU machine without it fails here, naming it), comm.h's contract on one
        # rank, then one rank under mpirun (a 1-rank NCCL world) against a process alone
        command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (the bundle's mpi/bin)"; exit 1; }
        export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
        echo "== test_comm --nccl, 1 rank"
        timeout -k 5 $([ "$EMU" = 1 ] && echo 300 || echo 60) $MPI -np 1 "$B/build/tests/test_comm" "$B" --nccl \
            >"$W/comm.log" 2>&1
        rc=$?
        cat "$W/comm.log"
        grep -q '^NCCL: .*libnccl.so.2 loads' "$W/comm.log" ||
            { echo "FAIL: libnccl.so.2 does not load: $(grep -m1 '^NCCL: ' "$W/comm.log")"; exit 1; }
        [ $rc -eq 0 ] || { echo "FAIL: test_comm --nccl exit $rc"; exit 1; }
        sh "$B/tests/gpu/train_vs_cpu.sh" "$BIN" "$W/one" $([ "$EMU" = 1 ] && echo emulated) nccl || exit 1
        plan_peaks
        # two GPUs or more: 2-rank training over NCCL against 2 MPI ranks on the CPU
        [ "$EMU" = 1 ] && exit 0
        ngpu=$(timeout -k 5 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        [ "$ngpu" -ge 2 ] || { echo "one GPU: the 2-rank runs (tests/gpu/nccl_vs_mpi.sh) need two"; exit 0; }
        exec sh "$B/tests/gpu/nccl_vs_mpi.sh" "$BIN" "$W/two"
        ;;
    bench-7b)
        # the headline: ftk with cuDNN's attention and mma's, --recompute auto, against PyTorch
        # eager; then, time left, a profiled ftk row (where its time went) and torch.profiler's
        if [ "$EMU" = 1 ]; then # no cuDNN, no PyTorch: two attentions of the emulation
            exec $GB --emulated --shapes smoke --steps 1 --micro-batch 2 --maxlen 64 --profile --attn mma,flash \
                --recompute auto
        fi
        exec $GB --shapes llama2-7b --steps 3 --no-compile --profile --attn cudnn,mma --recompute auto
        ;;
    epoch)
        pick=$(epoch_attn)
        at=${pick%%|*}
        echo "epoch: attention ${at:-ftk's default} (${pick#*|}), --recompute auto"
        [ "$EMU" = 1 ] && exec $GB --emulated --alpaca1024 ${at:+--attn $at} --recompute auto
        exec $GB --alpaca1024 ${at:+--attn $at} --recompute auto
        ;;
    sanitizer)
        emu_skip "compute-sanitizer checks a GPU's memory"
        command -v compute-sanitizer >/dev/null || skip "compute-sanitizer not found"
        # a probe first: some machines refuse the device to it ("Device not supported")
        if ! compute-sanitizer --target-processes all --error-exitcode 1 "$B/build/tests/gpu_smoke" >"$W/probe.log" 2>&1; then
            skip "compute-sanitizer cannot run here: $(grep -m1 -i 'error\|not supported' "$W/probe.log")"
        fi
        # gpu_ops provokes an allocation failure on purpose: API errors are the program's to check
        FTK_GPU_OPS_QUICK=1 exec compute-sanitizer --target-processes all --error-exitcode 1 --tool memcheck \
            --report-api-errors no "$B/build/tests/gpu_ops"
        ;;
    opbench)
        # every memory-bound family against the device copy, each attention's TFLOP/s, the
        # products
        emu_skip "make test runs gpu_opbench_emu, its harness at small shapes (40 s here)"
        exec "$B/build/tests/gpu_opbench"
        ;;
    ops-fp32)
        emu_skip "make test-slow runs these settings on the emulation"
        exec env FTK_CUDA_MATMUL=fp32 FTK_CUDA_ATTN=simple FTK_FUSED=none FTK_CUDA_VEC=0 "$B/build/tests/gpu_ops"
        ;;
    bench-1b)
        emu_skip "torch.compile's rows need a GPU"
        exec $GB --shapes llama-1b --steps 3 --attn flash
        ;;
    attn-e2e)
        emu_skip "40 steps of a 512-wide model: hours on the emulation"
        sh "$B/tests/gpu/attn_e2e.sh" "$BIN" "$DATA" "$W"
        rc=$?
        plan_peaks
        exit $rc
        ;;
    demo)
        emu_skip "make test-slow runs demo_vs_cpu.sh on the emulation"
        sh "$B/tests/gpu/demo_vs_cpu.sh" "$BIN" "$W"
        rc=$?
        plan_peaks
        exit $rc
        ;;
    esac
    echo "run.sh: no step $name"
    exit 2
fi

# --- The driver
OUTDIR=${1:?usage: run.sh OUTDIR [BUDGET_S]}
BUDGET=${2:-560}
case $BUDGET in '' | *[!0-9]*) echo "run.sh: error: BUDGET_S '$BUDGET' is not a number of seconds" >&2; exit 2 ;; esac
t_start=${FTK_BUNDLE_T0:-$(date +%s)}
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
FTK_BUNDLE_WORK=${FTK_BUNDLE_WORK:-${TMPDIR:-/tmp}/ftk-gpu-work}
mkdir -p "$FTK_BUNDLE_WORK" || exit 2
FTK_BUNDLE_WORK=$(cd "$FTK_BUNDLE_WORK" && pwd)
case $FTK_BUNDLE_WORK/ in "$OUTDIR"/*)
    echo "run.sh: error: FTK_BUNDLE_WORK ($FTK_BUNDLE_WORK) is inside OUTDIR: large files must stay out of it" >&2
    exit 2 ;;
esac
export FTK_BUNDLE_WORK
LOGS=$FTK_BUNDLE_WORK/logs ST=$FTK_BUNDLE_WORK/state
export FTK_BUNDLE_STATE=$ST # the steps' statuses, for the epoch's choice of attention
EMU=0
[ -f "$B/EMULATED" ] && EMU=1
export FTK_BUNDLE_EMULATED=$EMU
export FTK_DEVICE=cpu # a run that does not say --device cuda stays on the CPU

# name group limit emulated-limit cut what. Group a: what never ran on a GPU; b: the goal
# figures; d: the rest. The limits of the steps up to opbench add up to 485 s, so with the
# default budget (560 s, 5 kept for the last rewrite) bench-7b and opbench run even when every
# step before them takes its whole limit, and the epoch has 70 s less the time between the
# steps (the probes, the report's rewrites: seconds). cut: 0, a step
# starts only while its limit fits what is left, else it is "not run (time budget)"; N > 0,
# its figures are useful partial (each row is written as it lands): it runs with what is
# left as its limit, while that is N s or more.
STEP_TABLE='libs a 25 100 0 every program and library resolves (ldd); CUDA, NCCL, cuDNN located
smoke a 30 200 0 the device answers (gpu_smoke)
ops a 60 400 0 gpu_ops, quick cases: every op against the CPU, bf16 products, fused ops, adamw_multi, both tensor-core attentions
bench-7b b 180 400 60 Llama-2-7B 8x512, --recompute auto: ftk (cudnn, mma) against PyTorch eager + transformers; a profiled ftk row, time left
ops-cudnn a 50 400 0 gpu_ops with FTK_CUDA_ATTN=cudnn (the fused attention of cuDNN, no fallback) against the CPU; cudnn_graphs
train a 70 400 0 ftk-train --device cuda against the CPU; a GPU checkpoint resumed on the CPU
opbench b 70 400 30 gpu_opbench: memory-bound ops against the device copy, attention (flash, mma, cudnn), products
epoch b 120 400 45 the Alpaca1024 epoch (7B, bf16-true, the fastest attention that passed, --recompute auto): steps, wall time split, weights load against cat
sanitizer d 200 400 0 compute-sanitizer memcheck over gpu_ops (quick)
ops-all d 150 400 0 gpu_ops, every case: the larger ones, the staged uploads race
ops-fp32 d 120 400 0 gpu_ops with exact fp32 products, simple attention, unfused, one element a thread
bench-1b d 200 400 60 llama-1b: ftk against PyTorch eager and torch.compile
attn-e2e d 120 400 0 a small Llama trained with each attention (flash, mma, cudnn against simple): the same losses
demo d 120 400 0 the demo on the GPU against the CPU, fp32 and bf16-true, checkpoints both ways
nccl d 100 400 0 NCCL on one GPU: test_comm --nccl on 1 rank; a 1-rank NCCL world against a process alone'
STEPS=$(echo "$STEP_TABLE" | awk '{print $1}')
field() { echo "$STEP_TABLE" | awk -v n="$1" -v k="$2" '$1 == n { if (k == "what") { $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print } else print $k }'; }
n_steps=$(echo "$STEPS" | wc -l)
# what an earlier run left; the benchmarks' weights (7B: 13.5 GB) are kept for the next
for d in logs state pack goals.txt $STEPS; do rm -rf "${FTK_BUNDLE_WORK:?}/$d"; done
rm -f "$FTK_BUNDLE_WORK"/bench/profile-*.md
mkdir -p "$LOGS" "$ST"

# One clock, read through now_s: FTK_BUNDLE_FAKE=limits (the rehearsal) runs no step's body
# and advances CLOCK_SKEW by the step's whole limit instead, so the schedule of a run in which
# every step takes its whole limit is checked in seconds, with the GPU's limits and no sleep
CLOCK_SKEW=0
FAKE=${FTK_BUNDLE_FAKE:-}
case $FAKE in '' | limits) ;; *) echo "run.sh: error: FTK_BUNDLE_FAKE=$FAKE: only 'limits' is known" >&2; exit 2 ;; esac
now_s() { echo $(($(date +%s) + CLOCK_SKEW)); }
elapsed() { echo $(($(now_s) - t_start)); }
say() { echo "[$(elapsed) s] $*"; }

# --- The machine: GPU, CUDA's libraries, NCCL, cuDNN (the system's, else PyTorch's wheels)
PY=${GPU_PYTHON:-python3}
if [ "$EMU" = 1 ]; then
    FTK_BUNDLE_GPU=emulated
    GPU_DESC="none: the host emulation of CUDA (FTK_BUNDLE_EMULATED=1)"
elif command -v nvidia-smi >/dev/null && smi_list=$(timeout -k 5 20 nvidia-smi -L 2>/dev/null) &&
    echo "$smi_list" | grep -q '^GPU'; then
    FTK_BUNDLE_GPU=yes
    n_gpu=$(echo "$smi_list" | grep -c '^GPU')
    GPU_DESC="$(timeout -k 5 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
        head -n 1)$([ "$n_gpu" -gt 1 ] && echo " (x$n_gpu)")"
elif ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    FTK_BUNDLE_GPU=yes
    GPU_DESC="a /dev/nvidia device (nvidia-smi not found)"
else
    FTK_BUNDLE_GPU=no
    GPU_DESC="none found (no nvidia-smi listing, no /dev/nvidia0)"
fi
export FTK_BUNDLE_GPU
# the libraries the bundle's programs need from CUDA (as ldd names them), NCCL, cuDNN
need=$(for f in "$B"/libexec/* "$B"/lib/libftk-cuda.so; do ldd "$f" 2>/dev/null | awk '{print $1}'; done | grep -E '^lib(cudart|cublasLt|cublas)\.so' |
    sort -u | tr '\n' ' ')
[ "$EMU" = 1 ] || need="$need libnccl.so.2" # emulated: the bundle's own, lib/libnccl.so.2
# wheel folders: site-packages/nvidia/*/lib (cu12 layout) and nvidia/cu13/lib (cu13)
wheel_dirs=$(timeout -k 5 30 "$PY" -c 'import nvidia, os, glob
for p in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(p, "*", "lib")) + glob.glob(os.path.join(p, "*", "*", "lib"))): print(d)' 2>/dev/null)
sys_dirs="${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(ls -d /usr/local/cuda-*/lib64 2>/dev/null) /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu"
find_lib() { # find_lib NAME: the folder of NAME: the loader's cache, the CUDA folders, the wheels
    p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}')
    [ -n "$p" ] && [ -e "$p" ] && { dirname "$p"; return 0; }
    for d in $sys_dirs $wheel_dirs; do
        [ -e "$d/$1" ] && { echo "$d"; return 0; }
    done
    # last, torch's own folder (importing torch takes seconds of the budget: not for cuDNN)
    [ "${2:-}" = no-torch ] && return 1
    [ -n "${torch_lib:-}" ] || torch_lib=$(timeout -k 5 60 "$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null) || torch_lib=none
    [ -e "$torch_lib/$1" ] && { echo "$torch_lib"; return 0; }
    return 1
}
FTK_BUNDLE_CUDA_PATH="" FTK_BUNDLE_FOUND="" FTK_BUNDLE_NOT_FOUND=""
for l in $need; do
    if d=$(find_lib "$l"); then
        FTK_BUNDLE_FOUND="$FTK_BUNDLE_FOUND$l: $d;"
        case ":$FTK_BUNDLE_CUDA_PATH:" in *":$d:"*) ;; *) FTK_BUNDLE_CUDA_PATH=${FTK_BUNDLE_CUDA_PATH:+$FTK_BUNDLE_CUDA_PATH:}$d ;; esac
    else
        FTK_BUNDLE_NOT_FOUND="$FTK_BUNDLE_NOT_FOUND $l"
    fi
done
[ "$EMU" = 1 ] && FTK_BUNDLE_FOUND="${FTK_BUNDLE_FOUND}libnccl.so.2: $B/lib (emulated);"
# cuDNN 9 for FTK_CUDA_ATTN=cudnn (opened at run time: FTK_CUDNN_LIB names it), and NVRTC,
# which its runtime-compiled engines open; their folders go on the programs' library path
cudnn="" FTK_CUDNN_LIB=""
if d=$(find_lib libcudnn.so.9 no-torch); then
    cudnn="libcudnn.so.9: $d" FTK_CUDNN_LIB=$d/libcudnn.so.9
    for l in libnvrtc.so.13 libnvrtc.so.12; do
        if n=$(find_lib "$l" no-torch); then
            cudnn="$cudnn;$l: $n"
            case ":$FTK_BUNDLE_CUDA_PATH:" in *":$n:"*) ;; *) FTK_BUNDLE_CUDA_PATH=${FTK_BUNDLE_CUDA_PATH:+$FTK_BUNDLE_CUDA_PATH:}$n ;; esac
        fi
    done
    case ":$FTK_BUNDLE_CUDA_PATH:" in *":$d:"*) ;; *) FTK_BUNDLE_CUDA_PATH=${FTK_BUNDLE_CUDA_PATH:+$FTK_BUNDLE_CUDA_PATH:}$d ;; esac
fi
FTK_BUNDLE_FOUND="$FTK_BUNDLE_FOUND${cudnn:-cuDNN: not found (FTK_CUDA_ATTN=cudnn falls back to the flash kernels)};"
export FTK_BUNDLE_CUDA_PATH FTK_BUNDLE_FOUND FTK_BUNDLE_NOT_FOUND FTK_CUDNN_LIB
. "$B/env.sh"

# --- The report, rewritten after every step
json_str() { printf '%s' "$1" | awk 'BEGIN { ORS = "" } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, " ");
    gsub(/[\001-\037]/, " "); if (NR > 1) print "\\n"; print }'; }
status_of() { cat "$ST/$1.status" 2>/dev/null || echo pending; }
# the memory-bound kernel families against the device copy, from gpu_opbench's rows
# ("NAME DTYPE  ms  GB/s  P% of copy"): each family's range over its dtypes and shapes
fractions() {
    f=$LOGS/opbench.log
    [ -s "$f" ] && grep -q '% of copy' "$f" || { echo "not measured"; return; }
    # the kernels' own rows: the FTK_CUDA_VEC=0 and replaced-path rows beside them are for
    # comparison (", one … a thread", "in-order sums"), not the goal
    awk '/% of copy$/ && !/, one |in-order sums/ { fam = $1; p = $(NF - 2); sub(/%/, "", p); p += 0
            if (!(fam in lo) || p < lo[fam]) lo[fam] = p; if (!(fam in hi) || p > hi[fam]) hi[fam] = p
            if (!(fam in seen)) { seen[fam] = 1; order[++n] = fam } }
         END { for (i = 1; i <= n; i++) { x = order[i]
                 printf "%s%s %s%%", (i > 1 ? ", " : ""), x, (lo[x] == hi[x] ? lo[x] : lo[x] "–" hi[x]) }
               print "" }' "$f"
}
# attention at the 7B shape, from gpu_opbench's rows ("attn_fwd bf16 flash (default)  ms
# TFLOP/s"): forward/backward TFLOP/s for each bf16 kernel family measured
attn_tflops() {
    f=$LOGS/opbench.log
    [ -s "$f" ] && grep -q '^attn_fwd bf16' "$f" || { echo "not measured"; return; }
    awk '/^attn_(fwd|bwd) bf16 / && /TFLOP\/s$/ { k = $3; t = $(NF - 1)
            if ($1 == "attn_fwd") fw[k] = t; else bw[k] = t
            if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
         END { for (i = 1; i <= n; i++) { x = order[i]
                 printf "%s%s %s/%s", (i > 1 ? ", " : ""), x, (x in fw ? fw[x] : "-"), (x in bw ? bw[x] : "-") }
               print "" }' "$f"
}
# The goal figures: a run without one of them exits 1. Emulated, PyTorch's ratio and the
# copy fractions are not measured (no PyTorch there; opbench is skipped), so not asked for.
GOALS_NEEDED="7b_mfu 7b_ratio copy_fractions epoch_steps epoch_wall plan_7b"
[ "$EMU" = 1 ] && GOALS_NEEDED="7b_mfu epoch_steps epoch_wall plan_7b"
# load_goals: every goal figure into G_KEY (text) and J_KEY (JSON-escaped), "not measured"
# where absent; the derived ones (copy fractions, attention, plans, peaks) too; MISSING, the
# needed ones not measured. One awk for goals.txt (the report is rewritten after every step).
load_goals() {
    eval "$(awk -F '\t' -v keys="7b_mfu 7b_ratio epoch_steps epoch_wall epoch_load peak_7b peak_epoch plan_7b plan_epoch" \
        -v fr="$(fractions)" -v at="$(attn_tflops)" '
        function sq(s,   p, n, i, r) { n = split(s, p, "\047"); r = p[1]; for (i = 2; i <= n; i++) r = r "\047\\\047\047" p[i]
            return "\047" r "\047" }
        function js(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/[\001-\037]/, " ", s); return s }
        function put(k, s) { printf "G_%s=%s J_%s=%s\n", k, sq(s), k, sq(js(s)) }
        function two(a, b) { return a == "not measured" ? b : b == "not measured" ? a : a "; " b }
        { v[$1] = $2 }
        END { n = split(keys, k, " ")
              for (i = 1; i <= n; i++) { g[k[i]] = (k[i] in v && v[k[i]] != "") ? v[k[i]] : "not measured"; put(k[i], g[k[i]]) }
              g["copy_fractions"] = fr; put("copy_fractions", fr); put("attn_tflops", at)
              put("plans", two(g["plan_7b"], g["plan_epoch"])); put("peaks", two(g["peak_7b"], g["peak_epoch"])) }' \
        "$([ -f "$FTK_BUNDLE_WORK/goals.txt" ] && echo "$FTK_BUNDLE_WORK/goals.txt" || echo /dev/null)")"
    MISSING=""
    for g in $GOALS_NEEDED; do
        eval "v=\$G_$g"
        [ "$v" = "not measured" ] && MISSING="$MISSING${MISSING:+ }$g"
    done
}
# write_outputs [running]: report.md, summary.json and (not for a step's start) logs.tar.gz
write_outputs() {
    now=$(elapsed)
    load_goals
    # the steps' rows for the report and the summary, and the counts, in one awk
    T=$FTK_BUNDLE_WORK/rows
    counts=$(echo "$STEP_TABLE" | awk -v st="$ST" -v t="$T" '
        function rd(f, d,   l) { l = d; if ((getline l < f) <= 0) l = d; close(f); return l }
        function js(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/[\001-\037]/, " ", s); return s }
        { n++; name[n] = $1; grp[n] = $2; w = $0; for (k = 1; k <= 5; k++) sub(/^[^ ]+ +/, "", w); what[n] = w }
        END { for (i = 1; i <= n; i++) { x = name[i]
                s = rd(st "/" x ".status", "pending"); secs = rd(st "/" x ".secs", ""); lim = rd(st "/" x ".limit", "")
                if (s !~ /^(pending|running)/) done++
                if (s ~ /^FAIL/) fails++
                printf "| %s | %s | %s | %s | %s | %s |\n", x, grp[i], (s ~ /^FAIL/ ? "**" s "**" : s), (secs == "" ? "-" : secs),
                    (lim == "" ? "-" : lim), what[i] > (t ".md")
                printf "  {\"name\": \"%s\", \"group\": \"%s\", \"status\": \"%s\", \"seconds\": %s, \"limit_s\": %s}%s\n", x, grp[i],
                    js(s), (secs == "" ? "null" : secs), (lim == "" ? "null" : lim), (i < n ? "," : "") > (t ".json") }
              printf "%d %d\n", done, fails }')
    done_n=${counts% *} fails=${counts#* }
    R=$OUTDIR/report.md
    {
        echo "# ftk GPU check (the GPU bundle)"
        echo
        echo "- $(sed -n 1p "$B/BUILD_INFO" 2>/dev/null); $(sed -n 2p "$B/BUILD_INFO" 2>/dev/null)"
        echo "- run: $T_START_UTC, on $HOST; $now s of a budget of $BUDGET s; $done_n of $n_steps steps finished, $fails failed$([ "${FINISHED:-0}" = 1 ] && echo '; run complete' || echo '; run in progress')"
        echo "- GPU: $GPU_DESC"
        echo "- libraries: $(echo "$FTK_BUNDLE_FOUND" | sed 's/;$//; s/;/; /g')${FTK_BUNDLE_NOT_FOUND:+; NOT FOUND:$FTK_BUNDLE_NOT_FOUND}"
        echo "- logs: logs.tar.gz (each step's log, FTK_PROFILE's tables); large work files: $FTK_BUNDLE_WORK"
        [ -n "$FAKE" ] && echo "- **FTK_BUNDLE_FAKE=$FAKE: a rehearsal of the schedule: no step's body ran, each took its whole limit on a fake clock**"
        echo "- goal figures missing: ${MISSING:-none}$([ -n "$MISSING" ] && echo ' (the exit status is 1)')"
        echo
        echo "| step | group | result | seconds | limit | what |"
        echo "| --- | --- | --- | --- | --- | --- |"
        cat "$T.md"
        if grep -q '^MEM ' "$LOGS"/*.log 2>/dev/null; then
            echo
            echo "## Memory: ftk-train --plan beside the measured peaks"
            echo
            echo "Each ftk-train run on the GPU: the plan of its options, the backend's high-water mark"
            echo "(metrics.jsonl's mem_peak_bytes), the device memory its process held (nvidia-smi)."
            echo
            for ws in $STEPS; do
                [ -s "$LOGS/$ws.log" ] || continue
                grep '^MEM ' "$LOGS/$ws.log" | cut -c5-700 | sed "s/^/- $ws: /"
            done
        fi
        for ws in bench-7b opbench epoch bench-1b; do
            case $(status_of "$ws") in pass* | FAIL* | running* | cut*) ;; *) continue ;; esac
            [ -s "$LOGS/$ws.log" ] || continue
            echo
            echo "## $ws"
            echo
            echo '```'
            tail -n 120 "$LOGS/$ws.log" | cut -c1-300
            echo '```'
        done
        if [ "$fails" -gt 0 ]; then
            for ws in $STEPS; do # the end of each failed step's log
                case $(status_of "$ws") in FAIL*) ;; *) continue ;; esac
                echo
                echo "## $ws: the end of its log"
                echo
                echo '```'
                tail -n 30 "$LOGS/$ws.log" 2>/dev/null | cut -c1-300
                echo '```'
            done
        fi
        echo
        echo "## Goals"
        echo
        echo "| goal | figure |"
        echo "| --- | --- |"
        echo "| Llama-2-7B MFU (ftk, bf16-true, 8 x 512, --recompute auto; goal 55%) | $G_7b_mfu |"
        echo "| ratio to PyTorch eager (7B tokens/s; goal 1.3x) | $G_7b_ratio |"
        echo "| Alpaca1024 epoch: steps | $G_epoch_steps |"
        echo "| Alpaca1024 epoch: wall (start-up, weights load, steps, end) | $G_epoch_wall |"
        echo "| Alpaca1024 epoch: weights load against cat FILE > /dev/null (goal 0.8) | $G_epoch_load |"
        echo "| memory-bound kernel families, fraction of the device copy (goal 85%) | $G_copy_fractions |"
        echo "| attention at the 7B shape, TFLOP/s forward/backward (bf16; gpu_opbench) | $G_attn_tflops |"
        echo "| --plan against the measured peak (goal within 3%) | $G_plans |"
        echo "| peak GPU memory | $G_peaks |"
    } >"$R.tmp" && mv "$R.tmp" "$R"
    {
        printf '{"bundle": "%s", "started_utc": "%s", "gpu": "%s", "emulated": %s, "budget_s": %s, "elapsed_s": %s,\n' \
            "$J_BUILD" "$T_START_ISO" "$J_GPU_DESC" "$([ "$EMU" = 1 ] && echo true || echo false)" "$BUDGET" "$now"
        printf ' "steps_done": %s, "steps_total": %s, "failed": %s, "finished": %s,\n "steps": [\n' \
            "$done_n" "$n_steps" "$fails" "$([ "${FINISHED:-0}" = 1 ] && echo true || echo false)"
        cat "$T.json"
        printf ' ],\n "goals": {"7b_mfu": "%s", "7b_ratio": "%s", "epoch_steps": "%s", "epoch_wall": "%s", "epoch_load": "%s", "copy_fractions": "%s", "attn_tflops": "%s", "plan_vs_peak": "%s", "peak": "%s"},\n' \
            "$J_7b_mfu" "$J_7b_ratio" "$J_epoch_steps" "$J_epoch_wall" "$J_epoch_load" "$J_copy_fractions" \
            "$J_attn_tflops" "$J_plans" "$J_peaks"
        gm=""
        for g in $MISSING; do gm="$gm${gm:+, }\"$g\""; done
        printf ' "goals_missing": [%s], "fake": %s}\n' "$gm" "$([ -n "$FAKE" ] && echo "\"$FAKE\"" || echo null)"
    } >"$OUTDIR/summary.json.tmp" && mv "$OUTDIR/summary.json.tmp" "$OUTDIR/summary.json"
    rm -f "$T.md" "$T.json"
    # the logs, each cut to 4 MiB (its first and last 2 MiB), FTK_PROFILE's tables, the goals;
    # not at a step's start (nothing new to pack)
    if [ "${1:-}" != running ]; then
        P=$FTK_BUNDLE_WORK/pack
        rm -rf "$P" && mkdir -p "$P/logs"
        for f in "$LOGS"/*.log "$FTK_BUNDLE_WORK"/bench/profile-*.md "$FTK_BUNDLE_WORK/goals.txt" "$B/BUILD_INFO"; do
            [ -f "$f" ] && cp "$f" "$P/logs/"
        done
        for f in $(find "$P/logs" -type f -size +4096k); do
            n=$(wc -c <"$f")
            { head -c 2097152 "$f"; printf '\n[... cut: %s bytes in all ...]\n' "$n"; tail -c 2097152 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
        done
        tar -C "$P" -czf "$OUTDIR/logs.tar.gz.tmp" logs && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
        rm -rf "$P"
    fi
    if [ -n "${FTK_BUNDLE_ON_STEP:-}" ]; then sh -c "$FTK_BUNDLE_ON_STEP"; fi
}

# run_step NAME: runs one step under its limit if it fits the budget (a cut step: under what
# is left, if that is at least its minimum), then rewrites OUTDIR
run_step() {
    rs=$1
    if [ -n "${FTK_BUNDLE_STEPS:-}" ] && ! echo " $FTK_BUNDLE_STEPS " | grep -q " $rs "; then
        echo "skipped (not in FTK_BUNDLE_STEPS)" >"$ST/$rs.status"
        return
    fi
    limit=$(field "$rs" 3)
    [ "$EMU" = 1 ] && [ -z "$FAKE" ] && limit=$(field "$rs" 4)
    cut_min=$(field "$rs" 5)
    # the GPU's steps need the smoke's pass
    if [ "$rs" != libs ] && [ "$rs" != smoke ] && [ -n "${NO_GPU:-}" ]; then
        echo "skipped ($NO_GPU)" >"$ST/$rs.status"
        say "$rs: $(cat "$ST/$rs.status")"
        write_outputs
        return
    fi
    left=$((BUDGET - $(elapsed) - 5)) # 5 s kept for the last rewrite
    cut=""
    if [ "$limit" -gt "$left" ]; then
        if [ "$cut_min" -gt 0 ] && [ "$left" -ge "$cut_min" ]; then
            cut=" (cut from $limit s to what was left)"
            limit=$left
        else
            echo "not run (time budget)" >"$ST/$rs.status"
            echo "$limit" >"$ST/$rs.limit"
            say "$rs: not run (time budget: its limit ${limit}s, ${left}s left)"
            write_outputs
            return
        fi
    fi
    echo "$limit" >"$ST/$rs.limit"
    echo "running (started at $(elapsed) s$cut)" >"$ST/$rs.status"
    write_outputs running
    say "$rs (limit ${limit}s$cut) ..."
    t0=$(now_s)
    if [ -n "$FAKE" ]; then # the rehearsal's schedule: the step takes its whole limit
        echo "FTK_BUNDLE_FAKE=$FAKE: the body of $rs not run; the clock moved on by its limit, $limit s" >"$LOGS/$rs.log"
        CLOCK_SKEW=$((CLOCK_SKEW + limit))
        rc=0
    else
        FTK_BUNDLE_STEP_LIMIT=$limit timeout -k 10 "$limit" sh "$ME" --step "$rs" >"$LOGS/$rs.log" 2>&1 </dev/null
        rc=$?
    fi
    dt=$(($(now_s) - t0))
    case $rc in
    0) res=pass ;;
    77) res="skipped ($(grep -i 'skipped' "$LOGS/$rs.log" | tail -n 1 | sed 's/^.*skipped *(//; s/)[^)]*$//' | cut -c1-200))" ;;
    124 | 137)
        # a benchmark stopped at its limit keeps every row written before; its goal figures
        # say what is missing
        if [ "$cut_min" -gt 0 ]; then res="cut at its limit of ${limit} s$cut (the figures before it are kept)"; else res="FAIL (over its limit of ${limit} s)"; fi ;;
    *) res="FAIL (exit $rc: $(grep -E 'FAIL|error|Error' "$LOGS/$rs.log" | tail -n 1 | cut -c1-160))" ;;
    esac
    [ "$rc" = 0 ] && [ -n "$cut" ] && res="pass$cut"
    echo "$res" >"$ST/$rs.status"
    echo "$dt" >"$ST/$rs.secs"
    say "$rs: $res (${dt}s)"
    write_outputs
}

# what every rewrite of the report repeats, once
HOST=$(uname -n)
T_START_UTC=$(date -u -d "@$t_start" '+%Y-%m-%d %H:%M UTC' 2>/dev/null || date -u '+%Y-%m-%d %H:%M UTC')
T_START_ISO=$(date -u -d "@$t_start" '+%Y-%m-%dT%H:%M:%SZ' 2>/dev/null)
J_BUILD=$(json_str "$(sed -n 1p "$B/BUILD_INFO" 2>/dev/null)")
J_GPU_DESC=$(json_str "$GPU_DESC")
say "ftk GPU bundle: $(sed -n 1p "$B/BUILD_INFO" 2>/dev/null); GPU: $GPU_DESC; budget ${BUDGET}s; OUTDIR $OUTDIR"
write_outputs
NO_GPU=""
for ms in $STEPS; do
    run_step "$ms"
    if [ "$ms" = smoke ]; then
        case $(status_of smoke) in
        pass) ;;
        skipped*)
            NO_GPU="$(status_of smoke | sed 's/^skipped (//; s/)$//'), said the smoke step"
            [ "$FTK_BUNDLE_GPU" = yes ] && NO_GPU="the smoke step found no device, though this machine lists one" ;;
        FAIL*) NO_GPU="the smoke step failed" ;;
        *) NO_GPU="the smoke step did not pass: $(status_of smoke)" ;;
        esac
    fi
done
FINISHED=1
write_outputs
say "done: $OUTDIR/report.md"
echo
sed -n '/^| step /,/^$/p' "$OUTDIR/report.md"
sed -n '/^## Goals/,$p' "$OUTDIR/report.md"
[ -n "$MISSING" ] && say "goal figures missing: $MISSING"
! grep -q '^FAIL' "$ST"/*.status && [ -z "$MISSING" ]
