#!/bin/sh
# rehearsal.sh WORK: the GPU bundle (scripts/gpu-bundle.sh, tests/gpu/bundle/run.sh) rehearsed
# without a GPU, as the bare GPU machine will see it (make test: gpu/bundle-rehearsal):
#  - the bundle is built as make gpu-bundle builds it, is at most 48 MiB, and is copied into
#    a scratch folder, the emulated programs beside it (gpu-bundle.sh --emulated: the host
#    emulation of CUDA, tests/gpu/emu, and its NCCL);
#  - in a mount namespace (unshare) where the system's HDF5, Open MPI (and PMIx, hwloc,
#    libevent), zstd, xxHash, OpenBLAS (and libgfortran) are hidden under empty files and
#    folders (this checkout's own bin/ftk-pack no longer starts there), run.sh
#      1. emulated, every step: each runs in order (summary.json, kept after every rewrite
#         through FTK_BUNDLE_ON_STEP, counts one more finished step each time, and no step
#         finishes before an earlier one), the steps the emulation can run pass with the
#         bundle's libraries alone (Open MPI's launcher and plugins, the emulated NCCL under
#         mpirun), the others say why they are skipped; every goal figure the emulation can
#         measure is there (exit 0), --plan beside each training run's peak; OUTDIR holds at
#         most 8 plain files of at most 16 MiB (report.md, summary.json, logs.tar.gz, with a
#         log per step), the goals table last;
#      2. every step takes its whole limit (FTK_BUNDLE_FAKE=limits: no step's body runs, a
#         fake clock moves on by each step's GPU limit; no sleep): with the default budget of
#         560 s, every step through opbench runs with its whole limit, bench-7b and opbench
#         among them, the epoch is cut to what is left, the rest is "not run (time budget)",
#         nccl last; exit 1 (no goal figure); with 470 s, opbench is cut, the epoch not run;
#      3. not emulated, without a GPU: the GPU's steps are skipped, saying why, exit 1 (no
#         goal figure; on a machine with a GPU: libs and smoke only, whose pass is then
#         required).
# Exit 77 where the CUDA build, the emulation or unshare is missing, saying why.
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
if [ "${1:-}" = --inside ]; then
    INSIDE=1
    shift
fi
WORK=${1:?usage: rehearsal.sh WORK}
PY=${PYTHON:-/usr/bin/python3}
fails=0
ok() { echo "ok   $1"; }
notok() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { name=$1; shift; if "$@"; then ok "$name"; else notok "$name"; fi; }

if [ -z "${INSIDE:-}" ]; then
    cd "$ROOT" || exit 1
    for f in build/tests/gpu_smoke build/tests/emu/bin/ftk-train build/tests/emu/lib/libnccl.so.2; do
        [ -e "$f" ] || { echo "skipped (no $f: the bundle needs the CUDA build and its emulation, with nccl.h)"; exit 77; }
    done
    . "$ROOT/tests/cli/ns.sh"
    need_unshare
    rm -rf "$WORK" && mkdir -p "$WORK/scratch" || exit 1
    WORK=$(cd "$WORK" && pwd)
    sh scripts/gpu-bundle.sh "$WORK/gpu" || { echo "FAIL: gpu-bundle.sh"; exit 1; }
    sh scripts/gpu-bundle.sh --emulated "$WORK/emu" || { echo "FAIL: gpu-bundle.sh --emulated"; exit 1; }
    kib=$(du -sk "$WORK/gpu" | cut -f1)
    check "the bundle is at most 48 MiB ($kib KiB)" [ "$kib" -le $((48 * 1024)) ]
    check "it holds run.sh, BUILD_INFO and payload.tar.gz" \
        [ "$(ls "$WORK/gpu" | tr '\n' ' ')" = "BUILD_INFO payload.tar.gz run.sh " ]
    cp -r "$WORK/gpu" "$WORK/scratch/gpu" || exit 1
    # the hidden libraries' loader cache entries lead to empty files: whatever still asks for
    # them fails, loudly
    exec $NS sh "$0" --inside "$WORK" ${fails:+$fails}
