#!/bin/sh
# ftk-train --units (engine/units.h): the unit of communication, on 2 MPI ranks with the demo's
# shape (stories260K: 5 blocks, tied embedding), 3 steps of one micro-batch per rank:
#  - block, group:2 and size:600KB (3 blocks of 181,760 bytes: 545,280 <= 600,000) under full,
#    group:2 under grad-op (full's bits): every step's loss the same bits, and the same shard
#    files (xxh3 in the manifests); with slow also block and group:2 under none, and 4 ranks
#    in simulated nodes of 2 under hybrid, block against group:2, the same;
#  - the collectives per step are the policy's (metrics.jsonl "calls"): with U communication
#    units of blocks, full gathers M·(2U + 2) times and reduce-scatters M·(U + 2) times a step
#    (M micro-batches; shard.h "Collectives"), grad-op gathers U + 2 times; none all-reduces
#    U + 2 times (a group's gradients are one buffer), as hybrid does across its replicas;
#  - the manifest records the policy ("units_policy", canonical: size in bytes);
#  - a run stopped under group:2 (exit 75) resumes under block: the remaining losses and the
#    last shards are the uninterrupted run's bits; a manifest without "units_policy" reads as
#    block, one with a bad value is refused naming the key;
#  - ftk-reshard keeps the policy, or sets it with --units (group:M above the blocks: exit 2);
#  - bad values (group:0, size:abc, group:6 for 5 blocks, group:) exit 2 naming --units, with no
#    run directory left; so do the combinations not built: --units group:2 with --strategy hpz
#    or with --compress-weights / --compress-grads, and --compress-weights with hpz.
# Usage: tests/cli/units.sh BIN_DIR WORK_DIR [slow]   (slow: also none, and hybrid on 4 ranks)
set -u
BIN=$1 WORK=$2 SLOW=${3:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$ROOT/tests/cli/lib.sh"
need_mpi

demo_pack "$WORK/demo.h5" 128
demo_init "$WORK/init.h5" stories260k 1
B="$BIN/ftk-train -m $WORK/init.h5 -d $WORK/demo.h5 --global-batch 4 --micro-batch 2 --lr 2e-3 --warmup 2 --eval-every 0 -j1 --steps 3"
T="$B -q"

losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl"; }
shards() { "$PY" -c 'import json,sys; print(*[s["xxh3"] for s in json.load(open(sys.argv[1]))["shards"]])' "$1/manifest.json"; }
# calls RUN STRATEGY POLICY_BLOCKS_PER_UNIT...: every step's all-gather and reduce-scatter calls
calls() {
    "$PY" - "$@" <<'EOF'
import json, sys
run, strategy, units = sys.argv[1], sys.argv[2], int(sys.argv[3])
bad = []
for l in open(f"{run}/metrics.jsonl"):
    s = json.loads(l)
    if s.get("kind") != "step":
        continue
    M = s["micro_batches"]
    c = {x["kind"]: x["calls"] for x in s["collectives"] if x["level"] in ("world", "shard_group")}
    ar = sum(x["calls"] for x in s["collectives"] if x["kind"] == "all_reduce")
    ag = M * (2 * units + 2) if strategy in ("full", "hybrid") else units + 2 if strategy == "grad-op" else 0
    rs = M * (units + 2) if strategy != "none" else 0
    ar_want = units + 2 if strategy in ("none", "hybrid") else 0
    if (c["all_gather"], c["reduce_scatter"], ar) != (ag, rs, ar_want):
        bad.append(f"step {s['step']}: {c['all_gather']} all-gathers, {c['reduce_scatter']} reduce-scatters, "
                   f"{ar} all-reduces; want {ag}, {rs}, {ar_want}")
print("\n".join(bad) or f"     {M} micro-batch(es): {ag} all-gathers, {rs} reduce-scatters, {ar_want} all-reduces a step")
sys.exit(1 if bad else 0)
EOF
}
policy() { sed -n 's/^  "units_policy": "\(.*\)",$/\1/p' "$1/manifest.json"; }

# --- the same bits under every policy, the collectives the policy says ----------------------
# grad-op computes full's bits: its runs are compared with full's block
CFGS='"full block 5 full" "full group:2 3 full" "full size:600KB 2 full" "grad-op group:2 3 full"'
[ -n "$SLOW" ] && CFGS="$CFGS \"none block 5 none\" \"none group:2 3 none\""
eval "set -- $CFGS"
for c in "$@"; do
    set -- $c
    id=$1-$(echo "$2" | tr : -)
    expect "$1 --units $2: 3 steps on 2 ranks" 0 $TO $MPI -np 2 $T --strategy "$1" --units "$2" -o "$WORK/$id"
    check "$1 --units $2: $3 communication units of blocks a pass" calls "$WORK/$id" "$1" "$3"
    if [ "$2" != block ]; then
        check "$1 --units $2: every loss the same bits as $4 block" test -n "$(losses "$WORK/$id")" -a \
            "$(losses "$WORK/$id")" = "$(losses "$WORK/$4-block")"
        check "$1 --units $2: the same shard files as $4 block" \
            test "$(shards "$WORK/$id/step-00000003")" = "$(shards "$WORK/$4-block/step-00000003")"
    fi
done
check "the manifest records the policy (block, group:2, size:600000)" test \
    "$(policy "$WORK/full-block/step-00000003") $(policy "$WORK/full-group-2/step-00000003") $(policy "$WORK/full-size-600KB/step-00000003")" \
    = "block group:2 size:600000"
if [ -n "$SLOW" ]; then
    for u in block group:2; do
        id=hybrid-$(echo "$u" | tr : -)
        expect "hybrid --units $u: 4 ranks, simulated nodes of 2" 0 env FTK_SIM_NODE_RANKS=2 $TO $MPI -np 4 \
            $T --global-batch 8 --strategy hybrid --units "$u" -o "$WORK/$id"
    done
    check "hybrid --units group:2: 3 units a pass in the shard group" calls "$WORK/hybrid-group-2" hybrid 3
    check "hybrid --units group:2: the losses of block" test -n "$(losses "$WORK/hybrid-group-2")" -a \
        "$(losses "$WORK/hybrid-group-2")" = "$(losses "$WORK/hybrid-block")"
    check "hybrid --units group:2: the shards of block" \
        test "$(shards "$WORK/hybrid-group-2/step-00000003")" = "$(shards "$WORK/hybrid-block/step-00000003")"
fi

# --- stopped under group:2, resumed under block ---------------------------------------------
expect "group:2 stopped after 2 steps: exit 75" 75 $TO $MPI -np 2 $T --units group:2 --stop-after 2 -o "$WORK/stop"
expect "resumed under block" 0 $TO $MPI -np 2 $B --units block --resume auto -o "$WORK/stop"
check "... says it changed the policy" grep -q "written under --units group:2, resumed under --units block" "$WORK/err"
check "... step 3 the uninterrupted run's loss, bit for bit" test -n "$(losses "$WORK/stop")" -a \
    "$(losses "$WORK/stop" | tail -n 1)" = "$(losses "$WORK/full-group-2" | tail -n 1)"
check "... its last shards the uninterrupted run's" \
    test "$(shards "$WORK/stop/step-00000003")" = "$(shards "$WORK/full-group-2/step-00000003")"
check "... its manifest records block" test "$(policy "$WORK/stop/step-00000003")" = block

# a manifest without the key (before policies) reads as block; a bad value is refused
ck=$WORK/stop/step-00000002
"$PY" - "$ck/manifest.json" "$WORK/nokey.json" "$WORK/badkey.json" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
body = [l for l in lines if '"manifest_xxh3"' not in l and '"units_policy"' not in l]  # unsealed (read with a warning)
body[-2] = body[-2].rstrip().rstrip(",") + "\n"
open(sys.argv[2], "w").write("".join(body))
open(sys.argv[3], "w").write("".join(body).replace('"shard_count"', '"units_policy": "group:0",\n  "shard_count"'))
EOF
cp -r "$ck" "$WORK/nokey" && cp "$WORK/nokey.json" "$WORK/nokey/manifest.json"
cp -r "$ck" "$WORK/badkey" && cp "$WORK/badkey.json" "$WORK/badkey/manifest.json"
expect "a manifest without units_policy: ftk-verify passes" 0 $BIN/ftk-verify "$WORK/nokey"
expect "... ftk-reshard keeps it as block" 0 $BIN/ftk-reshard -q "$WORK/nokey" -o "$WORK/nokey-r" --ranks 1
check "... recorded as block" test "$(policy "$WORK/nokey-r/step-00000002")" = block
expect "a manifest with units_policy group:0: refused" 3 $BIN/ftk-verify "$WORK/badkey"
check "... naming the key" grep -q '"units_policy" is "group:0"' "$WORK/err"

# --- ftk-reshard keeps or sets the policy ---------------------------------------------------
expect "ftk-reshard to 1 rank" 0 $BIN/ftk-reshard -q "$ck" -o "$WORK/r1" --ranks 1
check "... keeps group:2" test "$(policy "$WORK/r1/step-00000002")" = group:2
expect "ftk-reshard --units size:1MiB" 0 $BIN/ftk-reshard -q "$ck" -o "$WORK/r2" --ranks 2 --units size:1MiB
check "... records size:1048576" test "$(policy "$WORK/r2/step-00000002")" = size:1048576
expect "ftk-reshard --units group:6 (5 blocks): exit 2" 2 $BIN/ftk-reshard -q "$ck" -o "$WORK/r3" --ranks 2 --units group:6
check "... names --units, writes nothing" sh -c "grep -q -- '--units group:6: the model has 5 blocks' '$WORK/err' && [ ! -e '$WORK/r3' ]"

# --- bad values ---------------------------------------------------------------------------
for u in group:0 size:abc group: size:0 blocks; do
    expect "--units $u: exit 2" 2 $T --units "$u" -o "$WORK/bad"
    check "... names --units $u, no run directory" sh -c "grep -q -- '--units $u: need block, group:M' '$WORK/err' && [ ! -e '$WORK/bad' ]"
done
expect "--units group:6 (5 blocks): exit 2" 2 $T --units group:6 -o "$WORK/bad"
check "... says the model has 5 blocks, no run directory" sh -c "grep -q -- '--units group:6: the model has 5 blocks' '$WORK/err' && [ ! -e '$WORK/bad' ]"
for c in "--strategy hpz --units group:2|--strategy hpz takes --units block only" \
    "--compress-weights int8 --units group:2|take --units block only" \
    "--compress-grads bf16 --units size:600KB|take --units block only" \
    "--strategy hpz --compress-weights int8|not with --strategy hpz"; do
    args=${c%%|*} want=${c#*|}
    expect "$args: exit 2" 2 $T $args -o "$WORK/bad"
    check "... says '$want', no run directory" sh -c "grep -q -- '$want' '$WORK/err' && [ ! -e '$WORK/bad' ]"
done
finish
