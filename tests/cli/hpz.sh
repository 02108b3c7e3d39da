#!/bin/sh
# CLI tests of the hierarchical strategy, --strategy hpz (engine/hpz.h, docs/communication.md
# "hpz"), on real MPI ranks with nodes simulated on this machine (FTK_SIM_NODE_RANKS):
#  - against full with the same options, on 1 process, 2 ranks (one node) and 4 ranks in nodes of 2
#    (the slow set: 8 in nodes of 4; stories260K's tied shape in the bf16 modes; validation
#    passes): the losses (and validation losses) identical at every step and the last
#    checkpoint's shard files byte-identical to full's (hpz gathers the very bytes full
#    does, and its state is full's: S = world);
#  - each level's bytes and calls per step (metrics.jsonl) equal the formula recomputed here
#    (also with validation passes between the steps: they gather over the world and leave
#    the secondary copy alone)
#    from the manifest's padded unit lengths (M micro-batches, W ranks, n per node group):
#    world all-gather (1 − 1/W)·b·ΣP, once per unit; node all-gather
#    (1 − 1/n)·b·((2M − 1)·ΣP_blocks + (M − 1)·(P_embedding + P_head)); world reduce-scatter
#    (1 − 1/W)·b_grad·M·ΣP, M per unit;
#  - --report: the levels world (intra- and inter-node) and node (intra-node), every row's
#    measured / analytical 1.000000; --node-size 2 without simulated nodes gives the same
#    levels' sizes;
#  - resume full → hpz and hpz → full (--stop-after, then --resume auto with the other
#    strategy): losses identical to the uninterrupted full run at every step, the last shard
#    files byte-identical; ftk-reshard --strategy hpz keeps the shard files, ftk-verify passes;
#  - refusals (exit 2, nothing written): --node-size not dividing the ranks, --node-size
#    without hpz, simulated nodes of unequal size.
# Usage: tests/cli/hpz.sh BIN_DIR WORK_DIR [slow]   (slow: instead, 8 ranks in nodes of 4, the tied
#        shape in the bf16 modes and validation passes)
set -u
BIN=$1 WORK=$2 ONLY=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi
if ! "$PY" -c 'import json' 2>/dev/null; then
    echo "skipped ($PY not found)"
    exit 77
fi

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/tiny.h5" tiny 1
demo_init "$WORK/s260.h5" stories260k 1
T="$BIN/ftk-train -d $WORK/demo.h5 --global-batch 16 --micro-batch 2 --lr 2e-3 --warmup 2 -j1 -q"

losses() { grep -o '"loss": [0-9.e+-]*\|"val_loss": [0-9.e+-]*' "$1/metrics.jsonl"; }
# same_shard_files NAME RUN_A RUN_B STEP: the shard files byte-identical (manifests name their strategy)
same_shard_files() {
    d=$(printf 'step-%08d' "$4")
    n=0 bad=0
    for f in "$2/$d"/shard-*; do
        n=$((n + 1))
        cmp -s "$f" "$3/$d/${f##*/}" || bad=1
    done
    if [ $n -gt 0 ] && [ $bad = 0 ] && [ "$(ls "$3/$d" | grep -c '^shard-')" = $n ]; then ok "$1 ($n shard files)"; else
        notok "$1: $2/$d and $3/$d differ"
    fi
}

# check_volumes NAME RUN NODE_SIZE PRECISION: every step line's figures against the formulas
check_volumes() {
    if "$PY" - "$2" "$3" "$4" <<'EOF'; then ok "$1: bytes and calls per level = formulas"; else notok "$1"; fi
import json, os, sys
run, n, prec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
last = sorted(d for d in os.listdir(run) if d.startswith("step-"))[-1]
man = json.load(open(f"{run}/{last}/manifest.json"))
bad = []
def need(cond, what):
    if not cond:
        bad.append(what)
W = man["world_size"]
need(man["strategy"] == "hpz" and man["shard_count"] == W, f"strategy {man['strategy']}, {man['shard_count']} shards")
P = [u["padded"] for u in man["units"]]
need(all(p % W == 0 for p in P), "units padded to the world size")
blocks, ends = sum(P[1:-1]), P[0] + P[-1]
b_ag, b_rs = {"fp32": (4, 4), "bf16-mixed": (2, 4), "bf16-true": (2, 2)}[prec]
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"kind": "step"' in l]
need(len(steps) >= 2, f"{len(steps)} step lines")
for s in steps:
    M = s["micro_batches"]
    fw, fn = (W - 1) / W, (n - 1) / n
    want = {("world", "all_gather"): (len(P), fw * b_ag * sum(P)),
            ("node", "all_gather"): ((2 * M - 1) * (len(P) - 2) + (M - 1) * 2,
                                     fn * b_ag * ((2 * M - 1) * blocks + (M - 1) * ends)),
            ("world", "reduce_scatter"): (M * len(P), fw * b_rs * M * sum(P))}
    coll = s["collectives"]
    need(sorted({c["level"] for c in coll}) == ["node", "world"], f"step {s['step']}: levels {[c['level'] for c in coll]}")
    for c in coll:
        calls, w = want.get((c["level"], c["kind"]), (0, 0))
        need(abs(c["bytes"] - w) <= 1e-9 * max(w, 1), f"step {s['step']} {c['level']} {c['kind']}: {c['bytes']} B, formula {w}")
        need(c["bytes"] == c["formula_bytes"], f"step {s['step']} {c['level']} {c['kind']}: formula_bytes {c['formula_bytes']}")
        need(c["calls"] == calls, f"step {s['step']} {c['level']} {c['kind']}: {c['calls']} calls, expected {calls}")
for x in bad[:10]:
    print("     |", x)
sys.exit(1 if bad else 0)
EOF
}

