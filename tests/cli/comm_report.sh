#!/bin/sh
# The communication and time report (engine/report.h, docs/communication.md) on real MPI
# ranks, with nodes simulated on this machine (FTK_SIM_NODE_RANKS):
#  - hybrid on 4 ranks in simulated nodes of 2 and on 8 ranks in nodes of 4: the default
#    shard group is the simulated node (the manifest's shard count), the levels are
#    shard_group (intra-node) and replicas (inter-node); without the variable the 4 ranks
#    are one node (one group of 4); full on 4 ranks has the one level "world";
#  - every step line of metrics.jsonl: each collective's measured bytes equal the formula
#    recomputed here from the manifest's unit lengths (all-gather and reduce-scatter
#    (1 − 1/p)·N·b, all-reduce 2(1 − 1/p)·N·b; docs/design.md "Volumes"), the level figures
#    sum to the comm totals, and the time split adds up: compute + exposed communication +
#    host = step_s within 1e-5 s (the rounding of three figures printed to 1e-6 s), no part
#    negative, overlapped communication within the time collectives were in flight, the
#    collectives' exposed seconds within the step's;
#  - --report FILE.md exists with its three tables, every analytical volume matched
#    (measured / analytical 1.000000), the projection labelled and the measured row in it;
#  - a bad FTK_SIM_NODE_RANKS is a usage error (exit 2) with nothing written.
# No figure here is a timing bound: the checks are identities and inequalities that hold
# however slow the machine is.
# Usage: tests/cli/comm_report.sh BIN_DIR WORK_DIR
set -u
BIN=$1 WORK=$2
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
demo_init "$WORK/init.h5" tiny 1
T="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 8 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 -j1 -q --steps 3"

