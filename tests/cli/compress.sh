#!/bin/sh
# Compressed collectives (engine/compress.h, docs/communication.md "Compressed collectives")
# on 2 MPI ranks with the tiny preset:
#  - --compress-weights int8 against the same run without, --strategy full: every step's
#    loss within a bound of the uncompressed run's (quick: fp32, 12 steps, 2e-3 relative,
#    measured 3.1e-4; long: fp32 and bf16-mixed, 300 steps, 7e-2, measured 3.5e-2 both,
#    and the last validation loss within 1e-2, measured 1.4e-3 and 3.8e-3);
#  - the gathers' bytes: each step's measured all-gather bytes equal the formula of the
#    packed parts, recomputed here from the manifest (S parts of 4·ceil(n/256) + n bytes
#    rounded up to 16, n = padded/S, for each gather), and are at most 0.26 of the
#    uncompressed run's in fp32 and 0.52 in bf16; the reduce-scatters are unchanged;
#  - --compress-grads bf16 (error feedback), fp32, full: every step's loss within 1e-4 of
#    the uncompressed run's (12 steps, measured 4.3e-6), the reduce-scatters' bytes half
#    of the f32 run's and equal to the report's formula;
#  - grad-op (bf16-mixed, both switches) and hybrid on 4 ranks in simulated nodes of 2
#    (int8 weights): measured bytes = the report's formula on every level;
#  - the memory plan (--plan) equals the run's high-water mark with the packed buffers, and
#    with the residual of --compress-grads;
#  - both switches, a run stopped after 2 steps and resumed gives the uninterrupted run's
#    losses bit for bit: the checkpoint holds each rank's residual (manifest compress_grads,
#    /grad_residual/UNIT in every shard file, ftk-verify checks them); the same checkpoint
#    through ftk-reshard (which drops the residuals, warning) resumes to other losses;
#    A background save (--async-save) holds them too: a resume from it is bit for bit;
#    a residual forged one element short is damage to ftk-verify and to --resume auto, which
#    falls back to the checkpoint before (and its step 3 is the uninterrupted run's);
#  - usage errors (exit 2 naming the option, nothing written): another value of either
#    option; --compress-grads with hybrid, none or bf16-true.
# Usage: tests/cli/compress.sh BIN_DIR WORK_DIR [long]
set -u
BIN=$1 WORK=$2 LONG=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/init.h5" tiny 1
if [ "$LONG" = long ]; then
    STEPS=300 TOL=7e-2 EVAL="--eval-every 300"
else
    STEPS=12 TOL=2e-3 EVAL="--eval-every 0"
fi
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 2 --lr 2e-3 --warmup 2 -j1 -q"