# versus_full TAG NP SIM MODEL PRECISION EVAL [OPTIONS]: full, then hpz with the same options
# (4 steps, a checkpoint every 2, validation every EVAL steps), compared; RUN_FULL and RUN_HPZ
versus_full() {
    tag=$1 np=$2 sim=$3 model=$4 prec=$5 ev=$6
    shift 6
    id=$(echo "$np-$sim-$model-$prec-$ev-$*" | tr -d ' ')
    RUN_FULL="$WORK/full-$id" RUN_HPZ="$WORK/hpz-$id"
    for s in full hpz; do
        expect "$tag: $s" 0 $TO env FTK_SIM_NODE_RANKS=$sim $MPI -np "$np" $T -m "$WORK/$model.h5" --steps 4 \
            --save-every 2 --eval-every "$ev" --precision "$prec" -o "$WORK/$s-$id" --report "$WORK/$s-$id.md" \
            --strategy $s "$@"
    done
    losses "$RUN_FULL" >"$WORK/l.full"
    losses "$RUN_HPZ" >"$WORK/l.hpz"
    check "$tag: 4 losses$([ "$ev" = 0 ] || echo ' and the validation losses')" \
        test "$(grep -c '"loss"' "$WORK/l.hpz")" = 4 -a "$(grep -c '"val_loss"' "$WORK/l.hpz")" = $((ev ? 4 / ev + 1 : 0))
    same "$tag: losses identical to full's at every step" "$WORK/l.hpz" "$WORK/l.full"
    same_shard_files "$tag: last checkpoint's shard files identical to full's" "$RUN_HPZ" "$RUN_FULL" 4
}

if [ "$ONLY" = slow ]; then
    # 8 ranks in nodes of 4; the tied shape in the bf16 modes, with validation passes (they
    # gather from the secondary copy refreshed after each step)
    versus_full "8 ranks, nodes of 4, tiny, fp32" 8 4 tiny fp32 0 --global-batch 32
    check_volumes "8 ranks, nodes of 4, M = 2" "$RUN_HPZ" 4 fp32
    grep -qF '| node | 4 | intra-node | all-gather |' "$RUN_HPZ.md" && ok "... the report's node level: 4 ranks" ||
        notok "... the report's node level: 4 ranks"
    for prec in bf16-mixed bf16-true; do
        versus_full "4 ranks, nodes of 2, stories260K (tied), $prec, validation" 4 2 s260 $prec 2
        check_volumes "4 ranks, nodes of 2, stories260K, $prec, M = 2, validation" "$RUN_HPZ" 2 $prec
        versus_full "4 ranks, nodes of 2, stories260K (tied), $prec" 4 2 s260 $prec 0 --micro-batch 1
        check_volumes "4 ranks, nodes of 2, stories260K, $prec, M = 4" "$RUN_HPZ" 2 $prec
    done
    finish
    exit
fi

# --- the same losses and weights as full; bytes per level; the report ---------------------
for s in full hpz; do # one process: hpz is full (one shard, nothing to gather)
    expect "1 process, tiny: $s" 0 $TO $T -m "$WORK/tiny.h5" --steps 2 --eval-every 0 -o "$WORK/one-$s" --strategy $s