fi

# --- inside the namespace
fails=${2:-0}
L=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
. "$ROOT/tests/cli/ns.sh"
hidden=0
hide_paths "$WORK/hidden-by" $L/libhdf5* $L/libmpi* $L/libopen-rte* $L/libopen-pal* $L/liboshmem* $L/libpmix* \
    $L/libhwloc* $L/libevent* $L/libzstd* $L/libxxhash* $L/libopenblas* $L/libblas* $L/liblapack* $L/libgfortran* \
    $L/libsz* $L/libaec* /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info
hide_paths "$WORK/hidden-by" $L/hdf5 $L/openmpi $L/pmix2 $L/openblas-openmp $L/openblas-pthread $L/blas $L/lapack \
    /etc/openmpi /usr/share/openmpi
echo "hidden: $hidden files and folders"
check "the system's zstd is hidden" [ ! -s $L/libzstd.so.1 ]
check "this checkout's own ftk-pack no longer starts" sh -c "! '$ROOT/bin/ftk-pack' --help >/dev/null 2>&1"

cd "$WORK/scratch" || exit 1
export GPU_PYTHON=$PY
# without ../shared/data the bundle has no Alpaca files: its benchmarks then say skipped
NODATA=$(grep -c '^data: none' gpu/BUILD_INFO)
SNAP=$WORK/snap
mkdir -p "$SNAP"
# json_get FILE EXPR: EXPR of the parsed summary (s)
json_get() { "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print($2)" "$1"; }
out_ok() { # the files OUTDIR returns: at most 8, plain, at most 16 MiB each
    n=$(ls -A "$1" | wc -l)
    big=$(find "$1" -mindepth 1 \( ! -type f -o -size +16M \) | wc -l)
    [ "$n" -le 8 ] && [ "$big" -eq 0 ]
}

echo "== 1. emulated, every step"
FTK_BUNDLE_EMULATED=$WORK/emu FTK_BUNDLE_WORK=$WORK/w1 \
    FTK_BUNDLE_ON_STEP="cp '$WORK/out1/summary.json' '$SNAP/'\$(printf %03d \$(ls '$SNAP' | wc -l)).json" \
    timeout -k 5 1800 sh gpu/run.sh "$WORK/out1" 3600 >"$WORK/run1.log" 2>&1
rc=$?
sed 's/^/   | /' "$WORK/run1.log"
S=$WORK/out1/summary.json
if [ "$NODATA" = 1 ]; then # no data: no benchmark figure, exit 1
    check "exit 1 (no data: the goal figures missing)" [ $rc -eq 1 ]
else
    check "exit 0: every goal figure the emulation measures is there" [ $rc -eq 0 ]
    check "summary.json: no goal figure missing" [ "$(json_get "$S" 's["goals_missing"]')" = "[]" ]
fi
check "summary.json: 15 of 15 steps finished, none failed" \
    [ "$(json_get "$S" 's["steps_done"], s["steps_total"], s["failed"], s["finished"]')" = "15 15 0 True" ]
check "the order: libs smoke ops bench-7b ops-cudnn train opbench epoch, the rest, nccl last" [ "$(json_get "$S" \
    "' '.join(x['name'] for x in s['steps'])")" = \
    "libs smoke ops bench-7b ops-cudnn train opbench epoch sanitizer ops-all ops-fp32 bench-1b attn-e2e demo nccl" ]
for st in libs smoke train nccl bench-7b epoch; do
    want="== 'pass'"
    case $NODATA$st in 1bench-7b | 1epoch) want="in ('pass', 'skipped (' + '$WORK/w1/bundle/data has no llama2-tokenizer/tokenizer.model or alpaca/*.json)')" ;; esac
    check "$st: pass$([ "$want" = "== 'pass'" ] || echo ', or skipped: the bundle has no data')" [ "$(json_get "$S" "[x['status'] for x in s['steps'] if x['name'] == '$st'][0] $want")" = True ]