# check_bytes NAME RUN BASE B: RUN's all-gather bytes = the packed formula, <= B of BASE's
check_bytes() {
    if "$PY" - "$2" "$3" "$4" <<'EOF'; then ok "$1: gathered bytes = packed formula, ratio bound"; else notok "$1"; fi
import glob, json, sys
run, base, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
man = json.load(open(sorted(glob.glob(f"{run}/step-*/manifest.json"))[-1]))
S = man["shard_count"]
P = [u["padded"] for u in man["units"]]
def part(n):  # compress.h: scales, codes, zeros to a multiple of 16
    return (4 * ((n + 255) // 256) + n + 15) // 16 * 16
g = [S * part(p // S) for p in P]
def steps(r):
    return [json.loads(l) for l in open(f"{r}/metrics.jsonl") if '"kind": "step"' in l]
bad = []
for s, b in zip(steps(run), steps(base)):
    M = s["micro_batches"]
    want = (S - 1) / S * M * (2 * sum(g[1:-1]) + g[0] + g[-1])
    ag = s["comm"]["allgather_bytes"]
    if abs(ag - want) > 1e-9 * want:
        bad.append(f"step {s['step']}: {ag} B gathered, formula {want}")
    if ag > bound * b["comm"]["allgather_bytes"]:
        bad.append(f"step {s['step']}: {ag} B against {b['comm']['allgather_bytes']} uncompressed")
    if s["comm"]["reduce_scatter_bytes"] != b["comm"]["reduce_scatter_bytes"]:
        bad.append(f"step {s['step']}: reduce-scatter bytes changed")
    for c in s["collectives"]:
        if c["bytes"] != c["formula_bytes"]:
            bad.append(f"step {s['step']} {c['level']} {c['kind']}: {c['bytes']} B, report's formula {c['formula_bytes']}")
last = steps(run)[-1]["comm"]["allgather_bytes"] / steps(base)[-1]["comm"]["allgather_bytes"]
print(f"     all-gather bytes {last:.4f} of the uncompressed run's")
for b in bad[:5]:
    print("    ", b)
sys.exit(1 if bad else 0)
EOF
}

# last_val RUN: the last validation loss
last_val() { grep '"kind": "eval"' "$1/metrics.jsonl" | tail -n 1 | sed 's/.*"val_loss": \([0-9.e+-]*\).*/\1/'; }

PRECS="fp32 bf16-mixed"
[ "$LONG" = long ] || PRECS=fp32 # quick: bf16-mixed's pair in the long run only
for prec in $PRECS; do
    bound=$([ $prec = fp32 ] && echo 0.26 || echo 0.52)
    expect "$prec, full: $STEPS steps" 0 $TO $MPI -np 2 $T --steps $STEPS $EVAL --precision $prec -o "$WORK/$prec"
    expect "$prec, full, --compress-weights int8: $STEPS steps" 0 $TO $MPI -np 2 $T --steps $STEPS $EVAL \
        --precision $prec --compress-weights int8 -o "$WORK/$prec-int8"
    close_losses "$prec: int8 weights' losses within $TOL of the uncompressed run's" "$WORK/$prec-int8" "$WORK/$prec" \
        $TOL $STEPS
    check_bytes "$prec" "$WORK/$prec-int8" "$WORK/$prec" $bound
    if [ "$LONG" = long ]; then
        a=$(last_val "$WORK/$prec") b=$(last_val "$WORK/$prec-int8")
        if awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d
                printf "     validation %s against %s: %.3g\n", b, a, d; exit !(d <= 1e-2) }'
        then ok "$prec: the last validation loss within 1e-2"; else notok "$prec: the last validation loss"; fi
    fi
done
[ "$LONG" = long ] && { finish; exit $?; }

expect "fp32, full, --compress-grads bf16: $STEPS steps" 0 $TO $MPI -np 2 $T --steps $STEPS $EVAL \
    --compress-grads bf16 -o "$WORK/grads"
close_losses "fp32: bf16 gradients with error feedback within 1e-4 of the uncompressed run's" "$WORK/grads" \
    "$WORK/fp32" 1e-4 $STEPS
if "$PY" - "$WORK/grads" "$WORK/fp32" <<'EOF'; then ok "--compress-grads: half the reduce-scatter bytes = formula"; else notok "--compress-grads bytes"; fi
import json, sys
def steps(r):
    return [json.loads(l) for l in open(f"{r}/metrics.jsonl") if '"kind": "step"' in l]
bad = 0
for s, b in zip(steps(sys.argv[1]), steps(sys.argv[2])):
    rs, rs0 = s["comm"]["reduce_scatter_bytes"], b["comm"]["reduce_scatter_bytes"]
    if 2 * rs != rs0 or any(c["bytes"] != c["formula_bytes"] for c in s["collectives"]):
        print("    ", s["step"], rs, rs0, s["collectives"])
        bad += 1
sys.exit(1 if bad else 0)
EOF

# grad-op and hybrid: the report's formula follows the packed parts
expect "grad-op bf16-mixed int8, bf16 gradients: 3 steps" 0 $TO $MPI -np 2 $T --steps 3 --eval-every 0 \
    --strategy grad-op --precision bf16-mixed --compress-weights int8 --compress-grads bf16 -o "$WORK/gradop"
expect "hybrid 4 ranks, nodes of 2, int8: 3 steps" 0 env FTK_SIM_NODE_RANKS=2 $TO $MPI -np 4 $T --steps 3 \
    --eval-every 0 --strategy hybrid --compress-weights int8 -o "$WORK/hybrid"
for r in gradop hybrid; do
    if "$PY" - "$WORK/$r" <<'EOF'; then ok "$r: measured bytes = the report's formula"; else notok "$r"; fi
import json, sys
bad = 0
for l in open(f"{sys.argv[1]}/metrics.jsonl"):
    if '"kind": "step"' in l:
        s = json.loads(l)
        for c in s["collectives"]:
            if c["bytes"] != c["formula_bytes"] or (c["kind"] == "all_gather" and c["level"] != "replicas" and c["calls"] == 0):
                print("    ", s["step"], c)
                bad += 1
sys.exit(1 if bad else 0)
EOF
done

# the plan counts the packed buffers and the residual: it equals the measured peak
for x in "fp32-int8 --compress-weights int8" "grads --compress-grads bf16"; do
    set -- $x
    run=$1
    shift
    expect "--plan, full fp32 $*, 2 ranks" 0 $BIN/ftk-train --plan -m "$WORK/init.h5" -d "$WORK/demo.h5" \
        --micro-batch 2 --global-batch 8 --ranks 2 "$@"
    want=$(sed -n 's/^  total .*(\([0-9]*\) bytes,.*/\1/p' "$WORK/out")
    got=$(sed -n 's/.*"mem_peak_bytes": \([0-9]*\)}$/\1/p' "$WORK/$run/metrics.jsonl" | tail -n 1)
    if [ -n "$want" ] && [ "$want" = "$got" ]; then ok "plan $want B = measured peak"; else
        notok "plan ${want:-?} B, measured ${got:-?} B"; fi
done

# stopped and resumed: the same bits as the uninterrupted run
R="$T --steps 4 --eval-every 0 --compress-weights int8 --compress-grads bf16"
expect "both: 4 steps, an --async-save checkpoint at step 2" 0 $TO $MPI -np 2 $R -o "$WORK/whole" --save-every 2 \
    --async-save
expect "both: stop after 2" 75 $TO $MPI -np 2 $R -o "$WORK/cut" --stop-after 2
ck=$WORK/cut/step-00000002
grep -q '"compress_grads": "bf16"' "$ck/manifest.json" && ok "the manifest records compress_grads" ||
    notok "the manifest records no compress_grads"
expect "ftk-verify: the residuals verify" 0 $BIN/ftk-verify "$ck"
grep -q "33 datasets" "$WORK/out" && ok "... 33 datasets: 3 kinds and the residual of 4 units, 2 shards, tokenizer" ||
    notok "... $(cat "$WORK/out")"
expect "ftk-reshard to the same 2 ranks" 0 $BIN/ftk-reshard "$ck" -o "$WORK/resharded" --ranks 2
grep -q "residuals are not carried over" "$WORK/err" && ok "... warns that the residuals are dropped" ||
    notok "... no warning: $(cat "$WORK/err")"
expect "both: resumed" 0 $TO $MPI -np 2 $R -o "$WORK/cut" --resume auto
if [ -s "$WORK/cut/metrics.jsonl" ] && [ "$(loss_steps "$WORK/cut" | sort -n -u)" = "$(loss_steps "$WORK/whole")" ]; then
    ok "the resumed run's losses = the uninterrupted run's, bit for bit"
else
    notok "the resumed run's losses differ"
fi
expect "both: resumed from the background save of step 2" 0 $TO $MPI -np 2 $R -o "$WORK/from-async" \
    --resume "$WORK/whole/step-00000002"
if [ "$(loss_steps "$WORK/from-async" | sort -n -u)" = "$(loss_steps "$WORK/whole" | tail -n 2)" ]; then
    ok "... steps 3-4 bit for bit: the snapshot holds the residuals"
else
    notok "... steps 3-4 differ"
fi
expect "both: resumed from the resharded checkpoint" 0 $TO $MPI -np 2 $R -o "$WORK/resharded" --resume auto
grep -q "residuals start at zero" "$WORK/err" && ok "... says the residuals start at zero" || notok "... no warning"
loss_steps "$WORK/resharded" | sort -n -u | tail -n 2 >"$WORK/l.drop"
loss_steps "$WORK/whole" | tail -n 2 >"$WORK/l.whole"
if [ -s "$WORK/l.drop" ] && ! cmp -s "$WORK/l.drop" "$WORK/l.whole"; then
    ok "... and other losses: the residuals matter to bit-exactness"
else
    notok "... the same losses without the residuals"
fi

# a residual forged one element short (checksums and seal recomputed): damage to ftk-verify and
# to the resume, which falls back to step 2 and continues bit for bit (it once verified, and the
# resume exited 1 with no fall-back)
if "$PY" -c 'import h5py' 2>/dev/null; then
    rm -rf "$WORK/forged" && cp -r "$WORK/whole" "$WORK/forged"
    F=$WORK/forged/step-00000004
    n=$(sed -n 's/.*"name": "layer.0", "length": [0-9]*, "padded": \([0-9]*\).*/\1/p' "$F/manifest.json")
    "$PY" "$ROOT/tests/fault/forge.py" "$F/shard-00002-of-00002.h5" /grad_residual/layer.0 reshape:$((n - 1)) \
        >/dev/null && "$PY" "$ROOT/tests/fault/forge.py" "$F/manifest.json" --sums >/dev/null || notok "forging failed"
    expect "a residual one element short: ftk-verify exit 3" 3 $BIN/ftk-verify "$F"
    grep -q "shard-00002-of-00002.h5: dataset /grad_residual/layer.0: shape \[$((n - 1))\], not \[$n\]" "$WORK/err" &&
        ok "... names the dataset and its shape" || notok "... $(cat "$WORK/err")"
    expect "... --resume auto falls back to step 2 (exit 75 after a step)" 75 $TO $MPI -np 2 $R -o "$WORK/forged" \
        --resume auto --stop-after 1
    grep -q "step-00000004 is damaged (.*grad_residual/layer.0" "$WORK/err" && ok "... says step 4 is damaged" ||
        notok "... $(cat "$WORK/err")"
    a=$(loss_steps "$WORK/forged" | sed -n 3p) b=$(loss_steps "$WORK/whole" | sed -n 3p)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        ok "... step 3 from step 2's residuals: the uninterrupted run's loss, bit for bit"
    else
        notok "... step 3's loss differs from the uninterrupted run's"
    fi
else
    echo "skip the forged residual ($PY lacks h5py)"
fi

for x in "--compress-grads int8|need off or bf16" "--compress-grads bf16 --strategy hybrid|for --strategy full or grad-op" \
    "--compress-grads bf16 --strategy none|for --strategy full or grad-op" \
    "--compress-grads bf16 --precision bf16-true|bf16 already"; do
    args=${x%%|*} msg=${x#*|}
    expect "$args: usage error" 2 $BIN/ftk-train -m "$WORK/init.h5" -d "$WORK/demo.h5" -o "$WORK/bad" $args
    grep -q -- "$msg" "$WORK/err" && [ ! -e "$WORK/bad" ] && ok "... says \"$msg\", writes nothing" ||
        notok "... message or leftovers: $(cat "$WORK/err")"
done
expect "--compress-weights int4: usage error" 2 $BIN/ftk-train -m "$WORK/init.h5" -d "$WORK/demo.h5" -o "$WORK/bad" \
    --compress-weights int4
grep -q -- "--compress-weights int4: need off or int8" "$WORK/err" && [ ! -e "$WORK/bad" ] &&
    ok "... names the option, writes nothing" || notok "... message or leftovers: $(cat "$WORK/err")"
finish