done
losses "$WORK/one-full" >"$WORK/l.full"
losses "$WORK/one-hpz" >"$WORK/l.hpz"
same "1 process: losses identical to full's" "$WORK/l.hpz" "$WORK/l.full"
versus_full "2 ranks, one node, tiny" 2 "" tiny fp32 0
check_volumes "2 ranks, one node of 2, M = 4" "$RUN_HPZ" 2 fp32
versus_full "4 ranks, nodes of 2, tiny, validation every 2 steps" 4 2 tiny fp32 2
check_volumes "4 ranks, nodes of 2, M = 2, validation passes between steps" "$RUN_HPZ" 2 fp32
F4=$RUN_FULL Z4=$RUN_HPZ
f="$Z4.md"
miss=""
for h in "strategy hpz" "- Level \`world\`: 4 ranks, intra- and inter-node" "- Level \`node\`: 2 ranks, intra-node" \
    "| world | 4 | intra- and inter-node | all-gather |" "| world | 4 | intra- and inter-node | reduce-scatter |" \
    "| node | 2 | intra-node | all-gather |" "hpz keeps its node groups of 2 ranks"; do
    grep -qF -- "$h" "$f" || miss="$miss [$h]"
done
grep '^| [a-z_]* | [0-9]* | [a-z -]* | [a-z-]* | ' "$f" | awk -F'|' '$9 != " 1.000000 " { bad = 1 } END { exit bad }' ||
    miss="$miss [a volume differs from its formula]"
[ -z "$miss" ] && ok "the report: levels world and node, every volume = its formula" ||
    notok "the report: missing or wrong:$miss"
expect "4 ranks, one real node, --node-size 2" 0 $TO $MPI -np 4 $T -m "$WORK/tiny.h5" --steps 2 --eval-every 0 \
    --strategy hpz --node-size 2 -o "$WORK/ns2" --report "$WORK/ns2.md"
check_volumes "--node-size 2" "$WORK/ns2" 2 fp32
grep -qF "| node | 2 | intra-node | all-gather |" "$WORK/ns2.md" && ok "... node groups of 2 in the report" ||
    notok "... node groups of 2 in the report"

# --- resume across strategies, ftk-reshard ----------------------------------------------------
R="$TO env FTK_SIM_NODE_RANKS=2 $MPI -np 4 $T -m $WORK/tiny.h5 --steps 4 --save-every 2 --eval-every 2"
losses "$F4" >"$WORK/l.ref"
for pair in "full hpz" "hpz full"; do
    set -- $pair
    expect "$1 --stop-after 3: exit 75" 75 $R -o "$WORK/r-$1" --strategy "$1" --stop-after 3
    expect "... --resume auto --strategy $2" 0 $R -o "$WORK/r-$1" --strategy "$2" --resume auto
    losses "$WORK/r-$1" >"$WORK/l.r"
    same "$1 → $2: losses identical to full's at every step" "$WORK/l.r" "$WORK/l.ref"
    same_shard_files "$1 → $2: step 4's shard files identical to full's" "$WORK/r-$1" "$F4" 4
done
grep -q '"strategy": "hpz"' "$WORK/r-full/step-00000004/manifest.json" && ok "the manifest records hpz" ||
    notok "the manifest records hpz"
expect "ftk-verify of an hpz checkpoint" 0 "$BIN/ftk-verify" "$WORK/r-full"
expect "ftk-reshard full -> hpz (4 ranks)" 0 "$BIN/ftk-reshard" "$F4" -o "$WORK/rs" -n 4 --strategy hpz
grep -q '"strategy": "hpz"' "$WORK/rs/step-00000004/manifest.json" && ok "... recorded as hpz" || notok "... recorded as hpz"
same_shard_files "... the shard files unchanged" "$WORK/rs" "$F4" 4

# --- refusals ---------------------------------------------------------------------------------
expect "--node-size 3 on 4 ranks: exit 2" 2 $TO $MPI -np 4 $T -m "$WORK/tiny.h5" --steps 1 --strategy hpz \
    --node-size 3 -o "$WORK/bad1"
check "... naming --node-size, nothing written" sh -c "grep -q -- '--node-size 3 does not divide' '$WORK/err' && \
    [ ! -e '$WORK/bad1' ]"
expect "--node-size with full: exit 2" 2 $T -m "$WORK/tiny.h5" --steps 1 --node-size 2 -o "$WORK/bad2"
check "... saying it is for hpz, nothing written" sh -c "grep -q -- '--node-size is for --strategy hpz' '$WORK/err' && \
    [ ! -e '$WORK/bad2' ]"
expect "FTK_SIM_NODE_RANKS=3 on 4 ranks: unequal nodes refused (exit 2)" 2 $TO env FTK_SIM_NODE_RANKS=3 $MPI -np 4 \
    $T -m "$WORK/tiny.h5" --steps 1 --strategy hpz -o "$WORK/bad3"
check "... saying the nodes are simulated, nothing written" sh -c "grep -q 'simulated: FTK_SIM_NODE_RANKS' \
    '$WORK/err' && [ ! -e '$WORK/bad3' ]"
finish