# check_run NAME RUN STRATEGY SHARDS LEVELS: the metrics and manifest of RUN (see above)
check_run() {
    if "$PY" - "$2" "$3" "$4" "$5" <<'EOF'; then ok "$1: volumes = formulas, parts add up, levels"; else notok "$1"; fi
import json, sys
run, strategy, shards, levels = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
man = json.load(open(f"{run}/step-00000003/manifest.json"))
bad = []
def need(cond, what):
    if not cond:
        bad.append(what)
need(man["shard_count"] == shards, f"shard count {man['shard_count']}, expected {shards}")
W = man["world_size"]
S = shards if strategy == "hybrid" else W
G = W // S
L = [u["length"] for u in man["units"]]
P = [(n + S - 1) // S * S for n in L]
need(P == [u["padded"] for u in man["units"]], "padded sizes")
b = 4  # fp32: every collective moves 4-byte elements
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"kind": "step"' in l]
need(len(steps) == 3, f"{len(steps)} step lines")
for s in steps:
    M = s["micro_batches"]
    f = (S - 1) / S
    want = {}
    if strategy in ("full", "hybrid"):
        want[(levels[0], "all_gather")] = f * b * M * (2 * sum(P[1:-1]) + P[0] + P[-1])
        want[(levels[0], "reduce_scatter")] = f * b * M * sum(P)
    if strategy == "hybrid" and G > 1:
        want[(levels[1], "all_reduce")] = 2 * (G - 1) / G * b * sum(p // S for p in P)
    coll = s["collectives"]
    need(sorted({c["level"] for c in coll}) == sorted(levels), f"step {s['step']}: levels {[c['level'] for c in coll]}")
    tot = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
    for c in coll:
        w = want.get((c["level"], c["kind"]), 0)
        need(abs(c["bytes"] - w) <= 1e-9 * max(w, 1), f"step {s['step']} {c['level']} {c['kind']}: {c['bytes']} B, formula {w}")
        need(c["bytes"] == c["formula_bytes"], f"step {s['step']} {c['level']} {c['kind']}: formula_bytes {c['formula_bytes']}")
        need((c["calls"] > 0) == (w > 0), f"step {s['step']} {c['level']} {c['kind']}: {c['calls']} calls")
        tot[c["kind"]] += c["bytes"]
    cm = s["comm"]
    for k, key in (("all_gather", "allgather_bytes"), ("reduce_scatter", "reduce_scatter_bytes"), ("all_reduce", "allreduce_bytes")):
        need(abs(tot[k] - cm[key]) <= 1e-9 * max(cm[key], 1), f"step {s['step']}: {k} levels sum {tot[k]} != {cm[key]}")
    sp = s["split"]
    parts = sp["compute_s"] + sp["exposed_comm_s"] + sp["host_s"]
    need(abs(parts - sp["step_s"]) <= 1e-5, f"step {s['step']}: parts {parts} != step {sp['step_s']}")
    need(min(sp["compute_s"], sp["exposed_comm_s"], sp["host_s"], sp["overlapped_comm_s"]) >= -1e-6, f"step {s['step']}: a negative part {sp}")
    need(sp["overlapped_comm_s"] <= sp["comm_inflight_s"] + 1e-6, f"step {s['step']}: overlapped > in flight {sp}")
    need(abs(sp["exposed_comm_s"] - cm["wait_s"]) <= 1e-4, f"step {s['step']}: exposed {sp['exposed_comm_s']} != wait_s {cm['wait_s']}")
    need(sum(c["wait_s"] for c in coll) <= sp["exposed_comm_s"] + 1e-5, f"step {s['step']}: collectives' waits above the exposed time")
    need(sp["step_s"] * s["tokens_per_s"] > 0, "step_s and tokens_per_s")
for x in bad[:10]:
    print("     |", x)
sys.exit(1 if bad else 0)
EOF
}

# check_report NAME FILE LEVEL:WHERE...: the report's tables
check_report() {
    name=$1 f=$2
    shift 2
    miss=""
    for h in "# Communication and time report" "## Time per step" "| compute |" "| exposed communication |" \
        "| host |" "| overlapped communication" "## Collectives per step" "| bytes measured | bytes analytical |" \
        "## Projected step time on other rank counts (a projection, not a measurement)" "(measured) |"; do
        grep -qF -- "$h" "$f" || miss="$miss [$h]"
    done
    for lw in "$@"; do
        grep -q "^| ${lw%%:*} | [0-9]* | ${lw#*:} | " "$f" || miss="$miss [level ${lw%%:*}: ${lw#*:}]"
    done
    # every collective row matched its formula
    grep '^| [a-z_]* | [0-9]* | [a-z -]* | [a-z-]* | ' "$f" | awk -F'|' '$9 != " 1.000000 " { bad = 1 } END { exit bad }' ||
        miss="$miss [a volume differs from its formula]"
    if [ -z "$miss" ]; then ok "$name"; else
        notok "$name: missing or wrong:$miss"
        sed 's/^/     | /' "$f" | head -n 30
    fi
}

# hybrid, 4 ranks in simulated nodes of 2
expect "hybrid on 4 ranks, FTK_SIM_NODE_RANKS=2, --report" 0 $TO env FTK_SIM_NODE_RANKS=2 $MPI -np 4 $T \
    --strategy hybrid -o "$WORK/h4" --report "$WORK/h4.md"
check_run "hybrid 4 ranks, nodes of 2: shard groups of 2" "$WORK/h4" hybrid 2 shard_group,replicas
check_report "hybrid 4 ranks, nodes of 2: the report" "$WORK/h4.md" shard_group:intra-node replicas:inter-node
grep -q "2 nodes" "$WORK/h4.md" && grep -q "simulated" "$WORK/h4.md" && ok "... says 2 simulated nodes" ||
    notok "... says 2 simulated nodes"

# hybrid, 8 ranks in simulated nodes of 4
expect "hybrid on 8 ranks, FTK_SIM_NODE_RANKS=4, --report" 0 $TO env FTK_SIM_NODE_RANKS=4 $MPI -np 8 $T \
    --strategy hybrid -o "$WORK/h8" --report "$WORK/h8.md"
check_run "hybrid 8 ranks, nodes of 4: shard groups of 4" "$WORK/h8" hybrid 4 shard_group,replicas
check_report "hybrid 8 ranks, nodes of 4: the report" "$WORK/h8.md" shard_group:intra-node replicas:inter-node

# the real node: this machine's 4 ranks are one node, one shard group of 4
expect "hybrid on 4 ranks, real nodes" 0 $TO $MPI -np 4 $T --strategy hybrid -o "$WORK/h4real"
check_run "hybrid 4 ranks on one real node: one group of 4" "$WORK/h4real" hybrid 4 shard_group,replicas

# full: one level
expect "full on 4 ranks in simulated nodes of 2, --report" 0 $TO env FTK_SIM_NODE_RANKS=2 $MPI -np 4 $T \
    -o "$WORK/f4" --report "$WORK/f4.md"
check_run "full 4 ranks: one level" "$WORK/f4" full 4 world
check_report "full 4 ranks: the report" "$WORK/f4.md" "world:intra- and inter-node"

# refusals
expect "FTK_SIM_NODE_RANKS=x: exit 2" 2 $TO env FTK_SIM_NODE_RANKS=x $MPI -np 2 $T --strategy hybrid -o "$WORK/bad"
check "... naming it, nothing written" sh -c "grep -q 'FTK_SIM_NODE_RANKS=x' '$WORK/err' && [ ! -e '$WORK/bad' ]"
expect "FTK_SIM_NODE_RANKS=3 on 4 ranks: unequal nodes refused (exit 2)" 2 $TO env FTK_SIM_NODE_RANKS=3 $MPI -np 4 $T \
    --strategy hybrid -o "$WORK/bad3"
check "... saying the nodes are simulated" grep -q "simulated: FTK_SIM_NODE_RANKS" "$WORK/err"
expect "--report in a missing directory: exit 2" 2 $TO $MPI -np 2 $T -o "$WORK/badrep" --report "$WORK/no/such/r.md"
check "... naming --report" grep -q -- "--report" "$WORK/err"
finish