done
check "the others: skipped (emulated: why)" [ "$(json_get "$S" "sum(x['status'].startswith('skipped (emulated: ') for x in s['steps'])")" = 9 ]
check "summary.json rewritten after every step, in order" "$PY" - "$SNAP" <<'EOF'
import glob, json, sys
snaps = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/*.json"))]
done = [s["steps_done"] for s in snaps]
# every count from 0 to 15 seen, never going back; a step finished only after the earlier ones
ok = set(range(16)) <= set(done) and done == sorted(done)
for s in snaps:
    fin = [not (x["status"] == "pending" or x["status"].startswith("running")) for x in s["steps"]]
    ok &= fin == sorted(fin, reverse=True) and sum(fin) == s["steps_done"]
print(f"{len(snaps)} rewrites, steps_done {done}")
sys.exit(0 if ok else 1)
EOF
check "OUTDIR: at most 8 plain files of at most 16 MiB" out_ok "$WORK/out1"
check "logs.tar.gz: the log of each step that ran" sh -c "tar -tzf '$WORK/out1/logs.tar.gz' | grep -c '^logs/.*\.log$' | grep -qx 15"
check "report.md ends with the goals table, the epoch's figures in it" sh -c "tail -n 13 '$WORK/out1/report.md' | \
    grep -q '^## Goals' && tail -n 1 '$WORK/out1/report.md' | grep -q '^| peak GPU memory | ' && \
    { [ $NODATA = 1 ] || grep -q '^| Alpaca1024 epoch: wall .*start-up .*weights load .*steps .*end' '$WORK/out1/report.md'; }"
if [ "$NODATA" = 0 ]; then
    R1=$WORK/out1/report.md
    check "--plan beside the peaks: bench-7b's rows, the epoch's, the train step's runs" sh -c "
        grep -q '^| --plan against the measured peak .*plan [0-9.]* GiB.*backend peak [0-9.]* GiB.*Alpaca1024 epoch.*plan [0-9.]* GiB' '$R1' &&
        grep -q '^- bench-7b: .*plan [0-9.]* GiB' '$R1' && grep -q '^- epoch: .*plan [0-9.]* GiB' '$R1' &&
        grep -q '^- train: .*plan [0-9.]* GiB; backend peak [0-9.]* GiB' '$R1'"
    tar -xzOf "$WORK/out1/logs.tar.gz" logs/bench-7b.log logs/epoch.log >"$WORK/bench-epoch.log"
    check "bench-7b: the timed rows without FTK_PROFILE, then a profiled row" [ "$(grep '^ROW ' "$WORK/bench-epoch.log" |
        awk '{print $3, $4, $5}' | sed 's/ [0-9]*$//' | tr '\n' ',')" = "ftk attn=mma,ftk attn=flash,ftk attn=$(grep '^7b_attn_order' \
        "$WORK/w1/goals.txt" | tail -n 1 | cut -f2 | cut -d' ' -f1) profiled," ]
    check "epoch: the fastest attention of bench-7b, --recompute auto, the weights' load against cat" sh -c "
        grep -q '^epoch: attention [a-z]* (the fastest in bench-7b' '$WORK/bench-epoch.log' &&
        grep -q '^| Alpaca1024 epoch: steps | .*--recompute auto' '$R1' &&
        grep -q '^| Alpaca1024 epoch: weights load against cat .* GB/s; cat FILE > /dev/null just after: .* GB/s; ratio ' '$R1'"
fi
check "no work file in OUTDIR, the bundle unpacked outside it" [ -f "$WORK/w1/bundle/env.sh" ]

echo "== 2. every step takes its whole limit (FTK_BUNDLE_FAKE=limits: a fake clock, no sleep)"
FTK_BUNDLE_FAKE=limits FTK_BUNDLE_WORK=$WORK/w2 timeout -k 5 300 sh gpu/run.sh "$WORK/out2" >"$WORK/run2.log" 2>&1
rc=$?
sed 's/^/   | /' "$WORK/run2.log"
S=$WORK/out2/summary.json
check "exit 1: no goal figure" [ $rc -eq 1 ]
check "every step through opbench (bench-7b, opbench among them) ran with its whole limit" [ "$(json_get "$S" \
    "[(x['name'], x['status'], x['limit_s'], x['seconds']) for x in s['steps'][:7]] == [(n, 'pass', l, l) for n, l in
     [('libs', 25), ('smoke', 30), ('ops', 60), ('bench-7b', 180), ('ops-cudnn', 50), ('train', 70), ('opbench', 70)]]")" = True ]
check "the epoch: cut to what was left (45 to 70 s), not skipped" [ "$(json_get "$S" \
    "s['steps'][7]['name'] == 'epoch' and s['steps'][7]['status'] == 'pass (cut from 120 s to what was left)' and
     45 <= s['steps'][7]['limit_s'] <= 70")" = True ]
check "the rest, nccl last: not run (time budget); within the budget" [ "$(json_get "$S" \
    "[x['status'] for x in s['steps'][8:]] == ['not run (time budget)'] * 7 and s['steps'][-1]['name'] == 'nccl' and
     s['elapsed_s'] <= 560")" = True ]
check "every goal figure missing, said" [ "$(json_get "$S" "len(s['goals_missing']) == 6 and s['fake'] == 'limits'")" = True ]
FTK_BUNDLE_FAKE=limits FTK_BUNDLE_WORK=$WORK/w2 timeout -k 5 300 sh gpu/run.sh "$WORK/out2b" 470 >"$WORK/run2b.log" 2>&1
sed 's/^/   | /' "$WORK/run2b.log"
check "a budget of 470 s: bench-7b whole, opbench cut (30 s or more), the epoch not run" [ "$(json_get "$WORK/out2b/summary.json" \
    "s['steps'][3]['limit_s'] == 180 and s['steps'][6]['status'] == 'pass (cut from 70 s to what was left)' and
     30 <= s['steps'][6]['limit_s'] < 70 and s['steps'][7]['status'] == 'not run (time budget)'")" = True ]
check "OUTDIR: at most 8 plain files of at most 16 MiB" out_ok "$WORK/out2"

echo "== 3. not emulated, on this machine"
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    FTK_BUNDLE_STEPS="libs smoke" FTK_BUNDLE_WORK=$WORK/w3 timeout -k 5 300 sh gpu/run.sh "$WORK/out3" 300 >"$WORK/run3.log" 2>&1
    rc=$?
    sed 's/^/   | /' "$WORK/run3.log"
    check "a GPU here: libs and smoke pass" [ "$(json_get "$WORK/out3/summary.json" \
        "[x['status'] for x in s['steps'][:2]] == ['pass'] * 2")" = True ]
else
    FTK_BUNDLE_WORK=$WORK/w3 timeout -k 5 300 sh gpu/run.sh "$WORK/out3" 300 >"$WORK/run3.log" 2>&1
    rc=$?
    sed 's/^/   | /' "$WORK/run3.log"
    S=$WORK/out3/summary.json
    check "exit 1: no goal figure" [ $rc -eq 1 ]
    check "libs: pass (or skipped: no CUDA libraries)" sh -c "[ \"\$('$PY' -c \"import json; print(json.load(open('$S'))['steps'][0]['status'])\")\" = pass ] || \
        grep -q '^| libs | a | skipped (no GPU, and no CUDA libraries' '$WORK/out3/report.md'"
    check "smoke: skipped (no GPU); every later step skipped, saying so" [ "$(json_get "$S" \
        "s['steps'][1]['status'] == 'skipped (no GPU)' and all(x['status'] == 'skipped (no GPU, said the smoke step)' for x in s['steps'][2:])")" = True ]
fi
check "OUTDIR: at most 8 plain files of at most 16 MiB" out_ok "$WORK/out3"
[ $fails -eq 0 ] && echo "all checks passed" || echo "$fails checks failed"
[ $fails -eq 0 ]
