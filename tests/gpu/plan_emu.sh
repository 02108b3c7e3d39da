#!/bin/sh
# plan_emu.sh BIN WORK: --plan --device cuda against what the device held, under the host
# emulation of CUDA (BIN is build/tests/emu/bin). The emulator counts every cudaMalloc in the
# driver's pages (kernels/cuda_mem.h) and reports the most the device held (FTK_EMU_STATS:
# device_peak_bytes); ftk-train's metrics give the backend's own count (mem_peak_bytes,
# mem_device_peak_bytes) and what cudaMemGetInfo said (mem_device_used_bytes). The plan is a
# dry run that runs no op, so each equality below fails if a step allocates device memory
# the plan does not hold (scratch grown by an op, a buffer outside bk_alloc), to the byte:
#   the emulator's peak in pages = mem_device_used_bytes = the plan's total less the CUDA
#   context (the one term an emulation has not: only a GPU measures it); the most bytes the
#   emulated device was asked for = mem_peak_bytes = the plan's allocations.
# Runs: bf16-true with block recompute, as the H200 ran 7B (2 rows of 64 tokens a
# micro-batch), fp32 with norms recompute (1 row), 2 steps each.
set -u
BIN=$1 WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
export FTK_DEVICE=cpu
. "$ROOT/tests/cli/lib.sh"
DEMO_TOOLS=$ROOT/bin # ftk-pack and ftk-init
demo_pack "$WORK/demo.h5" 64 2>/dev/null || exit 1
demo_init "$WORK/init.h5" tiny 42 || exit 1
# row FILE NAME: the bytes a --plan row names ("(N bytes")
row() { sed -n "s/^  $2  .*(\([0-9]*\) bytes.*/\1/p" "$1"; }
metric() { sed -n "s/.*\"$2\": \([0-9]*\).*/\1/p" "$1/metrics.jsonl" | tail -n 1; }
case_() { # case_ TAG OPTIONS...
    tag=$1
    shift
    opts="-m $WORK/init.h5 -d $WORK/demo.h5 --device cuda $*"
    rm -rf "$WORK/run" "$WORK/stats"
    expect "$tag: --plan" 0 "$BIN/ftk-train" --plan $opts
    cp "$WORK/out" "$WORK/$tag.plan"
    expect "$tag: 2 steps" 0 env FTK_EMU_STATS="$WORK/stats" "$BIN/ftk-train" -q $opts --lr 2e-3 --warmup 1 \
        --eval-every 0 --steps 2 --no-save -o "$WORK/run"
    total=$(row "$WORK/$tag.plan" total) ctx=$(row "$WORK/$tag.plan" 'CUDA context')
    allocs=$(row "$WORK/$tag.plan" allocations) pages=$(row "$WORK/$tag.plan" 'page rounding')
    emu=$(sed -n 's/^device_peak_bytes \([0-9]*\) .*/\1/p' "$WORK/stats" | tail -n 1)
    asked=$(sed -n 's/^device_peak_bytes .* asked_peak_bytes \([0-9]*\)$/\1/p' "$WORK/stats" | tail -n 1)
    used=$(metric "$WORK/run" mem_device_used_bytes) devp=$(metric "$WORK/run" mem_device_peak_bytes)
    peak=$(metric "$WORK/run" mem_peak_bytes)
    echo "     plan: allocations $allocs + page rounding $pages + context $ctx = total $total;" \
        "measured: emulator $emu in pages ($asked asked for), cudaMemGetInfo $used, backend $peak ($devp in pages)"
    check "$tag: the plan has every term" test -n "$total" -a -n "$ctx" -a -n "$allocs" -a -n "$pages"
    check "$tag: the emulated device's peak ${emu:-?} = the plan's total less the context" \
        test -n "$emu" -a "${emu:-0}" = "$(( ${total:-0} - ${ctx:-0} ))"
    check "$tag: the bytes the emulated device was asked for at most ${asked:-?} = the plan's allocations" \
        test -n "$asked" -a "${asked:-0}" = "${allocs:-x}"
    check "$tag: cudaMemGetInfo's peak in the metrics ${used:-?} = the emulated device's" \
        test -n "$used" -a "${used:-0}" = "${emu:-x}"
    check "$tag: mem_peak_bytes ${peak:-?} = the plan's allocations" test -n "$peak" -a "${peak:-0}" = "${allocs:-x}"
    other=$(metric "$WORK/run" mem_device_other_bytes)
    check "$tag: mem_device_other_bytes ${other:-?} = 0 (the emulation has no context)" test "${other:-x}" = 0
    check "$tag: mem_device_peak_bytes ${devp:-?} = allocations + page rounding" \
        test -n "$devp" -a "${devp:-0}" = "$(( ${allocs:-0} + ${pages:-0} ))"
}
case_ bf16-true-block --precision bf16-true --global-batch 4 --micro-batch 2 --recompute block
case_ fp32-norms --precision fp32 --global-batch 2 --micro-batch 1 --recompute norms
finish
